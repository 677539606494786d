// data.cpp — token streams from files, and the batching rule (see data.h).
#include "nn/data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "tensor/ops.h"

namespace sl::nn {

namespace {

// ---- files --------------------------------------------------------------------------------------

// The size of the regular file at `path`, or an error naming it.
int64_t checked_file_size(const std::string& path, const char* op) {
  std::error_code error;
  SL_CHECK(std::filesystem::is_regular_file(path, error), op, ": '", path, "' does not exist or is not a regular file");
  auto size = std::filesystem::file_size(path, error);
  SL_CHECK(!error, op, ": cannot read the size of '", path, "': ", error.message());
  return static_cast<int64_t>(size);
}

// Calls on_chunk(bytes, offset of the first byte in the file, count) over the whole file, 1 MiB at a
// time (a 9 GB train.bin is never held twice).
template <typename OnChunk>
void read_in_chunks(const std::string& path, int64_t size, const char* op, OnChunk on_chunk) {
  std::ifstream in(path, std::ios::binary);
  SL_CHECK(in.good(), op, ": cannot open '", path, "'");
  std::vector<unsigned char> buffer(std::min<int64_t>(size, int64_t{1} << 20));
  for (int64_t done = 0; done < size;) {
    auto count = std::min<int64_t>(size - done, static_cast<int64_t>(buffer.size()));
    in.read(reinterpret_cast<char*>(buffer.data()), count);
    SL_CHECK(in.gcount() == count, op, ": '", path, "' ended after ", done + in.gcount(), " of ", size, " bytes");
    on_chunk(buffer.data(), done, count);
    done += count;
  }
}

void check_enough_tokens(const TokenStream& stream, const std::string& path, const char* op) {
  SL_CHECK(stream.size() >= 2, op, ": '", path, "' holds ", stream.size(),
           " tokens; a stream needs at least 2 (one input and its target)");
}

}  // namespace

// ---- TokenStream --------------------------------------------------------------------------------

TokenStream TokenStream::from_text_file(const std::string& path) {
  TokenStream stream;
  stream.vocab_size = 256;
  const char* op = "TokenStream::from_text_file";
  const int64_t size = checked_file_size(path, op);
  stream.tokens.reserve(static_cast<size_t>(size));
  read_in_chunks(path, size, op, [&](const unsigned char* bytes, int64_t, int64_t count) {
    stream.tokens.insert(stream.tokens.end(), bytes, bytes + count);
  });
  check_enough_tokens(stream, path, op);
  return stream;
}

TokenStream TokenStream::from_bin_file(const std::string& path, int64_t vocab_size) {
  const char* op = "TokenStream::from_bin_file";
  SL_CHECK(vocab_size >= 1 && vocab_size <= 65536, op, ": vocab_size ", vocab_size,
           " must be in [1, 65536] for uint16 tokens (file '", path, "')");
  const int64_t size = checked_file_size(path, op);
  SL_CHECK(size % 2 == 0, op, ": '", path, "' has an odd number of bytes (", size,
           "); a .bin file is uint16 tokens, 2 bytes each");
  TokenStream stream;
  stream.vocab_size = vocab_size;
  stream.tokens.resize(static_cast<size_t>(size / 2));
  // Chunks are 1 MiB, an even size, so a token never straddles two of them.
  read_in_chunks(path, size, op, [&](const unsigned char* bytes, int64_t offset, int64_t count) {
    for (int64_t i = 0; i < count; i += 2) {
      int64_t position = (offset + i) / 2;
      int32_t token = bytes[i] | (bytes[i + 1] << 8);  // little-endian, whatever this machine is
      SL_CHECK(token < vocab_size, op, ": token ", token, " at position ", position, " of '", path,
               "' is not below vocab_size ", vocab_size);
      stream.tokens[static_cast<size_t>(position)] = token;
    }
  });
  check_enough_tokens(stream, path, op);
  return stream;
}

Batch TokenStream::get_batch(int64_t step, int64_t batch_size, int64_t block_size, int64_t row_begin,
                             int64_t row_end) const {
  const int64_t N = size(), B = batch_size, T = block_size;
  if (row_end == -1) row_end = B;
  SL_CHECK(step >= 0 && B >= 1 && T >= 1, "get_batch: need step >= 0, batch_size >= 1 and block_size >= 1 (got step ",
           step, ", batch_size ", B, ", block_size ", T, ")");
  SL_CHECK(N >= T + 1, "get_batch: the stream has N = ", N, " tokens, fewer than T + 1 = ", T + 1,
           " (block_size T = ", T, " inputs plus the last one's target)");
  SL_CHECK(0 <= row_begin && row_begin < row_end && row_end <= B, "get_batch: rows [", row_begin, ", ", row_end,
           ") are not a non-empty range inside the batch of ", B, " rows");
  SL_CHECK(loss_mask.empty() || loss_mask.size() == tokens.size(), "get_batch: loss_mask has ", loss_mask.size(),
           " entries for ", N, " tokens (it must be empty or one per token)");
  const int64_t rows = row_end - row_begin;

  // Built on the host (this thread's CPU device, so a rank's ledger counts it), copied if CUDA.
  const Device device = current_device();
  const Device host = device.is_cpu() ? device : Device::cpu();
  Tensor inputs = Tensor::empty({rows, T}, TensorOptions{DType::i64, host});   // [rows, T]
  Tensor targets = Tensor::empty({rows, T}, TensorOptions{DType::i64, host});  // [rows, T]
  int64_t* in = inputs.data<int64_t>();
  int64_t* out = targets.data<int64_t>();

  // p = ((s*B + r) * T) mod (N - T), reduced step by step so that no product overflows.
  using u128 = unsigned __int128;
  const auto wrap = static_cast<u128>(N - T);
  const u128 first_row = (static_cast<u128>(step) % wrap) * (static_cast<u128>(B) % wrap) % wrap;
  for (int64_t r = 0; r < rows; ++r) {
    const u128 row_index = (first_row + static_cast<u128>(row_begin + r)) % wrap;
    const auto p = static_cast<int64_t>(row_index * (static_cast<u128>(T) % wrap) % wrap);
    for (int64_t t = 0; t <= T; ++t) {  // tokens[p, p + T]: T inputs, and the targets shifted by one
      const int32_t token = tokens[static_cast<size_t>(p + t)];
      SL_CHECK(token >= 0 && token < vocab_size, "get_batch: token ", token, " at position ", p + t,
               " is outside the vocabulary [0, ", vocab_size, ")");
      if (t < T) in[r * T + t] = token;
      if (t > 0) {
        const bool counts = loss_mask.empty() || loss_mask[static_cast<size_t>(p + t)] != 0;
        out[r * T + t - 1] = counts ? token : kDefaultIgnoreIndex;
      }
    }
  }
  if (!device.is_cpu()) return {inputs.to(device), targets.to(device)};
  return {inputs, targets};
}

int64_t counted_targets(const Tensor& targets) {
  int64_t counted = 0;
  for (double target : targets.to_vector()) counted += target != kDefaultIgnoreIndex;
  return counted;
}

std::vector<TokenStream::MicroBatch> TokenStream::micro_batches(int64_t step, int64_t batch_size, int64_t block_size,
                                                                int64_t count, int64_t row_begin,
                                                                int64_t row_end) const {
  if (row_end == -1) row_end = batch_size;
  const int64_t rows = row_end - row_begin;
  SL_CHECK(count >= 1, "micro_batches: the number of micro-batches must be >= 1 (got ", count, ")");
  SL_CHECK(rows % count == 0, "micro_batches: ", rows, " rows cannot be cut into ", count,
           " equal micro-batches (", rows, " % ", count, " = ", rows % count, ")");
  std::vector<MicroBatch> out;
  const int64_t each = rows / count;
  for (int64_t m = 0; m < count; ++m) {
    MicroBatch micro;
    micro.batch = get_batch(step, batch_size, block_size, row_begin + m * each, row_begin + (m + 1) * each);
    micro.counted = counted_targets(micro.batch.targets);
    out.push_back(std::move(micro));
  }
  return out;
}

}  // namespace sl::nn
