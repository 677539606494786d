// data.h — training data: a stream of tokens cut into (inputs, targets) batches.
//
// TokenStream holds N tokens. Batching follows ONE rule, the contract every parallel layout relies on
// (a data-parallel rank, a pipeline stage, a resumed run all compute the same rows from (step, row)):
//
//   for block T and global batch B, row r of step s starts at   p = ((s*B + r) * T) mod (N - T)
//   inputs  [r, :] = tokens[p,     p + T)
//   targets [r, :] = tokens[p + 1, p + T + 1)     (the next token at every position)
//
// Consecutive rows, then consecutive steps, take consecutive blocks, wrapping around the stream.
// A data-parallel rank asks for rows [row_begin, row_end) of the global batch and gets exactly
// those rows of the full batch; no rank needs to know how the others split theirs.
//
// With a loss_mask (one byte per token), a target whose token has mask 0 becomes the ignore index
// (kDefaultIgnoreIndex, -100), so cross_entropy leaves it out of the loss.
//
// Streams come from files (raw bytes, or nanoGPT's uint16 .bin) or from a task that writes its own
// lines with a loss mask (nn/addition.h).
//
//   Tests: tests/nn/test_data.cpp
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace sl::nn {

// inputs and targets: i64 [rows, T], on the current device (built on the host, copied if CUDA).
struct Batch {
  Tensor inputs;
  Tensor targets;
};

struct TokenStream {
  std::vector<int32_t> tokens;  // [N], each in [0, vocab_size)
  int64_t vocab_size = 256;
  std::vector<uint8_t> loss_mask;  // empty (every target counts) or [N]: 0 = target ignored

  // The file's bytes, one token each (vocab 256).
  static TokenStream from_text_file(const std::string& path);
  // nanoGPT's train.bin / val.bin: raw little-endian uint16 tokens, no header.
  static TokenStream from_bin_file(const std::string& path, int64_t vocab_size);

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }

  // Rows [row_begin, row_end) of step `step`'s global batch of batch_size rows of block_size
  // tokens, by the rule above. row_end = -1 means batch_size.
  Batch get_batch(int64_t step, int64_t batch_size, int64_t block_size, int64_t row_begin = 0,
                  int64_t row_end = -1) const;

  // Gradient accumulation's cut: rows [row_begin, row_end) of step `step`'s batch as `count` equal
  // micro-batches, in row order, each with the number of its targets the loss counts (ignore_index
  // ones left out). The step's loss is then the serial one, the mean over all counted targets:
  //   loss = sum over m of loss_m * counted_m / (sum over m of counted_m)
  // Throws unless the rows divide by count: "6 rows cannot be cut into 4 equal micro-batches (6 % 4 = 2)".
  struct MicroBatch {
    Batch batch;
    int64_t counted = 0;
  };
  std::vector<MicroBatch> micro_batches(int64_t step, int64_t batch_size, int64_t block_size, int64_t count,
                                        int64_t row_begin = 0, int64_t row_end = -1) const;
};

// The targets of a batch that the loss counts (those != ignore_index).
int64_t counted_targets(const Tensor& targets);

}  // namespace sl::nn
