// checkpointing.cpp — see checkpointing.h.
#include "parallel/train/checkpointing.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/philox.h"

namespace sl::parallel {

std::map<std::string, Shape> serial_parameter_shapes(const nn::GPTConfig& config) {
  const int64_t C = config.n_embd, V = config.vocab_size;
  std::map<std::string, Shape> shapes{{"wte.weight", Shape({V, C})},
                                      {"wpe.weight", Shape({config.block_size, C})},
                                      {"ln_f.weight", Shape({C})},
                                      {"ln_f.bias", Shape({C})}};
  for (int64_t l = 0; l < config.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    for (const char* ln : {"ln_1", "ln_2"}) {
      shapes[h + ln + ".weight"] = Shape({C});
      shapes[h + ln + ".bias"] = Shape({C});
    }
    shapes[h + "attn.c_attn.weight"] = Shape({3 * C, C});
    shapes[h + "attn.c_attn.bias"] = Shape({3 * C});
    shapes[h + "attn.c_proj.weight"] = Shape({C, C});
    shapes[h + "attn.c_proj.bias"] = Shape({C});
    // a mixture of experts' block (nn/moe.h): the router [E, C], no bias, and E MLPs in place of one
    std::vector<std::string> mlps = {h + "mlp."};
    if (config.is_moe_layer(l)) {
      shapes[h + "mlp.router.weight"] = Shape({config.moe_experts, C});
      mlps.clear();
      for (int64_t e = 0; e < config.moe_experts; ++e) mlps.push_back(h + "mlp.experts." + std::to_string(e) + ".");
    }
    for (const std::string& mlp : mlps) {
      shapes[mlp + "c_fc.weight"] = Shape({4 * C, C});
      shapes[mlp + "c_fc.bias"] = Shape({4 * C});
      shapes[mlp + "c_proj.weight"] = Shape({C, 4 * C});
      shapes[mlp + "c_proj.bias"] = Shape({C});
    }
  }
  return shapes;
}

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

Region whole_box(const std::vector<int64_t>& shape) {
  Region r{std::vector<int64_t>(shape.size(), 0), shape, 0, 0};
  r.flat_end = r.box_numel();
  return r;
}

// The boxes of a tp slice (rank r of t) of a serial tensor, as tensor_parallel/tp_gpt.cpp cuts it.
std::vector<Region> tp_boxes(const std::string& name, const std::vector<int64_t>& global,
                             const std::vector<int64_t>& local, int r, int t) {
  auto box = [&](size_t dim, int64_t offset, int64_t length) {
    Region b = whole_box(global);
    b.offsets[dim] = offset;
    b.lengths[dim] = length;
    b.flat_end = b.box_numel();
    return b;
  };
  if (name == "wte.weight") {  // rows [r·Vp/t, ...) of the vocabulary padded to Vp: the real ones
    const int64_t rows = local[0], start = r * rows, real = std::clamp<int64_t>(global[0] - start, 0, rows);
    if (real == 0) return {};  // a rank holding only padding rows
    return {box(0, start, real)};
  }
  if (ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias")) {  // q, k, v: my heads of each
    const int64_t third = global[0] / 3, mine = local[0] / 3;
    return {box(0, r * mine, mine), box(0, third + r * mine, mine), box(0, 2 * third + r * mine, mine)};
  }
  for (size_t d = 0; d < global.size(); ++d)
    if (local[d] != global[d]) {
      SL_CHECK(local[d] * t == global[d], "checkpoint: ", name, " is ", Shape(local), " on tp rank ", r, " of ", t,
               " but ", Shape(global), " in the serial model: no tp cut explains it");
      return {box(d, r * local[d], local[d])};
    }
  return {whole_box(global)};
}

}  // namespace

std::map<std::string, ParameterPlace> parameter_places(nn::Module& module, const nn::GPTConfig& config,
                                                       const DeviceMesh& mesh) {
  const std::map<std::string, Shape> serial = serial_parameter_shapes(config);
  const int t = mesh.size(MeshDim::tp), r = mesh.tp_rank();
  std::map<std::string, ParameterPlace> places;
  const auto placements = module.named_placements();
  size_t i = 0;
  for (const auto& [name, param] : module.named_parameters()) {
    const nn::Placement& placement = placements[i++].second;
    auto it = serial.find(name);
    SL_CHECK(it != serial.end(), "checkpoint: this rank holds '", name, "', which the serial GPT (n_layer ",
             config.n_layer, ") does not have");
    const std::vector<int64_t> global = it->second, local = param.shape();
    SL_CHECK(global.size() == local.size(), "checkpoint: ", name, " is ", param.shape(), " here and ", it->second,
             " in the serial model");
    ParameterPlace place{global, {}, placement.kind != nn::Placement::Kind::tied};
    if (local == global) {
      place.boxes = {whole_box(global)};
      place.saves = place.saves && r == 0;  // replicated over tp: tp rank 0's is saved
    } else {
      place.boxes = tp_boxes(name, global, local, r, t);
    }
    places[name] = std::move(place);
  }
  return places;
}

std::vector<StatePiece> state_pieces(Trainer& trainer, const nn::GPTConfig& config) {
  ModelRunner& runner = *trainer.runner();
  const DeviceMesh& mesh = trainer.mesh();
  const std::map<std::string, ParameterPlace> places = parameter_places(runner.module(), config, mesh);
  std::vector<StatePiece> pieces;
  for (const LocalStateRun& run : trainer.strategy().local_state(runner)) {
    const ParameterPlace& place = places.at(run.parameter);
    bool owner = place.saves && !run.copy;
    for (MeshDim dim : run.replicated_over) owner = owner && mesh.coordinate(dim) == 0;
    for (const LocalRun& local : runs_of(place.boxes, run.begin, run.end))
      for (const auto& [kind, data] : run.data)
        pieces.push_back({state_tensor_name(kind, run.parameter), place.global_shape, local.region,
                          data.flat_view(local.local_offset, {local.region.numel()}), owner});
  }
  return pieces;
}

namespace {

nlohmann::json run_state_json(int64_t optimizer_steps, const nn::GradScaler& scaler, const std::vector<int64_t>& rng) {
  nlohmann::json state{{"optimizer_steps", optimizer_steps},
                       {"scaler", {{"scale", scaler.scale()}, {"clean_steps", scaler.clean_steps()},
                                   {"skipped_steps", scaler.skipped_steps()}}},
                       {"rng", nlohmann::json::array()}};
  for (size_t r = 0; 2 * r + 1 < rng.size(); ++r) state["rng"].push_back({{"seed", rng[2 * r]}, {"offset", rng[2 * r + 1]}});
  return state;
}

// The step count and the scaler; then the generator of `rank` if the state has `ranks` of them.
bool restore_run_state(const nlohmann::json& state, const std::function<void(int64_t)>& set_steps,
                       nn::GradScaler& scaler, int rank, int ranks) {
  SL_CHECK(state.is_object() && state.contains("optimizer_steps") && state.contains("scaler") && state.contains("rng"),
           "checkpoint: the run state lacks optimizer_steps, scaler or rng: ", state.dump().substr(0, 200));
  set_steps(state.at("optimizer_steps").get<int64_t>());
  const auto& s = state.at("scaler");
  scaler.restore(s.at("scale").get<double>(), s.at("clean_steps").get<int64_t>(), s.at("skipped_steps").get<int64_t>());
  const auto& rng = state.at("rng");
  if (!rng.is_array() || static_cast<int>(rng.size()) != ranks) return false;
  const auto& mine = rng.at(static_cast<size_t>(rank));
  default_generator() = Generator(mine.at("seed").get<uint64_t>());
  default_generator().set_offset(mine.at("offset").get<uint64_t>());
  return true;
}

}  // namespace

nlohmann::json trainer_run_state(Trainer& trainer) { return trainer_run_state(trainer, trainer.strategy().optimizer_steps()); }

nlohmann::json trainer_run_state(Trainer& trainer, int64_t optimizer_steps) {
  ProcessGroup& world = *trainer.mesh().world();
  const Generator& mine = default_generator();
  Tensor rng = from_vector({static_cast<double>(mine.seed()), static_cast<double>(mine.offset())}, Shape({2}), DType::i64);
  Tensor all = Tensor::empty({2 * static_cast<int64_t>(world.size())}, DType::i64);
  world.all_gather(all, rng);
  // AdamW's count: the most any rank holds (naive DP's workers hold no optimizer).
  Tensor steps = from_vector({static_cast<double>(optimizer_steps)}, Shape({1}), DType::i64);
  world.all_reduce(steps, ReduceOp::max);
  const Tensor host = all.device().is_cpu() ? all : all.to(Device::cpu());  // a GPU rank's (NCCL) comes over
  return run_state_json(static_cast<int64_t>(steps.item()), std::as_const(trainer).scaler(), host.values<int64_t>());
}

bool restore_trainer_run_state(Trainer& trainer, const nlohmann::json& state) {
  const ProcessGroup& world = *trainer.mesh().world();
  return restore_run_state(
      state, [&](int64_t steps) { trainer.strategy().set_optimizer_steps(steps); }, trainer.scaler(), world.rank(),
      world.size());
}

std::vector<StatePiece> whole_state_pieces(nn::Module& model, nn::AdamW& optimizer) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, p] : model.named_parameters()) shapes[name] = p.shape();
  std::vector<StatePiece> pieces;
  for (const LocalStateRun& run : whole_parameter_runs(model, &optimizer, {})) {
    const std::vector<int64_t>& global = shapes.at(run.parameter);
    for (const auto& [kind, data] : run.data)
      pieces.push_back({state_tensor_name(kind, run.parameter), global, whole_box(global), data, true});
  }
  return pieces;
}

nlohmann::json serial_run_state(const nn::AdamW& optimizer, const nn::GradScaler& scaler) {
  int64_t steps = optimizer.params().empty() ? 0 : optimizer.state(0).step;
  const Generator& g = default_generator();
  return run_state_json(steps, scaler, {static_cast<int64_t>(g.seed()), static_cast<int64_t>(g.offset())});
}

void restore_serial_run_state(nn::AdamW& optimizer, nn::GradScaler& scaler, const nlohmann::json& state) {
  restore_run_state(
      state,
      [&](int64_t steps) {
        for (size_t i = 0; i < optimizer.params().size(); ++i) optimizer.state(i).step = steps;
      },
      scaler, 0, 1);
}

}  // namespace sl::parallel
