// tests/support/vocab.h — the targets the vocab-parallel cross-entropy's edge-case tests share.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "parallel/tensor_parallel/vocab.h"

namespace sl::parallel {

// One target inside every rank's shard of a vocabulary of V (row 1 of each shard; V-1 where a shard
// holds padding only), then `extra` (ignored ones, -100; the last id, V-1; ...).
inline std::vector<double> one_target_per_shard(int64_t V, int world, std::initializer_list<double> extra) {
  const VocabRange first = VocabRange::of(V, 0, world);
  std::vector<double> targets;
  for (int r = 0; r < world; ++r) targets.push_back(std::min<double>(static_cast<double>(V - 1), r * first.rows + 1));
  targets.insert(targets.end(), extra);
  return targets;
}

}  // namespace sl::parallel
