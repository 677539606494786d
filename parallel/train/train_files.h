// train_files.h — the files build/bin/train writes (parallel/train/train_run.h), and how it fails when it cannot.
//
//   check_save_path(flag, path)     before step 0: can PATH be written? (a run must not train for an
//                                   hour and then lose its weights to a typo in --save)
//   check_output_directory(flag, dir)   the same for a folder the run writes into (--checkpoint-dir)
//   LogFile                         --log-jsonl: every write, flush and close checked
//   save_weights(path, weights)     --save: a temp file renamed into place, never over a non-regular file
//   check_stdout()                  at exit: did everything printed reach standard output?
//
// Every failure is an sl::Error naming the flag, the path and the OS error (strerror), e.g.
//   --log-jsonl '/dev/full': write failed: No space left on device
//   --save 'runs/model.safetensors': cannot create 'runs/model.safetensors.tmp': No such file or directory
#pragma once
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include "nn/safetensors.h"
#include "tensor/error.h"

namespace sl::train_files {

inline std::string os_error(int error) { return std::strerror(error); }

// PATH exists and is not a regular file (a directory, a device, a FIFO): never replaced by a rename.
// A symlink counts as what it points to; a dangling one as absent.
inline bool is_existing_non_regular(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode);
}

// --save PATH is written as PATH.tmp, then renamed over PATH (nn::save_safetensors): so PATH must be
// absent or a regular file, and PATH.tmp creatable. The probe creates PATH.tmp and removes it again;
// it leaves an existing PATH untouched (the old weights survive until the new ones are complete).
inline void check_save_path(const std::string& flag, const std::string& path) {
  SL_CHECK(!path.empty(), flag, ": the path is empty");
  SL_CHECK(!is_existing_non_regular(path), flag, " '", path,
           "': exists and is not a regular file (a directory or a device); give a file path");
  const std::string temp = path + ".tmp";
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  const bool created = fd >= 0;
  // A PATH.tmp already there (a crashed save) is opened, not truncated: the save will replace it.
  if (!created && errno == EEXIST) fd = ::open(temp.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
  SL_CHECK(fd >= 0, flag, " '", path, "': cannot create '", temp, "': ", os_error(errno));
  ::close(fd);
  if (created) ::unlink(temp.c_str());
}

// --checkpoint-dir DIR: each save creates DIR (with its parents) and writes DIR/step-N.partial into
// it, so the probe does the same in small: it creates DIR, then writes a file into it and removes
// it. The file's name is mkstemp's (.probe-XXXXXX: unique, never a checkpoint's name), so earlier
// checkpoints in DIR, and a run probing the same DIR at the same moment, are left alone.
inline void check_output_directory(const std::string& flag, const std::string& dir) {
  SL_CHECK(!dir.empty(), flag, ": the path is empty");
  struct stat info {};
  SL_CHECK(::stat(dir.c_str(), &info) != 0 || S_ISDIR(info.st_mode), flag, " '", dir,
           "': exists and is not a directory; give a directory path");
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  SL_CHECK(!error, flag, " '", dir, "': cannot create the directory: ", error.message());
  std::string probe = dir + "/.probe-XXXXXX";
  const int fd = ::mkostemp(probe.data(), O_CLOEXEC);
  SL_CHECK(fd >= 0, flag, " '", dir, "': cannot create a file in it: ", os_error(errno));
  const char byte = '\n';
  const bool written = ::write(fd, &byte, 1) == 1;
  const int write_error = errno;
  const bool closed = ::close(fd) == 0;
  const int close_error = errno;
  ::unlink(probe.c_str());
  SL_CHECK(written, flag, " '", dir, "': cannot write a file in it: ", os_error(write_error));
  SL_CHECK(closed, flag, " '", dir, "': cannot write a file in it: ", os_error(close_error));
}

// --log-jsonl PATH: opened (created or truncated) before step 0, written line by line with write(2),
// so a full disk or /dev/full fails at the line that did not fit, naming the path.
class LogFile {
 public:
  LogFile() = default;
  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;
  ~LogFile() {
    if (fd_ >= 0) ::close(fd_);  // an error path: close() already reported, or an exception is in flight
  }

  void open(const std::string& flag, const std::string& path) {
    SL_CHECK(!path.empty(), flag, ": the path is empty");
    where_ = flag + " '" + path + "': ";
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    SL_CHECK(fd_ >= 0, where_, "cannot open for writing: ", os_error(errno));
  }
  bool is_open() const { return fd_ >= 0; }

  // All of `text`, or an error: write(2) may take part of it (a pipe, a signal), so it loops.
  void write(const std::string& text) {
    SL_CHECK(fd_ >= 0, where_, "write after close");
    size_t done = 0;
    while (done < text.size()) {
      ssize_t put = ::write(fd_, text.data() + done, text.size() - done);
      if (put < 0 && errno == EINTR) continue;
      SL_CHECK(put > 0, where_, "write failed: ", put < 0 ? os_error(errno) : "no bytes written");
      done += static_cast<size_t>(put);
    }
  }

  // close(2) reports what the kernel deferred (NFS, quotas): checked, like every write.
  void close() {
    if (fd_ < 0) return;
    int result = ::close(std::exchange(fd_, -1));
    SL_CHECK(result == 0, where_, "close failed: ", os_error(errno));
  }

 private:
  int fd_ = -1;
  std::string where_;
};

// --save: checked again at the end (the file system may have changed during training), then written
// atomically by nn::save_safetensors (PATH.tmp, fsync, rename). A device or directory at PATH is
// refused here, before anything is created next to it: rename() would replace it.
inline void save_weights(const std::string& flag, const std::string& path, const nn::StateDict& weights) {
  SL_CHECK(!is_existing_non_regular(path), flag, " '", path,
           "': exists and is not a regular file (a directory or a device); give a file path");
  try {
    nn::save_safetensors(path, weights);
  } catch (const Error& e) {
    throw Error(flag + ": " + e.what());
  }
}

// Standard output is buffered (a pipe or a file): a full disk shows only when the buffer is flushed,
// and the error flag stays set after a failed write. Called last, so a run whose report was lost fails.
inline void check_stdout() {
  errno = 0;
  int flushed = std::fflush(stdout);
  int error = errno;
  SL_CHECK(flushed == 0 && !std::ferror(stdout),
           "cannot write to standard output: ", error != 0 ? os_error(error) : "an earlier write failed");
}

}  // namespace sl::train_files
