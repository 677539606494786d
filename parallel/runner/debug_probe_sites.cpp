// debug_probe_sites.cpp — the probe's faults inside the chapters (fault_sites.h) and inside a
// group's reductions (ring_chunk_index): see debug_probe.h.
#include "autograd/grad_mode.h"
#include "parallel/runner/debug_probe.h"
#include "tensor/ops.h"

namespace sl::parallel {

using Kind = ProbeFault::Kind;

void DebugProbe::before_gradient_reduce(const Tensor& parameter) const {
  const auto named = parameter_names_.find(parameter.impl());
  if (named == parameter_names_.end()) return;
  for (const ProbeFault& f : faults_) {
    if (f.kind != Kind::scale_contribution || (f.target != named->second && f.target != "*") || !mine(f)) continue;
    SL_CHECK(parameter.grad().defined(), "debug probe: ", f.str(), ": the chapter reduces a gradient it does not hold");
    NoGradGuard no_grad;
    parameter.grad().mul_(f.factor);
    fired_ = true;
  }
}

Tensor DebugProbe::before_partial_sum(const Tensor& partial, const Tensor& bias) const {
  Tensor sent = partial;
  for (const ProbeFault& f : faults_) {
    if (f.kind != Kind::add_bias || f.target != running_ || !mine(f)) continue;
    // The bias (and the offset) on this rank before the sum over tp; g adds the bias once more after it.
    if (bias.defined()) sent = add(sent, bias);
    if (f.offset != 0) sent = add(sent, f.offset);
    fired_ = true;
  }
  return sent;
}

bool DebugProbe::breaks(Mistake mistake) const {
  const Kind kind = mistake == Mistake::zigzag_unswapped         ? Kind::zigzag_unswapped
                    : mistake == Mistake::ulysses_arrival_order  ? Kind::ulysses_arrival_order
                    : mistake == Mistake::local_capacity         ? Kind::local_capacity
                                                                 : Kind::detached_weights;
  for (const ProbeFault& f : faults_) {
    if (f.kind != kind || f.target != running_ || !mine(f)) continue;
    fired_ = true;
    return true;
  }
  return false;
}

namespace {

// Lesson 5's ring with its chunk index off by one (the incoming partial sum added into the chunk
// just sent) never chains two ranks' values: chunk c of its result is rank c-1's chunk c alone.
// Each rank's input keeps only its chunk r+1, so the group's own reduction sums exactly that. The
// chunks are the ring's: n of them, the first numel mod n one element longer.
void keep_only_chunk_after_mine(const Tensor& input, int rank, int n) {
  NoGradGuard no_grad;
  const int64_t count = input.numel(), base = count / n, extra = count % n;
  const int kept = (rank + 1) % n;
  for (int c = 0; c < n; ++c) {
    const int64_t begin = c * base + std::min<int64_t>(c, extra), size = base + (c < extra ? 1 : 0);
    if (c != kept && size > 0) input.flat_view(begin, {size}).zero_();
  }
}

}  // namespace

void DebugProbe::plant_in_groups() {
  if (mesh_ == nullptr) return;  // the serial model reduces nothing
  for (const ProbeFault& f : faults_) {
    if (f.kind != Kind::ring_chunk_index) continue;
    const ProcessGroupPtr group = mesh_->group(mesh_dim_from_name(f.target));
    if (group->size() == 1) continue;
    faulty_groups_.push_back(group);
    ProcessGroup* raw = group.get();  // the group holds the hook: no cycle
    // Runs on the thread that runs the reduction (an async one's: the group's worker).
    group->set_reduction_fault([this, raw](const Fingerprint& fingerprint, const Tensor& input) {
      if (fingerprint.op != CommOp::all_reduce) return;
      for (const ProbeFault& g : faults_) {
        if (g.kind != Kind::ring_chunk_index || !mine(g)) continue;
        if (mesh_->group(mesh_dim_from_name(g.target)).get() != raw) continue;
        keep_only_chunk_after_mine(input, raw->rank(), raw->size());
        fired_ = true;
        return;
      }
    });
  }
}

}  // namespace sl::parallel
