// exercises/projects/01_pipeline_schedule_as_data/wrong_no_warmup.cpp — 1F1B without its warm-up.
//
// A common mistake: alternating one forward and one backward from the start on every rank, "1F1B"
// taken literally. Nothing deadlocks, but a micro-batch's backward must come back from the last stage
// before the next forward starts, so only one micro-batch is ever in the pipe: the naive schedule,
// whose bubble is (p-1)/p. The warm-up of p-1-r forwards is what lets the stages work side by side.
// expect: only one micro-batch is ever in flight
#include <vector>

#include "exercises/grader.h"
#include "parallel/pipeline/schedule.h"

namespace project01 {

using sl::parallel::Action;

sl::parallel::Schedule my_schedule(int stages, int micro_batches) {
  const int p = stages, m = micro_batches;
  std::vector<std::vector<Action>> compute(p);
  for (int r = 0; r < p; ++r) {
    int b = 0;
    for (int i = 0; i < m; ++i) {  // the mistake: no warm-up of p-1-r forwards first
      compute[r].push_back({Action::Kind::forward, i, r});
      compute[r].push_back({Action::Kind::backward, b++, r});
    }
  }
  return sl::parallel::with_communication(sl::parallel::ScheduleKind::one_f_one_b, p, m, 1, compute);
}

}  // namespace project01
