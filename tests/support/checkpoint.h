// tests/support/checkpoint.h — what the checkpoint tests share: a small model's worth of global tensors
// with known bytes, cut into pieces the ways layouts cut them, saved and loaded on thread ranks.
//
//   Cut::flat       each tensor's whole box, its elements split into `world` flat ranges (ZeRO)
//   Cut::rows       boxes of dim-0 rows, one per rank (TP's column-parallel weights)
//   Cut::cols       boxes of the last dim split, each box again split into 2 flat ranges (TP x ZeRO)
//   Cut::replicated every rank holds every tensor whole; rank 0 owns (DDP)
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "parallel/checkpoint/checkpoint.h"
#include "parallel/comm/launch.h"

namespace sl::parallel::checkpoint::testing_util {

struct GlobalTensor {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype;
};

// A model's worth of tensors: 2-D and 3-D weights, a bias, AdamW state, a bf16 one and a 0-d scalar.
inline std::vector<GlobalTensor> model_tensors() {
  return {{"w", {6, 10}, DType::f32},         {"b", {10}, DType::f32},   {"exp_avg.w", {6, 10}, DType::f32},
          {"h.0.bf", {4, 3, 5}, DType::bf16}, {"scalar", {}, DType::f32}, {"ids", {7, 3}, DType::i64}};
}

inline int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// The byte `b` of element `index` of tensor number `t`, in save `version`: every byte distinct-ish.
inline uint8_t byte_of(size_t t, int64_t index, int64_t b, int version) {
  return static_cast<uint8_t>(index * 7 + b * 31 + static_cast<int64_t>(t) * 101 + version * 13 + (index >> 8));
}

// The global (row-major) index of each element of a region, in the region's order.
inline std::vector<int64_t> global_indices(const Region& region, const std::vector<int64_t>& shape) {
  std::vector<int64_t> indices;
  const size_t ndim = shape.size();
  for (int64_t k = region.flat_begin; k < region.flat_end; ++k) {
    std::vector<int64_t> at(ndim);
    int64_t rest = k;
    for (size_t d = ndim; d-- > 0;) at[d] = region.offsets[d] + rest % region.lengths[d], rest /= region.lengths[d];
    int64_t index = 0;
    for (size_t d = 0; d < ndim; ++d) index = index * shape[d] + at[d];
    indices.push_back(index);
  }
  return indices;
}

enum class Cut { flat, rows, cols, replicated };
inline const char* cut_name(Cut cut) {
  const char* names[] = {"flat", "rows", "cols", "replicated"};
  return names[static_cast<int>(cut)];
}

// [begin, end) of `n` split into `parts` nearly equal ranges.
inline std::pair<int64_t, int64_t> split(int64_t n, int parts, int part) {
  return {n * part / parts, n * (part + 1) / parts};
}

// The regions rank `rank` of `world` holds of a tensor of `shape` under `cut`, and whether it owns them.
inline std::vector<Region> regions_of(Cut cut, const std::vector<int64_t>& shape, int world, int rank, bool& owner) {
  const int64_t n = numel_of(shape);
  const std::vector<int64_t> zeros(shape.size(), 0);
  owner = true;
  if (cut == Cut::replicated || shape.empty() || (cut != Cut::flat && shape.size() < 2)) {
    // 0-d and 1-d tensors are replicated under the box cuts (as TP replicates a LayerNorm).
    if (cut != Cut::flat) {
      owner = rank == 0;
      return {Region{zeros, shape, 0, n}};
    }
  }
  if (cut == Cut::flat) {
    auto [begin, end] = split(n, world, rank);
    return {Region{zeros, shape, begin, end}};
  }
  const size_t dim = cut == Cut::rows ? 0 : shape.size() - 1;
  auto [begin, end] = split(shape[dim], world, rank);
  std::vector<int64_t> offsets = zeros, lengths = shape;
  offsets[dim] = begin, lengths[dim] = end - begin;
  const int64_t box = numel_of(lengths);
  if (cut == Cut::rows) return {Region{offsets, lengths, 0, box}};
  return {Region{offsets, lengths, 0, box / 3}, Region{offsets, lengths, box / 3, box}};
}

// Rank `rank`'s pieces of every model tensor, filled with save `version`'s bytes (or zeros).
inline std::vector<StatePiece> make_pieces(Cut cut, int world, int rank, int version, bool fill = true,
                                           const std::vector<GlobalTensor>& tensors = model_tensors()) {
  std::vector<StatePiece> pieces;
  for (size_t t = 0; t < tensors.size(); ++t) {
    bool owner = true;
    for (const Region& region : regions_of(cut, tensors[t].shape, world, rank, owner)) {
      Tensor data = Tensor::empty({region.numel()}, {tensors[t].dtype, Device::cpu()});
      auto* bytes = static_cast<uint8_t*>(data.raw_data());
      const auto element = static_cast<int64_t>(dtype_size(tensors[t].dtype));
      const std::vector<int64_t> indices = global_indices(region, tensors[t].shape);
      for (size_t k = 0; k < indices.size(); ++k)
        for (int64_t b = 0; b < element; ++b) bytes[k * element + b] = fill ? byte_of(t, indices[k], b, version) : 0;
      pieces.push_back({tensors[t].name, tensors[t].shape, region, data, owner});
    }
  }
  return pieces;
}

// Every byte of every piece is save `version`'s; "" or the first difference.
inline std::string check_pieces(const std::vector<StatePiece>& pieces, int version,
                                const std::vector<GlobalTensor>& tensors = model_tensors()) {
  for (const StatePiece& piece : pieces) {
    size_t t = 0;
    while (tensors[t].name != piece.tensor) ++t;
    const auto* bytes = static_cast<const uint8_t*>(piece.data.raw_data());
    const auto element = static_cast<int64_t>(dtype_size(tensors[t].dtype));
    const std::vector<int64_t> indices = global_indices(piece.region, piece.global_shape);
    for (size_t k = 0; k < indices.size(); ++k)
      for (int64_t b = 0; b < element; ++b)
        if (bytes[k * element + b] != byte_of(t, indices[k], b, version))
          return piece.tensor + " " + describe(piece.region) + ": element " + std::to_string(k) + " differs";
  }
  return "";
}

// Saves save `version` of the model cut by `cut` over `world` thread ranks into dir (or a step of root).
inline void save_model(const std::string& dir, Cut cut, int world, int version, int64_t step = -1, int keep = 0) {
  launch(world, [&](RankContext& ctx) {
    const std::vector<StatePiece> pieces = make_pieces(cut, world, ctx.rank, version);
    const nlohmann::json run_state = {{"version", version}, {"step", step}};
    const std::string layout = std::string(cut_name(cut)) + " x" + std::to_string(world);
    if (step < 0)
      save(dir, *ctx.world, pieces, run_state, layout);
    else
      save_step(dir, step, *ctx.world, pieces, run_state, layout, keep);
  });
}

// Loads `dir` under `cut` over `world` thread ranks; "" or what differs from save `version`.
inline std::string load_model(const std::string& dir, Cut cut, int world, int version, LoadOptions options = {}) {
  std::vector<std::string> problems(world);
  launch(world, [&](RankContext& ctx) {
    std::vector<StatePiece> pieces = make_pieces(cut, world, ctx.rank, version, false);
    Reader(dir).load(pieces, options);
    problems[ctx.rank] = check_pieces(pieces, version);
  });
  for (const std::string& problem : problems)
    if (!problem.empty()) return problem;
  return "";
}

inline std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
inline void write_file_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A fresh directory under the GoogleTest temp dir, removed afterwards.
class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::path(::testing::TempDir()) / "sl_checkpoint_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << pattern;
    dir_ = pattern;
  }
  void TearDown() override {
    set_fault_hook({});
    std::filesystem::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

}  // namespace sl::parallel::checkpoint::testing_util
