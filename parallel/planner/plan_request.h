// plan_request.h — what build/bin/plan does with its options (PlanOptions, plan_options.h; the
// command line: tools/plan_cli.h): resolve them into a workload, a cluster and maybe one layout
// (sl::Error naming the value when they do not fit together), then evaluate that layout or search
// them all, as text or JSON. A layout is train's: its flags become a TrainPlan the way train's do
// (parallel/train/plan_of_options.h).
//
//   Tests: tests/parallel/planner/test_planner.cpp
#pragma once
#include <optional>
#include <string>

#include "parallel/planner/cluster.h"
#include "parallel/planner/plan_options.h"
#include "parallel/planner/step_time.h"
#include "parallel/train/train_plan.h"

namespace sl::parallel::planner {

struct PlanRequest {
  Workload work;
  Cluster cluster;
  std::optional<TrainPlan> layout;  // one layout to evaluate; none: search
  nn::MixedPrecision precision;
};

// The preset (or train's defaults: 2 layers, 4 heads, 128 wide, V 256, T 64) with the flags' overrides.
ModelShape plan_model(const PlanOptions& o, const nn::MixedPrecision& precision);
// train's layout options as the TrainPlan train would run, checked as train checks them.
TrainPlan plan_layout(TrainOptions o, int64_t batch_size, const nn::MixedPrecision& precision);
// --cluster FILE, or the flags; without --nodes: enough nodes for `world` ranks (search: 1 node).
Cluster plan_cluster(const PlanOptions& o, int64_t world);
PlanRequest resolve_plan(const PlanOptions& o);
// One layout: its row, where its time goes per group, as text.
// show_ep: the table's ep column (a model with experts).
std::string layout_text(const LayoutEstimate& e, bool show_ep = false);
// The whole answer: one layout's estimate, or the search's ranking and recommendation (text or JSON).
std::string run_plan(const PlanOptions& o);

}  // namespace sl::parallel::planner
