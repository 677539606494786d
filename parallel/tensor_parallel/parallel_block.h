// parallel_block.h — a GPT block's attention and MLP made tensor parallel, on the GPT's own modules.
//
//   The shard nn::GPT(config, seed, spec.with_tensor_parallel(r, t)) already holds rank r's slices:
//   c_attn [3C/t, C] = whole heads r·NH/t … of q, k and v (CausalSelfAttention reads its NH/t heads
//   off that width), attn.c_proj [C, C/t], mlp.c_fc [4C/t, C], mlp.c_proj [C, 4C/t]. Block::forward
//   runs unchanged; forward hooks put the communication where Megatron puts it:
//
//     attention:  x ─ln_1─▶ f ─▶ c_attn_r ─▶ heads_r ─▶ c_proj_r ─▶ g ─▶ + b ─▶ + x
//                              └─ column parallel ─┘       └─ row parallel ─┘
//     MLP:        h ─ln_2─▶ f ─▶ c_fc_r ─GeLU─▶ c_proj_r ─▶ g ─▶ + b ─▶ + h
//                              └─ column ─┘         └─ row parallel ─┘
//
//   make_column_parallel(c_attn, ln_1) and make_column_parallel(c_fc, ln_2) put f on the LayerNorm
//   that feeds each column layer; make_row_parallel on each c_proj adds g, then the bias once
//   (linear.h, the chapter's one implementation of the two layers). Under SP, f and g are the
//   sequence all-gather and reduce-scatter, and the LayerNorms and residual adds see [B, T/t, C].
//
//   A mixture-of-experts block (nn/moe.h) keeps its router and experts whole on every tp rank: only
//   its attention is split, and every rank of the group computes the same experts on the same tokens
//   (not under SP, whose T/t rows would make tp a batch split: parallel/expert_parallel/expert_parallel.h).
//
//   Per block: forward 2 all-reduces of B·T·C (the g's), backward 2 (the f's) — or, under SP, 2
//   all-gathers + 2 reduce-scatters each way, the same bytes.
//
//   Tests: tests/parallel/tensor_parallel/test_tensor_parallel.cpp   Lesson: lessons/11_tensor_parallel.cpp
#pragma once
#include "nn/gpt.h"
#include "parallel/tensor_parallel/linear.h"

namespace sl::parallel {

// Installs the hooks and the four Linears' placements on block (built with a tp shard spec of
// tp.size()); the LayerNorms' placements under SP are apply_tensor_parallel's (tp_gpt.h).
void parallelize_block(nn::Block& block, const TPGroup& tp);

}  // namespace sl::parallel
