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
// How far (the bound, printed with its derivation): a value produced by reductions whose roundings
// number n, each of relative size u (the unit roundoff of the type that rounds: f32 2^-24, bf16 2^-8,
// fp16 2^-11), differs between two summation orders by at most about u·√n (random-walk rounding; the
// worst case is u·n) relative to the terms' magnitude, which here is |serial| + rms(serial tensor):
//
//   bound_i = k · u · √n · (|s_i| + rms(s)) · (1 + g · step)          k = 16, g = 256
//
// (1 + g·step): the earlier steps' weights already differ within their bounds (AdamW turns a
// gradient's rounding into up to lr per element), which every later value carries. k and g are
// safety factors, not derived: g was set from the largest ratio seen on the tested layouts (2.6 at
// g = 16 on step 1 with lr 1e-2), with a margin of about six.
//
// For the weights after a step AdamW's update lr·m̂/(√v̂ + ε) is what differs: a gradient known
// to δg moves it by at most lr·min(2, 2·δg / (|g| + ε)) (the update of one element is at most ±lr),
// summed over the steps, plus one rounding of the stored weight (2·u_w·|w|).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/runner/state_pieces.h"
#include "tensor/tensor.h"

namespace sl::parallel {

struct RoundingBound {
  static constexpr double kSafety = 16;
  static constexpr double kCarry = 256;
  double unit = 0;    // u
  double length = 1;  // n: the roundings on the value's path
  int step = 0;
  std::string dtype;  // the rounding type's name
  double relative() const;
  std::string str() const;  // "16·u·√n·(1+step), u = 2^-24 (f32), n = 448, step 1: 2.0e-05 × (|s| + rms s)"
};

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
  int cp = 1, cp_rank = 0, ulysses = 1;
  bool zigzag = true;
  int tp = 1, tp_rank = 0;
  std::vector<int64_t> positions() const;  // the cp shard's global token positions, local order
};

// A captured output of micro-batch `micro` against the serial module's output for the whole batch
// (`serial`: [B, T, C], wpe's [T, C], the head's [B, T, V]). Returns "" or why the shapes are no cut
// it knows (then nothing is added).
std::string compare_output(const RankCut& cut, int micro, const Tensor& layout, const Tensor& serial,
                           const RoundingBound& bound, Comparison& row);

// `count` elements of a local run, starting at run[local_offset], that are `region` of a serial
// tensor of `global_shape` (`serial` and `bounds` its values, row-major), added to `row`.
void compare_region(const Region& region, const std::vector<int64_t>& global_shape, const std::vector<double>& run,
                    int64_t local_offset, const std::vector<double>& serial, const std::vector<double>& bounds,
                    Comparison& row);

}  // namespace sl::parallel
