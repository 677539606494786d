// layout_cli.h — the layout flags that build/bin/train (tools/train_cli.h) and build/bin/plan
// (tools/plan_cli.h) share: data parallelism, ZeRO/FSDP, the pipeline, tensor and context
// parallelism, bound to the library's TrainOptions (parallel/train/train_options.h) with one name,
// one range and one help line each.
#pragma once
#include "parallel/train/train_options.h"
#include "tools/cli.h"

namespace sl {

// The train program's name for the library's options.
using Options = parallel::TrainOptions;

// Data parallelism, ZeRO/FSDP, the pipeline's stages and schedule, tensor and context parallelism.
inline void add_layout_flags(cli::Parser& cli, Options& o) {
  cli.group("Data parallel");
  cli.integer("--dp", o.dp, 1, 1024, "data-parallel ranks (threads; under mpirun: the processes)");
  cli.group("ZeRO/FSDP");
  cli.integer("--zero", o.zero, 0, 3,
              "0: DDP, 1/2: ZeRO optimizer (and gradient) sharding over the --dp ranks, 3: FSDP (parameters too)");
  cli.integer("--dp-replicate", o.dp_replicate, 1, 1024,
              "HSDP: FSDP within --dp-shard S ranks, replicated R times (world R x S); needs --dp-shard");
  cli.integer("--dp-shard", o.dp_shard, 1, 1024,
              "FSDP over S ranks (alone: as --dp S --zero 3); over a pp, tp or cp cut FSDP shards each rank's "
              "part over dp_shard x cp");
  cli.flag("--offload", o.offload, "ZeRO-1/2/3: optimizer state and update on the host");
  cli.group("Pipeline");
  cli.integer("--pp", o.pp, 1, 1024, "pipeline stages (world = dp x pp x tp x cp; pp, tp and cp combine)");
  cli.choice("--schedule", o.schedule, {"naive", "gpipe", "1f1b", "interleaved", "zero-bubble"},
             "the pipeline schedule");
  cli.integer("--virtual-stages", o.virtual_stages, 1, 1024, "interleaved: model chunks per stage");
  cli.group("Tensor parallel");
  cli.integer("--tp", o.tp, 1, 1024, "Megatron tensor parallelism over N ranks");
  cli.flag("--sp", o.sp, "sequence parallelism: LayerNorm and dropout on a sequence shard of each tp rank");
  cli.group("Context parallel");
  cli.integer("--cp", o.cp, 1, 1024, "context parallelism: the sequence over N ranks");
  cli.choice("--cp-balance", o.cp_balance, {"zigzag", "none"}, "the causal load balance");
  cli.choice("--cp-variant", o.cp_variant, {"ring", "allgather", "ulysses", "hybrid"},
             "pass K/V around a ring, gather them all, all-to-all to a head cut (Ulysses: n_head % (cp x tp) "
             "== 0), or Ulysses inside and the ring across");
  cli.integer("--ulysses-degree", o.ulysses_degree, 1, 1024, "hybrid: U Ulysses ranks per ring position, cp = U x R");
}

}  // namespace sl
