// safetensors.h — state dicts to and from safetensors files (the Hugging Face weights format).
//
//   [8 bytes: N, little-endian uint64] [N bytes: JSON header, space-padded to a multiple of 8] [data]
//   header: {"__metadata__": {"format": "pt"},
//            "wte.weight": {"dtype": "F32", "shape": [V, C], "data_offsets": [begin, end]}, ...}
//   Offsets count from the start of the data; tensors are packed row-major, little-endian.
//
//   dtypes: F32 F64 BF16 F16 I32 I64  <->  shardlab's f32 f64 bf16 f16 i32 i64
//
// Files written here are byte-identical to what the reference Python/Rust `safetensors` writes for
// the same tensors, so weights move both ways between shardlab and PyTorch / transformers.
// Loading trusts nothing in the file: every length, shape and offset is checked against the file
// size before a byte is allocated, and a bad file raises sl::Error naming the path, the tensor and
// the numbers involved.
//
//   Tests: tests/nn/test_safetensors.cpp
#pragma once
#include <map>
#include <string>

#include "tensor/tensor.h"

namespace sl::nn {

// The same alias as nn/module.h (an identical using-alias may be declared twice).
#ifndef SL_NN_STATE_DICT_DECLARED
#define SL_NN_STATE_DICT_DECLARED
using StateDict = std::map<std::string, Tensor>;
#endif

// Writes `tensors` (any device; the data is copied to the host) and string `metadata` to `path`.
// The file is written to `path`.tmp and renamed into place, so `path` is never left half-written.
void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of the file onto `device`. The tensors are fresh leaves (requires_grad off).
StateDict load_safetensors(const std::string& path, Device device = current_device());

// The header's "__metadata__" (empty when absent); reads and checks the header only, not the data.
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);

}  // namespace sl::nn
