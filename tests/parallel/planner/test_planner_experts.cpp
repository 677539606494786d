// The planner's mixtures of experts (parallel/planner/model_shape.h, expert_traffic.cpp): the MoE
// presets against their published sizes, the ep group's all-to-all bytes and a rank's expert memory
// against formulas written here from tokens, k, C, E, ep and Ψ, and the search on a cluster where
// Mixtral trains. Expected values come from the shapes, never from the cost model.
#include <gtest/gtest.h>

#include <functional>
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
  // ep 1 over data-parallel ranks is refused (each rank would route its own rows); alone, no all-to-all
  EXPECT_THROW(estimate_traffic(small_moe(), ep_plan(8, 1, M), batch, 0), Error);
  EXPECT_EQ(find(estimate_traffic(small_moe(), ep_plan(1, 1, M), batch, 0), "ep", CommOp::all_to_all), nullptr);
}

// A rank holds E/ep experts of every MoE layer and every other weight whole (DDP). ZeRO-1 shards the
// other weights' optimizer state over dp_shard x ep and keeps the experts out of its flat buffers:
// their weights, gradients (.grad) and AdamW moments whole on every rank. At ep 1 the mixture of
// experts runs on one data-parallel rank only (each rank would route its own rows): refused over 8.
TEST(PlannerExperts, ARankHoldsItsShareOfTheExperts) {
  const ModelShape m = small_moe();
  const double C = 64, E = 8, F = 4 * C, moe_layers = 2;
  const double expert = 2 * C * F + F + C;          // c_fc [F, C] + bias, c_proj [C, F] + bias
  const double dense_psi = 4 * (12 * C * C + 13 * C) + (64 + 16) * C + 2 * C;  // the GPT without experts
  // an MoE layer trades the MLP (8C² + 5C) for a router [E, C] and E experts
  const double shared = dense_psi + moe_layers * (E * C - (8 * C * C + 5 * C));
  const double psi_experts = moe_layers * E * expert;
  const BatchShape batch{64, 16};
  EXPECT_THROW(estimate_memory(m, ep_plan(8, 1, 1), batch, 0), Error);
  for (int ep : {2, 4, 8}) {
    const MemoryEstimate ddp = estimate_memory(m, ep_plan(8 / ep, ep, 1), batch, 0);
    EXPECT_EQ(ddp.weights, static_cast<int64_t>(4 * (shared + psi_experts / ep))) << "ep " << ep;
    const int dp_shard = 8 / ep;
    const MemoryEstimate zero1 = estimate_memory(m, ep_plan(dp_shard, ep, 1, 1), batch, 0);
    const double optimizer = 8 * (shared / (dp_shard * ep) + psi_experts / ep);
    EXPECT_NEAR(static_cast<double>(zero1.optimizer) / optimizer, 1.0, 0.01) << "ep " << ep;  // bucket padding
    // the gradients: ZeRO-1's flat buffer of the other weights (padded) and the experts' whole .grad
    EXPECT_NEAR(static_cast<double>(zero1.grads) / (4 * (shared + psi_experts / ep)), 1.0, 0.01) << "ep " << ep;
    EXPECT_NEAR(static_cast<double>(zero1.weights) / (4 * (shared + psi_experts / ep)), 1.0, 0.01) << "ep " << ep;
  }
  EXPECT_THROW(estimate_memory(m, ep_plan(1, 3, 1), {6, 16}, 0), Error);  // ep 3 does not divide 8 experts
  EXPECT_THROW(estimate_memory(nn::GPTConfig{}, ep_plan(1, 2, 1), {2, 16}, 0), Error);  // no experts to split
}

// tp cuts the attention, the dense MLPs and the embedding, but not an MoE block: its router and this
// ep rank's experts are whole on every tp rank, so the experts' bytes do not shrink with tp.
TEST(PlannerExperts, TpLeavesTheMoEBlockWhole) {
  const ModelShape m = small_moe();
  const double C = 64, E = 8, F = 4 * C, V = 64, T = 16, t = 2, ep = 2;
  const double attention = 5 * C + 4 * C * C / t + 3 * C / t;   // LayerNorms, c_attn rows, c_proj columns
  const double dense_mlp = 8 * C * C / t + 4 * C / t + C;        // c_fc rows, c_proj columns (bias whole)
  const double moe_mlp = E * C + E / ep * (2 * C * F + F + C);   // router, E/ep whole experts
  const double psi = V / t * C + T * C + 4 * attention + 2 * dense_mlp + 2 * moe_mlp + 2 * C;
  TrainPlan plan = ep_plan(2, 2, 1);
  plan.parallelism.tp = 2;
  for (int rank = 0; rank < 8; ++rank)
    EXPECT_EQ(estimate_memory(m, plan, {16, 16}, rank).weights, static_cast<int64_t>(4 * psi)) << "rank " << rank;
  // every tp rank routes the same tokens: the same all-to-all bytes as without tp, on its own ep group
  const std::vector<GroupTraffic> tp_traffic = estimate_traffic(m, plan, {16, 16}, 1);
  const std::vector<GroupTraffic> no_tp_traffic = estimate_traffic(m, ep_plan(2, 2, 1), {16, 16}, 0);
  const GroupTraffic* with_tp = find(tp_traffic, "ep", CommOp::all_to_all);
  const GroupTraffic* without = find(no_tp_traffic, "ep", CommOp::all_to_all);
  ASSERT_NE(with_tp, nullptr);
  ASSERT_NE(without, nullptr);
  EXPECT_EQ(with_tp->bytes_sent, without->bytes_sent);
  EXPECT_EQ(with_tp->members, (std::vector<int>{1, 3}));  // [dp_replicate 2, ep 2, tp 2]: tp coordinate 1
}

// The planner costs only what train runs: with experts, no mixed precision, no SP or offload with ep,
// ZeRO/FSDP not with pp or cp, no interleaved stages under DDP.
TEST(PlannerExperts, LayoutsTrainRefusesAreRefused) {
  const ModelShape m = small_moe();
  auto refused = [&](const std::function<void(TrainPlan&)>& change) {
    TrainPlan plan = ep_plan(2, 2, 2, 1);
    change(plan);
    return std::make_pair(plan, plan.parallelism.world_size());
  };
  const std::vector<std::pair<std::string, std::function<void(TrainPlan&)>>> cases = {
      {"bf16", [](TrainPlan& p) { p.precision = nn::MixedPrecision::parse("bf16"); }},
      {"sp", [](TrainPlan& p) { p.parallelism.tp = 2, p.sequence_parallel = true; }},
      {"offload", [](TrainPlan& p) { p.offload = true; }},
      {"zero1 pp", [](TrainPlan& p) { p.parallelism.pp = 2; }},
      {"zero1 cp", [](TrainPlan& p) { p.parallelism.cp = 2; }},
      {"ddp interleaved", [](TrainPlan& p) {
         p.dp_strategy = DpStrategy::ddp, p.parallelism.dp_shard = 1, p.parallelism.pp = 2;
         p.schedule = ScheduleKind::interleaved, p.virtual_stages = 2;
       }},
  };
  for (const auto& [name, change] : cases) {
    const auto [plan, world] = refused(change);
    EXPECT_THROW(estimate_memory(m, plan, {32, 16}, 0), Error) << name;
    EXPECT_THROW(check_layout(Workload{m, {32, 16}}, plan, world), Error) << name;
  }
  EXPECT_NO_THROW(estimate_memory(m, ep_plan(2, 2, 2, 1), {32, 16}, 0));  // ZeRO-1 over dp_shard 2 x ep 2
}

// Expert gradients are all-reduced without ep (over expert_dp_cp, dp_replicate here), the others with
// it (dp). The group is named as the trainer names DDP's expert group.
TEST(PlannerExperts, ExpertGradientsReduceWithoutEp) {
  const ModelShape m = small_moe();
  const auto traffic = estimate_traffic(m, ep_plan(2, 4, 1), {64, 16}, 0);
  const GroupTraffic* experts = find(traffic, "expert_dp_cp", CommOp::all_reduce);
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

// Mixtral on 64 H100s in f32 (train runs a mixture of experts in f32 only) with a 1M-token batch (1024
// rows of 1024): the best layout splits the experts (ep > 1; with these numbers ep4 x pp8 under DDP),
// and its step time holds the ep all-to-alls, on the critical path. With the experts whole over tp and
// under ZeRO/FSDP, and ZeRO/FSDP refused with pp or cp, a 4M-token batch of 4096-token rows leaves no
// ep layout that fits 80 GB: the planner then ranks ep-free FSDP layouts first.
TEST(PlannerExperts, MixtralOn64H100sUsesExpertParallelism) {
  const Workload work{preset_config("mixtral-8x7b"), {1024, 1024}};
  const Ranking r = search(work, h100s(8), {});
  ASSERT_GT(r.fitting(), 0);
  const LayoutEstimate& best = r.layouts.front();
  EXPECT_GT(best.plan.parallelism.ep, 1) << layout_name(best.plan);
  EXPECT_EQ(best.plan.dp_strategy, DpStrategy::ddp) << layout_name(best.plan);  // ep with pp runs under DDP
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

std::string plan_text(std::vector<std::string> words) {
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  return run_plan(parse_plan(static_cast<int>(argv.size()), argv.data()));
}

// The tool: a ranked table with an ep column, the presets by name; a mixture of experts in f32 only.
TEST(PlannerExperts, PlanPrintsEpForMoEPresets) {
  std::vector<std::string> words{"plan", "--model", "mixtral-8x7b", "--nodes", "8", "--batch-size", "1024",
                                 "--seq-len", "1024", "--flops", "989TFLOP/s", "--links",
                                 "intra=450GB/s,1us;inter=50GB/s,5us", "--top", "5"};
  const std::string text = plan_text(words);
  EXPECT_NE(text.find("tp  pp  cp  ep  dp(rxs)"), std::string::npos) << text;
  EXPECT_NE(text.find("   1  ep"), std::string::npos) << text;
  EXPECT_NE(text.find("active: 2 of 8 experts a token"), std::string::npos) << text;
  EXPECT_NE(text.find("  EP "), std::string::npos) << text;
  words.insert(words.end(), {"--mixed-precision", "bf16"});
  EXPECT_THROW(plan_text(words), Error);  // train refuses --moe-experts with --mixed-precision
}

}  // namespace
}  // namespace sl::parallel::planner
