// divergence_sync.cpp — see divergence_sync.h.
#include "parallel/train/divergence_sync.h"

#include <algorithm>

#include "autograd/grad_mode.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace sl::parallel {

namespace {

// A whole tensor of `shape` as a region of itself.
Region whole(const std::vector<int64_t>& shape) {
  Region r{std::vector<int64_t>(shape.size(), 0), shape, 0, 0};
  r.flat_end = r.box_numel();
  return r;
}

}  // namespace

LayoutState::LayoutState(const std::vector<StatePiece>& serial) {
  for (const StatePiece& piece : serial) {
    Buffer& b = buffers_[piece.tensor];
    b.shape = piece.global_shape;
    b.values.assign(static_cast<size_t>(whole(b.shape).numel()), 0.0);
    b.covered.assign(b.values.size(), 0);
  }
}

void LayoutState::clear() {
  for (auto& [name, b] : buffers_) std::fill(b.covered.begin(), b.covered.end(), 0);
  steps_behind_.clear();
}

void LayoutState::add_steps_behind(const std::map<std::string, int64_t>& steps) {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [name, count] : steps) steps_behind_[name] = count;  // replicas step alike
}

void LayoutState::add(const std::vector<StatePiece>& rank_pieces) {
  for (const StatePiece& piece : rank_pieces) {
    if (!piece.owner) continue;
    const auto it = buffers_.find(piece.tensor);
    if (it == buffers_.end()) continue;  // state the serial run does not keep
    Buffer& b = it->second;
    SL_ASSERT(b.shape == piece.global_shape);
    const std::vector<double> values = piece.data.detach().to(DType::f64).to_vector();  // [region.numel()]
    const std::vector<char> ones(values.size(), 1);
    const Region all = whole(b.shape);
    const std::lock_guard<std::mutex> lock(mutex_);
    copy_overlap(all, b.values.data(), piece.region, values.data(), sizeof(double));
    copy_overlap(all, b.covered.data(), piece.region, ones.data(), 1);
  }
}

void LayoutState::load_into(const std::vector<StatePiece>& pieces) const {
  for (const StatePiece& piece : pieces) {
    const auto it = buffers_.find(piece.tensor);
    const int64_t missing = it == buffers_.end() ? piece.data.numel()
                                                 : std::count(it->second.covered.begin(), it->second.covered.end(), 0);
    if (missing > 0)
      throw Error("diverge: the layout's state pieces leave " + std::to_string(missing) + " of " +
                  std::to_string(piece.data.numel()) + " elements of " + piece.tensor +
                  " unheld, so the serial run cannot start the step from the layout's state");
  }
  NoGradGuard no_grad;
  for (const StatePiece& piece : pieces) {
    const Buffer& b = buffers_.at(piece.tensor);
    SL_ASSERT(piece.region == whole(b.shape) && piece.data.numel() == static_cast<int64_t>(b.values.size()));
    piece.data.copy_(from_vector(b.values, Shape({piece.data.numel()}), TensorOptions(DType::f64, piece.data.device())));
  }
}

}  // namespace sl::parallel
