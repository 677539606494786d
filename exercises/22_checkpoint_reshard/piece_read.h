// exercises/22_checkpoint_reshard/piece_read.h — one entry of a read plan, shared by student.cpp and grader.cpp.
#pragma once
#include <cstddef>
#include <cstdint>

namespace exercise22 {

// What a loading rank reads of one saved piece: the piece (its index in the saved list), how many
// elements of the wanted region it holds, and the bytes [byte_begin, byte_end) of the piece's data
// (its region's elements in order, element_bytes each) to read: the smallest contiguous range that
// holds all of them.
struct PieceRead {
  size_t piece = 0;
  int64_t elements = 0;
  int64_t byte_begin = 0, byte_end = 0;
  bool operator==(const PieceRead&) const = default;
};

}  // namespace exercise22
