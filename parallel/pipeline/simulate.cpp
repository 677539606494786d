// simulate.cpp — see simulate.h: the validator and the rendezvous simulator.
#include "parallel/pipeline/simulate.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "parallel/pipeline/stage.h"
#include "tensor/error.h"

namespace sl::parallel {

using Kind = Action::Kind;

namespace {
// A message end: (from, to, k) with k counting the messages from `from` to `to` in list order.
using Message = std::tuple<int, int, int>;

// Each rank's list cut into steps: one compute action, or one batch of consecutive send/recv actions.
struct Step {
  bool compute = false;
  std::vector<size_t> actions;  // indices into the rank's list
};

std::vector<Step> steps_of(const std::vector<Action>& list) {
  std::vector<Step> steps;
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].is_compute() || steps.empty() || steps.back().compute) steps.push_back({list[i].is_compute(), {}});
    steps.back().actions.push_back(i);
  }
  return steps;
}

// The message each send/recv is, numbered in issue order per (from, to).
std::vector<std::vector<Message>> number_messages(const Schedule& s) {
  std::vector<std::vector<Message>> ids(s.ranks.size());
  std::map<std::pair<int, int>, int> sent, received;
  for (size_t r = 0; r < s.ranks.size(); ++r)
    for (const Action& a : s.ranks[r]) {
      const int me = static_cast<int>(r);
      if (a.is_compute()) ids[r].push_back({-1, -1, -1});
      else if (a.is_send()) ids[r].push_back({me, a.peer, sent[{me, a.peer}]++});
      else ids[r].push_back({a.peer, me, received[{a.peer, me}]++});
    }
  return ids;
}
}  // namespace

void validate(const Schedule& s) {
  const int p = s.stages, m = s.micro_batches, chunks = s.chunks();
  SL_CHECK(static_cast<int>(s.ranks.size()) == p, "schedule: ", s.ranks.size(), " action lists for ", p, " stages");
  // Per pair of ranks, the tags of the sends and of the receives, in issue order.
  std::map<std::pair<int, int>, std::vector<const Action*>> sends, recvs;
  for (int r = 0; r < p; ++r) {
    std::map<std::pair<int, int>, int> forward_at, backward_at, weight_at;  // (micro, chunk) -> position
    const auto& list = s.ranks[r];
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Action& a = list[i];
      SL_CHECK(a.micro >= 0 && a.micro < m && a.chunk >= 0 && a.chunk < chunks, "schedule: rank ", r, " action ",
               a.str(), " is outside ", m, " micro-batches x ", chunks, " chunks");
      if (a.is_compute()) {
        SL_CHECK(chunk_rank(a.chunk, p) == r, "schedule: rank ", r, " runs ", a.str(), " but chunk ", a.chunk,
                 " lives on rank ", chunk_rank(a.chunk, p));
        auto& seen = a.kind == Kind::forward ? forward_at : a.kind == Kind::backward ? backward_at : weight_at;
        SL_CHECK(!seen.count({a.micro, a.chunk}), "schedule: rank ", r, " runs ", a.str(), " twice");
        seen[{a.micro, a.chunk}] = i;
        if (a.kind == Kind::weight) {
          SL_CHECK(s.split_backward(), "schedule: rank ", r, " runs ", a.str(), " but ", schedule_name(s.kind),
                   " does not split the backward (W belongs to zero-bubble)");
          SL_CHECK(backward_at.count({a.micro, a.chunk}), "schedule: rank ", r, " runs ", a.str(),
                   " before its input-gradient backward B", a.micro, ".", a.chunk, " (W uses what B left)");
        }
        if (a.kind == Kind::backward)
          SL_CHECK(forward_at.count({a.micro, a.chunk}), "schedule: rank ", r, " runs ", a.str(),
                   " before its forward F", a.micro, ".", a.chunk);
        continue;
      }
      SL_CHECK(a.peer >= 0 && a.peer < p && a.peer != r, "schedule: rank ", r, " action ", a.str(), " has no valid peer");
      (a.is_send() ? sends[{r, a.peer}] : recvs[{a.peer, r}]).push_back(&a);
    }
    // Each send after the compute that made its tensor, each receive before the one that needs it.
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Action& a = list[i];
      auto position = [&](const std::map<std::pair<int, int>, int>& at, int micro, int chunk) {
        auto it = at.find({micro, chunk});
        return it == at.end() ? -1 : it->second;
      };
      int producer = -2, consumer = -2;
      if (a.kind == Kind::send_activation) producer = position(forward_at, a.micro, a.chunk);
      if (a.kind == Kind::send_grad) producer = position(backward_at, a.micro, a.chunk);
      if (a.kind == Kind::recv_activation) consumer = position(forward_at, a.micro, a.chunk + 1);
      if (a.kind == Kind::recv_grad) consumer = position(backward_at, a.micro, a.chunk - 1);
      SL_CHECK(producer == -2 || (producer >= 0 && producer < i), "schedule: rank ", r, " ", a.str(),
               " comes before the compute that makes it (or that compute is missing)");
      SL_CHECK(consumer == -2 || consumer > i, "schedule: rank ", r, " ", a.str(),
               " comes after the compute that needs it (or that compute is missing)");
    }
    for (int c = r; c < chunks; c += p)
      for (int micro = 0; micro < m; ++micro)
      {
        SL_CHECK(forward_at.count({micro, c}) && backward_at.count({micro, c}), "schedule: rank ", r,
                 " never runs F or B of micro-batch ", micro, " on chunk ", c);
        SL_CHECK(!s.split_backward() || weight_at.count({micro, c}), "schedule: rank ", r,
                 " never runs W of micro-batch ", micro, " on chunk ", c, ": its weight gradient would be lost");
      }
  }
  for (const auto& [pair, list] : sends) {
    const auto& other = recvs[pair];
    SL_CHECK(list.size() == other.size(), "schedule: rank ", pair.first, " sends ", list.size(), " messages to rank ",
             pair.second, ", which receives ", other.size());
    for (size_t k = 0; k < list.size(); ++k)
      SL_CHECK(list[k]->tag() == other[k]->tag() && (list[k]->kind == Kind::send_activation) ==
                                                        (other[k]->kind == Kind::recv_activation),
               "schedule: message ", k, " from rank ", pair.first, " to rank ", pair.second, " is sent as '",
               list[k]->str(), "' but received as '", other[k]->str(), "' (the k-th send meets the k-th receive)");
  }
  for (const auto& [pair, list] : recvs)
    SL_CHECK(sends.count(pair) || list.empty(), "schedule: rank ", pair.second, " receives ", list.size(),
             " messages from rank ", pair.first, ", which sends none");
}

Simulation simulate(const Schedule& s, const Costs& costs) {
  const int p = s.stages;
  const auto ids = number_messages(s);
  std::vector<std::vector<Step>> steps(p);
  for (int r = 0; r < p; ++r) steps[r] = steps_of(s.ranks[r]);
  std::vector<size_t> at(p, 0);       // the step each rank is at
  std::vector<double> clock(p, 0);    // its time
  std::vector<bool> posted(p, false); // whether its current batch is posted
  std::map<std::pair<Message, bool>, double> post_time;  // (message, is_send) -> when its end was posted
  Simulation sim;
  sim.timeline.ranks.resize(p);
  sim.timeline.micro_batches = s.micro_batches;
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      while (at[r] < steps[r].size()) {
        const Step& step = steps[r][at[r]];
        if (step.compute) {
          const Action& a = s.ranks[r][step.actions[0]];
          const double start = clock[r];
          TimelineEvent::Kind kind = TimelineEvent::Kind::forward;
          if (a.kind == Kind::forward) clock[r] += costs.forward;
          if (a.kind == Kind::backward) {
            kind = TimelineEvent::Kind::backward;
            clock[r] += s.split_backward() ? costs.backward - costs.weight : costs.backward;
          }
          if (a.kind == Kind::weight) {
            kind = TimelineEvent::Kind::weight;
            clock[r] += costs.weight;
          }
          sim.timeline.ranks[r].push_back({kind, a.micro, a.chunk, start, clock[r]});
          ++at[r];
          moved = true;
          continue;
        }
        if (!posted[r]) {  // post every op of the batch at once
          for (size_t i : step.actions) post_time[{ids[r][i], s.ranks[r][i].is_send()}] = clock[r];
          posted[r] = true;
          moved = true;
        }
        double done = clock[r];
        bool complete = true;
        for (size_t i : step.actions) {
          auto other = post_time.find({ids[r][i], !s.ranks[r][i].is_send()});
          if (other == post_time.end()) complete = false;
          else done = std::max(done, other->second);
        }
        if (!complete) break;
        sim.timeline.ranks[r].push_back({TimelineEvent::Kind::comm, -1, -1, clock[r], done});
        clock[r] = done;
        posted[r] = false;
        ++at[r];
        moved = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    if (at[r] == steps[r].size()) continue;
    sim.deadlocked = true;
    sim.stuck += (sim.stuck.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " waits in {";
    for (size_t k = 0; k < steps[r][at[r]].actions.size(); ++k)
      sim.stuck += (k ? ", " : "") + s.ranks[r][steps[r][at[r]].actions[k]].str();
    sim.stuck += "}";
  }
  return sim;
}

void check(const Schedule& s) {
  validate(s);
  const Simulation sim = simulate(s);
  SL_CHECK(!sim.deadlocked, "schedule ", schedule_name(s.kind), " (p ", s.stages, ", m ", s.micro_batches, ", v ",
           s.virtual_stages, ") deadlocks: ", sim.stuck);
}

}  // namespace sl::parallel
