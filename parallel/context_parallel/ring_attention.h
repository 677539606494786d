// ring_attention.h — causal attention over a sequence sharded across cp ranks (Liu et al., 2023),
// the K/V blocks passed around a ring while each rank computes.
//
//   forward, cp = 4, rank r holds Q_r K_r V_r:          at step s rank r holds K/V of rank (r - s) mod cp
//
//     step 0     step 1     step 2     step 3            each step: isend K/V to r+1, irecv from r-1,
//    r0: K0V0   r0: K3V3   r0: K2V2   r0: K1V1            THEN attend Q_r to the block held (the
//    r1: K1V1   r1: K0V0   r1: K3V3   r1: K2V2            transfer runs under the compute), merge
//    r2: K2V2   r2: K1V1   r2: K0V0   r2: K3V3            it into (out, lse) with the online softmax,
//    r3: K3V3   r3: K2V2   r3: K1V1   r3: K0V0            wait, swap buffers. K/V move cp-1 times.
//
//   backward: D = rowsum(dO ∘ O); the same ring again, recomputing every block with the FINAL lse.
//     dQ_r accumulates locally; the dK/dV of the block held rides along with it: received from r-1
//     with what the earlier holders added, this rank adds its part and sends it on to r+1. After cp
//     hops it is home, complete. A skipped block (contiguous split, wholly in the future) costs no
//     compute but its dK/dV buffer is still forwarded. The result is exactly full attention's gradient.
//
//   (On the threads backend a message is one memcpy made when the receiver waits, so there is little
//   to hide; on NCCL and MPI the posted transfer can progress while the block is computed.)
//
//   Bytes per layer per rank, blk = B·NH·(T/cp)·HS·4:
//     forward  2·blk·(cp-1)  (K and V)         backward  2·blk·(cp-1) (K/V again) + 2·blk·cp (dK/dV)
//   Memory: q, k, v, out, lse saved; two K/V blocks in flight; one [T/cp]² score block at a time.
//
//   Lesson: lessons/13_ring_attention.cpp   Tests: tests/parallel/context_parallel/test_context_parallel*.cpp
#pragma once
#include "parallel/comm/process_group.h"
#include "parallel/context_parallel/sequence_shard.h"

namespace sl::parallel {

// q, k, v [B, NH, T/cp, HS]: this rank's tokens (shard.take's order) -> out [B, NH, T/cp, HS].
// Differentiable; collective over `group` (its size is cp and its rank shard.rank) in forward and backward.
Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SequenceShard& shard,
                      const ProcessGroupPtr& group, double scale = 0);

}  // namespace sl::parallel
