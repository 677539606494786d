// expert_traffic.cpp — expert parallelism's traffic (traffic_step.h), as the expert_parallel chapter
// moves it: per MoE layer this rank runs and per micro-batch,
//
//   forward    dispatch all-to-all   each kept assignment [C] to the ep rank that holds its expert
//              combine all-to-all    the experts' outputs back to the tokens' ranks
//   backward   their two reverses    the outputs' gradients out, the inputs' gradients back
//
//   one call's input: the rank's kept assignments, tokens·k·min(1, cf) rows of C elements (tokens =
//   b·T/cp, the rows its MLP sees; cf the capacity factor, 0 dropless). For a uniform load every ep
//   rank gets 1/ep of them, so (ep-1)/ep leaves: tokens·k·C·bytes·(ep-1)/ep per call, 4 calls.
//   A capacity cf < 1 caps each expert at cf·tokens·k/E and drops the rest; cf >= 1 drops nothing
//   from a uniform load.
//
//   routing    the chosen expert ids (i64, tokens·k) all-gathered once per layer over the ranks that
//              split the batch (dp_cp), so every rank balances the load over the whole batch
//
//   the step  each micro-batch's counted targets (f64) summed once over dp (ep included): the weight
//              of its MoE batch's auxiliary losses (expert_parallel_step.h), on every rank of an ep layout
//
// Selective recomputation reruns the attention core only, so the MoE's exchanges are not repeated.
#include <algorithm>
#include <cmath>

#include "parallel/planner/traffic_step.h"

namespace sl::parallel::planner {

namespace {

void expert_step_traffic(Step& s) {
  if (s.plan.parallelism.ep > 1 && s.book.size({MeshDim::dp}) > 1) s.book.all_reduce({MeshDim::dp}, s.M, 8);
}

}  // namespace

void expert_traffic(Step& s) {
  if (!s.model.has_experts()) return;
  expert_step_traffic(s);
  const int64_t moe_layers = std::count_if(s.part.layers.begin(), s.part.layers.end(),
                                           [&](int64_t layer) { return s.model.moe_layer(layer); });
  if (moe_layers == 0) return;
  const int64_t tokens = s.micro_rows * s.tokens, k = s.model.moe_top_k;
  const double cf = s.model.moe_capacity_factor;
  const double kept = cf > 0 ? std::min(1.0, cf) : 1.0;
  const auto assignments = static_cast<int64_t>(std::llround(static_cast<double>(tokens * k) * kept));
  if (s.plan.parallelism.ep > 1)
    s.book.named_all_to_all("ep", {MeshDim::ep}, assignments * s.model.n_embd * s.pes, 4 * moe_layers * s.M);
  if (s.book.size({MeshDim::dp_cp}) > 1) s.book.all_gather({MeshDim::dp_cp}, tokens * k * 8, moe_layers * s.M);
}

}  // namespace sl::parallel::planner
