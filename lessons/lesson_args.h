// lesson_args.h — what a lesson lets you change, read from its command line (header-only, on CLI11,
// as build/bin/train's: tools/cli.h).
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
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace lesson {

class Args {
 public:
  Args(int argc, char** argv, std::string name, std::string about)
      : name_(std::move(name)), about_(std::move(about)), app_("", "build/lessons/" + name_), argc_(argc), argv_(argv) {
    app_.allow_extras();  // until done(): the flags declared later are extras for now
    app_.set_help_flag();  // --help is read in done(), once every flag is declared
    app_.add_flag("-h,--help")->description("this list");
    app_.get_formatter()->column_width(24);
    app_.get_formatter()->label("OPTIONS", "FLAGS");
    app_.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }

  // An integer in [lo, hi]; the default when the flag is absent.
  int64_t integer(const std::string& flag, int64_t fallback, const std::string& help, int64_t lo, int64_t hi) {
    const std::string range = std::to_string(lo) + ".." + std::to_string(hi);
    const CLI::Range in_range(lo, hi);
    CLI::Option* option = app_.add_option("--" + flag)->description(help + " (default " + std::to_string(fallback) + ", " + range + ")");
    option->type_name("N")->check(CLI::Validator(
        [=](std::string& value) {
          // Decimal only: CLI11 reads integers in C's base 0, where 010 is 8.
          const std::string magnitude = value.rfind('-', 0) == 0 ? value.substr(1) : value;
          const bool digits = !magnitude.empty() && magnitude.size() <= 18 &&
                              (magnitude.size() == 1 || magnitude[0] != '0') &&
                              magnitude.find_first_not_of("0123456789") == std::string::npos;
          if (!digits) return "takes an integer, not '" + value + "'";
          std::string copy = value;
          return in_range(copy).empty() ? std::string() : value + " is outside " + range;
        },
        ""));
    return read<int64_t>(option, fallback);
  }

  // A real number in [lo, hi].
  double real(const std::string& flag, double fallback, const std::string& help, double lo, double hi) {
    const std::string range = number(lo) + ".." + number(hi);
    CLI::Option* option = app_.add_option("--" + flag)->description(help + " (default " + number(fallback) + ", " + range + ")");
    option->type_name("X")->check(CLI::Validator(
        [=](std::string& value) {
          double parsed = 0;
          if (!CLI::detail::lexical_cast(value, parsed)) return "takes a number, not '" + value + "'";
          return parsed >= lo && parsed <= hi ? std::string() : value + " is outside " + range;
        },
        ""));
    return read<double>(option, fallback);
  }

  // Free text (a link spec, a path); the lesson validates it.
  std::string text(const std::string& flag, const std::string& fallback, const std::string& help) {
    CLI::Option* option = app_.add_option("--" + flag)->type_name("TEXT");
    option->description(help + (fallback.empty() ? "" : " (default " + fallback + ")"));
    return read<std::string>(option, fallback);
  }

  // A "break it" switch, --break-<what>: true when given.
  bool breaks(const std::string& what, const std::string& mistake) {
    CLI::Option* option = app_.add_flag("--break-" + what);
    option->description("break it: " + mistake + "; the lesson's check then fails");
    parse();
    return option->count() > 0;
  }

  // --svg DIR: the folder the lesson writes its pictures into (created); empty when not asked.
  std::string svg() {
    CLI::Option* option = app_.add_option("--svg")->type_name("DIR");
    option->description("write this lesson's pictures (.svg) into DIR");
    const std::string dir = read<std::string>(option, "");
    if (dir.empty()) return "";
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    if (error) fail("--svg " + dir + ": cannot create the folder (" + error.message() + ")");
    return dir;
  }

  // After the last flag: --help prints them all and exits 0; an unknown flag exits 2.
  void done() {
    parse();
    if (app_.count("--help") > 0) {
      std::printf("%s: %s\n\n%s", name_.c_str(), about_.c_str(), app_.help().c_str());
      std::exit(0);
    }
    const std::vector<std::string> extra = app_.remaining();
    if (!extra.empty())
      fail((extra[0].rfind("--", 0) == 0 ? "unknown flag " + extra[0]
                                         : "'" + extra[0] + "' is not a flag (flags start with --)") +
           " (--help lists what this lesson takes)");
  }

 private:
  // The command line parsed again with every flag declared so far; a bad value exits 2 naming it.
  void parse() {
    try {
      app_.parse(argc_, argv_);
    } catch (const CLI::ArgumentMismatch& e) {
      const std::string what = e.what();
      fail(what.substr(0, what.find(':')) + " needs a value");
    } catch (const CLI::ValidationError& e) {
      std::string what = e.what();  // "--p: 9 is outside 2..8" -> "--p 9 is outside 2..8"
      const size_t colon = what.find(": ");
      if (colon != std::string::npos) what.replace(colon, 2, " ");
      fail(what);
    } catch (const CLI::ParseError& e) {
      fail(e.what());
    }
  }

  template <typename T>
  T read(CLI::Option* option, T fallback) {
    parse();
    return option->count() > 0 ? option->as<T>() : fallback;
  }

  static std::string number(double x) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", x);
    return text;
  }

  [[noreturn]] void fail(const std::string& message) const {
    std::fprintf(stderr, "%s: %s\n", name_.c_str(), message.c_str());
    std::exit(2);
  }

  std::string name_, about_;
  CLI::App app_;
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
