// exercises/projects/01_pipeline_schedule_as_data/wrong_split_without_kind.cpp — ZB-H1's order labelled 1F1B.
//
// A common mistake: building a zero-bubble order (B for the input gradient, W for the weights, held
// back into the cool-down) and passing it to with_communication as ScheduleKind::one_f_one_b, copied
// from the 1F1B it started from. The kind is not a label: it tells the engine whether B is the whole
// backward or only its input half. Under one_f_one_b every B already computes the weight gradients,
// and a W has nothing left to do (the engine refuses it).
// expect: only ScheduleKind::zero_bubble splits the backward into B and W
#include <algorithm>
#include <vector>

#include "exercises/grader.h"
#include "parallel/pipeline/schedule.h"

namespace project01 {

using sl::parallel::Action;

sl::parallel::Schedule my_schedule(int stages, int micro_batches) {
  const int p = stages, m = micro_batches;
  std::vector<std::vector<Action>> compute(p);
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& list = compute[r];
    const int warmup = std::min(p - r - 1, m), lag = r;  // rank r lets r W's wait
    int b = 0, w = 0;
    auto backward = [&] {
      list.push_back({Action::Kind::backward, b++, r});
      if (b - w > lag) list.push_back({Action::Kind::weight, w++, r});
    };
    for (int i = 0; i < warmup; ++i) list.push_back({Action::Kind::forward, i, r});
    for (int i = warmup; i < m; ++i) {
      list.push_back({Action::Kind::forward, i, r});
      backward();
    }
    while (b < m) backward();
    while (w < m) list.push_back({Action::Kind::weight, w++, r});  // the held-back W's fill the cool-down
  }
  // The mistake: the kind of the schedule it was copied from; B and W need ScheduleKind::zero_bubble.
  return sl::parallel::with_communication(sl::parallel::ScheduleKind::one_f_one_b, p, m, 1, compute);
}

}  // namespace project01
