// file_io.cpp — checked POSIX file calls (see file_io.h).
#include "parallel/checkpoint/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "tensor/error.h"

namespace sl::parallel::checkpoint {
namespace {
constexpr uint64_t kMaxChunk = uint64_t{1} << 30;  // one read()/write() call moves at most 1 GiB
}

std::string os_error() { return std::strerror(errno); }

File::File(File&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

File File::open_read(const std::string& path, const std::string& where, uint64_t& size) {
  // O_NONBLOCK: a FIFO must not hang the open; it is then refused as not a regular file.
  File file(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  SL_CHECK(file.fd_ >= 0, where, "cannot open '", path, "': ", os_error());
  struct stat info {};
  SL_CHECK(::fstat(file.fd_, &info) == 0, where, "cannot stat '", path, "': ", os_error());
  SL_CHECK(S_ISREG(info.st_mode), where, "'", path, "' is not a regular file");
  size = static_cast<uint64_t>(info.st_size);
  return file;
}

File File::create(const std::string& path, const std::string& where) {
  File file(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  SL_CHECK(file.fd_ >= 0, where, "cannot create '", path, "': ", os_error());
  return file;
}

void File::read_at(void* into, uint64_t bytes, uint64_t offset, const std::string& where) const {
  auto* cursor = static_cast<char*>(into);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd_, cursor, std::min(bytes, kMaxChunk), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    SL_CHECK(got >= 0, where, "read failed at byte ", offset, ": ", os_error());
    SL_CHECK(got > 0, where, "the file ended at byte ", offset, " (truncated while being read?)");
    cursor += got;
    offset += static_cast<uint64_t>(got);
    bytes -= static_cast<uint64_t>(got);
  }
}

void File::write_all(const void* from, uint64_t bytes, const std::string& where) const {
  const auto* cursor = static_cast<const char*>(from);
  while (bytes > 0) {
    const ssize_t put = ::write(fd_, cursor, std::min(bytes, kMaxChunk));
    if (put < 0 && errno == EINTR) continue;
    SL_CHECK(put > 0, where, "write failed: ", put < 0 ? os_error() : "no bytes written");
    cursor += put;
    bytes -= static_cast<uint64_t>(put);
  }
}

void File::sync(const std::string& where) const { SL_CHECK(::fsync(fd_) == 0, where, "fsync failed: ", os_error()); }

void File::close(const std::string& where) {
  if (fd_ < 0) return;
  SL_CHECK(::close(std::exchange(fd_, -1)) == 0, where, "close failed: ", os_error());
}

bool exists(const std::string& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0;
}

bool is_directory(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

void make_directory(const std::string& path, const std::string& where) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  SL_CHECK(is_directory(path), where, "cannot create the directory '", path, "': ", error.message());
}

void sync_directory(const std::string& dir, const std::string& where) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  SL_CHECK(fd >= 0, where, "cannot open the directory '", dir, "' to fsync it: ", os_error());
  const int result = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  SL_CHECK(result == 0, where, "fsync of the directory '", dir, "' failed: ", std::strerror(error));
}

void rename_path(const std::string& from, const std::string& to, const std::string& where) {
  SL_CHECK(::rename(from.c_str(), to.c_str()) == 0, where, "cannot rename '", from, "' to '", to, "': ", os_error());
}

void exchange_paths(const std::string& a, const std::string& b, const std::string& where) {
  SL_CHECK(::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0, where, "cannot exchange '",
           a, "' and '", b, "': ", os_error());
}

void remove_file(const std::string& path) { ::unlink(path.c_str()); }

void remove_tree(const std::string& path) {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
}

std::vector<std::string> list_directory(const std::string& dir, const std::string& where) {
  DIR* handle = ::opendir(dir.c_str());
  SL_CHECK(handle != nullptr, where, "cannot list the directory '", dir, "': ", os_error());
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(handle)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(handle);
  std::sort(names.begin(), names.end());
  return names;
}

void write_file_atomically(const std::string& dir, const std::string& name, const std::string& text,
                           const std::string& where) {
  const std::string path = dir + "/" + name, temp = path + ".tmp";
  File file = File::create(temp, where);
  try {
    file.write_all(text.data(), text.size(), where);
    file.sync(where);
    file.close(where);
  } catch (...) {
    remove_file(temp);
    throw;
  }
  rename_path(temp, path, where);
  sync_directory(dir, where);
}

std::string read_small_file(const std::string& path, uint64_t max_bytes, const std::string& where) {
  uint64_t size = 0;
  File file = File::open_read(path, where, size);
  SL_CHECK(size <= max_bytes, where, "'", path, "' is ", size, " bytes, over the limit of ", max_bytes);
  std::string text(size, '\0');
  file.read_at(text.data(), size, 0, where);
  return text;
}

}  // namespace sl::parallel::checkpoint
