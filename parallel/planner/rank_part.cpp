// rank_part.cpp — see rank_part.h: a rank's parameters, buckets and ring bytes, from shapes alone.
#include "parallel/planner/rank_part.h"

#include <algorithm>
#include <numeric>

#include "tensor/error.h"

namespace sl::parallel::planner {

int64_t bytes_of(DType dtype) { return static_cast<int64_t>(dtype_size(dtype)); }

int64_t RankPart::numel() const {
  int64_t total = 0;
  for (const ParamShape& p : params) total += p.numel;
  return total;
}

std::array<int, kGridDimCount> mesh_coordinates(const ParallelismConfig& config, int rank) {
  const std::array<int, kGridDimCount> degrees = config.degrees();  // pp, dp_replicate, dp_shard, cp, tp
  std::array<int, kGridDimCount> coords{};
  for (int d = kGridDimCount - 1; d >= 0; --d) {
    coords[d] = rank % degrees[d];
    rank /= degrees[d];
  }
  return coords;
}

namespace {

// The layer counts of the p·v chunks (pipeline/stage.h's split_layers rule: balanced by count, the
// first n_layer % chunks chunks one more, or --stage-layers as given).
std::vector<int64_t> chunk_layer_counts(int64_t n_layer, int chunks, const std::vector<int>& given) {
  std::vector<int64_t> counts(given.begin(), given.end());
  if (counts.empty())
    for (int c = 0; c < chunks; ++c) counts.push_back(n_layer / chunks + (c < n_layer % chunks ? 1 : 0));
  return counts;
}

// A block's twelve parameters under a tp cut of t: [3C/t, C] rows of c_attn, [C, C/t] columns of
// c_proj (its bias whole), [4C/t, C] rows of c_fc, [C, 4C/t] columns of mlp.c_proj (bias whole).
// An MoE block's MLP is not cut by tp (parallel/tensor_parallel/parallel_block.h): the router [E, C]
// whole, then `count` whole experts of width F, stacked (this ep rank's routed ones, or the shared ones).
void add_block(std::vector<ParamShape>& out, int64_t layer, const ModelShape& m, int64_t t, bool sp, int ep) {
  const int64_t C = m.n_embd;
  const std::string h = "h." + std::to_string(layer) + ".";
  auto add = [&](const std::string& name, int64_t numel, bool matrix, bool partial, bool sharded, bool expert = false) {
    out.push_back({h + name, numel, matrix, false, partial && sp && t > 1, sharded && t > 1, expert});
  };
  add("ln_1.weight", C, false, true, false);
  add("ln_1.bias", C, false, true, false);
  add("attn.c_attn.weight", 3 * C / t * C, true, false, true);
  add("attn.c_attn.bias", 3 * C / t, false, false, true);
  add("attn.c_proj.weight", C * (C / t), true, false, true);
  add("attn.c_proj.bias", C, false, true, false);
  add("ln_2.weight", C, false, true, false);
  add("ln_2.bias", C, false, true, false);
  if (!m.moe_layer(layer)) {
    add("mlp.c_fc.weight", 4 * C / t * C, true, false, true);
    add("mlp.c_fc.bias", 4 * C / t, false, false, true);
    add("mlp.c_proj.weight", C * (4 * C / t), true, false, true);
    add("mlp.c_proj.bias", C, false, true, false);
    return;
  }
  const int64_t F = m.expert_width();
  auto experts = [&](const std::string& name, int64_t count, bool routed) {
    if (count == 0) return;
    const bool expert = routed && ep > 1;  // placed on one ep rank; at ep 1 an ordinary replicated weight
    add("mlp." + name + ".c_fc.weight", count * F * C, true, false, false, expert);
    add("mlp." + name + ".c_fc.bias", count * F, false, false, false, expert);
    add("mlp." + name + ".c_proj.weight", count * C * F, true, false, false, expert);
    add("mlp." + name + ".c_proj.bias", count * C, false, false, false, expert);
  };
  add("mlp.router.weight", m.moe_experts * C, true, false, false);
  experts("shared_experts", m.shared_experts, false);
  experts("experts", m.moe_experts / ep, true);
}

// FSDP's units (parallel/zero/fsdp.cpp): the whole model's root {wte, wpe, ln_f}; a part's wte
// alone, then root {wpe} or {ln_f}; then one unit per block. An ep rank's experts join no unit: they
// stay whole (parallel/zero/expert_replicas.h).
void add_units(RankPart& part, bool whole) {
  auto unit_of = [&](const std::string& name, const std::vector<std::string>& prefixes) {
    UnitShape unit{name, {}, 0};
    for (size_t i = 0; i < part.params.size(); ++i)
      for (const std::string& prefix : prefixes)
        if (part.params[i].name.rfind(prefix, 0) == 0 && !part.params[i].expert) {
          unit.params.push_back(i);
          unit.numel += part.params[i].numel;
        }
    if (!unit.params.empty()) part.units.push_back(unit);
  };
  if (whole) {
    unit_of("root", {"wte.", "wpe.", "ln_f."});
  } else {
    unit_of("wte", {"wte."});
    unit_of("root", {"wpe.", "ln_f."});
  }
  for (int64_t layer : part.layers) {
    const std::string h = "h." + std::to_string(layer);
    unit_of(h, {h + "."});
  }
}

}  // namespace

RankPart rank_part(const ModelShape& model, const TrainPlan& plan, int rank) {
  const ParallelismConfig& c = plan.parallelism;
  const std::array<int, kGridDimCount> coords = mesh_coordinates(c, rank);
  const int pp = c.pp, stage = coords[grid_index(MeshDim::pp)], v = pp > 1 ? plan.virtual_stages : 1;
  const int64_t C = model.n_embd, t = c.tp, L = model.n_layer;
  const bool sp = plan.sequence_parallel;
  RankPart part;
  part.chunks = v;
  part.first_stage = stage == 0;
  part.last_stage = stage == pp - 1;
  const std::vector<int64_t> counts = chunk_layer_counts(L, pp * v, pp > 1 ? plan.stage_layers : std::vector<int>{});
  std::vector<int64_t> starts(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), starts.begin() + 1);
  for (int local = 0; local < v; ++local) {
    const int chunk = local * pp + stage;  // chunk_rank(chunk) = chunk % p
    for (int64_t layer = starts[chunk]; layer < starts[chunk + 1]; ++layer) part.layers.push_back(layer);
  }
  std::sort(part.layers.begin(), part.layers.end());
  const int64_t vocab_rows = (model.vocab_size + t - 1) / t;  // Vp / t
  // StageModule's order: wte, wpe, the blocks, ln_f (the last stage's wte is the head's tied copy).
  if (part.first_stage || part.last_stage)
    part.params.push_back({"wte.weight", vocab_rows * C, true, !part.first_stage, false, t > 1});
  if (part.first_stage) part.params.push_back({"wpe.weight", model.block_size * C, true, false, false, false});
  for (int64_t layer : part.layers) add_block(part.params, layer, model, t, sp, c.ep);
  if (part.last_stage) {
    part.params.push_back({"ln_f.weight", C, false, false, sp && t > 1, false});
    part.params.push_back({"ln_f.bias", C, false, false, sp && t > 1, false});
  }
  add_units(part, pp == 1);  // FullyShardedGPT on a whole model (tp/cp cuts keep every layer): one root
  return part;
}

std::vector<size_t> params_where(const RankPart& part, bool expert) {
  std::vector<size_t> out;
  for (size_t i = 0; i < part.params.size(); ++i)
    if (part.params[i].expert == expert) out.push_back(i);
  return out;
}

std::vector<std::vector<size_t>> reverse_buckets(const std::vector<int64_t>& bytes_per_param, int64_t bucket_bytes) {
  std::vector<std::vector<size_t>> buckets(1);
  int64_t bytes = 0;
  for (size_t k = bytes_per_param.size(); k-- > 0;) {
    if (bytes >= bucket_bytes) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(k);
    bytes += bytes_per_param[k];
  }
  return buckets;
}

std::vector<FlatBucketShape> flat_buckets(const RankPart& part, const std::vector<size_t>& params, int world,
                                          int64_t bucket_bytes, int64_t element_bytes, bool one_bucket) {
  std::vector<std::vector<size_t>> members;
  if (one_bucket) {
    members.push_back(params);
  } else {
    std::vector<int64_t> bytes;
    for (size_t i : params) bytes.push_back(part.params[i].numel * element_bytes);
    for (const auto& bucket : reverse_buckets(bytes, bucket_bytes)) {
      members.emplace_back();
      for (size_t k : bucket) members.back().push_back(params[k]);
    }
  }
  std::vector<FlatBucketShape> out;
  for (const auto& indices : members) {
    FlatBucketShape b;
    b.params = indices;
    for (size_t i : indices) b.numel += part.params[i].numel;
    b.chunk = (b.numel + world - 1) / world;  // padded to a multiple of N: every rank the same chunk
    b.padded = b.chunk * world;
    out.push_back(b);
  }
  return out;
}

int64_t shard_elements_of(const RankPart& part, const std::vector<FlatBucketShape>& buckets, int rank,
                          const std::vector<bool>& wanted) {
  int64_t total = 0;
  for (const FlatBucketShape& b : buckets) {
    const int64_t begin = rank * b.chunk, end = begin + b.chunk;
    int64_t offset = 0;
    for (size_t i : b.params) {
      const int64_t n = part.params[i].numel;
      if (wanted[i]) total += std::max<int64_t>(0, std::min(end, offset + n) - std::max(begin, offset));
      offset += n;
    }
  }
  return total;
}

// The threads backend's ring all-reduce: segments of a multiple of n elements (at least n chunks of
// 1 MiB, at most 65536 / 2n segments), each a reduce-scatter then an all-gather over its n chunks,
// the first count % n chunks one element longer. Rank r sends every chunk but r+1 in the first half
// and every chunk but r+2 in the second; it receives every chunk but r, then every chunk but r+1.
RingBytes ring_all_reduce(int64_t count, int64_t es, int n, int r) {
  if (n == 1) return {};
  const int64_t max_segments = std::max<int64_t>(1, 65536 / (2 * n));
  int64_t segment = std::max<int64_t>(n * ((int64_t{1} << 20) / es), (count + max_segments - 1) / max_segments);
  segment = (segment + n - 1) / n * n;
  const int64_t full = count / segment, rest = count % segment;
  RingBytes out;
  out.sent = out.received = full * 2 * (n - 1) * (segment / n);
  if (rest > 0) {
    auto size = [&](int i) { return rest / n + ((i % n) < rest % n ? 1 : 0); };
    out.sent += 2 * rest - size(r + 1) - size(r + 2);
    out.received += 2 * rest - size(r) - size(r + 1);
  }
  out.sent *= es;
  out.received *= es;
  return out;
}

RingBytes ring_all_gather(int64_t input_bytes, int n) { return {(n - 1) * input_bytes, (n - 1) * input_bytes}; }
RingBytes ring_reduce_scatter(int64_t output_bytes, int n) { return {(n - 1) * output_bytes, (n - 1) * output_bytes}; }

}  // namespace sl::parallel::planner
