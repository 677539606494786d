// sha256.h — SHA-256 (FIPS 180-4), written out: the checksum metadata.json keeps of every shard.
//
//   Sha256 hash;                      // streaming: feed the bytes in as many pieces as you like
//   hash.update(data, bytes);
//   std::string hex = hash.finish();  // 64 lowercase hex digits, as `sha256sum` prints
//
//   The message is cut into 64-byte blocks (the last padded with 0x80, zeros and the message's bit
//   length); each block is mixed into eight 32-bit words by 64 rounds. Writers hash a shard as they
//   write it; verify() hashes it again from disk and compares.
//
//   Tests: tests/parallel/checkpoint/test_checkpoint_format.cpp (the standard vectors: "", "abc", 448 bits, a million 'a')
#pragma once
#include <array>
#include <cstdint>
#include <string>

namespace sl::parallel::checkpoint {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  std::string finish();  // the digest in hex; the object then starts over (a fresh hash)

 private:
  void compress(const uint8_t* block);  // one 64-byte block into state_
  std::array<uint32_t, 8> state_{};
  std::array<uint8_t, 64> block_{};
  size_t block_used_ = 0;
  uint64_t total_bytes_ = 0;
};

std::string sha256_hex(const std::string& bytes);
// The SHA-256 of a whole file, read in 1 MiB chunks; throws sl::Error naming the path if it cannot.
std::string sha256_file(const std::string& path);

}  // namespace sl::parallel::checkpoint
