// Lesson 12 — sequence parallelism (Korthikanti et al. 2022): the activations tensor parallelism
// forgot to cut, and the all-reduce it then needs.
//
// What you will learn
//   * under tensor parallelism the attention and MLP activations are cut t ways, but LayerNorm, the
//     residual stream and dropout still hold whole [B, T, C] tensors on every rank: per layer
//     sbh(10 + 24/t + 5as/(ht)) bytes (fp16), whose "10" never shrinks.
//   * Megatron-SP cuts those along the sequence: LayerNorm runs on T/t rows; the f before a
//     column-parallel layer becomes an all-gather of the rows, the g after a row-parallel layer a
//     reduce-scatter back to them. All-reduce = reduce-scatter + all-gather, so the bytes are the same
//     (measured below) and the activations become sbh(34 + 5as/h)/t: everything divided by t.
//   * measured per layer by the memory ledger against those formulas, in f32 and without dropout,
//     with the two places shardlab differs and why.
//   * the catch: LayerNorm's weight and bias are replicated, but each rank now normalises only its
//     rows, so each holds a PARTIAL gradient. Without an all-reduce over tp the copies drift apart
//     (Megatron-LM #1446, gpt-neox #1257). Shown on the page, then as a training run with the fix
//     (TensorParallelRunner::finish_gradients); --break-ln-allreduce runs both without it.
//
// Run:    make lesson N=12   (about a second)
// Try:    build/lessons/12_sequence_parallel --tp 4 --batch 8 --T 16 --seq 64 --svg /tmp/svg_12
//         build/lessons/12_sequence_parallel --break-ln-allreduce   (the LayerNorm copies drift apart)
// Prints: 1 bytes, TP vs SP; 2 activation bytes per layer vs the formulas; 3 SP LayerNorm on the page;
//         4 five steps with the all-reduce (--break-ln-allreduce: without it); "lesson 12: OK".
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/tensor_parallel/tensor_parallel_runner.h"
#include "tensor/ledger.h"
#include "lesson_args.h"
#include "lesson_svg.h"

using namespace sl;
using namespace sl::parallel;

static void section(const char* title) { std::printf("\n--- %s\n", title); }

// What a student may change: the tp degree t (sections 1, 3, 4), the batch B and context T of
// section 1's bytes, the sequence s of section 2's activations, the AdamW steps of section 4.
struct Config {
  int tp = 2;
  int64_t batch = 4, T = 8, seq = 32;
  int steps = 5;
  bool break_ln_allreduce = false;  // skip the all-reduce of the SP LayerNorm gradients over tp
  std::string svg_dir;
};

// A check that prints its line and remembers a failure.
struct Checker {
  bool ok = true;
  void operator()(bool condition, const std::string& what) {
    std::printf("  check: %-72s %s\n", what.c_str(), condition ? "ok" : "FAILED");
    ok = ok && condition;
  }
};

static nn::TokenStream tokens(int64_t vocab) {
  nn::TokenStream data;
  data.vocab_size = vocab;
  for (int i = 0; i < 600; ++i) data.tokens.push_back(static_cast<int32_t>((i * 7 + i / 5 + (i * i) % 11) % vocab));
  return data;
}

static void same_bytes(const Config& cfg, Checker& check) {
  section("1. The same bytes: all-reduce = reduce-scatter + all-gather");
  const int t = cfg.tp;
  const int64_t B = cfg.batch, T = cfg.T;
  const nn::GPTConfig config{.vocab_size = 32, .block_size = T, .n_layer = 2, .n_head = std::max(2, t), .n_embd = 16};
  std::vector<std::vector<CommStats>> seen(2);
  launch(t, [&](RankContext& ctx) {
    DeviceMesh mesh(ctx.world, {.tp = t});
    for (bool sp : {false, true}) {
      TensorParallelRunner runner(config, 5, mesh, {.sequence_parallel = sp});
      mesh.group(MeshDim::tp)->ledger().reset();
      auto micros = tokens(32).micro_batches(0, B, T, 1);
      runner.forward_backward(micros, static_cast<double>(micros[0].counted), 1, {});
      const CommLedger& l = mesh.group(MeshDim::tp)->ledger();
      if (ctx.rank == 0) seen[sp] = {l[CommOp::all_reduce], l[CommOp::all_gather], l[CommOp::reduce_scatter]};
    }
  });
  const char* names[] = {"all-reduce", "all-gather", "reduce-scatter"};
  for (int sp = 0; sp < 2; ++sp) {
    std::printf("  %-7s", sp ? "TP + SP" : "TP");
    for (int op = 0; op < 3; ++op)
      std::printf("  %s %2lld x, %6lld B", names[op], (long long)seen[sp][op].calls,
                  (long long)seen[sp][op].bytes_sent);
    std::printf("\n");
  }
  auto total = [&](int sp) { return seen[sp][0].bytes_sent + seen[sp][1].bytes_sent + seen[sp][2].bytes_sent; };
  std::printf(
      "  total sent per rank: TP %lld B, TP + SP %lld B (the loss's 3 small all-reduces stay in both;\n"
      "  SP moves the embedding's rows once more: its scatter's backward is an all-gather)\n",
      (long long)total(0), (long long)total(1));
  const int64_t act = B * T * 16 * 4;
  if (!cfg.svg_dir.empty()) {
    lesson::BarChart chart("tp bytes sent per rank, t=" + std::to_string(t) + " B=" + std::to_string(B) + " T=" +
                               std::to_string(T) + " (red: TP's total + the scatter's backward)", "bytes");
    chart.bar("TP", static_cast<double>(total(0)));
    chart.bar("TP + SP", static_cast<double>(total(1)), static_cast<double>(total(0) + act * (t - 1) / t), "#f58518");
    lesson::write_picture(cfg.svg_dir, "sp_bytes.svg", chart.svg());
  }
  check(total(1) - total(0) == act * (t - 1) / t,
        "SP's extra bytes are exactly the embedding scatter's backward (n-1)/n·B·T·C·4");
}

static void activation_bytes(const Config& cfg, Checker& check) {
  section("2. Activation bytes per layer, from the ledger, vs Korthikanti et al. (f32, dropout 0)");
  const int64_t b = 4, s = cfg.seq, h = 32, a = 4;
  lesson::BarChart chart("activation bytes per layer, s=" + std::to_string(s) + " (red: Korthikanti, f32)", "B");
  std::printf(
      "  b %lld, s %lld, h %lld, a %lld.  Table 2 of the paper, fp16 with 1-byte dropout masks:\n"
      "    TP: sbh(10 + 24/t + 5as/(ht))     TP + SP: sbh(34 + 5as/h)/t\n"
      "  In f32 with dropout 0 the masks and the attention-dropout output vanish, the rest doubles, and\n"
      "  the blockwise attention keeps the rows' lse (4asb/t bytes) in place of the softmax:\n"
      "    TP: 4sbh(4 + 12/t) + 4asb/t      TP + SP: 4sbh·16/t + 4asb/t\n",
      (long long)b, (long long)s, (long long)h, (long long)a);
  std::printf("  %-3s %-8s %12s %12s %12s %12s %9s\n", "t", "layout", "measured", "formula", "LN stats", "gathered",
              "fp16 paper");
  bool all_match = true;
  for (int t : {1, 2, 4})
    for (bool sp : {false, true}) {
      if (t == 1 && sp) continue;
      std::vector<double> per_layer(t);
      launch(t, [&](RankContext& ctx) {
        auto kept = [&](int64_t layers) {
          const nn::GPTConfig config{.vocab_size = 32, .block_size = s, .n_layer = layers, .n_head = a, .n_embd = h};
          TensorParallelGPT model(config, 5, ctx.world, {.sequence_parallel = sp});
          nn::Batch batch = tokens(32).get_batch(0, b, s);
          const int64_t before = MemoryLedger::instance().current(ctx.device, MemoryCategory::activations);
          Tensor out = model.hidden(batch.inputs);
          return MemoryLedger::instance().current(ctx.device, MemoryCategory::activations) - before;
        };
        per_layer[ctx.rank] = static_cast<double>(kept(3) - kept(1)) / 2;
      });
      const double sbh = s * b * h, sb = s * b, T = t, as_h = double(a * s) / h;
      const double lse = 4.0 * a * s * b / T;  // attention keeps no [s, s] matrix, only the rows' lse
      const double formula = (sp ? 4 * sbh * 16 / T : 4 * sbh * (4 + 12 / T)) + lse;
      const double stats = sp ? 16 * sb / T : 16 * sb;         // LayerNorm mean, rstd: 2 floats/row, 2 LNs
      const double gathered = sp ? 8 * sbh * (1 - 1 / T) : 0;  // c_attn, c_fc keep the gathered input
      const double paper = sp ? sbh * (34 + 5 * as_h) / T : sbh * (10 + 24 / T + 5 * as_h / T);
      std::printf("  %-3d %-8s %12.0f %12.0f %12.0f %12.0f %9.0f\n", t, sp ? "TP + SP" : "TP", per_layer[0], formula,
                  stats, gathered, paper);
      chart.bar("t " + std::to_string(t) + (sp ? " TP + SP" : " TP"), per_layer[0], formula, sp ? "#f58518" : "#4c78a8");
      all_match = all_match && per_layer[0] == formula + stats + gathered;
    }
  std::printf(
      "  measured = formula + LN stats + gathered, exactly. The two differences:\n"
      "   * LN stats: shardlab's layer_norm keeps mean and 1/std per row for backward (the paper rounds\n"
      "     them away); 2 floats per row per LayerNorm, cut by t under SP.\n"
      "   * gathered: under SP, c_attn and c_fc save the all-gathered [B, T, C] input they multiplied.\n"
      "     Megatron saves only the T/t-row shard and all-gathers it again in backward (one more\n"
      "     all-gather per column layer, overlapped with the weight-gradient GEMM); shardlab keeps the\n"
      "     simpler graph, so 2sbh·(1 - 1/t) floats per layer are not cut.\n");
  lesson::write_picture(cfg.svg_dir, "sp_activations.svg", chart.svg());
  check(all_match, "per-layer activation bytes == Korthikanti (f32) + LN stats + gathered inputs");
}

static void layer_norm_on_the_page(const Config& cfg, Checker& check) {
  section("3. Why SP needs an all-reduce of the LayerNorm gradients: on the page");
  const int t = cfg.tp;
  const int64_t B = 2, T = 2 * t, C = 6;
  Generator g(3);
  Tensor x = randn({B, T, C}, {}, &g), dy = randn({B, T, C}, {}, &g);
  Tensor w = randn({C}, {}, &g).set_requires_grad(), bias = zeros({C}).set_requires_grad();
  layer_norm(x, w, bias).backward(dy);  // serial: dW = Σ over all B·T rows of dy · x̂
  const Tensor serial_dw = w.grad();
  std::vector<double> partial_err(t), summed_err(t);
  launch(t, [&](RankContext& ctx) {
    const int64_t rows = T / t, first = ctx.rank * rows;
    const Tensor want = serial_dw.to(ctx.device);  // this rank's copies live on its device
    Tensor mine_w = w.detach().to(ctx.device).set_requires_grad(), mine_b = zeros({C}).set_requires_grad();
    layer_norm(x.narrow(1, first, rows).to(ctx.device), mine_w, mine_b)
        .backward(dy.narrow(1, first, rows).to(ctx.device));  // my rows only
    Tensor dw = mine_w.grad().clone();
    partial_err[ctx.rank] = max_abs_diff(dw, want);  // a partial sum: only my rows
    if (!cfg.break_ln_allreduce) ctx.world->all_reduce(dw);  // the fix: sum over tp
    summed_err[ctx.rank] = max_abs_diff(dw, want);
  });
  bool summed = true;
  for (int r = 0; r < t; ++r) {
    std::printf("  rank %d |dW_rank - dW_serial|: before the all-reduce %.3f, after %.1e%s\n", r, partial_err[r],
                summed_err[r], cfg.break_ln_allreduce ? " (--break-ln-allreduce: skipped)" : "");
    summed = summed && summed_err[r] < 1e-6;
  }
  check(partial_err[0] > 1e-3 && summed,
        "each rank's LayerNorm dW is partial; the all-reduce over tp makes it the serial one");
}

static void training_run(const Config& cfg, Checker& check) {
  std::printf("\n--- 4. %d AdamW steps at tp %d with SP, %s the all-reduce of the LayerNorm gradients\n", cfg.steps, cfg.tp,
              cfg.break_ln_allreduce ? "WITHOUT (--break-ln-allreduce)" : "with");
  const int steps = cfg.steps, t = cfg.tp;
  const nn::GPTConfig config{.vocab_size = 32, .block_size = 8, .n_layer = 2, .n_head = std::max(2, t), .n_embd = 16};
  const nn::AdamWOptions adamw{.lr = 1e-2, .eps = 1e-6, .weight_decay = 0.1};
  nn::GPT serial(config, 5);
  nn::AdamW serial_opt(serial.parameters(), adamw);
  const nn::TokenStream data = tokens(32);
  for (int step = 0; step < steps; ++step) {
    serial_opt.zero_grad();
    nn::Batch batch = data.get_batch(step, 4, 8);
    serial.loss(batch.inputs, batch.targets).backward();
    serial_opt.step();
  }
  const Tensor want = serial.block(0).ln_1->weight;
  {
    const bool fixed = !cfg.break_ln_allreduce;
    std::vector<Tensor> ln(t);
    launch(t, [&](RankContext& ctx) {
      DeviceMesh mesh(ctx.world, {.tp = t});
      TensorParallelRunner runner(config, 5, mesh, {.sequence_parallel = true});
      nn::AdamW opt(runner.module().parameters(), adamw);
      for (int step = 0; step < steps; ++step) {
        opt.zero_grad();
        auto micros = data.micro_batches(step, 4, 8, 1);
        runner.forward_backward(micros, static_cast<double>(micros[0].counted), 1, {});
        if (fixed) runner.finish_gradients();  // the LayerNorm (and c_proj bias) all-reduce over tp
        opt.step();
      }
      ln[ctx.rank] = runner.model().gpt().block(0).ln_1->weight.detach().clone();
    });
    const Tensor ln1 = ln[t - 1].to(ln[0].device());
    const double drift = max_abs_diff(ln[0], ln1),
                 error = std::max(max_abs_diff(ln[0], want), max_abs_diff(ln1, want));
    std::printf("  %-22s h.0.ln_1.weight: rank 0 vs rank %d %.2e, vs serial %.2e\n",
                fixed ? "with the all-reduce:" : "without it (the bug):", t - 1, drift, error);
    if (!fixed) std::printf("  the replicas of one weight drift apart, and away from serial: the check fails\n");
    check(drift == 0 && error < 4e-5 + 1e-5, "the LayerNorm replicas are bitwise equal and equal to serial");
  }
}

int main(int argc, char** argv) {
  lesson::Args args(argc, argv, "12_sequence_parallel", "sequence parallelism and the LayerNorm all-reduce it needs");
  Config cfg;
  cfg.tp = static_cast<int>(args.integer("tp", 2, "tp degree t of sections 1, 3, 4: 2 or 4 (divides 16 and the heads)", 2, 4));
  cfg.batch = args.integer("batch", 4, "B of section 1's bytes", 1, 32);
  cfg.T = args.integer("T", 8, "T of section 1's bytes (a multiple of t: SP cuts the rows)", 4, 64);
  cfg.seq = args.integer("seq", 32, "s, the sequence of section 2's activation bytes (a multiple of 4)", 4, 128);
  cfg.steps = static_cast<int>(args.integer("steps", 5, "AdamW steps of section 4", 1, 20));
  cfg.break_ln_allreduce = args.breaks("ln-allreduce", "skip the all-reduce of the SP LayerNorm gradients over tp");
  cfg.svg_dir = args.svg();
  args.done();
  if (cfg.tp == 3 || cfg.T % cfg.tp != 0 || cfg.seq % 4 != 0) {
    std::fprintf(stderr, "12_sequence_parallel: need --tp 2 or 4, --T a multiple of tp, --seq a multiple of 4\n");
    return 2;
  }
  std::printf("lesson 12 with tp = %d, B = %lld, T = %lld, s = %lld, %d steps%s\n", cfg.tp, (long long)cfg.batch,
              (long long)cfg.T, (long long)cfg.seq, cfg.steps, cfg.break_ln_allreduce ? ", BROKEN: no LayerNorm all-reduce" : "");
  Checker check;
  same_bytes(cfg, check);
  activation_bytes(cfg, check);
  layer_norm_on_the_page(cfg, check);
  training_run(cfg, check);
  std::printf("\nlesson 12: %s\n", check.ok ? "OK" : "FAILED");
  return check.ok ? 0 : 1;
}
