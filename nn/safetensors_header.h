// safetensors_header.h — the JSON header of a safetensors file, read and written (internal to
// nn/safetensors.cpp; the file layout is drawn in nn/safetensors.h).
//
//   {"__metadata__": {"format": "pt"},
//    "wte.bias":   {"dtype": "F32", "shape": [4],    "data_offsets": [0, 16]},
//    "wte.weight": {"dtype": "F32", "shape": [2, 4], "data_offsets": [16, 48]}}
//
// Reading: the header is the one part of the file a hostile writer fully controls, so every entry
// is checked (dtype, shape, offsets, byte count, overlap) before a single tensor is allocated.
// Writing: what the reference implementation writes, byte for byte.
//
// This file knows JSON and nothing of files; nn/safetensors.cpp knows files and nothing of JSON.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/shape.h"

namespace sl::nn::safetensors {

// One tensor's entry: its bytes are [begin, end) of the data buffer that follows the header.
struct TensorRecord {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range in the data buffer
};

struct Header {
  std::map<std::string, std::string> metadata;
  std::vector<TensorRecord> tensors;  // in name order
  uint64_t data_start = 0;            // file offset of the data buffer: 8 + N
};

// The header text (N bytes) of a file of file_size bytes, parsed and checked: it must be a JSON
// object, and every tensor must lie inside the data buffer without overlapping another. Errors
// raise sl::Error beginning with `where`. The caller has checked that 8 + N <= file_size.
Header parse_header(const std::string& text, uint64_t file_size, const std::string& where);

// The reference writer's dtype order: tensors are written widest (highest rank) first.
int write_rank(DType dtype);

// The compact JSON header for `tensors` (in data order, offsets filled in), "__metadata__" first
// when there is any, padded with spaces to a multiple of 8 bytes so the data starts 8-byte aligned.
std::string format_header(const std::vector<TensorRecord>& tensors, const std::map<std::string, std::string>& metadata,
                          const std::string& where);

}  // namespace sl::nn::safetensors
