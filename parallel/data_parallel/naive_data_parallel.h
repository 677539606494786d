// naive_data_parallel.h — DataParallel as it is classically described (PyTorch's nn.DataParallel):
// rank 0 ("GPU 0") holds the batch, the loss and the optimizer; the others are its workers.
//
//            rank 0                                rank r (r = 1 … N-1)
//   ┌────────────────────────────┐
//   │ 1 scatter_batch    ───────────────────────►  its rows [r·B/N, (r+1)·B/N) of the inputs
//   │ 2 replicate_model  ───────────────────────►  the current parameters (4Ψ bytes)
//   │   forward my rows                            forward its rows
//   │ 3 gather_outputs   ◄───────────────────────  its logits [B/N, T, V]
//   │   loss = CE(all logits, all targets)
//   │   d loss / d logits
//   │ 4 scatter_loss_grad ──────────────────────►  its rows of d loss / d logits (and the loss)
//   │   backward                                   backward from them
//   │ 5 gather_grads      ◄──────────────────────  its gradients (4Ψ bytes)
//   │   sum, clip, optimizer.step()
//   └────────────────────────────┘
//
//   Why the gradients are summed, not averaged: rank 0's loss is the mean over all B rows, so the
//   loss gradient it scatters already carries the 1/(B·T); each rank's backward gives its rows' part
//   of the global gradient, and the parts add up to it (DataParallel's reduce-add does the same).
//
//   How the exchanges are made: each runs on its own sub-group of the world, so each has its own
//   ledger (ledger(Exchange::...)) and a reader can count it. Scatter and gather are rank 0's
//   point-to-point send/recv to and from each rank (the library has no scatter or gather, and a
//   broadcast or all-gather would move N times the bytes); replicate_model is one broadcast of the
//   parameters laid end to end.
//
//   Cost per step (B rows of T tokens, V vocab, Ψ parameters, N ranks), on rank 0:
//     send  (N-1)·(B/N·T·8)     batch (i64 inputs)              recv (N-1)·(B/N·T·V·4)     logits
//     send  (N-1)·(B/N·T·V+1)·4 loss gradient and the loss      recv (N-1)·4Ψ              gradients
//     broadcast 4Ψ (chained: every rank but the last forwards it)
//   Rank 0 alone moves (N-1)·4Ψ of gradients, where DDP's ring moves 2(N-1)/N·4Ψ on every rank.
//   The targets never leave rank 0: only it computes the loss.
//
//   Lesson: lessons/06_data_parallel.cpp   Tests: tests/parallel/data_parallel/test_data_parallel.cpp
#pragma once
#include <array>
#include <cstdint>

#include "nn/data.h"
#include "nn/gpt.h"
#include "parallel/comm/process_group.h"

namespace sl::parallel {

enum class Exchange : uint8_t { scatter_batch, replicate_model, gather_outputs, scatter_loss_grad, gather_grads };
constexpr int kNumExchanges = 5;
const char* exchange_name(Exchange exchange);

class NaiveDataParallel {
 public:
  static constexpr int kRoot = 0;

  // Collective: every rank of `group` calls it with its own model (only rank 0's weights matter:
  // the others are overwritten every step) and the global batch's shape [batch_rows, block_size].
  NaiveDataParallel(nn::GPT& model, const ProcessGroupPtr& group, int64_t batch_rows, int64_t block_size);

  // One forward and backward over the global batch with the five exchanges. Rank 0 passes the whole
  // batch ([batch_rows, block_size] inputs and targets); the other ranks pass nn::Batch{} (they get
  // their rows from rank 0). On return rank 0's parameters hold the gradient of the global mean
  // loss, added to what they held (as backward accumulates); the other ranks hold none. Every rank
  // returns the global mean loss. Rank 0 then clips and steps its optimizer; nobody else has one.
  double forward_backward(const nn::Batch& batch);

  // Exchange 2 alone: makes every rank's parameters rank 0's (forward_backward begins with it).
  void replicate();

  // Calls and bytes of one exchange on this rank (a sub-group of its own).
  CommLedger& ledger(Exchange exchange) { return groups_[static_cast<int>(exchange)]->ledger(); }
  int64_t rows_per_rank() const { return rows_per_rank_; }

 private:
  ProcessGroup& group(Exchange exchange) { return *groups_[static_cast<int>(exchange)]; }
  bool root() { return group(Exchange::scatter_batch).rank() == kRoot; }
  // The exchanges of forward_backward, in order (rank 0's side and the workers' side of each).
  Tensor scatter_batch(const nn::Batch& batch);  // 1: -> this rank's inputs [R, T]
  // 3 and 4: the logits [R, T, V] to rank 0, which computes the loss of the whole batch; back come
  // this rank's rows of d loss / d logits [R, T, V]. Returns them and sets `loss` (on every rank).
  Tensor gather_outputs_scatter_loss_grad(const Tensor& logits, const Tensor& targets, float& loss);
  void gather_grads();  // 5: the workers' gradients added into rank 0's, in rank order

  nn::GPT& model_;
  std::vector<Tensor> params_;
  int64_t numel_;  // Ψ
  int64_t batch_rows_, block_size_, rows_per_rank_;
  std::array<ProcessGroupPtr, kNumExchanges> groups_;
};

}  // namespace sl::parallel
