// Memory ledger: exact bytes per device and category, current and peak.
#include <gtest/gtest.h>

#include <thread>

#include "tensor/ops.h"

namespace sl {
namespace {

// Each test uses its own virtual device so that nothing else running in the process disturbs it.
TEST(Ledger, TwoScopesExactCurrentAndPeak) {
  Device dev = Device::cpu(101);
  MemoryLedger& ledger = MemoryLedger::instance();
  ASSERT_EQ(ledger.current(dev), 0);
  {
    DeviceGuard on(dev);
    Tensor weights, optimizer_state;
    {
      MemoryScope scope(MemoryCategory::weights);
      weights = zeros({256, 128});  // 256*128*4 = 131072 bytes
    }
    {
      MemoryScope scope(MemoryCategory::optimizer);
      optimizer_state = zeros({2, 256, 128});                     // two moments: 262144 bytes
      Tensor scratch = zeros({1000}, TensorOptions{DType::f64});  // 8000 bytes, freed at the brace
      EXPECT_EQ(ledger.current(dev, MemoryCategory::optimizer), 262144 + 8000);
    }
    EXPECT_EQ(ledger.current(dev, MemoryCategory::weights), 131072);
    EXPECT_EQ(ledger.current(dev, MemoryCategory::optimizer), 262144);
    EXPECT_EQ(ledger.peak(dev, MemoryCategory::optimizer), 262144 + 8000);
    EXPECT_EQ(ledger.current(dev), 131072 + 262144);
    EXPECT_EQ(ledger.peak(dev), 131072 + 262144 + 8000);
    EXPECT_EQ(ledger.current(dev, MemoryCategory::other), 0);
  }
  EXPECT_EQ(ledger.current(dev), 0);
  EXPECT_EQ(ledger.peak(dev), 131072 + 262144 + 8000);
  ledger.reset_peak(dev);
  EXPECT_EQ(ledger.peak(dev), 0);
}

TEST(Ledger, DefaultCategoryIsOtherAndScopesNest) {
  Device dev = Device::cpu(102);
  DeviceGuard on(dev);
  MemoryScope outer(MemoryCategory::activations);
  Tensor a = zeros({10});
  {
    MemoryScope inner(MemoryCategory::comm);
    Tensor b = zeros({5});
    EXPECT_EQ(MemoryLedger::instance().current(dev, MemoryCategory::comm), 20);
  }
  EXPECT_EQ(MemoryScope::current(), MemoryCategory::activations);
  EXPECT_EQ(MemoryLedger::instance().current(dev, MemoryCategory::activations), 40);
}

TEST(Ledger, ReshapeAndDetachShareStorageAndAreNotCountedTwice) {
  Device dev = Device::cpu(103);
  DeviceGuard on(dev);
  Tensor a = zeros({4, 6});
  Tensor b = a.detach();
  Tensor c = a.flat_view(6, {3, 6});
  EXPECT_EQ(MemoryLedger::instance().current(dev), 96);
}

TEST(Ledger, TransfersBetweenVirtualDevicesAreCounted) {
  Device from = Device::cpu(104), to = Device::cpu(105);
  Tensor a = zeros({100}, TensorOptions{}.with_device(from));
  Tensor b = a.to(to);
  EXPECT_EQ(b.device(), to);
  EXPECT_EQ(MemoryLedger::instance().current(to), 400);
  EXPECT_EQ(MemoryLedger::instance().transferred(from, to), 400);
  EXPECT_EQ(MemoryLedger::instance().transferred(to, from), 0);
}

TEST(Ledger, EachThreadHasItsOwnDeviceAndScope) {
  // Two "ranks" allocate on their own virtual devices at once.
  auto rank = [](int r) {
    DeviceGuard on(Device::cpu(110 + r));
    MemoryScope scope(MemoryCategory::grads);
    Tensor t = zeros({(r + 1) * 1000});
    EXPECT_EQ(MemoryLedger::instance().current(Device::cpu(110 + r), MemoryCategory::grads), (r + 1) * 4000);
  };
  std::thread t0(rank, 0), t1(rank, 1);
  t0.join();
  t1.join();
  EXPECT_EQ(current_device(), Device::cpu(0));
  EXPECT_EQ(MemoryScope::current(), MemoryCategory::other);
}

TEST(Ledger, ReportNamesEveryCategory) {
  std::string report = MemoryLedger::instance().report(Device::cpu(101));
  for (const char* name : {"weights", "grads", "optimizer", "activations", "comm", "other", "host (offloaded)", "total"})
    EXPECT_NE(report.find(name), std::string::npos) << name;
}

TEST(Device, ParseAndErrors) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu(0));
  EXPECT_EQ(Device::parse("cpu:3"), Device::cpu(3));
  EXPECT_EQ(Device::parse("cuda:1"), Device::cuda(1));
  EXPECT_EQ(Device::cpu(2).str(), "cpu:2");
  EXPECT_THROW(Device::parse("tpu:0"), Error);
  EXPECT_THROW(Device::parse("cpu:x"), Error);
  EXPECT_THROW(Device::parse("cpu:99999"), Error);
  EXPECT_THROW(Device::parse("cpu:-1"), Error);
}

}  // namespace
}  // namespace sl
