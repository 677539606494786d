// lesson_args.cpp — lesson::Args on CLI11 (see lessons/lesson_args.h), compiled once and linked into
// every lesson: CLI11 is a large header, and one translation unit of it is enough.
#include "lessons/lesson_args.h"

#include <CLI/CLI.hpp>
#include <vector>

namespace lesson {

namespace {
std::string number(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", x);
  return text;
}
}  // namespace

Args::Args(int argc, char** argv, std::string name, std::string about)
    : name_(std::move(name)),
      about_(std::move(about)),
      app_(std::make_unique<CLI::App>("", "build/lessons/" + name_)),
      argc_(argc),
      argv_(argv) {
  app_->allow_extras();   // until done(): the flags declared later are extras for now
  app_->set_help_flag();  // --help is read in done(), once every flag is declared
  app_->add_flag("-h,--help")->description("this list");
  app_->get_formatter()->column_width(24);
  app_->get_formatter()->label("OPTIONS", "FLAGS");
  app_->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

Args::~Args() = default;

int64_t Args::integer(const std::string& flag, int64_t fallback, const std::string& help, int64_t lo, int64_t hi) {
  const std::string range = std::to_string(lo) + ".." + std::to_string(hi);
  const CLI::Range in_range(lo, hi);
  CLI::Option* option =
      app_->add_option("--" + flag)->description(help + " (default " + std::to_string(fallback) + ", " + range + ")");
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

double Args::real(const std::string& flag, double fallback, const std::string& help, double lo, double hi) {
  const std::string range = number(lo) + ".." + number(hi);
  CLI::Option* option =
      app_->add_option("--" + flag)->description(help + " (default " + number(fallback) + ", " + range + ")");
  option->type_name("X")->check(CLI::Validator(
      [=](std::string& value) {
        double parsed = 0;
        if (!CLI::detail::lexical_cast(value, parsed)) return "takes a number, not '" + value + "'";
        return parsed >= lo && parsed <= hi ? std::string() : value + " is outside " + range;
      },
      ""));
  return read<double>(option, fallback);
}

std::string Args::text(const std::string& flag, const std::string& fallback, const std::string& help) {
  CLI::Option* option = app_->add_option("--" + flag)->type_name("TEXT");
  option->description(help + (fallback.empty() ? "" : " (default " + fallback + ")"));
  return read<std::string>(option, fallback);
}

bool Args::breaks(const std::string& what, const std::string& mistake) {
  CLI::Option* option = app_->add_flag("--break-" + what);
  option->description("break it: " + mistake + "; the lesson's check then fails");
  parse();
  return option->count() > 0;
}

std::string Args::svg() {
  CLI::Option* option = app_->add_option("--svg")->type_name("DIR");
  option->description("write this lesson's pictures (.svg) into DIR");
  const std::string dir = read<std::string>(option, "");
  if (dir.empty()) return "";
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) fail("--svg " + dir + ": cannot create the folder (" + error.message() + ")");
  return dir;
}

void Args::done() {
  parse();
  if (app_->count("--help") > 0) {
    std::printf("%s: %s\n\n%s", name_.c_str(), about_.c_str(), app_->help().c_str());
    std::exit(0);
  }
  const std::vector<std::string> extra = app_->remaining();
  if (!extra.empty())
    fail((extra[0].rfind("--", 0) == 0 ? "unknown flag " + extra[0]
                                       : "'" + extra[0] + "' is not a flag (flags start with --)") +
         " (--help lists what this lesson takes)");
}

// The command line parsed again with every flag declared so far; a bad value exits 2 naming it.
void Args::parse() {
  try {
    app_->parse(argc_, argv_);
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
T Args::read(CLI::Option* option, T fallback) {
  parse();
  return option->count() > 0 ? option->as<T>() : fallback;
}

void Args::fail(const std::string& message) const {
  std::fprintf(stderr, "%s: %s\n", name_.c_str(), message.c_str());
  std::exit(2);
}

}  // namespace lesson
