// topology.cpp — links, their units, and the two ways to write a cluster down (topology.h).
#include "parallel/comm/topology.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tensor/error.h"

namespace sl::parallel {

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// "300GB/s" -> {300, "GB/s"}; throws naming `what` if there is no number or it is negative.
std::pair<double, std::string> number_and_unit(const std::string& text, const std::string& what) {
  std::string t = trim(text);
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(t, &used);
  } catch (const std::exception&) {
    throw Error(what + ": '" + text + "' does not start with a number");
  }
  SL_CHECK(std::isfinite(value) && value >= 0, what, ": '", text, "' must be a finite number >= 0");
  return {value, trim(t.substr(used))};
}

double scaled(const std::string& text, const std::string& what, const std::string& suffix, double base_unit) {
  auto [value, unit] = number_and_unit(text, what);
  struct Prefix {
    const char* name;
    double factor;
  };
  static constexpr Prefix prefixes[] = {{"", 1},      {"K", 1e3},           {"M", 1e6},           {"G", 1e9},
                                        {"T", 1e12},  {"P", 1e15},          {"Ki", 1024.0},       {"Mi", 1048576.0},
                                        {"Gi", 1073741824.0}, {"Ti", 1099511627776.0}};
  for (const Prefix& p : prefixes)
    if (unit == std::string(p.name) + suffix) return value * p.factor * base_unit;
  throw Error(what + ": unknown unit in '" + text + "' (want a number and " + suffix + ", with K, M, G, T, Ki, Mi, Gi)");
}

}  // namespace

double parse_bandwidth(const std::string& text, const std::string& what) {
  auto [value, unit] = number_and_unit(text, what);
  if (unit.size() >= 5 && unit.substr(unit.size() - 5) == "bit/s") return scaled(text, what, "bit/s", 1.0 / 8);
  return scaled(text, what, "B/s", 1);
}

double parse_bytes(const std::string& text, const std::string& what) { return scaled(text, what, "B", 1); }

double parse_flops(const std::string& text, const std::string& what) { return scaled(text, what, "FLOP/s", 1); }

double parse_duration(const std::string& text, const std::string& what) {
  auto [value, unit] = number_and_unit(text, what);
  if (unit == "s") return value;
  if (unit == "ms") return value * 1e-3;
  if (unit == "us") return value * 1e-6;
  if (unit == "ns") return value * 1e-9;
  throw Error(what + ": unknown unit in '" + text + "' (want s, ms, us or ns)");
}

double Link::seconds(int64_t bytes) const {
  return latency_s + (bytes_per_s > 0 ? static_cast<double>(bytes) / bytes_per_s : 0.0);
}

static std::string number(double v, int digits = 6) {
  std::ostringstream out;
  out.precision(digits);
  out << v;
  return out.str();
}

std::string Link::str() const {
  return number(bytes_per_s / 1e9) + " GB/s, " + number(latency_s * 1e6) + " us";
}

int Topology::node_of(int world_rank) const {
  if (!enabled()) return 0;
  if (!placement.empty()) return placement.at(static_cast<size_t>(world_rank));
  return world_rank / gpus_per_node;
}

void Topology::check_world(int world_size) const {
  SL_CHECK(placement.empty() || static_cast<int>(placement.size()) == world_size, "links: the placement names ",
           placement.size(), " ranks' nodes but the world has ", world_size, " ranks");
}

const Link& Topology::link(int a, int b) const { return node_of(a) == node_of(b) ? intra : inter; }

bool Topology::crosses_nodes(const std::vector<int>& members) const {
  return std::any_of(members.begin(), members.end(), [&](int m) { return node_of(m) != node_of(members.front()); });
}

double Topology::ring_step_seconds(const std::vector<int>& members, int64_t bytes) const {
  double slowest = 0;
  for (size_t i = 0; i < members.size() && members.size() > 1; ++i)
    slowest = std::max(slowest, link(members[i], members[(i + 1) % members.size()]).seconds(bytes));
  return slowest;
}

static Link parse_link(const std::string& value, const std::string& what) {
  size_t comma = value.find(',');
  SL_CHECK(comma != std::string::npos, what, ": '", value, "' must be BANDWIDTH,LATENCY (e.g. 25GB/s,5us)");
  return {parse_bandwidth(value.substr(0, comma), what + " bandwidth"),
          parse_duration(value.substr(comma + 1), what + " latency")};
}

Topology Topology::parse_links(const std::string& spec) {
  Topology t;
  bool have_gpus = false;
  std::stringstream pieces(spec);
  for (std::string piece; std::getline(pieces, piece, ';');) {
    piece = trim(piece);
    if (piece.empty()) continue;
    size_t eq = piece.find('=');
    SL_CHECK(eq != std::string::npos, "--links: '", piece, "' is not KEY=VALUE (keys: intra, inter, gpus-per-node)");
    std::string key = trim(piece.substr(0, eq)), value = trim(piece.substr(eq + 1));
    if (key == "intra") {
      t.intra = parse_link(value, "--links intra");
    } else if (key == "inter") {
      t.inter = parse_link(value, "--links inter");
    } else if (key == "placement") {
      std::stringstream nodes(value);
      for (std::string node; std::getline(nodes, node, ',');) {
        auto [n, unit] = number_and_unit(node, "--links placement");
        SL_CHECK(unit.empty() && n == std::floor(n) && n < 1e6, "--links: placement wants node numbers like 0,1,0,1, got '",
                 value, "'");
        t.placement.push_back(static_cast<int>(n));
      }
    } else if (key == "gpus-per-node") {
      auto [n, unit] = number_and_unit(value, "--links gpus-per-node");
      SL_CHECK(unit.empty() && n >= 1 && n == std::floor(n) && n < 1e6, "--links: gpus-per-node must be a whole number >= 1, got '",
               value, "'");
      t.gpus_per_node = static_cast<int>(n);
      have_gpus = true;
    } else {
      throw Error("--links: unknown key '" + key + "' in '" + spec + "' (keys: intra, inter, gpus-per-node, placement)");
    }
  }
  SL_CHECK(have_gpus, "--links '", spec, "' must say gpus-per-node=N (which ranks share a node)");
  return t;
}

static Link json_link(const nlohmann::json& j, const std::string& what) {
  SL_CHECK(j.is_object(), what, " must be an object with bandwidth and latency");
  Link link;
  auto read = [&](const char* key, auto parse) -> double {
    if (!j.contains(key)) return 0.0;
    const auto& v = j.at(key);
    if (v.is_number()) {
      double x = v.get<double>();
      SL_CHECK(std::isfinite(x) && x >= 0, what, ".", key, " must be >= 0, got ", x);
      return x;
    }
    SL_CHECK(v.is_string(), what, ".", key, " must be a number or a string such as \"25GB/s\" / \"5us\"");
    return parse(v.get<std::string>(), what + "." + key);
  };
  link.bytes_per_s = read("bandwidth", parse_bandwidth);
  link.latency_s = read("latency", parse_duration);
  return link;
}

Topology Topology::from_json_text(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": not JSON (" + e.what() + ")");
  }
  SL_CHECK(j.is_object(), where, ": want an object with gpus_per_node, intra and inter");
  Topology t;
  SL_CHECK(j.contains("gpus_per_node") && j.at("gpus_per_node").is_number_integer() &&
               j.at("gpus_per_node").get<int64_t>() >= 1 && j.at("gpus_per_node").get<int64_t>() < 1000000,
           where, ": gpus_per_node must be a whole number >= 1");
  t.gpus_per_node = j.at("gpus_per_node").get<int>();
  if (j.contains("intra")) t.intra = json_link(j.at("intra"), where + ": intra");
  if (j.contains("inter")) t.inter = json_link(j.at("inter"), where + ": inter");
  if (j.contains("placement")) {
    SL_CHECK(j.at("placement").is_array(), where, ": placement must be a list of node numbers, one per rank");
    for (const auto& node : j.at("placement")) {
      SL_CHECK(node.is_number_integer() && node.get<int64_t>() >= 0 && node.get<int64_t>() < 1000000, where,
               ": placement must hold node numbers >= 0, got ", node.dump());
      t.placement.push_back(node.get<int>());
    }
  }
  return t;
}

Topology Topology::load(const std::string& path) {
  std::ifstream in(path);
  SL_CHECK(in.good(), "topology file ", path, " cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  return from_json_text(text.str(), path);
}

std::string Topology::str() const {
  if (!enabled()) return "off";
  auto link_spec = [](const Link& l) { return number(l.bytes_per_s, 17) + "B/s," + number(l.latency_s, 17) + "s"; };
  std::string out =
      "intra=" + link_spec(intra) + ";inter=" + link_spec(inter) + ";gpus-per-node=" + std::to_string(gpus_per_node);
  for (size_t r = 0; r < placement.size(); ++r) out += (r ? "," : ";placement=") + std::to_string(placement[r]);
  return out;
}

}  // namespace sl::parallel
