// topology.h — a cluster described in a few numbers, so that a laptop can pretend to be one.
//
//   Real clusters have two kinds of wire. Inside a node GPUs talk over NVLink (hundreds of GB/s, a
//   microsecond to start); between nodes over InfiniBand or Ethernet (tens of GB/s, several
//   microseconds), or over PCIe in a cheap box (16 GB/s). Ranks are placed on nodes in order: with
//   4 GPUs per node, ranks 0-3 are node 0, 4-7 node 1, ... (the mesh puts TP innermost, so a tp
//   group of 4 shares a node and a pp group spans nodes).
//
//       node 0                       node 1
//     ┌───────────────────────┐    ┌───────────────────────┐
//     │ r0 ═ r1 ═ r2 ═ r3     │────│ r4 ═ r5 ═ r6 ═ r7     │     ═ intra: 300 GB/s, 1 µs
//     └───────────────────────┘    └───────────────────────┘     ─ inter:  25 GB/s, 5 µs
//
//   A message of b bytes from rank a to rank c costs   latency + b / bandwidth   of the link between
//   their nodes (the alpha-beta model). A ring step moves one chunk over every hop at once, so it
//   lasts as long as its slowest hop: a ring that crosses nodes runs at the inter-node speed.
//
//   The threads backend charges every message this way when a launch has a topology (LaunchOptions::
//   topology, train's --links or --topology): a receiver reads a message no earlier than the time it
//   would have arrived, and the group's ledger counts the charged time (CommLedger::link_seconds). The
//   bytes, the results and the order of everything are unchanged; compute stays real. Links are not
//   shared: two groups talking at once each get the full link (a real NIC would be split).
//
//   Written as a spec string (train --links, plan --links):
//       intra=300GB/s,1us;inter=25GB/s,5us;gpus-per-node=4
//   An explicit placement (placement=0,1,0,1: rank r sits on node placement[r]) replaces the order,
//   to show what a bad one costs (lesson 15 puts a tp pair on two nodes).
//   or a JSON file (train --topology, plan --cluster; keys other than these are the planner's):
//       {"gpus_per_node": 4, "intra": {"bandwidth": "300GB/s", "latency": "1us"},
//                            "inter": {"bandwidth": "25GB/s",  "latency": "5us"}}
//   Units: B/s KB/s MB/s GB/s TB/s (powers of 1000), KiB/s MiB/s GiB/s, Gbit/s Mbit/s; s ms us ns.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sl::parallel {

struct Link {
  double bytes_per_s = 0;  // 0: infinitely fast
  double latency_s = 0;
  double seconds(int64_t bytes) const;  // latency + bytes / bandwidth
  std::string str() const;              // "25 GB/s, 5 us"
  bool operator==(const Link&) const = default;
};

struct Topology {
  int gpus_per_node = 0;  // 0: links off (every message is free, as without a topology)
  Link intra, inter;
  std::vector<int> placement;  // empty: rank r on node r / gpus_per_node; else node placement[r]

  bool enabled() const { return gpus_per_node > 0; }
  int node_of(int world_rank) const;
  // Throws sl::Error unless a placement, if any, names a node for each of `world_size` ranks.
  void check_world(int world_size) const;
  const Link& link(int world_rank_a, int world_rank_b) const;
  // One ring step over `members` (world ranks in ring order), every hop carrying `bytes`: its slowest hop.
  double ring_step_seconds(const std::vector<int>& members, int64_t bytes) const;
  // Does the group span more than one node?
  bool crosses_nodes(const std::vector<int>& members) const;

  // "intra=300GB/s,1us;inter=25GB/s,5us;gpus-per-node=4" (either link may be left out: then it is
  // free). Throws sl::Error naming the piece it cannot read.
  static Topology parse_links(const std::string& spec);
  static Topology from_json_text(const std::string& text, const std::string& where = "topology");
  static Topology load(const std::string& path);  // a JSON file as above
  std::string str() const;                        // the spec form, parse_links(str()) == *this
  bool operator==(const Topology&) const = default;
};

// "300GB/s" -> 3e11 bytes per second; "5us" -> 5e-6 seconds; "80GB" -> 8e10 bytes; "312TFLOP/s" -> 3.12e14.
// Throw sl::Error naming `what` and the text.
double parse_bandwidth(const std::string& text, const std::string& what);
double parse_duration(const std::string& text, const std::string& what);
double parse_bytes(const std::string& text, const std::string& what);
double parse_flops(const std::string& text, const std::string& what);

}  // namespace sl::parallel
