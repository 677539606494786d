// report.h — what the planner says: a table of layouts, JSON with every figure, and a
// recommendation in words whose reasons are the numbers of the layouts it beat.
//
//   rank  layout                         tp pp cp  dp    zero sched  m   weights grads optim  act  total GB  step s  bubble  fits
//      1  pp8 tp8 sp zero1 x32 micro      8  8  1  16    1   1f1b   32   ...
//
//   The recommendation takes the first layout and, for each of its choices (tp, pp, cp, the ZeRO
//   stage; ep for a model with experts), the best layout that chose otherwise: "TP 8 inside a node: with tp 4 the best layout
//   needs 96.1 GB of 80 GB" or "... takes 1.52 s (+23%)".
#pragma once
#include <string>
#include <vector>

#include "parallel/planner/search.h"

namespace sl::parallel::planner {

// show_ep: an ep column after cp (a model with experts).
std::string layout_table(const std::vector<LayoutEstimate>& layouts, size_t first_rank = 1, bool show_ep = false);
// {"model": ..., "cluster": ..., "layouts": [...]} with, per layout, memory_bytes {weights, grads,
// optimizer, activations, total}, bytes_per_step {group: {op: {calls, bytes_sent, bytes_received,
// seconds, exposed_seconds}}}, compute_s, exposed_comm_s, step_time_s, bubble, fits.
std::string layouts_json(const Workload& work, const Cluster& cluster, const std::vector<LayoutEstimate>& layouts,
                         int64_t considered = 0, int64_t impossible = 0);
// The recommendation: the best layout and why, in a few sentences. `ranking.layouts` sorted.
std::string recommendation(const Ranking& ranking, const Workload& work, const Cluster& cluster);

}  // namespace sl::parallel::planner
