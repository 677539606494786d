// stage.h — cutting the GPT into pipeline stages: which layers each stage (and each of its virtual
// chunks) runs.
//
//   p = 3 stages, v = 1, n_layer 7 (need not divide by p): balanced by count, the first stages
//   take the remainder:
//
//     stage 0: wte, wpe, h.0 h.1 h.2        stage 1: h.3 h.4        stage 2: h.5 h.6, ln_f, head, loss
//
//   v = 2 virtual stages per rank (interleaved 1F1B): the model is cut into p·v chunks and rank r
//   holds chunks r, r+p, r+2p, …  (p = 2, n_layer 4:  rank 0: h.0 | h.2   rank 1: h.1 | h.3+head)
//
//   A chunk is an nn::GPT built from a GPTShardSpec (layers [begin, end)): chunk 0 also holds wte and
//   wpe, the last chunk ln_f and a tied copy of wte (the head). Each part's weights are drawn at the
//   serial model's Philox counters, so the stages equal the serial model's slices bitwise.
//
//   Memory per stage = the weights of its layers (+ wte on the first and last, V·C each) and the
//   activations of the micro-batches in flight (the schedule decides how many: schedule.h).
//
//   Lesson: lessons/08_naive_model_parallel.cpp   Tests: tests/parallel/pipeline/test_pipeline_schedule.cpp
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/data.h"
#include "nn/gpt.h"
#include "parallel/runner/chunk_parallelizer.h"
#include "parallel/runner/model_runner.h"

namespace sl::parallel {

// The layer ranges of `chunks` consecutive chunks. `layers_per_chunk` empty: balanced by count (the
// first n_layer % chunks chunks get one more); else its entries are the counts, in chunk order.
// Throws naming the values when a chunk would hold no layer or the counts do not add to n_layer.
std::vector<nn::GPTShardSpec> split_layers(int64_t n_layer, int chunks,
                                           const std::vector<int64_t>& layers_per_chunk = {});

// Where chunk `chunk` (0 .. p·v-1) lives: rank chunk % p, local index chunk / p.
inline int chunk_rank(int chunk, int stages) { return chunk % stages; }
inline int global_chunk(int rank, int local, int stages) { return local * stages + rank; }

// One rank's part of the model: v chunks, each an nn::GPT over its layer range, local index order.
struct Stage {
  int rank = 0, stages = 1, virtual_stages = 1;
  std::vector<nn::GPTShardSpec> specs;         // [v] this rank's chunks, local order
  std::vector<std::shared_ptr<nn::GPT>> parts;  // [v] built from specs (same seed as the serial model)

  bool holds_first() const { return rank == 0; }                 // chunk 0: wte, wpe
  bool holds_last() const { return rank == stages - 1; }         // chunk p·v-1: ln_f, head, loss
  std::string str() const;  // "stage 1/3: h.3 h.4"
};

// Builds rank `rank`'s chunks. Throws before anything is built when the split is impossible.
// `build` makes each chunk from its layer range (parallel/nd/parallelize.cpp: the chunk cut over tp
// and cp); the plain one builds the serial model's slice from `seed`.
using ChunkBuilder = std::function<std::shared_ptr<nn::GPT>(const nn::GPTShardSpec& layers)>;
Stage make_stage(const nn::GPTConfig& config, int rank, int stages, int virtual_stages,
                 const std::vector<int64_t>& layers_per_chunk, const ChunkBuilder& build);
Stage make_stage(const nn::GPTConfig& config, uint64_t seed, int rank, int stages, int virtual_stages,
                 const std::vector<int64_t>& layers_per_chunk = {});

// Every parameter of a stage's parts under the serial model's names ("h.3.mlp.c_fc.weight"),
// as one nn::Module: what DDP, ZeRO and clip_grad_norm wrap. The tensors are the parts' own.
class StageModule : public nn::Module {
 public:
  explicit StageModule(const Stage& stage);
};

}  // namespace sl::parallel
