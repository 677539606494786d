// exercises/projects/01_pipeline_schedule_as_data/project.cpp — a pipeline schedule of your own, as data.
//
// A schedule is one list of actions per rank (parallel/pipeline/schedule.h): F(m, c) the forward of
// micro-batch m through chunk c, B(m, c) its backward (only the input gradient when the schedule
// splits the backward), W(m, c) the weight gradient, and the sends/receives between them. The one
// engine runs any such list (parallel/pipeline/engine.h), the simulator checks and times it
// (parallel/pipeline/simulate.h), the timeline draws it (timeline.h). The library builds five
// (naive, gpipe, 1f1b, interleaved, zero-bubble ZB-H1); write a sixth. Ideas:
//
//   Megatron's relaxed interleaving   interleaved 1F1B (v chunks per rank) for any m >= p, not only
//                                     multiples of p (schedule.h says the library's needs m % p == 0)
//   ZB-H2 / interleaved zero-bubble   the W's (weight gradients nobody waits for) moved into the
//                                     warm-up and cool-down bubbles; or split B/W on v = 2 chunks
//   your own                          any order the engine can run with a bubble no worse than 1F1B's
//
// The fixed rules: chunk c (0 .. p·v-1) lives on rank c % p (stage.h: chunk_rank), so rank r holds
// chunks r, r+p, …; micro-batch m's F(m, c) needs F(m, c-1)'s output, its B(m, c) needs B(m, c+1)'s
// input gradient; backwards (B and W) run in micro-batch order per chunk. Schedule::kind says which
// engine semantics apply: ScheduleKind::zero_bubble splits the backward into B and W, any other kind
// runs B as the whole backward (use one_f_one_b or interleaved for those).
//
// The tools: write each rank's compute order (F, B, W only), then let
//   sl::parallel::with_communication(kind, p, m, v, compute)
// place the sends and receives around it (schedule.h). sl::parallel::check(schedule) validates and
// simulates it (throws naming a deadlock); sl::parallel::simulate(schedule).timeline with
// ascii_gantt() draws it. The library's own rules are in parallel/pipeline/schedule.cpp: read them,
// then write yours here.
//
//   Action{Action::Kind::forward, micro, chunk}   Action{Action::Kind::backward, micro, chunk}
//   Action{Action::Kind::weight, micro, chunk}
//
// Grade it:  make project N=01        (README.md: what is checked and the rubric)
#include "exercises/grader.h"
#include "parallel/pipeline/schedule.h"

namespace project01 {

// The schedule for `stages` ranks and `micro_batches` micro-batches (the grader asks for m >= p,
// including m not a multiple of p). Choose virtual_stages (chunks per rank) yourself.
sl::parallel::Schedule my_schedule(int stages, int micro_batches) {
  // TODO: each rank's compute order, then with_communication(...).
  throw exercises::NotImplemented("my_schedule");
}

}  // namespace project01
