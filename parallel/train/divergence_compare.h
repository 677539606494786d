// divergence_compare.h — the element-by-element half of build/bin/diverge (divergence.h): where a
// rank's tensor sits in the serial model's, and how far apart the two may be from rounding alone.
//
// Where (worked out here from the layout's degrees, not by the layout's own gathers or shards):
//   rows       dp rank r of D, micro-batch m of M:  global rows r·B/D + m·B/(D·M) + [0, B/(D·M))
//   tokens     cp rank c of cp: contiguous [c·T/cp, ...); zigzag: chunks c and 2cp-1-c of 2cp; a hybrid
//              (U Ulysses ranks per ring shard) cuts each of its ring shard's chunks into U pieces and
//              takes piece c mod U of each; under SP the local tokens are cut again over tp
//   columns    the head's logits of tp rank k: vocabulary rows [k·Vp/tp, (k+1)·Vp/tp), those below V
//   parameters the boxes a local tensor stacks (train/checkpointing.h parameter_places: the placements
//              and the serial shapes) and the strategy's runs of them (its shards' element ranges)
//
// How far (the bound, printed with its derivation): the serial run's rounding noise in this step,
// measured each run, times a derived factor 4. Beside the serial run s in the layout's dtype the
// finder runs the same serial model, from the same weights and batches, in f64: e, a twin whose own
// rounding is negligible (2^-53). Each step starts from the layout's state: before every step after
// the first, s and e are set to the layout's weights, AdamW's moments and f32 masters, its step count
// and loss scale (divergence_sync.h), so l, s and e enter the step with the same values and what
// separates them is the step's own rounding. Per tensor and step, the serial run's rounding noise
// relative to the values' magnitude is measured,
//
//   r = max_j |s_j - e_j| / (|s_j| + rms s)
//
// and each element of the layout l is allowed
//
//   bound_i = 4 · r · (|s_i| + rms s) + 2·u·|s_i|
//
// Why 4: |l - s| <= |l - e| + |s - e| (the triangle inequality). The layout rounds in the same dtype
// through the same operations, its reductions cut into partial sums no longer than the serial run's
// plus one sum over the ranks, so |l - e| is noise of the same kind and size as |s - e|: together
// 2·r. The other 2: r is the largest of one sample of roundings (pooled over the phase's tensors, so
// that a tensor of a few elements does not stand on its own few), and the layout's largest, another
// sample of the same spread, may lie above it. Without the re-synchronisation the runs would carry
// each other's earlier roundings into the step: AdamW moves an element whose gradient is within
// rounding of 0 by ±lr either way, its sign decided by the rounding, and those moves would make later
// steps differ with a heavy tail that one sample (e) does not bound.
// 2·u·|s_i|: the last rounding of each side into the dtype (u = 2^-24 in f32, 2^-8 in bf16, 2^-11 in
// fp16), which alone bounds a value both runs produce exactly (a lookup).
// The weights after the step add lr·min(2, 2·bound(g)_i/(|g_i| + eps)): AdamW's update of one element
// moves at most ±lr, and a gradient known to δg moves it by about lr·2δg/|g| (this step's only).
//
// The loss is bounded through the logits: a token's cross-entropy moves by at most 2·max_k |Δz_k|
// when its logits move by Δz, so |Δloss| <= 2·max_i bound_i(lm_head) + 2·u·|loss|.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/runner/state_pieces.h"
#include "tensor/tensor.h"

namespace sl::parallel {

// The bound of one tensor at one step (above): bound_i = 4·r·(|s_i| + scale) + 2u·|s_i|.
struct NoiseBound {
  static constexpr double kFactor = 4;  // c (above): derived
  double noise = 0;                     // r, measured against the f64 twin
  double unit = 0;                      // u of the dtype that rounds
  std::string dtype;
  double relative() const { return kFactor * noise; }
  double at(double serial, double scale) const;
  std::string str() const;  // "4·r·(|s| + rms s) + 2u·|s|, r = 3.1e-07 (f32 vs f64), u = 2^-24"
};

// r of a tensor: its serial values in the run's dtype and in the f64 twin, same order.
double measured_noise(const std::vector<double>& serial, const std::vector<double>& exact);

// One value whose bound was exceeded the most, with its serial index.
struct DivergentElement {
  std::vector<int64_t> index;
  double layout = 0, serial = 0, bound = 0;
};

// One row of the finder's table: one tensor of one rank at one step and phase.
struct Comparison {
  int step = 0;
  std::string phase;  // forward, backward (the gradient before the update), step (the weights after it)
  std::string name;   // module ("h.1.attn", "lm_head", "loss") or parameter
  int rank = 0;
  std::string coordinates;  // "pp 0 dp_replicate 0 dp_shard 1 cp 0 tp 1"
  int order = 0;            // its place in its phase (divergence.h: first())
  int64_t elements = 0, over = 0;
  double max_error = 0, worst_ratio = 0;  // the largest |layout - serial| and |Δ| / bound
  std::string bound;
  std::vector<DivergentElement> largest;  // up to 4, by |Δ| / bound
  bool diverged() const { return over > 0; }
};

// Adds one element to a row (NaN on one side only counts as over the bound).
void check_element(Comparison& row, std::vector<int64_t> index, double layout, double serial, double bound);

double rms(const std::vector<double>& values);

// Where a rank's activations sit in the serial batch.
struct RankCut {
  int64_t batch = 0, tokens = 0, vocab = 0;  // B, T, V of the serial step
  int dp = 1, dp_rank = 0, micro_batches = 1;
  // Under ep (a mixture of experts) rank d's micro-batch m is its slice of the serial micro-batch m,
  // rows m·B/M + d·B/(M·dp) onwards; otherwise the m-th slice of its rows d·B/dp onwards.
  bool micro_major = false;
  int cp = 1, cp_rank = 0, ulysses = 1;
  bool zigzag = true;
  int tp = 1, tp_rank = 0;
  std::vector<int64_t> positions() const;  // the cp shard's global token positions, local order
};

// A captured output of micro-batch `micro` against the serial module's output for the whole batch
// (`serial`: [B, T, C], wpe's [T, C], the head's [B, T, V]). Returns "" or why the shapes are no cut
// it knows (then nothing is added).
std::string compare_output(const RankCut& cut, int micro, const Tensor& layout, const Tensor& serial,
                           const NoiseBound& bound, Comparison& row);

// `count` elements of a local run, starting at run[local_offset], that are `region` of a serial
// tensor of `global_shape` (`serial` and `bounds` its values, row-major), added to `row`.
void compare_region(const Region& region, const std::vector<int64_t>& global_shape, const std::vector<double>& run,
                    int64_t local_offset, const std::vector<double>& serial, const std::vector<double>& bounds,
                    Comparison& row);

}  // namespace sl::parallel
