// file_io.h — the POSIX calls a crash-safe checkpoint is made of, each failure an sl::Error naming
// the path and the OS's reason.
//
//   Writing a file so that a crash leaves either nothing or all of it:
//     File::create(dir/name.tmp) → write_all ... → sync() (fsync: the bytes are on disk)
//     → close() → rename(name.tmp, name) → sync_directory(dir) (the rename itself is on disk)
//   Without the first fsync a power cut can leave `name` pointing at blocks never written; without
//   the second the rename can be lost, and the file with it.
//
//   Reading: File::open_read gives the size first, so that every offset a file claims is checked
//   against it before a byte is read or allocated; read_at reads exactly a range or throws.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sl::parallel::checkpoint {

class File {
 public:
  static File open_read(const std::string& path, const std::string& where, uint64_t& size);
  static File create(const std::string& path, const std::string& where);  // truncates
  File(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  File& operator=(File&&) = delete;
  ~File();

  void read_at(void* into, uint64_t bytes, uint64_t offset, const std::string& where) const;
  void write_all(const void* from, uint64_t bytes, const std::string& where) const;
  void sync(const std::string& where) const;  // fsync
  void close(const std::string& where);       // close(2), checked

 private:
  explicit File(int fd) : fd_(fd) {}
  int fd_ = -1;
};

std::string os_error();  // strerror(errno)
bool exists(const std::string& path);
bool is_directory(const std::string& path);
void make_directory(const std::string& path, const std::string& where);  // ok if it exists
void sync_directory(const std::string& dir, const std::string& where);
void rename_path(const std::string& from, const std::string& to, const std::string& where);
// Swaps two existing paths atomically (renameat2 RENAME_EXCHANGE): a step directory saved again.
void exchange_paths(const std::string& a, const std::string& b, const std::string& where);
void remove_file(const std::string& path);  // absent is fine
void remove_tree(const std::string& path);  // absent is fine
std::vector<std::string> list_directory(const std::string& dir, const std::string& where);  // names, sorted
// Writes `text` to dir/name through dir/name.tmp: create, write, fsync, rename, fsync the directory.
void write_file_atomically(const std::string& dir, const std::string& name, const std::string& text,
                           const std::string& where);
std::string read_small_file(const std::string& path, uint64_t max_bytes, const std::string& where);

}  // namespace sl::parallel::checkpoint
