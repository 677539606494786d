// ledger.h — the memory ledger: who holds how many bytes, on which device, for what.
//
// Every tensor allocation is charged to (device, category). The category comes from the innermost
// MemoryScope on the allocating thread ("other" when there is none):
//
//     { sl::MemoryScope scope(sl::MemoryCategory::optimizer);
//       exp_avg = sl::zeros_like(param); }          // 4 bytes per f32 element, charged to "optimizer"
//
// The ledger keeps current and peak bytes per device and per (device, category), and bytes copied
// between devices by to(). Lessons print it; tests compare it to formulas such as ZeRO's 8Ψ/N.
// It is shared by all rank threads (memory is a property of the process), so it is thread-safe.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "tensor/device.h"

namespace sl {

// offload: host memory that stands in for the GPU's (ZeRO-Offload's optimizer state, parallel/zero/zero_adamw.h);
// report() labels it "host (offloaded)".
enum class MemoryCategory : uint8_t { weights, grads, optimizer, activations, comm, other, offload };
constexpr int kNumMemoryCategories = 7;
const char* category_name(MemoryCategory category);

class MemoryLedger {
 public:
  static MemoryLedger& instance();

  void allocate(Device device, MemoryCategory category, int64_t bytes);
  void release(Device device, MemoryCategory category, int64_t bytes);
  void record_transfer(Device from, Device to, int64_t bytes);

  int64_t current(Device device) const;  // all categories
  int64_t peak(Device device) const;     // highest total since reset
  int64_t current(Device device, MemoryCategory category) const;
  int64_t peak(Device device, MemoryCategory category) const;
  int64_t transferred(Device from, Device to) const;  // bytes copied by to()

  void reset_peak(Device device);           // peaks := current values (start a new measurement)
  std::string report(Device device) const;  // a small table, one line per category

 private:
  struct Account {
    int64_t current = 0, peak = 0;
    std::array<int64_t, kNumMemoryCategories> category_current{}, category_peak{};
  };
  mutable std::mutex mutex_;
  std::map<std::string, Account> accounts_;   // keyed by Device::str()
  std::map<std::string, int64_t> transfers_;  // "cpu:0->cpu:1"
};

// RAII: allocations on this thread are charged to `category` until the scope ends.
class MemoryScope {
 public:
  explicit MemoryScope(MemoryCategory category);
  ~MemoryScope();
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;
  static MemoryCategory current();

 private:
  MemoryCategory previous_;
};

}  // namespace sl
