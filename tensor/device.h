// device.h — where a tensor lives.
//
// Device{CPU, r} with r = 0, 1, 2, ... are *virtual* CPU devices: the same host memory, but the
// memory ledger accounts each one separately, so a rank thread that owns cpu:r can measure "its GPU".
// Device{CUDA, i} is GPU i (the CUDA backend is built when nvcc is found).
//
// Each thread has a current device (DeviceGuard sets it); creation ops allocate there by default.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>

namespace sl {

enum class DeviceKind : uint8_t { CPU, CUDA };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;

  static Device cpu(int index = 0) { return {DeviceKind::CPU, index}; }
  static Device cuda(int index = 0) { return {DeviceKind::CUDA, index}; }
  static Device parse(const std::string& text);  // "cpu", "cpu:3", "cuda:0"

  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool is_cuda() const { return kind == DeviceKind::CUDA; }
  std::string str() const;  // "cpu:0"
  bool operator==(const Device& other) const = default;
};

std::ostream& operator<<(std::ostream& out, const Device& device);

// The device new tensors go to on this thread (cpu:0 unless a DeviceGuard says otherwise).
Device current_device();

// RAII: makes `device` the current device of this thread until the guard ends.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  Device previous_;
};

}  // namespace sl
