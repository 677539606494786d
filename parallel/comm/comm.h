// comm.h — the communication chapter: how ranks talk. Every technique above stands on it, and it
// knows none of them.
//
//   launch(N, fn)        N ranks run fn (SPMD): threads in one process, or one process per rank
//        │               under mpirun
//        ▼
//   ProcessGroup         all_reduce, all_gather, reduce_scatter, broadcast, send/recv, batches of
//        │               isend/irecv; a ledger of calls and bytes per op; failures in bounded time
//        ▼
//   backends             threads (the ring algorithms written out), MPI (CPU, across machines),
//                        NCCL (GPUs)
//
//   DeviceMesh           ranks on a grid [pp, dp_replicate, dp_shard, cp, tp], TP innermost; one
//                        group per dimension and the flattened ones (dp, dp_shard_cp, dp_cp)
//
//   Bytes per rank, ring algorithms over N ranks and a tensor of S bytes: all-reduce 2(N-1)/N · S,
//   all-gather and reduce-scatter (N-1)/N · S (of the whole), broadcast S (chained).
//
// Read in this order:
//   process_group.h     the API, the ledger, sub-groups
//   launch.h            SPMD over threads or MPI processes
//   errors.h            how a distributed run fails, loudly and in bounded time
//   reduce_kernels.h    the arithmetic inside a reducing collective
//   backends/threads_backend.h, backends/mpi_backend.h, backends/nccl_backend.h
//   mesh.h              DeviceMesh and ParallelismConfig (Accelerate's names)
//   mesh_dim.h          MeshDim: the mesh's dimensions as a type; their names only where text comes in or goes out
//   flatten.h           flat buffers: a model's tensors as one message
//   grad_norm.h         clip_grad_norm across ranks, each element counted once
//
//   Lesson: lessons/05_collectives.cpp   Tests: tests/parallel/comm/test_collectives.cpp, tests/parallel/comm/test_mesh.cpp
#pragma once
#include "parallel/comm/errors.h"
#include "parallel/comm/flatten.h"
#include "parallel/comm/grad_norm.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/comm/process_group.h"
