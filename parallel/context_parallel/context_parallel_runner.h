// context_parallel_runner.h — context parallelism for the GPT: every rank of a cp group holds the whole
// model and 1/cp of every sequence; only attention talks (ring, all-gather, Ulysses or hybrid, per layer).
//
//   global batch rows, T tokens, labels already shifted (targets[t] = tokens[t + 1])
//          │ every cp rank gets the same rows, then takes its tokens (SequenceShard::take)
//          ▼
//   idx, targets [B, T/cp] ──embed(idx, global positions)──► blocks (attention core = ring, all-gather, Ulysses or hybrid) ──► head
//          ──► Σ CE over this rank's counted targets · dp / C   (C: counted targets of the global batch)
//
//   Per layer, everything but the attention core is per token and runs on the local T/cp tokens
//   unchanged (the model is cut, never forked: each CausalSelfAttention gets its AttentionCore
//   swapped). Labels are shifted before the sequence is sharded, so no token's target lives on
//   another rank; positions are global, so each rank embeds its own wpe rows.
//
//   Gradients: every parameter is replicated over cp (placement replicated). Each rank's backward
//   gives the gradient of ITS tokens' part of the loss, so gradient_sums() SUMS them over cp;
//   the weight dp / C undoes the trainer's average over dp. Summed over cp and averaged over dp,
//   the gradient is the serial model's.
//
//   With DDP over dp (the trainer), the sum runs after DDP's all-reduce has finished (synchronize()):
//   the two commute, but not with a bucket still in flight. Equivalently, DDP over the MeshDim::dp_cp group
//   with the weight dp·cp / C makes the sum unnecessary (Megatron's and torchtitan's way: one
//   all-reduce over dp × cp); FSDP over a cp cut does exactly that with its reduce-scatter over
//   dp_shard × cp (parallel/nd/fsdp_nd_runner.h), and ZeRO-2 sums its gradient shards over cp.
//
//   Activation memory per rank: T/cp tokens through every layer, one [T/cp]² score block at a time
//   (tests: 0.89 / 0.40 / 0.19 MiB at cp 2 / 4 / 8 where the serial GPT peaks at 4.71 MiB, T 256).
//
//   Lesson: lessons/13_ring_attention.cpp   Tests: tests/parallel/context_parallel/test_context_parallel_runner.cpp
#pragma once
#include <memory>
#include <string>

#include "nn/gpt.h"
#include "parallel/comm/mesh.h"
#include "parallel/context_parallel/allgather_attention.h"
#include "parallel/context_parallel/ring_attention.h"
#include "parallel/context_parallel/ulysses_attention.h"
#include "parallel/runner/model_runner.h"

namespace sl::parallel {

enum class CpVariant { ring, allgather, ulysses, hybrid };
const char* cp_variant_name(CpVariant variant);
// "ring" | "allgather" | "ulysses" | "hybrid"; throws naming the choices
CpVariant parse_cp_variant(const std::string& name);
CpBalance parse_cp_balance(const std::string& name);  // "zigzag" | "none"; throws naming the choices

struct ContextParallelOptions {
  CpBalance balance = CpBalance::zigzag;
  CpVariant variant = CpVariant::ring;
  int ulysses_degree = 0;  // hybrid: U, the Ulysses ranks per ring position (cp = U × R)
};

// U for this variant over cp ranks: 1 for ring and all-gather, cp for Ulysses, the option for hybrid.
int ulysses_degree(const ContextParallelOptions& options, int cp);

// The groups a variant talks over, made from the cp group (ulysses_attention.h: rank = i·U + u).
struct CpGroups {
  ProcessGroupPtr cp;       // every cp rank: ring and all-gather run here
  ProcessGroupPtr ulysses;  // the U ranks of one ring position (Ulysses: cp itself)
  ProcessGroupPtr ring;     // the R ranks with the same Ulysses rank (hybrid only)
};
// Collective over `cp` for a hybrid (two split()s); no communication otherwise.
CpGroups make_cp_groups(const ProcessGroupPtr& cp, CpVariant variant, int ulysses_degree);
// A hybrid's sub-groups by name ("cp_ulysses", "cp_ring") for the run report; none otherwise.
std::vector<std::pair<std::string, const CommLedger*>> own_ledgers(const CpGroups& groups);

// The attention core for CausalSelfAttention::core: ring, all-gather, Ulysses or hybrid attention.
nn::AttentionCore context_parallel_core(const SequenceShard& shard, const CpGroups& groups, CpVariant variant);

// The chapter's rules for a model over cp ranks (tp: the tensor-parallel degree around it), checked
// before any communication (the runner, the N-D cut and the factory call this one function):
// block_size splits over cp (over 2·cp with zigzag), no dropout (the ring's attention core has none),
// and for Ulysses and hybrid: U divides cp, and the heads split over U·tp. Throws sl::Error naming
// the values.
void check_context_parallel(const nn::GPTConfig& config, int cp, const ContextParallelOptions& options, int tp = 1);

class ContextParallelRunner : public ModelRunner {
 public:
  // Builds the whole GPT (the same seed on every rank: the same weights) and swaps every layer's
  // attention core. Uses mesh.group(MeshDim::cp); no communication but a hybrid's two group splits. Throws naming the values if
  // block_size does not split over cp (T % cp, or T % 2cp with zigzag).
  ContextParallelRunner(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh,
                        ContextParallelOptions options = {});

  nn::Module& module() override { return *model_; }
  nn::GPT& model() { return *model_; }
  // micros: the same full rows on every cp rank. Returns Σ_m (CE summed over this rank's counted
  // targets of m) / global_count. Throws before any communication unless T splits over cp.
  double forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros, double global_count, int dp,
                          const BackwardHooks& hooks) override;
  bool holds_loss() const override { return true; }  // each cp rank holds its tokens' share
  std::vector<GradientSum> gradient_sums() override;  // every gradient summed over cp
  nn::StateDict full_state_dict() override;            // replicated: this rank's own parameters
  nn::StateDict full_gradients() override;             // copies (zeros where none)
  std::vector<std::pair<std::string, const CommLedger*>> own_groups() const override { return own_ledgers(groups_); }

  const SequenceShard& shard() const { return shard_; }
  const ProcessGroupPtr& group() const { return groups_.cp; }
  const CpGroups& groups() const { return groups_; }

 private:
  std::unique_ptr<nn::GPT> model_;
  CpGroups groups_;
  SequenceShard shard_;
  ContextParallelOptions options_;
};

}  // namespace sl::parallel
