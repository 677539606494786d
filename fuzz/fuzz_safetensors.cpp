// fuzz_safetensors.cpp — libFuzzer target: a checkpoint shard (a safetensors file) as a hostile
// writer could make it, through the reader a checkpoint load uses (parallel/checkpoint/shard_file.h:
// the 8-byte length, nn::safetensors::parse_header's checks, then byte-range reads).
//
//   make fuzz        (clang's -fsanitize=fuzzer,address,undefined; seeds in fuzz/corpus/safetensors/)
//
// Every input must end in success or sl::Error: any other exception, crash, leak or undefined
// behaviour is a finding. On success the header's promises are checked: every tensor inside the file.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "parallel/checkpoint/shard_file.h"

using namespace sl::parallel::checkpoint;

namespace {

// The input as a file: an anonymous memory file, opened by path as the reader opens a shard.
class MemoryFile {
 public:
  MemoryFile(const uint8_t* data, size_t size) : fd_(::memfd_create("shard", MFD_CLOEXEC)) {
    if (fd_ < 0 || ::write(fd_, data, size) != static_cast<ssize_t>(size)) std::abort();
  }
  ~MemoryFile() { ::close(fd_); }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

void check_promises(const sl::nn::safetensors::Header& header, uint64_t size) {
  for (const auto& record : header.tensors)
    if (record.begin > record.end || header.data_start + record.end > size) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    check_promises(parse_shard_header(bytes, size, "fuzz: "), size);
  } catch (const sl::Error&) {
  }
  try {  // the same bytes as a file: the reader then reads every tensor's bytes
    MemoryFile file(data, size);
    ShardReader reader(file.path(), "fuzz: ");
    check_promises(reader.header(), reader.size());
    std::vector<char> buffer;
    for (const auto& record : reader.header().tensors) {
      buffer.resize(record.end - record.begin);
      reader.read(record, 0, buffer.size(), buffer.data());
      reader.find(record.name);
    }
  } catch (const sl::Error&) {
  }
  return 0;
}
