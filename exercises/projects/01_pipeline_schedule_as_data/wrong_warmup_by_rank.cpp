// exercises/projects/01_pipeline_schedule_as_data/wrong_warmup_by_rank.cpp — 1F1B with a warm-up of r forwards.
//
// A common mistake: giving rank r a warm-up of r forwards instead of p-1-r. The warm-up fills the pipe
// so that the LAST stage can start its first backward at once; counted from the wrong end, rank 0
// runs B0 straight after F0 and waits for a gradient that the last stage will only send after
// forwards that rank 0 has not sent yet. Every rank waits for another: the schedule deadlocks (the
// simulator finds it before any rank hangs).
// expect: the schedule deadlocks
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
    const int warmup = std::min(r, m);  // the mistake: the last stage needs no warm-up, the first p-1
    int b = 0;
    for (int i = 0; i < warmup; ++i) compute[r].push_back({Action::Kind::forward, i, r});
    for (int i = warmup; i < m; ++i) {  // steady state: one forward, one backward
      compute[r].push_back({Action::Kind::forward, i, r});
      compute[r].push_back({Action::Kind::backward, b++, r});
    }
    while (b < m) compute[r].push_back({Action::Kind::backward, b++, r});  // cool-down
  }
  return sl::parallel::with_communication(sl::parallel::ScheduleKind::one_f_one_b, p, m, 1, compute);
}

}  // namespace project01
