#include "tensor/ledger.h"

#include <algorithm>
#include <sstream>

#include "tensor/error.h"

namespace sl {

namespace {
thread_local MemoryCategory tls_category = MemoryCategory::other;
}

const char* category_name(MemoryCategory category) {
  static const char* names[] = {"weights", "grads", "optimizer", "activations", "comm", "other", "offload"};
  return names[static_cast<int>(category)];
}

MemoryLedger& MemoryLedger::instance() {
  static MemoryLedger ledger;
  return ledger;
}

void MemoryLedger::allocate(Device device, MemoryCategory category, int64_t bytes) {
  std::lock_guard lock(mutex_);
  Account& account = accounts_[device.str()];
  int c = static_cast<int>(category);
  account.current += bytes;
  account.category_current[c] += bytes;
  account.peak = std::max(account.peak, account.current);
  account.category_peak[c] = std::max(account.category_peak[c], account.category_current[c]);
}

void MemoryLedger::release(Device device, MemoryCategory category, int64_t bytes) {
  std::lock_guard lock(mutex_);
  Account& account = accounts_[device.str()];
  int c = static_cast<int>(category);
  account.current -= bytes;
  account.category_current[c] -= bytes;
  SL_ASSERT(account.current >= 0 && account.category_current[c] >= 0);
}

void MemoryLedger::record_transfer(Device from, Device to, int64_t bytes) {
  std::lock_guard lock(mutex_);
  transfers_[from.str() + "->" + to.str()] += bytes;
}

int64_t MemoryLedger::current(Device device) const {
  std::lock_guard lock(mutex_);
  auto it = accounts_.find(device.str());
  return it == accounts_.end() ? 0 : it->second.current;
}

int64_t MemoryLedger::peak(Device device) const {
  std::lock_guard lock(mutex_);
  auto it = accounts_.find(device.str());
  return it == accounts_.end() ? 0 : it->second.peak;
}

int64_t MemoryLedger::current(Device device, MemoryCategory category) const {
  std::lock_guard lock(mutex_);
  auto it = accounts_.find(device.str());
  return it == accounts_.end() ? 0 : it->second.category_current[static_cast<int>(category)];
}

int64_t MemoryLedger::peak(Device device, MemoryCategory category) const {
  std::lock_guard lock(mutex_);
  auto it = accounts_.find(device.str());
  return it == accounts_.end() ? 0 : it->second.category_peak[static_cast<int>(category)];
}

int64_t MemoryLedger::transferred(Device from, Device to) const {
  std::lock_guard lock(mutex_);
  auto it = transfers_.find(from.str() + "->" + to.str());
  return it == transfers_.end() ? 0 : it->second;
}

void MemoryLedger::reset_peak(Device device) {
  std::lock_guard lock(mutex_);
  Account& account = accounts_[device.str()];
  account.peak = account.current;
  account.category_peak = account.category_current;
}

std::string MemoryLedger::report(Device device) const {
  std::ostringstream out;
  out << "memory on " << device << " (current / peak bytes)\n";
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    auto category = static_cast<MemoryCategory>(c);
    std::string label = category == MemoryCategory::offload ? "host (offloaded)" : category_name(category);
    out << "  " << label << std::string(17 - label.size(), ' ') << current(device, category) << " / "
        << peak(device, category) << "\n";
  }
  out << "  total            " << current(device) << " / " << peak(device) << "\n";
  return out.str();
}

MemoryScope::MemoryScope(MemoryCategory category) : previous_(tls_category) { tls_category = category; }
MemoryScope::~MemoryScope() { tls_category = previous_; }
MemoryCategory MemoryScope::current() { return tls_category; }

}  // namespace sl
