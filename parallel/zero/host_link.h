// host_link.h — offload's copies between a rank's device and its host (ZeRO-Offload, FSDP's CPU offload),
// recorded in the memory ledger as the bytes that cross the link.
//
//   rank on cuda:i   host cpu:i    the copy crosses PCIe; Tensor::to(Device) records it
//   rank on cpu:r    host cpu:r    the same virtual device: a memcpy, and the ledger is told the bytes
//                                  that would cross, so the offload formulas read the same on either
//
// What crosses is in the device side's dtype (DeepSpeed's design): under mixed precision 16-bit
// gradients go down and 16-bit weights go up, converted from and to the f32 master on the host.
//
//   link_copy(host_grads, device_grads, device_grads.dtype());   // down: 2 bytes per element in bf16
//   link_copy(device_weights, host_master, device_weights.dtype());  // up: rounded on the host first
//   Tensor down = to_host(reduced, host);                         // the tensor itself on a CPU rank
//
//   Used by: parallel/zero/zero_adamw.cpp, parallel/zero/fsdp_unit.cpp
#pragma once
#include "tensor/tensor.h"

namespace sl::parallel {

// to := from (shapes equal, dtypes converted), crossing the link in `crossing`: numel x its size recorded.
void link_copy(const Tensor& to, const Tensor& from, DType crossing);
// `t` on `host` in its own dtype: t itself when it is there already (its bytes recorded as crossing), else a copy.
Tensor to_host(const Tensor& t, Device host);

}  // namespace sl::parallel
