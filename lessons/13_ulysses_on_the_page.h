// 13_ulysses_on_the_page.h — lesson 13, section 5: "ring or Ulysses". Included once, by
// lessons/13_ring_attention.cpp (header-only: that lesson was 366 lines before this section).
//
//   DeepSpeed-Ulysses (Jacobs et al., 2023) cuts the SEQUENCE everywhere but in attention, where it
//   cuts the HEADS: one all-to-all each for Q, K and V before, one for the output after.
//
//     cp = 2, NH = 4, T = 8     before                  all-to-all          after
//                     rank 0    t0..t3 × h0 h1 h2 h3    ─────────▶   rank 0  t0..t7 × h0 h1
//                     rank 1    t4..t7 × h0 h1 h2 h3                 rank 1  t0..t7 × h2 h3
//
//   Bytes per rank and layer, forward (B batch, T tokens, C = NH·HS channels, elements):
//     ring      2·(cp-1) blocks of K and V, each B·(T/cp)·C       = 2·B·T·C·(cp-1)/cp   ~ 2·B·T·C, flat in cp
//     Ulysses   4 tensors (Q, K, V, out) of B·(T/cp)·C, of each
//               (cp-1)/cp leaves the rank                         = 4·B·T·C·(cp-1)/cp²  ~ 4·B·T·C / cp
//   Ulysses / ring = 2/cp: a tie at cp 2, Ulysses ahead beyond. But a rank needs whole heads, so
//   Ulysses stops at cp = NH; the ring has no such limit and hides its passes behind the blocks'
//   compute. Hybrid (USP): Ulysses over U ranks, the ring over R = cp/U, past the head limit.
//
//   Sections: 5a the exchange on the page (checked against the library), 5b the table (bytes from
//   the ledger against the formulas, peak memory, time on slow simulated links), 5c the head limit,
//   5d when each wins (checked against 5b's numbers).
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "lesson_args.h"
#include "lesson_svg.h"
#include "parallel/comm/launch.h"
#include "parallel/context_parallel/context_parallel.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"

namespace lesson13_ulysses {

using namespace sl;
using namespace sl::parallel;
using Check = std::function<void(bool, const std::string&)>;

// ---- 5a. Ulysses' exchange on the page -------------------------------------------------------------------
// Which global positions rank s holds under Ulysses (U = cp), in local order. Contiguous: [s·T/cp, ...).
// Zigzag: each half of the sequence cut into cp pieces, rank s holding piece s of both (so that a
// hybrid's ring level, which sees a Ulysses group's tokens together, still gets the zigzag halves).
static std::vector<int64_t> ulysses_positions(int cp, int s, int64_t T, CpBalance balance) {
  const int halves = balance == CpBalance::zigzag ? 2 : 1;
  const int64_t piece = T / (halves * cp);
  std::vector<int64_t> out;
  for (int half = 0; half < halves; ++half)
    for (int64_t i = 0; i < piece; ++i) out.push_back(half * (T / halves) + s * piece + i);
  return out;
}

// The pairwise all-to-all: in step k rank r sends its piece for rank r+k and receives rank r-k's piece
// for it, so each pair meets once and nobody waits on two peers; the piece for itself never leaves.
static std::vector<Tensor> all_to_all_on_page(ProcessGroup& group, const std::vector<Tensor>& to_rank) {
  using Kind = ProcessGroup::P2POp::Kind;
  const int n = group.size(), r = group.rank();
  std::vector<Tensor> from_rank(n);
  from_rank[r] = to_rank[r];
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n, from = (r - k + n) % n;
    from_rank[from] = zeros_like(to_rank[from]);  // equal pieces: theirs has my piece's shape
    for (auto& work : group.batch_isend_irecv({{Kind::send, to_rank[to], to}, {Kind::recv, from_rank[from], from}}))
      work->wait();
  }
  return from_rank;
}

// x [B, NH, T/cp, HS], my tokens × every head -> [B, NH/cp, T, HS], every token × head group r, in order.
static Tensor sequence_to_heads_on_page(ProcessGroup& group, const Tensor& x, int64_t T, CpBalance balance,
                                        bool forget_order) {
  const int n = group.size();
  const int64_t B = x.size(0), h = x.size(1) / n, Tl = x.size(2), HS = x.size(3);
  std::vector<Tensor> to_rank;
  for (int d = 0; d < n; ++d) to_rank.push_back(x.narrow(1, d * h, h));  // head group d, for rank d
  const std::vector<Tensor> from_rank = all_to_all_on_page(group, to_rank);  // rank s's tokens, my heads
  // The layout change: rank s's local token j is global token pos[j]; put its row there.
  Tensor out = zeros({B, h, T, HS}, x.options());
  float* o = out.data<float>();
  for (int s = 0; s < n; ++s) {
    const std::vector<int64_t> pos = ulysses_positions(n, s, T, balance);
    const float* in = from_rank[s].data<float>();
    for (int64_t bh = 0; bh < B * h; ++bh)
      for (int64_t j = 0; j < Tl; ++j) {
        const int64_t t = forget_order ? s * Tl + j : pos[j];  // the mistake: rows in the order they came
        std::copy_n(in + (bh * Tl + j) * HS, HS, o + (bh * T + t) * HS);
      }
  }
  return out;
}

// The inverse: y [B, NH/cp, T, HS] -> [B, NH, T/cp, HS]: rank d's tokens of my heads go to rank d, and
// what comes back from rank s is my tokens of head group s (so the pieces stack along the heads).
static Tensor heads_to_sequence_on_page(ProcessGroup& group, const Tensor& y, CpBalance balance) {
  const int n = group.size();
  const int64_t B = y.size(0), h = y.size(1), T = y.size(2), HS = y.size(3), Tl = T / n;
  std::vector<Tensor> to_rank;
  for (int d = 0; d < n; ++d) {
    Tensor piece = zeros({B, h, Tl, HS}, y.options());
    const std::vector<int64_t> pos = ulysses_positions(n, d, T, balance);
    for (int64_t bh = 0; bh < B * h; ++bh)
      for (int64_t j = 0; j < Tl; ++j)
        std::copy_n(y.data<float>() + (bh * T + pos[j]) * HS, HS, piece.data<float>() + (bh * Tl + j) * HS);
    to_rank.push_back(piece);
  }
  return cat(all_to_all_on_page(group, to_rank), 1);
}

// ---- 5b. bytes, memory and time per rank ----------------------------------------------------------------
struct Row {
  std::string variant;  // "ring", "ulysses", "hybrid U2xR2", ...
  int cp = 0, U = 1;
  int64_t T = 0;
  int64_t fwd_bytes = 0, total_bytes = 0;        // sent per rank (max over ranks), forward and fwd+bwd
  int64_t fwd_formula = 0, total_formula = 0;    // what the formulas say
  int64_t peak = 0;                              // peak bytes per rank (max over ranks)
  double ms = 0, link_ms = 0;                    // wall time of forward + backward, and the links' charge
};

// The formulas, in bytes (f32), for B·(T/cp)·C elements per block. Ring backward passes K, V
// (cp-1 times) and the blocks' dK, dV (cp times: the last pass brings a rank's own gradient home);
// Ulysses backward runs the 4 all-to-alls again (dOut, then dQ, dK, dV).
static void formulas(Row& row, int64_t B, int64_t C) {
  const int64_t block = B * (row.T / row.cp) * C * 4, cp = row.cp, U = row.U, R = cp / U;
  const int64_t ulysses = U > 1 ? 4 * block * (U - 1) / U : 0;
  const int64_t ring_fwd = R > 1 ? 2 * (R - 1) * block : 0, ring_bwd = R > 1 ? (2 * (R - 1) + 2 * R) * block : 0;
  row.fwd_formula = ulysses + ring_fwd;
  row.total_formula = 2 * ulysses + ring_fwd + ring_bwd;
}

struct Sweep {
  int64_t B = 1, NH = 8, HS = 16;
  std::vector<int> cps = {2, 4, 8};
  std::vector<int64_t> Ts = {256, 1024};
  Topology links;  // every rank its own node, one slow link between any two
};

// One attention core (forward + backward) over cp ranks on the sweep's links, measured: the slowest
// rank's wall time, the faster of two runs (2 cores shared by up to 8 rank threads and other jobs make
// any one run noisy); bytes, peak and the links' charge do not change between runs.
static Row measure(const Sweep& sweep, CpVariant variant, int cp, int U, int64_t T) {
  Row row{variant == CpVariant::hybrid ? "hybrid U" + std::to_string(U) + "xR" + std::to_string(cp / U)
                                       : cp_variant_name(variant),
          cp, U, T};
  formulas(row, sweep.B, sweep.NH * sweep.HS);
  Generator g(11);
  const Shape shape{sweep.B, sweep.NH, T, sweep.HS};
  Tensor q = randn(shape, DType::f32, &g), k = randn(shape, DType::f32, &g), v = randn(shape, DType::f32, &g),
         dout = randn(shape, DType::f32, &g);
  LaunchOptions options;
  options.topology = sweep.links;
  std::vector<Row> per_rank(cp, row);
  auto run = [&](RankContext& ctx) {
    const CpGroups groups = make_cp_groups(ctx.world, variant, U);
    const SequenceShard shard{cp, ctx.rank, CpBalance::zigzag, U};
    auto local = [&](const Tensor& t) { return shard.take(t, 2).to(ctx.device); };
    Tensor ql = local(q).set_requires_grad(), kl = local(k).set_requires_grad(), vl = local(v).set_requires_grad();
    Tensor dl = local(dout);
    auto sent = [&] {  // bytes and link time over every group the variant talks in (each counted once)
      CommStats sum;
      for (const ProcessGroupPtr& group : std::set<ProcessGroupPtr>{groups.cp, groups.ulysses, groups.ring})
        if (group) sum.bytes_sent += group->ledger().total().bytes_sent, sum.link_s += group->ledger().total().link_s;
      return sum;
    };
    MemoryLedger& memory = MemoryLedger::instance();
    ctx.world->barrier();
    memory.reset_peak(ctx.device);
    const int64_t before = memory.current(ctx.device);
    const CommStats at_start = sent();
    const auto start = std::chrono::steady_clock::now();
    Tensor out = context_parallel_core(shard, groups, variant)(ql, kl, vl);
    const CommStats after_forward = sent();
    out.backward(dl);
    Row& mine = per_rank[ctx.rank];
    mine.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const CommStats at_end = sent();
    mine.peak = memory.peak(ctx.device) - before;
    mine.fwd_bytes = after_forward.bytes_sent - at_start.bytes_sent;
    mine.total_bytes = at_end.bytes_sent - at_start.bytes_sent;
    mine.link_ms = 1e3 * (at_end.link_s - at_start.link_s);
  };
  row.ms = 1e300;
  for (int attempt = 0; attempt < 2; ++attempt) {
    launch(cp, run, options);
    double slowest = 0;  // the step ends when its last rank does
    for (const Row& r : per_rank) {
      row.fwd_bytes = std::max(row.fwd_bytes, r.fwd_bytes), row.total_bytes = std::max(row.total_bytes, r.total_bytes);
      row.peak = std::max(row.peak, r.peak), row.link_ms = std::max(row.link_ms, r.link_ms);
      slowest = std::max(slowest, r.ms);
    }
    row.ms = std::min(row.ms, slowest);
  }
  return row;
}

static const Row& find(const std::vector<Row>& rows, const std::string& variant, int cp, int64_t T) {
  for (const Row& r : rows)
    if (r.variant.rfind(variant, 0) == 0 && r.cp == cp && r.T == T) return r;
  throw Error("lesson 13: no row " + variant + " cp " + std::to_string(cp));
}

// ---- the section --------------------------------------------------------------------------------------------
// page_cp, page_T: 5a's cp and T (T a multiple of 2·cp); the sweep of 5b is fixed (cp 2, 4, 8).
// 5a. the exchange on the page against the library, both layouts, NH 2·cp, B 2.
static void exchange_on_the_page(int page_cp, int64_t page_T, bool forget_order, const Check& check) {
  const int cp = page_cp;
  const int64_t T = page_T, NH = 2 * cp, HS = 4;
  std::printf("  5a. sequence -> heads by hand (pairwise all-to-all + the layout change), cp %d, NH %lld, T %lld\n", cp,
              static_cast<long long>(NH), static_cast<long long>(T));
  Generator g(12);
  Tensor q = randn({2, NH, T, HS}, DType::f32, &g), k = randn({2, NH, T, HS}, DType::f32, &g),
         v = randn({2, NH, T, HS}, DType::f32, &g);
  const Tensor full = causal_attention(q, k, v);
  for (CpBalance balance : {CpBalance::none, CpBalance::zigzag}) {
    std::vector<double> swap_err(cp), out_err(cp), full_err(cp);
    std::vector<int64_t> page_bytes(cp), library_bytes(cp);
    bool same_positions = true;
    launch(cp, [&](RankContext& ctx) {
      const SequenceShard shard{cp, ctx.rank, balance, cp};
      auto local = [&](const Tensor& t) { return shard.take(t, 2).to(ctx.device); };
      ProcessGroup& world = *ctx.world;
      const int64_t sent0 = world.ledger()[CommOp::send].bytes_sent;
      Tensor qh = sequence_to_heads_on_page(world, local(q), T, balance, forget_order);
      Tensor kh = sequence_to_heads_on_page(world, local(k), T, balance, forget_order);
      Tensor vh = sequence_to_heads_on_page(world, local(v), T, balance, forget_order);
      Tensor mine = heads_to_sequence_on_page(world, causal_attention(qh, kh, vh), balance);  // the serial core
      page_bytes[ctx.rank] = world.ledger()[CommOp::send].bytes_sent - sent0;
      swap_err[ctx.rank] = max_abs_diff(qh, sequence_to_heads(local(q), shard, ctx.world));
      const int64_t a2a0 = world.ledger()[CommOp::all_to_all].bytes_sent;
      const Tensor library = ulysses_attention(local(q), local(k), local(v), shard, ctx.world, /*ring_group=*/nullptr);
      out_err[ctx.rank] = max_abs_diff(mine, library);
      library_bytes[ctx.rank] = world.ledger()[CommOp::all_to_all].bytes_sent - a2a0;
      full_err[ctx.rank] = max_abs_diff(mine, local(full));
      if (ctx.rank == 0)
        for (int s = 0; s < cp; ++s) {
          const std::vector<double> lib = SequenceShard{cp, s, balance, cp}.positions(T).to_vector();
          const std::vector<int64_t> page = ulysses_positions(cp, s, T, balance);
          same_positions = same_positions && std::equal(page.begin(), page.end(), lib.begin(), lib.end());
        }
    });
    const double e_swap = *std::max_element(swap_err.begin(), swap_err.end());
    const double e_out = *std::max_element(out_err.begin(), out_err.end());
    const double e_full = *std::max_element(full_err.begin(), full_err.end());
    std::printf("  %-7s page vs sequence_to_heads %.2g, vs ulysses_attention %.2g, vs full attention %.2g;"
                " sent %lld B (page) / %lld B (library) per rank\n",
                cp_balance_name(balance), e_swap, e_out, e_full, static_cast<long long>(page_bytes[0]),
                static_cast<long long>(library_bytes[0]));
    if (forget_order && balance == CpBalance::none)
      std::printf("  --break-ulysses-order: contiguous shards arrive in sequence order anyway, so this one passes\n");
    if (forget_order && balance == CpBalance::zigzag)
      std::printf("  --break-ulysses-order: rank 1's rows land at %d.. where its tokens are %lld.. and %lld..\n",
                  static_cast<int>(T / cp), static_cast<long long>(T / (2 * cp)),
                  static_cast<long long>(T / 2 + T / (2 * cp)));
    check(same_positions,
          std::string("Ulysses positions by hand == SequenceShard::positions (") + cp_balance_name(balance) + ")");
    check(e_swap == 0 && e_out == 0 && e_full < 1e-5 && page_bytes == library_bytes,
          "page == the library (exactly, same bytes) == full attention");
  }
}

// 5b. the table: every variant's bytes, memory and time as cp and T grow.
static std::vector<Row> the_table(const Sweep& sweep, const std::string& svg_dir, const Check& check) {
  const int64_t C = sweep.NH * sweep.HS;
  std::printf("\n  5b. one attention core, forward + backward, per rank: B %lld, NH %lld, HS %lld (C %lld), zigzag,\n"
              "      f32, links %s between any two ranks. Bytes are sent per rank (the ledger; formula in [])\n",
              static_cast<long long>(sweep.B), static_cast<long long>(sweep.NH), static_cast<long long>(sweep.HS),
              static_cast<long long>(C), sweep.links.inter.str().c_str());
  std::printf("  %-14s %-3s %-5s  %-22s %-24s %-10s %-9s %s\n", "variant", "cp", "T", "fwd KiB [formula]",
              "fwd+bwd KiB [formula]", "peak MiB", "time ms", "links ms");
  std::vector<Row> rows;
  for (int64_t T_row : sweep.Ts)
    for (int cp_row : sweep.cps) {
      rows.push_back(measure(sweep, CpVariant::ring, cp_row, 1, T_row));
      rows.push_back(measure(sweep, CpVariant::ulysses, cp_row, cp_row, T_row));
      if (cp_row >= 4) rows.push_back(measure(sweep, CpVariant::hybrid, cp_row, 2, T_row));
      for (size_t i = rows.size() - (cp_row >= 4 ? 3 : 2); i < rows.size(); ++i) {
        const Row& r = rows[i];
        std::printf("  %-14s %-3d %-5lld  %7.1f [%7.1f]      %8.1f [%8.1f]      %7.2f    %7.1f   %7.1f\n",
                    r.variant.c_str(), r.cp, static_cast<long long>(r.T), r.fwd_bytes / 1024.0, r.fwd_formula / 1024.0,
                    r.total_bytes / 1024.0, r.total_formula / 1024.0, r.peak / 1048576.0, r.ms, r.link_ms);
      }
    }
  bool formulas_hold = true;
  for (const Row& r : rows)
    formulas_hold = formulas_hold && r.fwd_bytes == r.fwd_formula && r.total_bytes == r.total_formula;
  check(formulas_hold, "every row's bytes == the formulas (forward and forward + backward)");

  lesson::BarChart chart("bytes sent per rank per layer, fwd+bwd, T " + std::to_string(sweep.Ts.back()) +
                             " (red: the formula)", "KiB");
  for (const Row& r : rows)
    if (r.T == sweep.Ts.back())
      chart.bar("cp " + std::to_string(r.cp) + " " + r.variant, r.total_bytes / 1024.0, r.total_formula / 1024.0,
                r.variant == "ring" ? "#4c78a8" : r.variant == "ulysses" ? "#f58518" : "#72b7b2");
  lesson::write_picture(svg_dir, "ring_or_ulysses_bytes.svg", chart.svg());
  return rows;
}

// 5c. the head limit.
static void head_limit(const Check& check) {
  std::printf("\n  5c. the head limit: after the all-to-all a rank attends with n_head / U WHOLE heads\n");
  nn::GPTConfig config{.vocab_size = 64, .block_size = 64, .n_layer = 1, .n_head = 6, .n_embd = 48};
  bool refused = false, hybrid_ok = true;
  try {
    check_context_parallel(config, 4, {.variant = CpVariant::ulysses});
  } catch (const Error& e) {
    refused = true;
    std::printf("  n_head 6, cp 4, ulysses: refused: %s\n", e.what());
  }
  try {
    check_context_parallel(config, 4, {.variant = CpVariant::hybrid, .ulysses_degree = 2});
    std::printf("  n_head 6, cp 4, hybrid U 2 x R 2: accepted (3 heads per rank, the ring over 2 ranks)\n");
  } catch (const Error& e) {
    hybrid_ok = false;
    std::printf("  n_head 6, cp 4, hybrid U 2 x R 2: refused: %s\n", e.what());
  }
  std::printf("  A head's softmax needs its own q·k over every key: a rank cannot hold 1.5 heads, so U | n_head\n"
              "  (and U <= n_head: Ulysses stops at cp = n_head, 8 in 5b). The ring cuts tokens, not heads.\n");
  check(refused && hybrid_ok, "Ulysses refuses n_head 6 over cp 4; the hybrid U 2 x R 2 takes it");
}

// 5d. when each wins, from the table's own numbers.
static void when_each_wins(const Sweep& sweep, const std::vector<Row>& rows, const Check& check) {
  const int64_t C = sweep.NH * sweep.HS;
  const int64_t big_T = sweep.Ts.back();
  const double BTC = static_cast<double>(sweep.B * big_T * C * 4);
  std::printf("\n  5d. when each wins (T %lld; bytes sent per rank in units of B·T·C = %.0f KiB):\n",
              static_cast<long long>(big_T), BTC / 1024);
  std::printf("  %-4s %-7s %-9s %-21s %-8s %-26s %-10s %s\n", "cp", "ring", "ulysses", "ulysses/ring [2/cp]",
              "hybrid", "fwd+bwd ulysses/ring [f]", "links u/r", "wall u/r");
  bool ulysses_falls = true, ring_flat = true, ratio_holds = true, hybrid_between = true, links_follow = true;
  double last_ulysses = 1e300;
  for (int cp_row : sweep.cps) {
    const Row &ring = find(rows, "ring", cp_row, big_T), &ulysses = find(rows, "ulysses", cp_row, big_T);
    const double ratio = static_cast<double>(ulysses.fwd_bytes) / static_cast<double>(ring.fwd_bytes);
    const double total_ratio = static_cast<double>(ulysses.total_bytes) / static_cast<double>(ring.total_bytes);
    // forward + backward: Ulysses 8·(cp-1)/cp², the ring (2(cp-1) + 2(cp-1) + 2cp)/cp of B·T·C
    const double total_formula = 8.0 * (cp_row - 1) / (cp_row * (6.0 * cp_row - 4));
    std::string hybrid = "-";
    if (cp_row >= 4) {
      const Row& h = find(rows, "hybrid", cp_row, big_T);
      hybrid = std::to_string(h.fwd_bytes / BTC).substr(0, 5);
      hybrid_between = hybrid_between && ulysses.fwd_bytes < h.fwd_bytes && h.fwd_bytes < ring.fwd_bytes;
    }
    char forward[32], both[32];
    std::snprintf(forward, sizeof forward, "%.3f [%.3f]", ratio, 2.0 / cp_row);
    std::snprintf(both, sizeof both, "%.3f [%.3f]", total_ratio, total_formula);
    std::printf("  %-4d %-7.3f %-9.3f %-21s %-8s %-26s %-10.2f %.2f\n", cp_row, ring.fwd_bytes / BTC,
                ulysses.fwd_bytes / BTC, forward, hybrid.c_str(), both, ulysses.link_ms / ring.link_ms,
                ulysses.ms / ring.ms);
    ulysses_falls = ulysses_falls && ulysses.fwd_bytes < last_ulysses;
    last_ulysses = static_cast<double>(ulysses.fwd_bytes);
    ring_flat = ring_flat && ring.fwd_bytes >= BTC && ring.fwd_bytes < 2 * BTC;
    ratio_holds = ratio_holds && std::abs(ratio - 2.0 / cp_row) < 1e-12 &&
                  std::abs(total_ratio - total_formula) < 1e-12;
    links_follow = links_follow && ulysses.link_ms < ring.link_ms;
  }
  const Row& fewest = find(rows, "ulysses", sweep.cps.front(), big_T);  // Ulysses at the smallest and largest cp
  const Row& most = find(rows, "ulysses", sweep.cps.back(), big_T);
  const double memory_ratio = static_cast<double>(most.peak) / static_cast<double>(fewest.peak);
  std::printf("  Forward, per rank: the ring sends 2·(cp-1) blocks of T/cp tokens, ~2·B·T·C whatever cp; Ulysses\n"
              "  sends (cp-1)/cp of 4 tensors of T/cp tokens, 4·B·T·C·(cp-1)/cp², ~4·B·T·C/cp. A tie at cp 2,\n"
              "  Ulysses ahead from cp 4 (DeepSpeed's 4Nh/P against the ring's ~2Nh). Backward the ring passes K, V\n"
              "  again and dK, dV a whole lap, Ulysses only runs its 4 all-to-alls again: over a step Ulysses\n"
              "  moves half the ring's bytes even at cp 2. The links' charge follows the bytes (plus 20 us a\n"
              "  message: Ulysses' cp-1 per all-to-all). Wall time is this machine's and not checked: up to 8 rank\n"
              "  threads share two cores, so their compute runs in turn and each synchronisation can wait on a\n"
              "  descheduled peer (it moves by tens of percent between runs). On real devices the ring posts each\n"
              "  pass before the block's compute and hides it where compute is large (small cp, long T), while\n"
              "  Ulysses' all-to-alls block; where the bytes dominate Ulysses pulls ahead (EasyContext: ~15%% on\n"
              "  8 A100s). The ring's other advantage: no head limit (5c).\n"
              "  Memory: both compute attention blockwise, so a rank holds ~T/cp tokens' q, k, v and out either\n"
              "  way (the ring a little more: K/V and dK/dV in flight); Ulysses' peak at cp %d is %.2f of cp %d's\n"
              "  (~%d/%d). The hybrid sits between on bytes and takes any n_head that U divides: USP puts Ulysses\n"
              "  inside a node, on fast links, and the ring across nodes, where its passes overlap compute.\n",
              sweep.cps.back(), memory_ratio, sweep.cps.front(), sweep.cps.front(), sweep.cps.back());
  check(ulysses_falls, "Ulysses' bytes per rank fall as cp grows (4·(cp-1)/cp² of B·T·C)");
  check(ring_flat, "the ring's bytes per rank stay in [1, 2) x B·T·C whatever cp (2·(cp-1)/cp)");
  check(ratio_holds, "Ulysses / ring bytes == 2/cp forward (a tie at cp 2, Ulysses less from cp 4), == [f] fwd+bwd");
  check(hybrid_between, "the hybrid (U 2) moves between the two: more than Ulysses, less than the ring");
  check(links_follow, "on the slow links Ulysses is charged less link time than the ring at every cp");
  check(std::abs(memory_ratio * sweep.cps.back() / sweep.cps.front() - 1) < 0.15,
        "Ulysses' peak per rank falls as 1/cp (T/cp tokens' worth of q, k, v and out)");
}

static void ring_or_ulysses(int page_cp, int64_t page_T, bool forget_order, const std::string& svg_dir,
                            const Check& check) {
  std::printf("\n--- 5. ring or Ulysses: all-to-all Q, K, V and out, or pass K and V around\n");
  exchange_on_the_page(page_cp, page_T, forget_order, check);
  Sweep sweep;
  sweep.links.gpus_per_node = 1;  // every rank alone on its node: every message crosses the slow link
  sweep.links.inter = {40e6, 20e-6};  // 40 MB/s: slow enough that the bytes show in the time
  const std::vector<Row> rows = the_table(sweep, svg_dir, check);
  head_limit(check);
  when_each_wins(sweep, rows, check);
}

}  // namespace lesson13_ulysses
