// search.h — every layout a cluster can run a model in, the impossible ones dropped, the rest
// estimated (step_time.h) and ranked: those that fit by step time, then the others by memory.
//
//   world = nodes × gpus_per_node = pp × dp_replicate × dp_shard × ep × cp × tp
//
//   tp   divides the heads (whole heads per rank); Megatron-SP on whenever tp > 1 (the same bytes
//        as TP's all-reduces, 1/tp of the LayerNorm and dropout activations)
//   cp   divides T (zigzag: 2·cp does), up to 16
//   pp   divides the layers (v·pp with interleaving: balanced stages); schedules 1f1b, gpipe,
//        interleaved (v = 2), zero-bubble; m = p, 2p, 4p, 8p micro-batches (pp = 1: the fewest,
//        1, 2, 4, ..., that fits)
//   ep   with experts: divides E and what tp, cp and pp leave (ep ranks read other rows: dp × ep is
//        the data-parallel degree); a dense model has ep 1
//   dp   what is left: DDP, ZeRO-1, ZeRO-2, FSDP, and HSDP sharded within a node
//   then TrainPlan::validate and the chapters' model rules (parallel/nd/parallelize_options.h), and the
//   global batch must split into dp × m micro-batches.
//
//   Of layouts that differ only in their micro-batch count, the best is kept.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/planner/step_time.h"

namespace sl::parallel::planner {

// Throws sl::Error naming the value unless 1 <= T <= block_size and the batch has rows.
void check_workload(const Workload& work);
// Throws sl::Error naming the value when `plan` cannot train `work` on `world` ranks: the plan's
// rules and train's (cost_model.h: check_trainable), heads % tp, layers % (pp·v), T % cp, T <= block_size, batch % (dp · ep · micro-batches), and
// the expert rules (cost_model.h: check_experts).
void check_layout(const Workload& work, const TrainPlan& plan, int world);

struct SearchOptions {
  nn::MixedPrecision precision{};  // every layout's
  int max_cp = 16;
  bool sequence_parallel = true;   // SP with every tp > 1
};

struct Ranking {
  std::vector<LayoutEstimate> layouts;  // fitting ones by step time, then the rest by memory
  int64_t considered = 0, impossible = 0;
  int fitting() const;
};

Ranking search(const Workload& work, const Cluster& cluster, const SearchOptions& options = {});

// The layout's name: TrainPlan::name(), led by "ep8 " when ep > 1.
std::string layout_name(const TrainPlan& plan);
// The layouts' order: fitting before not, then step time (fitting) or memory (not), then name.
bool ranks_before(const LayoutEstimate& a, const LayoutEstimate& b);

}  // namespace sl::parallel::planner
