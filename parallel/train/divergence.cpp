// divergence.cpp — see divergence.h: at every step the serial runs first (on rank 0, from the layout's
// state gathered from every rank), then the layout's ranks, each comparing what it holds with the record.
#include "parallel/train/divergence.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <tuple>

#include "autograd/grad_mode.h"
#include "parallel/comm/launch.h"
#include "parallel/nd/parallelize.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "parallel/runner/part_runner.h"
#include "parallel/train/checkpointing.h"
#include "parallel/train/plan_of_options.h"
#include "parallel/train/divergence_serial.h"
#include "parallel/train/divergence_sync.h"
#include "parallel/train/trainer.h"
#include "tensor/ops.h"

namespace sl::parallel {

namespace {

// The forward order of the captured modules: depth from the input.
std::map<std::string, int> module_depths(int64_t n_layer) {
  std::map<std::string, int> depth{{"wte", 1}, {"wpe", 1}};
  for (int64_t l = 0; l < n_layer; ++l) {
    const std::string h = "h." + std::to_string(l);
    depth[h + ".attn"] = static_cast<int>(2 + 3 * l);
    depth[h + ".mlp"] = static_cast<int>(3 + 3 * l);
    depth[h] = static_cast<int>(4 + 3 * l);
  }
  depth["ln_f"] = static_cast<int>(2 + 3 * n_layer);
  depth["lm_head"] = static_cast<int>(3 + 3 * n_layer);
  depth["loss"] = static_cast<int>(4 + 3 * n_layer);
  return depth;
}

std::string coordinates_of(const DeviceMesh& mesh) {
  std::string out;
  const auto coords = mesh.coordinates();
  for (size_t d = 0; d < kGridDims.size(); ++d)
    out += (out.empty() ? "" : " ") + std::string(name(kGridDims[d])) + " " + std::to_string(coords[d]);
  return out;
}

RankCut cut_of(const TrainRun& run, const TrainPlan& plan, const DeviceMesh& mesh) {
  RankCut cut;
  cut.batch = run.o.batch_size, cut.tokens = run.o.block_size, cut.vocab = run.config.vocab_size;
  cut.dp = mesh.size(MeshDim::dp), cut.dp_rank = mesh.dp_rank(), cut.micro_batches = plan.micro_batches;
  cut.micro_major = mesh.size(MeshDim::ep) > 1;
  cut.cp = mesh.size(MeshDim::cp), cut.cp_rank = mesh.cp_rank(), cut.zigzag = plan.cp_balance == CpBalance::zigzag;
  cut.ulysses = plan.cp_variant == CpVariant::ulysses ? cut.cp : plan.cp_variant == CpVariant::hybrid ? plan.ulysses_degree : 1;
  cut.tp = mesh.size(MeshDim::tp), cut.tp_rank = mesh.tp_rank();
  return cut;
}

// The probe on every module of this rank's parts, the head's logits included.
void attach(DebugProbe& probe, Trainer& trainer) {
  probe.attach(trainer.runner()->module(), &trainer.mesh());
  if (auto* part = dynamic_cast<PartRunner*>(trainer.runner())) probe.attach_head(part->part());
  if (auto* pipeline = dynamic_cast<PipelineRunner*>(trainer.runner()))
    for (const auto& chunk : pipeline->stage().parts) probe.attach_head(*chunk);
}

// The weights after a step, as the checkpoint's state pieces place them, against the serial run's.
void compare_weights(Trainer& trainer, const TrainRun& run, const SerialStepRecord& rec,
                     const std::function<Comparison*(const std::string&)>& row) {
  std::map<std::string, Comparison*> by_name;
  for (const StatePiece& piece : state_pieces(trainer, run.config)) {
    if (!rec.weights.count(piece.tensor)) continue;  // AdamW's moments and masters: not compared
    Comparison*& c = by_name[piece.tensor];
    if (!c) c = row(piece.tensor), c->bound = rec.weight_bound.str();
    compare_region(piece.region, piece.global_shape, values_f64(piece.data), 0, rec.weights.at(piece.tensor),
                   rec.weight_bounds.at(piece.tensor), *c);
  }
}

// Every captured module output of this rank's step against the serial run's; what cannot be placed, in `uncompared`.
void compare_outputs(const DebugProbe& probe, const RankCut& cut, const SerialStepRecord& rec, int rank,
                     std::vector<std::string>& uncompared, const std::function<Comparison*(const std::string&)>& row) {
  for (const auto& [name, outs] : probe.outputs()) {
    if (!rec.outputs.count(name)) {
      uncompared.push_back("rank " + std::to_string(rank) + " " + name + ": the serial model has no such module");
      continue;
    }
    Comparison* c = row(name);
    for (size_t m = 0; m < outs.size(); ++m) {
      const std::string why = compare_output(cut, static_cast<int>(m), outs[m], rec.outputs.at(name), rec.output_bound, *c);
      if (!why.empty()) uncompared.push_back("rank " + std::to_string(rank) + " " + name + ": " + why);
    }
  }
}

// The serial runs take `step` from the layout's state (divergence_sync.h): after the first step every
// rank adds the pieces it saves, then rank 0 loads them and steps the serial runs while the others
// wait; `serial[step]` is ready on every rank when it returns.
void step_serial_runs(RankContext& ctx, Trainer& trainer, const TrainRun& run, int step, SerialRecorder& serial_runs,
                      LayoutState& layout_state, std::vector<SerialStepRecord>& serial) {
  nlohmann::json run_state;
  if (step > 0) {
    layout_state.add(state_pieces(trainer, run.config));
    layout_state.add_steps_behind(trainer.strategy().parameters_behind());  // experts AdamW skipped
    run_state = trainer_run_state(trainer, trainer.strategy().most_optimizer_steps());  // collective: the loss scaler too
    ctx.world->barrier();
  }
  if (ctx.rank == 0) {
    if (step > 0) serial_runs.load(layout_state, run_state), layout_state.clear();
    serial[step] = serial_runs.step(step);
  }
  ctx.world->barrier();
}

// The ranks' rows in one table, sorted for first(); the faults with whether they acted.
void assemble(DivergenceReport& report, std::vector<std::deque<Comparison>>& rows,
              std::vector<std::vector<std::string>>& uncompared, const std::vector<char>& fired,
              const std::vector<ProbeFault>& faults) {
  for (size_t rank = 0; rank < rows.size(); ++rank) {
    for (Comparison& c : rows[rank]) report.rows.push_back(std::move(c));
    for (std::string& why : uncompared[rank]) report.uncompared.push_back(std::move(why));
  }
  bool any_fired = false;
  for (char f : fired) any_fired = any_fired || f;
  for (const ProbeFault& f : faults) report.faults.push_back(f.str() + (any_fired ? "" : " (acted on no rank)"));
  auto key = [](const Comparison& c) {
    const int phase = c.phase == "forward" ? 0 : c.phase == "backward" ? 1 : 2;
    return std::make_tuple(c.step, phase, c.order, c.rank);
  };
  std::stable_sort(report.rows.begin(), report.rows.end(), [&](const Comparison& a, const Comparison& b) { return key(a) < key(b); });
}

// A fault whose target the serial model does not have would act on no rank: refused, naming it.
void check_targets(const std::vector<ProbeFault>& faults, const std::map<std::string, int>& modules,
                   const std::map<std::string, int>& parameters) {
  for (const ProbeFault& f : faults) {
    if (f.names_group()) continue;  // a mesh dimension: checked when its words were read
    const bool gradient = f.names_parameter();
    const auto& names = gradient ? parameters : modules;
    if ((names.count(f.target) && f.target != "loss") || (gradient && f.target == "*")) continue;
    std::string some;
    for (const auto& [name, order] : names)
      if (name != "loss" && some.size() < 160) some += (some.empty() ? "" : ", ") + name;
    throw Error("fault '" + f.str() + "': the model has no " + (gradient ? "parameter" : "module") + " '" + f.target +
                "' (" + some + ", ...)");
  }
}

}  // namespace

void check_comparable(const TrainOptions& o) {
  if (o.naive_dp)
    throw Error("--naive-dp runs its passes inside its strategy (rank 0 scatters and steps): its modules' "
                "outputs and gradients are not where the Trainer's hooks see them");
  if (o.dropout > 0)
    throw Error("--dropout " + std::to_string(o.dropout) + ": each rank draws its own masks, so no "
                "element of the layout is the serial model's");
  if (o.offload) throw Error("--offload: the gradient shard is moved to the host inside the step, where the finder does not read it");
  if (!o.resume.empty()) throw Error("--resume: the finder starts both runs at step 0 from the same weights");
  if (o.ep > 1 && (o.zero > 0 || o.dp_replicate > 0))
    throw Error("--ep " + std::to_string(o.ep) + (o.zero > 0 ? " with --zero " + std::to_string(o.zero) : " with HSDP") +
                ": under ZeRO and FSDP the experts' own AdamW state is not yet among the state pieces the finder reads "
                "(ep under DDP, --zero 0, is compared)");
  if (o.steps < 1) throw Error("--steps must be at least 1");
}

namespace {
// Gives the caller back its GEMM thread count, whatever happens while the finder runs.
struct CallersThreadCount {
  int count = num_threads();
  ~CallersThreadCount() { set_num_threads(count); }
};
}  // namespace

DivergenceReport find_divergence(const TrainRun& run, const std::vector<ProbeFault>& faults) {
  const TrainOptions& o = run.o;
  check_comparable(o);
  DivergenceReport report;
  const int world = static_cast<int>(o.world());
  const TrainPlan plan = plan_of_options(o, run.precision);
  plan.validate(world);
  check_model_cut(run.config, plan.parallelize_options(), plan.micro_batches);
  SerialRecorder serial_runs(run);
  const std::vector<std::string>& parameter_order = serial_runs.parameter_order();
  const std::unique_ptr<LayoutState> layout_state = serial_runs.make_layout_state();
  std::vector<SerialStepRecord> serial(static_cast<size_t>(o.steps));  // filled by rank 0, step by step
  report.derivation = derivation_of(run);
  std::map<std::string, int> parameter_index;
  for (size_t i = 0; i < parameter_order.size(); ++i) parameter_index[parameter_order[i]] = static_cast<int>(i);
  const std::map<std::string, int> depth = module_depths(o.n_layer);
  check_targets(faults, depth, parameter_index);
  std::vector<std::deque<Comparison>> rows(world);  // a deque: rows are filled through pointers
  std::vector<std::vector<std::string>> uncompared(world);
  std::vector<char> fired(world, 0);
  const CallersThreadCount restore_threads;
  if (o.parallel()) set_num_threads(1);  // ranks are threads: one GEMM thread each
  launch(world, [&](RankContext& ctx) {
    Trainer trainer(ctx, plan, parallelize(run.config, o.seed, ctx.world, plan.parallelize_options(adamw_of_options(o)), run.initial));
    DebugProbe probe(faults);
    attach(probe, trainer);
    const DeviceMesh& mesh = trainer.mesh();
    const std::string coords = coordinates_of(mesh);
    const RankCut cut = cut_of(run, plan, mesh);
    auto row = [&](int step, const char* phase, const std::string& name) {
      // The order of the first divergence: forward from the input, backward from the loss, the step's weights in order.
      const std::string p = phase;
      const int order = p == "forward" ? depth.at(name) : p == "backward" ? -parameter_index.at(name) : parameter_index.at(name);
      Comparison c;
      c.step = step, c.phase = p, c.name = name, c.rank = ctx.rank, c.coordinates = coords, c.order = order;
      rows[ctx.rank].push_back(std::move(c));
      return &rows[ctx.rank].back();
    };
    const std::map<std::string, ParameterPlace> places = parameter_places(trainer.runner()->module(), run.config, mesh);
    int step = 0;
    trainer.set_step_hooks({.after_backward = [&] { probe.apply_gradient_faults(trainer.runner()->module()); },
                            .before_update = [&] {
                              const SerialStepRecord& rec = serial[step];
                              std::map<std::string, Comparison*> by_name;
                              for (const LocalGradientRun& g : trainer.strategy().local_gradients(*trainer.runner())) {
                                Comparison*& c = by_name[g.parameter];
                                if (!c) c = row(step, "backward", g.parameter), c->bound = rec.grad_bound.str();
                                const ParameterPlace& place = places.at(g.parameter);
                                const std::vector<double> data = values_f64(g.data);
                                for (const LocalRun& local : runs_of(place.boxes, g.begin, g.end))
                                  compare_region(local.region, place.global_shape, data, local.local_offset,
                                                 rec.grads.at(g.parameter), rec.grad_bounds.at(g.parameter), *c);
                              }
                            }});
    for (; step < o.steps; ++step) {
      step_serial_runs(ctx, trainer, run, step, serial_runs, *layout_state, serial);
      const SerialStepRecord& rec = serial[step];
      probe.begin_step(step);
      const double loss = trainer.train_step(run.stream, step, o.batch_size, o.block_size, rec.lr, o.grad_clip);
      compare_outputs(probe, cut, rec, ctx.rank, uncompared[ctx.rank], [&](const std::string& name) { return row(step, "forward", name); });
      if (ctx.rank == 0) {
        Comparison* c = row(step, "forward", "loss");
        c->bound = "2·max bound(lm_head) + 2u·|loss|";
        check_element(*c, {}, loss, rec.loss, rec.loss_bound);
      }
      compare_weights(trainer, run, rec, [&](const std::string& name) { return row(step, "step", name); });
    }
    fired[ctx.rank] = probe.fired();
  });
  assemble(report, rows, uncompared, fired, faults);
  return report;
}

}  // namespace sl::parallel
