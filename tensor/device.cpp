#include "tensor/device.h"

#include "tensor/error.h"

namespace sl {

namespace {
constexpr int kMaxDevices = 4096;  // a sanity bound for virtual devices, not a hardware limit
thread_local Device tls_current_device = Device::cpu(0);
}  // namespace

Device Device::parse(const std::string& text) {
  std::string kind = text, index;
  if (auto colon = text.find(':'); colon != std::string::npos) {
    kind = text.substr(0, colon);
    index = text.substr(colon + 1);
  }
  SL_CHECK(kind == "cpu" || kind == "cuda", "Device: unknown device '", text,
           "' (expected cpu, cpu:N, cuda or cuda:N)");
  int number = 0;
  if (!index.empty()) {
    SL_CHECK(index.size() <= 4 && index.find_first_not_of("0123456789") == std::string::npos, "Device: bad index in '",
             text, "' (expected a number from 0 to ", kMaxDevices - 1, ")");
    number = std::stoi(index);
  }
  SL_CHECK(number < kMaxDevices, "Device: index ", number, " in '", text, "' is past ", kMaxDevices - 1);
  return {kind == "cpu" ? DeviceKind::CPU : DeviceKind::CUDA, number};
}

std::string Device::str() const { return (is_cpu() ? "cpu:" : "cuda:") + std::to_string(index); }

std::ostream& operator<<(std::ostream& out, const Device& device) { return out << device.str(); }

Device current_device() { return tls_current_device; }

DeviceGuard::DeviceGuard(Device device) : previous_(tls_current_device) {
  SL_CHECK(device.index >= 0 && device.index < kMaxDevices, "DeviceGuard: bad device index ", device.index);
  tls_current_device = device;
}
DeviceGuard::~DeviceGuard() { tls_current_device = previous_; }

}  // namespace sl
