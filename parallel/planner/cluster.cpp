// cluster.cpp — see cluster.h.
#include "parallel/planner/cluster.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tensor/error.h"

namespace sl::parallel::planner {

void Cluster::validate() const {
  SL_CHECK(nodes >= 1, "cluster: nodes must be >= 1 (got ", nodes, ")");
  SL_CHECK(topology.gpus_per_node >= 1, "cluster: gpus per node must be >= 1 (got ", topology.gpus_per_node, ")");
  SL_CHECK(gpu_memory_bytes > 0, "cluster: GPU memory must be > 0 bytes (got ", gpu_memory_bytes, ")");
  SL_CHECK(flops > 0, "cluster: FLOP/s per GPU must be > 0 (got ", flops, ")");
  SL_CHECK(static_cast<double>(nodes) * topology.gpus_per_node <= (1 << 20), "cluster: ", nodes, " nodes x ",
           topology.gpus_per_node, " GPUs is more than 1048576 GPUs");
}

std::string Cluster::str() const {
  std::ostringstream out;
  out << nodes << " node" << (nodes == 1 ? "" : "s") << " x " << gpus_per_node() << " GPUs, "
      << gpu_memory_bytes / 1e9 << " GB, " << flops / 1e12 << " TFLOP/s; intra " << topology.intra.str() << "; inter "
      << topology.inter.str();
  return out.str();
}

Cluster Cluster::from_json_text(const std::string& text, const std::string& where) {
  Cluster cluster;
  cluster.topology = Topology::from_json_text(text, where);  // gpus_per_node, intra, inter
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": not JSON (" + e.what() + ")");
  }
  auto text_of = [&](const char* key) -> std::string {
    SL_CHECK(doc.contains(key), where, ": needs \"", key, "\" (e.g. \"nodes\": 4, \"gpu_memory\": \"80GB\", ",
             "\"flops\": \"312TFLOP/s\")");
    const nlohmann::json& v = doc[key];
    SL_CHECK(v.is_string() || v.is_number(), where, ": \"", key, "\" must be a string or a number (got ", v.dump(),
             ")");
    return v.is_string() ? v.get<std::string>() : v.dump();
  };
  const nlohmann::json nodes = doc.value("nodes", nlohmann::json(1));
  SL_CHECK(nodes.is_number_integer() && nodes.get<int64_t>() >= 1 && nodes.get<int64_t>() <= (1 << 20), where,
           ": \"nodes\" must be an integer in 1..1048576 (got ", nodes.dump(), ")");
  cluster.nodes = static_cast<int>(nodes.get<int64_t>());
  cluster.gpu_memory_bytes = parse_bytes(text_of("gpu_memory"), where + " gpu_memory");
  cluster.flops = parse_flops(text_of("flops"), where + " flops");
  cluster.validate();
  return cluster;
}

Cluster Cluster::load(const std::string& path) {
  std::ifstream in(path);
  SL_CHECK(in.good(), "--cluster: cannot read '", path, "'");
  std::stringstream text;
  text << in.rdbuf();
  return from_json_text(text.str(), path);
}

}  // namespace sl::parallel::planner
