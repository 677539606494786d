// schedule.cpp — see schedule.h: the four schedules as per-rank action lists.
#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <optional>
#include <set>

#include "parallel/pipeline/stage.h"
#include "tensor/error.h"

namespace sl::parallel {

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::naive: return "naive";
    case ScheduleKind::gpipe: return "gpipe";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::interleaved: return "interleaved";
    case ScheduleKind::zero_bubble: return "zero-bubble";
  }
  return "?";
}

ScheduleKind parse_schedule(const std::string& name) {
  for (auto kind : {ScheduleKind::naive, ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                    ScheduleKind::zero_bubble})
    if (name == schedule_name(kind)) return kind;
  SL_CHECK(false, "pipeline: unknown schedule '", name, "' (naive, gpipe, 1f1b, interleaved or zero-bubble)");
  return ScheduleKind::gpipe;
}

int Action::tag() const {
  const int direction = (kind == Kind::send_grad || kind == Kind::recv_grad || kind == Kind::backward) ? 1 : 0;
  return (micro * 1024 + chunk) * 2 + direction;  // chunks < 1024 (checked in check_schedule_config)
}

std::string Action::str() const {
  const std::string id = std::to_string(micro) + "." + std::to_string(chunk);
  switch (kind) {
    case Kind::forward: return "F" + id;
    case Kind::backward: return "B" + id;
    case Kind::weight: return "W" + id;
    case Kind::send_activation: return "send act " + id + " -> " + std::to_string(peer);
    case Kind::recv_activation: return "recv act " + id + " <- " + std::to_string(peer);
    case Kind::send_grad: return "send grad " + id + " -> " + std::to_string(peer);
    case Kind::recv_grad: return "recv grad " + id + " <- " + std::to_string(peer);
  }
  return "?";
}

std::string Schedule::str() const {
  std::string out;
  for (size_t r = 0; r < ranks.size(); ++r) {
    out += "rank " + std::to_string(r) + ":";
    for (const Action& a : ranks[r])
      if (a.is_compute())
        out += std::string(" ") + a.str().substr(0, 1) + std::to_string(a.micro) +
               (virtual_stages > 1 ? "." + std::to_string(a.chunk) : "");
    out += "\n";
  }
  return out;
}

void check_schedule_config(ScheduleKind kind, int p, int m, int v) {
  SL_CHECK(p >= 1 && m >= 1 && v >= 1, "pipeline: stages (", p, "), micro-batches (", m, ") and virtual stages (", v,
           ") must all be >= 1");
  SL_CHECK(p * v < 1024, "pipeline: ", p, " stages x ", v, " virtual stages is more chunks than the tags hold (1023)");
  if (kind != ScheduleKind::interleaved) {
    SL_CHECK(v == 1, "pipeline: --virtual-stages ", v, " needs --schedule interleaved (got ", schedule_name(kind), ")");
    return;
  }
  SL_CHECK(p >= 2, "pipeline: the interleaved schedule needs at least 2 stages (got ", p, ")");
  SL_CHECK(m % p == 0, "pipeline: the interleaved schedule needs micro-batches (", m, ") to be a multiple of stages (",
           p, "): Megatron's rule, m % p = ", m % p);
}

namespace {
using Kind = Action::Kind;
Action F(int m, int c) { return {Kind::forward, m, c, -1}; }
Action B(int m, int c) { return {Kind::backward, m, c, -1}; }
Action W(int m, int c) { return {Kind::weight, m, c, -1}; }

// Megatron's interleaved order: the k-th forward (or backward) of a rank runs this (micro, chunk).
Action interleaved_action(int k, int rank, int p, int v, bool forward) {
  const int in_group = k % (p * v);
  int local = in_group / p;
  if (!forward) local = v - 1 - local;
  const int micro = (k / (p * v)) * p + in_group % p;
  const int chunk = global_chunk(rank, local, p);
  return forward ? F(micro, chunk) : B(micro, chunk);
}
}  // namespace

namespace {
// The send that follows a compute and the receive that must precede one (none at the model's ends).
void add_send_of(std::vector<Action>& batch, const Action& a, int p, int last) {
  if (a.kind == Kind::forward && a.chunk < last) batch.push_back({Kind::send_activation, a.micro, a.chunk, chunk_rank(a.chunk + 1, p)});
  if (a.kind == Kind::backward && a.chunk > 0) batch.push_back({Kind::send_grad, a.micro, a.chunk, chunk_rank(a.chunk - 1, p)});
}
void add_recv_for(std::vector<Action>& batch, const Action& a, int p, int last) {
  if (a.kind == Kind::forward && a.chunk > 0) batch.push_back({Kind::recv_activation, a.micro, a.chunk - 1, chunk_rank(a.chunk - 1, p)});
  if (a.kind == Kind::backward && a.chunk < last) batch.push_back({Kind::recv_grad, a.micro, a.chunk + 1, chunk_rank(a.chunk + 1, p)});
}

// Interleaved 1F1B as Megatron runs it: each receive is posted one step ahead, together with the
// previous step's sends, and in the steady state a forward and a backward run back to back, followed
// by one exchange of all four tensors (send_forward_backward_recv_forward_backward). Posting the
// neighbours' messages in the same batch is what keeps the wrap-around ring (the last rank feeds
// rank 0's next chunk) from waiting on itself.
Schedule interleaved_schedule(int p, int m, int v) {
  Schedule s{ScheduleKind::interleaved, p, m, v, std::vector<std::vector<Action>>(p)};
  const int total = m * v, last = p * v - 1;
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& list = s.ranks[r];
    auto fwd = [&](int k) { return interleaved_action(k, r, p, v, true); };
    auto bwd = [&](int k) { return interleaved_action(k, r, p, v, false); };
    auto flush = [&](std::vector<Action> batch) {
      // Activations before gradients, each in tag order: both ends of a pair list them alike.
      std::stable_sort(batch.begin(), batch.end(), [](const Action& a, const Action& b) {
        return std::make_pair(a.kind == Kind::send_grad || a.kind == Kind::recv_grad, a.tag()) <
               std::make_pair(b.kind == Kind::send_grad || b.kind == Kind::recv_grad, b.tag());
      });
      list.insert(list.end(), batch.begin(), batch.end());
    };
    const int warmup = std::min(2 * (p - r - 1) + (v - 1) * p, total), steady = total - warmup;
    flush([&] { std::vector<Action> b; add_recv_for(b, fwd(0), p, last); return b; }());
    for (int k = 0; k < warmup; ++k) {  // warm-up
      list.push_back(fwd(k));
      std::vector<Action> batch;
      add_send_of(batch, fwd(k), p, last);
      if (k + 1 < total) add_recv_for(batch, fwd(k + 1), p, last);
      if (k + 1 == warmup) add_recv_for(batch, bwd(0), p, last);  // the first backward's gradient
      flush(batch);
    }
    for (int k = 0; k < steady; ++k) {  // steady: F, B, one exchange
      list.push_back(fwd(warmup + k));
      list.push_back(bwd(k));
      std::vector<Action> batch;
      add_send_of(batch, fwd(warmup + k), p, last);
      add_send_of(batch, bwd(k), p, last);
      if (warmup + k + 1 < total) add_recv_for(batch, fwd(warmup + k + 1), p, last);
      if (k + 1 < total) add_recv_for(batch, bwd(k + 1), p, last);
      flush(batch);
    }
    if (warmup == 0) SL_ASSERT(steady == total);
    for (int k = steady; k < total; ++k) {  // cool-down
      list.push_back(bwd(k));
      std::vector<Action> batch;
      add_send_of(batch, bwd(k), p, last);
      if (k + 1 < total) add_recv_for(batch, bwd(k + 1), p, last);
      flush(batch);
    }
  }
  return s;
}
}  // namespace

Schedule make_schedule(ScheduleKind kind, int p, int m, int v) {
  check_schedule_config(kind, p, m, v);
  std::vector<std::vector<Action>> compute(p);
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& list = compute[r];
    if (kind == ScheduleKind::naive) {
      for (int i = 0; i < m; ++i) list.insert(list.end(), {F(i, r), B(i, r)});
    } else if (kind == ScheduleKind::gpipe) {
      for (int i = 0; i < m; ++i) list.push_back(F(i, r));
      for (int i = 0; i < m; ++i) list.push_back(B(i, r));
    } else if (kind == ScheduleKind::one_f_one_b) {
      const int warmup = std::min(p - r - 1, m);
      for (int i = 0; i < warmup; ++i) list.push_back(F(i, r));          // warm-up
      for (int i = 0; i < m - warmup; ++i) list.insert(list.end(), {F(warmup + i, r), B(i, r)});  // steady
      for (int i = m - warmup; i < m; ++i) list.push_back(B(i, r));      // cool-down
    } else if (kind == ScheduleKind::zero_bubble) {
      // ZB-H1: 1F1B's warm-up and F,B pairs; rank r lets `lag` = r W's wait (they fill its cool-down).
      const int warmup = std::min(p - r - 1, m), lag = r;
      int b = 0, w = 0;
      auto backward = [&] {
        list.push_back(B(b++, r));
        if (b - w > lag) list.push_back(W(w++, r));
      };
      for (int i = 0; i < warmup; ++i) list.push_back(F(i, r));  // warm-up
      for (int i = warmup; i < m; ++i) {                          // steady
        list.push_back(F(i, r));
        backward();
      }
      while (b < m) backward();                                   // cool-down
      while (w < m) list.push_back(W(w++, r));                    // the W's held back
    } else {
      return interleaved_schedule(p, m, v);
    }
  }
  return with_communication(kind, p, m, v, compute);
}

Schedule with_communication(ScheduleKind kind, int p, int m, int v, const std::vector<std::vector<Action>>& compute) {
  Schedule s{kind, p, m, v, std::vector<std::vector<Action>>(p)};
  const int last = p * v - 1;
  for (int r = 0; r < p; ++r) {
    std::optional<Action> pending_send;  // a B's send held back past the W's that follow it
    for (size_t k = 0; k < compute[r].size(); ++k) {
      const Action& a = compute[r][k];
      SL_CHECK(a.is_compute(), "pipeline: a compute order holds only F, B and W, got ", a.str());
      SL_CHECK(a.chunk >= 0 && a.chunk <= last && chunk_rank(a.chunk, p) == r, "pipeline: rank ", r, " was given ",
               a.str(), " but chunk ", a.chunk, " lives on rank ", chunk_rank(a.chunk, p));
      std::vector<Action>& list = s.ranks[r];
      if (a.kind == Kind::weight) {
        list.push_back(a);  // sends and needs nothing
      } else if (a.kind == Kind::forward) {
        if (a.chunk > 0) list.push_back({Kind::recv_activation, a.micro, a.chunk - 1, chunk_rank(a.chunk - 1, p)});
        list.push_back(a);
        if (a.chunk < last) list.push_back({Kind::send_activation, a.micro, a.chunk, chunk_rank(a.chunk + 1, p)});
      } else {
        if (a.chunk < last) list.push_back({Kind::recv_grad, a.micro, a.chunk + 1, chunk_rank(a.chunk + 1, p)});
        list.push_back(a);
        if (a.chunk > 0) pending_send = Action{Kind::send_grad, a.micro, a.chunk, chunk_rank(a.chunk - 1, p)};
      }
      // In the steady state B's gradient goes after the W's that follow it, with the next forward's
      // receive in one batch (1F1B's send_backward_recv_forward): under rendezvous a send waits for
      // its receive, which the previous stage posts only after its own next forward, a W's time
      // later. In the cool-down (no forward follows) it goes at once: the previous stage waits for it.
      size_t next = k + 1;
      while (next < compute[r].size() && compute[r][next].kind == Kind::weight) ++next;
      const bool forward_after_ws = next > k + 1 && next < compute[r].size() && compute[r][next].kind == Kind::forward;
      if (pending_send && !forward_after_ws) {
        list.push_back(*pending_send);
        pending_send.reset();
      }
    }
  }
  return s;
}

std::vector<int> peak_in_flight(const Schedule& schedule) {
  std::vector<int> peaks;
  for (const auto& list : schedule.ranks) {
    std::set<std::pair<int, int>> live;
    int peak = 0;
    for (const Action& a : list) {
      if (a.kind == Kind::forward) live.insert({a.micro, a.chunk});
      if (a.kind == (schedule.split_backward() ? Kind::weight : Kind::backward)) live.erase({a.micro, a.chunk});
      peak = std::max(peak, static_cast<int>(live.size()));
    }
    peaks.push_back(peak);
  }
  return peaks;
}

double bubble_formula(ScheduleKind kind, int p, int m, int v) {
  if (kind == ScheduleKind::naive) return static_cast<double>(p - 1) / p;  // one micro-batch in flight
  // ZB-H1 with F = B = W: each rank idles p-1 passes of 3m + p-1 (1F1B: p-1 of F+B+W per pass).
  if (kind == ScheduleKind::zero_bubble) return static_cast<double>(p - 1) / (3 * m + p - 1);
  const int work = kind == ScheduleKind::interleaved ? v * m : m;
  return static_cast<double>(p - 1) / (work + p - 1);
}

}  // namespace sl::parallel
