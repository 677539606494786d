// The planner's mixtures of experts (parallel/planner/model_shape.h, expert_traffic.cpp): the MoE
// presets against their published sizes, the ep group's all-to-all bytes and a rank's expert memory
// against formulas written here from tokens, k, C, E, ep and Ψ, and the search on a cluster where
// Mixtral trains. Expected values come from the shapes, never from the cost model.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "parallel/planner/plan_request.h"
#include "parallel/planner/planner.h"
#include "tools/plan_cli.h"

namespace sl::parallel::planner {
namespace {

double published_ratio(double planner, double published) { return planner / published; }

// Mixtral 8x7B as published (Jiang et al. 2024; its config): V 32000, C 4096, 32 layers, 32 heads of
// 128 with 8 k/v heads (GQA), 8 SwiGLU experts of 14336, top-2, RMSNorm, rotary, untied head.
TEST(PlannerExperts, MixtralCountsMatchPublishedOnceTheModelledDifferencesAreTakenOut) {
  const double C = 4096, L = 32, V = 32000, f = 14336, kv = 8 * 128;
  const double attention = 2 * C * C + 2 * C * kv + 2 * C;  // q, o; k, v of 8 heads; two RMSNorms
  const double expert = 3 * C * f, router = 8 * C;
  const double published_total = L * (attention + router + 8 * expert) + 2 * V * C + C;
  const double published_active = L * (attention + router + 2 * expert) + 2 * V * C + C;
  EXPECT_NEAR(published_total / 46.7e9, 1.0, 0.002);  // the shapes give the published 46.7B / 12.9B
  EXPECT_NEAR(published_active / 12.9e9, 1.0, 0.002);

  const ModelShape m = preset_config("mixtral-8x7b");
  const ParameterCount count = model_parameters(m);
  // As planned: within 2% (total) and 6% (active) of the published counts, the gap explained below.
  EXPECT_NEAR(published_ratio(static_cast<double>(count.total), 46.7e9), 1.0, 0.02);
  EXPECT_NEAR(published_ratio(static_cast<double>(count.active), 12.9e9), 1.0, 0.06);
  // The gap: every k/v head (4C² against GQA's 2C² + 2C·kv), the tied head (V·C fewer), learned
  // positions (T·C more). Taken out, what is left is the GPT's biases and LayerNorm biases: < 0.1%.
  const double gqa = L * (4 * C * C - (2 * C * C + 2 * C * kv)), head = V * C;
  const double positions = static_cast<double>(m.block_size) * C;
  EXPECT_NEAR((static_cast<double>(count.total) - gqa + head - positions) / published_total, 1.0, 0.001);
  EXPECT_NEAR((static_cast<double>(count.active) - gqa + head - positions) / published_active, 1.0, 0.001);
}

// DeepSeek-V3 as published (its report and config): V 129280, C 7168, 61 layers, 128 heads, MLA
// (q rank 1536, kv rank 512, 128 + 64 query/key dims, 128 value dims), the first 3 layers dense SwiGLU
// of 18432, then 256 routed + 1 shared SwiGLU experts of 2048, top-8, untied head; the MTP module is
// outside the published 671B.
TEST(PlannerExperts, DeepSeekV3CountsMatchPublishedOnceTheModelledDifferencesAreTakenOut) {
  const double C = 7168, L = 61, V = 129280, H = 128;
  const double mla = C * 1536 + 1536 + 1536 * H * 192 + C * 576 + 512 + 512 * H * 256 + H * 128 * C + 2 * C;
  const double dense = 3 * C * 18432, expert = 3 * C * 2048, router = 256 * C;
  const double outside = 2 * V * C + C;
  const double published_total = L * mla + 3 * dense + 58 * (router + 257 * expert) + outside;
  const double published_active = L * mla + 3 * dense + 58 * (router + 9 * expert) + outside;
  EXPECT_NEAR(published_total / 671e9, 1.0, 0.002);
  // "37B activated" is the shapes' 37.5B cut to two digits
  EXPECT_NEAR(published_active / 37e9, 1.0, 0.02);

  const ModelShape m = preset_config("deepseek-v3");
  const ParameterCount count = model_parameters(m);
  EXPECT_NEAR(published_ratio(static_cast<double>(count.total), 671e9), 1.0, 0.005);
  EXPECT_NEAR(published_ratio(static_cast<double>(count.active), 37e9), 1.0, 0.03);
  // The gap: MHA's 4C² + biases for MLA, the tied head, learned positions, the dense layers' 4C GELU
  // MLP (8C² + 5C) for SwiGLU's 3·C·18432. Taken out: the experts' biases, < 0.1%.
  const double attention_gap = L * ((4 * C * C + 8 * C) - mla);
  const double dense_gap = 3 * ((8 * C * C + 5 * C) - dense);
  const double positions = static_cast<double>(m.block_size) * C;
  auto adjusted = [&](int64_t n) { return static_cast<double>(n) - attention_gap - dense_gap + V * C - positions; };
  EXPECT_NEAR(adjusted(count.total) / published_total, 1.0, 0.001);
  EXPECT_NEAR(adjusted(count.active) / published_active, 1.0, 0.001);
}

TEST(PlannerExperts, ADenseModelCountsAsBefore) {
  for (const char* name : {"gpt2", "gpt3-175b", "llama-70b"}) {
    const ModelShape m = preset_config(name);
    EXPECT_EQ(model_parameters(m).total, gpt_parameters(m)) << name;
    EXPECT_EQ(model_parameters(m).active, gpt_parameters(m)) << name;
  }
}

// A small MoE: C 64, 4 layers with experts in layers 1 and 3 (moe_every 2), E 8 of width 4C, k 2.
ModelShape small_moe() {
  ModelShape m(nn::GPTConfig{.vocab_size = 64, .block_size = 16, .n_layer = 4, .n_head = 4, .n_embd = 64});
  m.moe_experts = 8;
  m.moe_top_k = 2;
  m.moe_every = 2;
  return m;
}

TrainPlan ep_plan(int dp_replicate, int ep, int micro_batches, int zero = 0) {
  TrainPlan plan;
  plan.dp_strategy = zero_stage_strategy(zero);
  plan.parallelism = {.dp_replicate = zero == 0 ? dp_replicate : 1, .dp_shard = zero == 0 ? 1 : dp_replicate,
                      .ep = ep};
  plan.micro_batches = micro_batches;
  return plan;
}

const GroupTraffic* find(const std::vector<GroupTraffic>& traffic, const std::string& group, CommOp op) {
  for (const GroupTraffic& t : traffic)
    if (t.group == group && t.op == op) return &t;
  return nullptr;
}

// Per MoE layer and micro-batch: dispatch and combine forward, their reverses backward, each moving
// tokens·k·C·bytes·(ep-1)/ep; a capacity factor 0.5 keeps half the assignments of a uniform load.
TEST(PlannerExperts, AllToAllBytesAreTheKeptAssignmentsThatLeaveTheRank) {
  ModelShape m = small_moe();
  const BatchShape batch{32, 16};  // 32 rows over dp 2 x ep 4 x 2 micro-batches: 2 rows of 16 tokens
  const int ep = 4, M = 2;
  const int64_t tokens = 32 / (2 * ep) / M * 16, k = 2, C = 64, bytes = 4, moe_layers = 2;
  for (double capacity : {0.0, 0.5, 1.25}) {
    m.moe_capacity_factor = capacity;
    const double kept = capacity == 0.5 ? 0.5 : 1.0;  // dropless, or a cap above a uniform load
    const auto traffic = estimate_traffic(m, ep_plan(2, ep, M), batch, 0);
    const GroupTraffic* a2a = find(traffic, "ep", CommOp::all_to_all);
    ASSERT_NE(a2a, nullptr);
    EXPECT_EQ(a2a->calls, 4 * moe_layers * M);
    const double per_call = tokens * k * kept * C * bytes * (ep - 1.0) / ep;
    EXPECT_EQ(a2a->bytes_sent, static_cast<int64_t>(per_call) * a2a->calls) << "capacity " << capacity;
    EXPECT_EQ(a2a->bytes_received, a2a->bytes_sent);
    EXPECT_EQ(a2a->members.size(), static_cast<size_t>(ep));
  }
  // ep 1: no all-to-all at all
  EXPECT_EQ(find(estimate_traffic(small_moe(), ep_plan(8, 1, M), batch, 0), "ep", CommOp::all_to_all), nullptr);
}

// A rank holds E/ep experts of every MoE layer and every other weight whole (DDP); ZeRO-1 shards the
// optimizer state of the other weights over dp_shard x ep and of the experts over dp_shard.
TEST(PlannerExperts, ARankHoldsItsShareOfTheExperts) {
  const ModelShape m = small_moe();
  const double C = 64, E = 8, F = 4 * C, moe_layers = 2;
  const double expert = 2 * C * F + F + C;          // c_fc [F, C] + bias, c_proj [C, F] + bias
  const double dense_psi = 4 * (12 * C * C + 13 * C) + (64 + 16) * C + 2 * C;  // the GPT without experts
  // an MoE layer trades the MLP (8C² + 5C) for a router [E, C] and E experts
  const double shared = dense_psi + moe_layers * (E * C - (8 * C * C + 5 * C));
  const double psi_experts = moe_layers * E * expert;
  const BatchShape batch{64, 16};
  for (int ep : {1, 2, 4, 8}) {
    const MemoryEstimate ddp = estimate_memory(m, ep_plan(8 / ep, ep, 1), batch, 0);
    EXPECT_EQ(ddp.weights, static_cast<int64_t>(4 * (shared + psi_experts / ep))) << "ep " << ep;
    const int dp_shard = 8 / ep;
    const MemoryEstimate zero1 = estimate_memory(m, ep_plan(dp_shard, ep, 1, 1), batch, 0);
    const double optimizer = 8 * (shared / (dp_shard * ep) + psi_experts / ep / dp_shard);
    EXPECT_NEAR(static_cast<double>(zero1.optimizer) / optimizer, 1.0, 0.01) << "ep " << ep;  // bucket padding
  }
  EXPECT_THROW(estimate_memory(m, ep_plan(1, 3, 1), {6, 16}, 0), Error);  // ep 3 does not divide 8 experts
  EXPECT_THROW(estimate_memory(nn::GPTConfig{}, ep_plan(1, 2, 1), {2, 16}, 0), Error);  // no experts to split
}

// Expert gradients are all-reduced without ep (over dp_replicate here), the others with it (dp).
TEST(PlannerExperts, ExpertGradientsReduceWithoutEp) {
  const ModelShape m = small_moe();
  const auto traffic = estimate_traffic(m, ep_plan(2, 4, 1), {64, 16}, 0);
  const GroupTraffic* experts = find(traffic, "dp_replicate", CommOp::all_reduce);
  const GroupTraffic* rest = find(traffic, "dp", CommOp::all_reduce);
  ASSERT_NE(experts, nullptr);
  ASSERT_NE(rest, nullptr);
  EXPECT_EQ(experts->members.size(), 2u);
  EXPECT_EQ(rest->members.size(), 8u);
  // a ring all-reduce of S over 2 ranks sends S/2 twice: S, the rank's 2 experts of 2 layers in f32
  const double C = 64, F = 256;
  EXPECT_EQ(experts->bytes_sent, static_cast<int64_t>(4 * 2 * 2 * (2 * C * F + F + C)));
}

Cluster h100s(int nodes) {
  Cluster c;
  c.nodes = nodes;
  c.topology = Topology::parse_links("intra=450GB/s,1us;inter=50GB/s,5us;gpus-per-node=8");
  c.gpu_memory_bytes = 80e9;
  c.flops = 989e12;
  return c;
}

// Mixtral on 64 H100s with a 4M-token batch (1024 rows of 4096): the best layout splits the experts
// (ep > 1), and its step time holds the ep all-to-alls, on the critical path.
TEST(PlannerExperts, MixtralOn64H100sUsesExpertParallelism) {
  Workload work{preset_config("mixtral-8x7b"), {1024, 4096}};
  work.model.param_dtype = DType::bf16;
  const Ranking r = search(work, h100s(8), {.precision = nn::MixedPrecision::parse("bf16", "")});
  ASSERT_GT(r.fitting(), 0);
  const LayoutEstimate& best = r.layouts.front();
  EXPECT_GT(best.plan.parallelism.ep, 1) << layout_name(best.plan);
  double all_to_all = 0;
  for (const GroupTime& g : best.groups)
    if (g.traffic.group == "ep" && g.traffic.op == CommOp::all_to_all) {
      EXPECT_GT(g.seconds, 0);
      EXPECT_DOUBLE_EQ(g.exposed, g.seconds);  // the layer waits for its tokens
      all_to_all += g.exposed;
    }
  EXPECT_GT(all_to_all, 0);
  EXPECT_GE(best.exposed_comm_s, all_to_all - 1e-9);
  EXPECT_NEAR(best.step_time_s, best.compute_s + best.bubble_s + best.exposed_comm_s, 1e-9);
}

// The tool: a ranked table with an ep column, the presets by name.
TEST(PlannerExperts, PlanPrintsEpForMoEPresets) {
  std::vector<std::string> words{"plan", "--model", "mixtral-8x7b", "--nodes", "8", "--batch-size", "1024",
                                 "--mixed-precision", "bf16", "--flops", "989TFLOP/s", "--links",
                                 "intra=450GB/s,1us;inter=50GB/s,5us", "--top", "5"};
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  const std::string text = run_plan(parse_plan(static_cast<int>(argv.size()), argv.data()));
  EXPECT_NE(text.find("tp  pp  cp  ep  dp(rxs)"), std::string::npos) << text;
  EXPECT_NE(text.find("   1  ep"), std::string::npos) << text;
  EXPECT_NE(text.find("active: 2 of 8 experts a token"), std::string::npos) << text;
  EXPECT_NE(text.find("  EP "), std::string::npos) << text;
}

}  // namespace
}  // namespace sl::parallel::planner
