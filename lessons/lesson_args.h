// lesson_args.h — what a lesson lets you change, read from its command line (on CLI11, as
// build/bin/train's: tools/cli.h; CLI11 is compiled once, in lessons/support/lesson_args.cpp).
//
//   int main(int argc, char** argv) {
//     lesson::Args args(argc, argv, "09_pipeline_schedules", "1F1B and interleaving against GPipe");
//     const int p = args.integer("p", 4, "pipeline stages", 2, 8);
//     const int m = args.integer("m", 8, "micro-batches", 1, 64);
//     const bool broken = args.breaks("warmup", "give every rank p warm-up forwards, not p - r - 1");
//     const std::string svg_dir = args.svg();   // --svg DIR: where the lesson writes its pictures
//     args.done();                              // --help prints the list and exits 0; a bad flag exits 2
//
// Flags are `--name value` or `--name=value`. Each call declares its flag and reads it at once (the
// command line is parsed again with what is declared so far; flags not yet declared wait for done()).
// Defaults are the lesson's own numbers, so `make lessons` (no flags) runs what it always ran; every
// value a lesson accepts keeps its check meaningful, and a value outside [min, max] is refused with
// the range. A "break it" switch is `--break-<what>`: with it on, the lesson makes the mistake on
// purpose, shows what goes wrong, and its check fails (exit 1).
// tools/check_lessons.sh reads the `--break-` lines of every lesson's --help and runs each one.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace lesson {

class Args {
 public:
  Args(int argc, char** argv, std::string name, std::string about);
  ~Args();

  // An integer in [lo, hi]; the default when the flag is absent.
  int64_t integer(const std::string& flag, int64_t fallback, const std::string& help, int64_t lo, int64_t hi);
  // A real number in [lo, hi].
  double real(const std::string& flag, double fallback, const std::string& help, double lo, double hi);
  // Free text (a link spec, a path); the lesson validates it.
  std::string text(const std::string& flag, const std::string& fallback, const std::string& help);
  // A "break it" switch, --break-<what>: true when given.
  bool breaks(const std::string& what, const std::string& mistake);
  // --svg DIR: the folder the lesson writes its pictures into (created); empty when not asked.
  std::string svg();
  // After the last flag: --help prints them all and exits 0; an unknown flag exits 2.
  void done();

 private:
  void parse();
  template <typename T>
  T read(CLI::Option* option, T fallback);
  [[noreturn]] void fail(const std::string& message) const;

  std::string name_, about_;
  std::unique_ptr<CLI::App> app_;
  int argc_;
  char** argv_;
};

// Writes `text` to dir/file and says so; nothing when dir is empty (no --svg).
inline void write_picture(const std::string& dir, const std::string& file, const std::string& text) {
  if (dir.empty()) return;
  const std::string path = (std::filesystem::path(dir) / file).string();
  std::ofstream out(path);
  out << text;
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(2);
  }
  std::printf("  (picture: %s)\n", path.c_str());
}

}  // namespace lesson
