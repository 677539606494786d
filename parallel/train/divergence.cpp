// divergence.cpp — see divergence.h: the serial run recorded first, then the layout's ranks, each
// comparing what it holds with the record as it goes.
#include "parallel/train/divergence.h"

#include <algorithm>
#include <cmath>
#include <deque>
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
#include "parallel/train/serial_reference.h"
#include "parallel/train/trainer.h"
#include "tensor/ops.h"

namespace sl::parallel {

namespace {

// What the serial run did at one step.
struct SerialStepRecord {
  double loss = 0, lr = 0;
  std::map<std::string, Tensor> outputs;                  // module -> the whole batch's output
  std::map<std::string, std::vector<double>> grads, grad_bounds;  // before the update
  std::map<std::string, std::vector<double>> weights, weight_bounds;  // after it
};

struct Rounding {
  double unit;
  std::string dtype;
};
Rounding rounding_of(DType dtype) {
  if (dtype == DType::bf16) return {std::ldexp(1.0, -8), "bf16"};
  if (dtype == DType::f16) return {std::ldexp(1.0, -11), "fp16"};
  return {std::ldexp(1.0, -24), "f32"};
}

// The roundings on a value's path (divergence_compare.h). In f32 every multiply-add of a reduction
// rounds: n counts them (the widest matmul's K, 4C, per module on the path; the B·T tokens a gradient
// sums). In 16 bits the f32 accumulations are negligible beside the 16-bit roundings of each stored
// activation (about 4 per module: LayerNorm, a projection, the core, the output) and, for gradients,
// of each accumulation (micro-batches) and sum (one per rank of the world at most).
struct PathLengths {
  bool sixteen;
  int64_t C, L, B, T, M, world;
  // f32: + B·T from step 1 on: every weight's gradient (and so every later forward) summed the tokens
  double forward(int depth) const { return sixteen ? 4.0 * depth : 4.0 * C * depth + double(B * T); }
  double backward() const { return sixteen ? 4.0 * (2 * L + 3) + M + world : double(B * T) + 4.0 * C * (2 * L + 3); }
  double loss() const { return sixteen ? 4.0 * (2 * L + 3) : double(B * T) + 4.0 * C * (2 * L + 3); }
};

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

std::vector<double> values_f32(const Tensor& t) { return t.detach().to(DType::f32).to_vector(); }

std::vector<SerialStepRecord> record_serial(const TrainRun& run, const PathLengths& paths, std::vector<std::string>& derivation,
                                           std::vector<std::string>& parameter_order) {
  const TrainOptions& o = run.o;
  std::unique_ptr<nn::GPT> model = initial_model(run);
  SerialReference reference(*model, o, run.precision);
  DebugProbe probe;
  probe.attach(*model);
  probe.attach_head(*model);
  for (const auto& [name, p] : model->named_parameters()) parameter_order.push_back(name);
  const Rounding r = rounding_of(run.config.param_dtype);
  std::map<std::string, std::vector<double>> carried;  // the weights' Adam term, summed over the steps
  std::vector<SerialStepRecord> steps;
  for (int64_t s = 0; s < o.steps; ++s) {
    SerialStepRecord rec;
    rec.lr = nn::cosine_lr(s, o.steps, o.warmup_steps, o.lr, o.min_lr);
    {
      NoGradGuard no_grad;
      probe.begin_step(static_cast<int>(s));
      const nn::Batch batch = run.stream.get_batch(s, o.batch_size, o.block_size);
      model->forward(batch.inputs);
      for (const auto& [name, outs] : probe.outputs()) rec.outputs[name] = outs.at(0).to(DType::f32);
    }
    const RoundingBound grad_bound{r.unit, paths.backward(), static_cast<int>(s), r.dtype};
    rec.loss = reference.step(run.stream, s, [&] {
      for (const auto& [name, p] : model->named_parameters()) {
        std::vector<double> g = values_f32(p.grad().defined() ? p.grad() : zeros_like(p));
        const double scale = rms(g), relative = grad_bound.relative();
        std::vector<double> bound(g.size()), &acc = carried[name];
        acc.resize(g.size(), 0.0);
        for (size_t i = 0; i < g.size(); ++i) {
          bound[i] = relative * (std::fabs(g[i]) + scale);
          acc[i] += rec.lr * std::min(2.0, 2 * bound[i] / (std::fabs(g[i]) + o.adam_eps));
        }
        rec.grads[name] = std::move(g);
        rec.grad_bounds[name] = std::move(bound);
      }
    });
    for (const auto& [name, p] : model->named_parameters()) {
      std::vector<double> w = values_f32(p), bound(w.size());
      const std::vector<double>& acc = carried[name];
      for (size_t i = 0; i < w.size(); ++i) bound[i] = (acc.empty() ? 0 : acc[i]) + 2 * r.unit * std::fabs(w[i]);
      rec.weights[name] = std::move(w);
      rec.weight_bounds[name] = std::move(bound);
    }
    if (s == 0 || s == o.steps - 1)
      derivation.push_back("step " + std::to_string(s) + " gradients: " + grad_bound.str());
    steps.push_back(std::move(rec));
  }
  derivation.push_back("weights after step t: Σ_{s<=t} lr_s·min(2, 2·bound(g_s)/(|g_s| + eps)) + 2·u·|w| (AdamW's "
                       "update of one element moves at most ±lr; a gradient known to δg moves it by about lr·δg/|g|)");
  return steps;
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

}  // namespace

void check_comparable(const TrainOptions& o) {
  if (o.naive_dp)
    throw Error("diverge: --naive-dp runs its passes inside its strategy (rank 0 scatters and steps): its modules' "
                "outputs and gradients are not where the Trainer's hooks see them");
  if (o.dropout > 0)
    throw Error("diverge: --dropout " + std::to_string(o.dropout) + ": each rank draws its own masks, so no "
                "element of the layout is the serial model's");
  if (o.offload) throw Error("diverge: --offload: the gradient shard is moved to the host inside the step, where the finder does not read it");
  if (!o.resume.empty()) throw Error("diverge: --resume: the finder starts both runs at step 0 from the same weights");
  if (o.steps < 1) throw Error("diverge: --steps must be at least 1");
}

DivergenceReport find_divergence(const TrainRun& run, const std::vector<ProbeFault>& faults) {
  const TrainOptions& o = run.o;
  check_comparable(o);
  DivergenceReport report;
  const int world = static_cast<int>(o.world());
  const TrainPlan plan = plan_of_options(o, run.precision);
  plan.validate(world);
  check_model_cut(run.config, plan.parallelize_options(), plan.micro_batches);
  const PathLengths paths{is_16bit(run.config.param_dtype), o.n_embd, o.n_layer, o.batch_size, o.block_size,
                          o.micro_batches, world};
  std::vector<std::string> parameter_order;
  const std::vector<SerialStepRecord> serial = record_serial(run, paths, report.derivation, parameter_order);
  std::map<std::string, int> parameter_index;
  for (size_t i = 0; i < parameter_order.size(); ++i) parameter_index[parameter_order[i]] = static_cast<int>(i);
  const std::map<std::string, int> depth = module_depths(o.n_layer);
  const Rounding r = rounding_of(run.config.param_dtype);
  std::vector<std::deque<Comparison>> rows(world);  // a deque: rows are filled through pointers
  std::vector<std::vector<std::string>> uncompared(world);
  std::vector<char> fired(world, 0);
  if (o.parallel()) set_num_threads(1);
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
                                if (!c) c = row(step, "backward", g.parameter), c->bound = RoundingBound{r.unit, paths.backward(), step, r.dtype}.str();
                                const ParameterPlace& place = places.at(g.parameter);
                                const std::vector<double> data = values_f32(g.data);
                                for (const LocalRun& local : runs_of(place.boxes, g.begin, g.end))
                                  compare_region(local.region, place.global_shape, data, local.local_offset,
                                                 rec.grads.at(g.parameter), rec.grad_bounds.at(g.parameter), *c);
                              }
                            }});
    for (; step < o.steps; ++step) {
      const SerialStepRecord& rec = serial[step];
      probe.begin_step(step);
      const double loss = trainer.train_step(run.stream, step, o.batch_size, o.block_size, rec.lr, o.grad_clip);
      for (const auto& [name, outs] : probe.outputs()) {
        if (!rec.outputs.count(name)) {
          uncompared[ctx.rank].push_back("rank " + std::to_string(ctx.rank) + " " + name + ": the serial model has no such module");
          continue;
        }
        const RoundingBound bound{r.unit, paths.forward(depth.at(name)), step, r.dtype};
        Comparison* c = row(step, "forward", name);
        for (size_t m = 0; m < outs.size(); ++m) {
          const std::string why = compare_output(cut, static_cast<int>(m), outs[m], rec.outputs.at(name), bound, *c);
          if (!why.empty()) uncompared[ctx.rank].push_back("rank " + std::to_string(ctx.rank) + " " + name + ": " + why);
        }
      }
      if (ctx.rank == 0) {
        const RoundingBound bound{r.unit, paths.loss(), step, r.dtype};
        Comparison* c = row(step, "forward", "loss");
        c->bound = bound.str();
        check_element(*c, {}, loss, rec.loss, bound.relative() * std::fabs(rec.loss));
      }
      std::map<std::string, Comparison*> by_name;
      for (const StatePiece& piece : state_pieces(trainer, run.config)) {
        if (!rec.weights.count(piece.tensor)) continue;  // AdamW's moments and masters: not compared
        Comparison*& c = by_name[piece.tensor];
        if (!c) c = row(step, "step", piece.tensor), c->bound = report.derivation.back();
        compare_region(piece.region, piece.global_shape, values_f32(piece.data), 0, rec.weights.at(piece.tensor),
                       rec.weight_bounds.at(piece.tensor), *c);
      }
    }
    fired[ctx.rank] = probe.fired();
  });
  set_num_threads(static_cast<int>(o.threads));
  for (int rank = 0; rank < world; ++rank) {
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
  return report;
}

}  // namespace sl::parallel
