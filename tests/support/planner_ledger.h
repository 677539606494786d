// planner_ledger.h — the planner's traffic (parallel/planner/cost_model.h: estimate_traffic) against
// a Trainer's ledgers, for tests/parallel/planner/test_planner_ledger*.cpp:
//   snapshot(trainer, model)              each distinct ledger's counts per op, under the trainer's
//                                         first name for it, plus the mesh's group of every "a+b" set
//                                         the model names
//   counted_as(trainer, model)            the ledger name a model group named after one mesh dim is
//                                         counted under (the trainer's first name for its ledger)
//   expect_traffic(before, after, model)  every group and op: calls and bytes of the step between the
//                                         snapshots equal the model's; a group the model has and the
//                                         trainer does not name fails
#pragma once
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "parallel/planner/cost_model.h"
#include "parallel/train/trainer.h"

namespace sl::parallel::planner {

using Counts = std::map<std::pair<std::string, CommOp>, CommStats>;

// "pp+tp" -> {pp, tp}: the dims of a group the cost model names by joining them, read back from the text.
inline MeshDims dims_of(const std::string& joined) {
  MeshDims dims;
  for (size_t begin = 0, end = 0; end != std::string::npos; begin = end + 1) {
    end = joined.find('+', begin);
    dims.push_back(mesh_dim_from_name(joined.substr(begin, end == std::string::npos ? std::string::npos : end - begin)));
  }
  return dims;
}

// The groups the model names after one mesh dim: each counted under the trainer's first name for its
// mesh group's ledger when it shares one ("dp" when ep is every data-parallel rank; "dp_replicate"
// for expert_dp_cp when dp_shard and cp are 1), else under its own (the trainer lists no "ep").
inline std::map<std::string, std::string> counted_as(const Trainer& trainer, const std::vector<GroupTraffic>& model) {
  const std::vector<std::pair<std::string, const CommLedger*>> named = trainer.ledgers();
  std::map<std::string, std::string> out;
  for (const GroupTraffic& t : model) {
    if (t.dims.size() != 1 || t.group != name(t.dims) || out.count(t.group)) continue;
    out[t.group] = t.group;
    const CommLedger* ledger = &trainer.mesh().group(t.dims)->ledger();
    for (auto it = named.rbegin(); it != named.rend(); ++it)
      if (it->second == ledger) out[t.group] = it->first;  // the first name for that ledger
  }
  return out;
}

// Every distinct ledger once, under the trainer's first name for it; then the mesh's group over the
// dims of each group the model names with a "+" (the trainer names none such), unless its ledger is
// one of the trainer's: the model should have used the trainer's name then, which expect_traffic
// reports as a group the trainer does not name.
inline Counts snapshot(const Trainer& trainer, const std::vector<GroupTraffic>& model) {
  std::vector<std::pair<std::string, const CommLedger*>> ledgers = trainer.ledgers();
  for (const GroupTraffic& t : model)
    if (t.group.find('+') != std::string::npos)
      ledgers.emplace_back(t.group, &trainer.mesh().group(dims_of(t.group))->ledger());
  for (const auto& [own, counted] : counted_as(trainer, model))
    if (own == counted) ledgers.emplace_back(own, &trainer.mesh().group(dims_of(own))->ledger());
  Counts out;
  std::set<const CommLedger*> seen;
  for (const auto& [name, ledger] : ledgers) {
    if (!seen.insert(ledger).second) continue;
    for (int op = 0; op < static_cast<int>(CommOp::count_); ++op)
      out[{name, static_cast<CommOp>(op)}] = (*ledger)[static_cast<CommOp>(op)];
  }
  return out;
}

// `counted`: counted_as's names for the groups the trainer does not list (none: each model name as is).
inline void expect_traffic(const Counts& before, const Counts& after, const std::vector<GroupTraffic>& model, int rank,
                           const std::map<std::string, std::string>& counted = {}) {
  Counts expected;
  for (const GroupTraffic& t : model) {
    CommStats& e = expected[{counted.count(t.group) ? counted.at(t.group) : t.group, t.op}];
    e.calls += t.calls;
    e.bytes_sent += t.bytes_sent;
    e.bytes_received += t.bytes_received;
  }
  for (const auto& [key, now] : after) {
    const CommStats was = before.count(key) ? before.at(key) : CommStats{};
    const CommStats want = expected.count(key) ? expected.at(key) : CommStats{};
    const std::string where = "rank " + std::to_string(rank) + " group " + key.first + " " + comm_op_name(key.second);
    EXPECT_EQ(now.calls - was.calls, want.calls) << where << ": calls";
    EXPECT_EQ(now.bytes_sent - was.bytes_sent, want.bytes_sent) << where << ": bytes sent";
    EXPECT_EQ(now.bytes_received - was.bytes_received, want.bytes_received) << where << ": bytes received";
    expected.erase(key);
  }
  for (const auto& [key, want] : expected)
    EXPECT_EQ(want.calls, 0) << "rank " << rank << ": the cost model has group " << key.first << " "
                             << comm_op_name(key.second) << ", which the trainer does not name";
}

}  // namespace sl::parallel::planner
