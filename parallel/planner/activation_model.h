// activation_model.h — the cost model's activation peak (internal to parallel/planner; cost_model.h's
// estimate_memory reports it): what one rank holds above its model states at the highest point of a
// step, worked out from shapes (memory_model.cpp gives the model states it is measured against).
#pragma once
#include <cstdint>

#include "parallel/planner/cost_model.h"
#include "parallel/planner/rank_part.h"

namespace sl::parallel::planner {

// Bytes above the model states held between steps. held_grads: the gradients memory_model.cpp counts
// for this rank (a cut at dp 1 sets them to none at zero_grad, so they are missing until backward
// makes them again); zero2_flat: ZeRO-2's full flat gradient buffer (g·P) that lives through backward.
int64_t activation_peak(const ModelShape& model, const TrainPlan& plan, const BatchShape& batch,
                        const RankPart& part, int rank, int64_t held_grads, int64_t zero2_flat);

}  // namespace sl::parallel::planner
