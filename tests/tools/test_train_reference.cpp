// docs/reference.md cannot fall behind train's flags: every flag `build/bin/train --help` prints must be
// named on the page (as `--flag`, not as the prefix of a longer one: --dp is not --dp-shard).
//
// Runs the real binary (build*/bin/train, passed by `make test` in SL_TRAIN_BIN); the tests run in the
// repository's root, where docs/reference.md is.
#include <gtest/gtest.h>

#include <cctype>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/train_cli.h"

namespace sl {
namespace {

using namespace train_cli;

struct HelpFlag {
  std::string flag;   // "--dp-shard"
  std::string group;  // the --help group it is listed under: "ZeRO/FSDP"
};

// The flags of a --help text, in order, each with its group. CLI11 lists a group as a line "NAME:"
// and each option as an indented line that starts with its flag.
std::vector<HelpFlag> flags_of_help(const std::string& help) {
  static const std::regex group_line(R"(^(\S.*):\s*$)");
  static const std::regex option_line(R"(^  (?:-[a-z],)?(--[a-z][a-z0-9-]*))");
  std::vector<HelpFlag> flags;
  std::string group, line;
  std::istringstream lines(help);
  while (std::getline(lines, line)) {
    std::smatch match;
    if (std::regex_search(line, match, group_line)) group = match[1];
    else if (std::regex_search(line, match, option_line)) flags.push_back({match[1], group});
  }
  return flags;
}

// Whether `text` names `flag` on its own: the next character does not continue a flag's name.
bool names_flag(const std::string& text, const std::string& flag) {
  for (size_t at = text.find(flag); at != std::string::npos; at = text.find(flag, at + 1)) {
    const size_t end = at + flag.size();
    if (end == text.size()) return true;
    const char next = text[end];
    if (!(std::isalnum(static_cast<unsigned char>(next)) || next == '-' || next == '_')) return true;
  }
  return false;
}

TEST(TrainReferenceParsing, FindsFlagsWholeNotAsPrefixes) {
  EXPECT_TRUE(names_flag("`--dp 2`", "--dp"));
  EXPECT_TRUE(names_flag("ends with --dp", "--dp"));
  EXPECT_FALSE(names_flag("`--dp-shard 2` and --dpx", "--dp"));
  const std::vector<HelpFlag> flags = flags_of_help(
      "train: the tiny GPT\n\nModel:\n  --n-layer N  blocks\n  --dropout P  probability\n"
      "                 (0 <= P < 1; default 0)\n\nZeRO/FSDP:\n  --zero N  stage\n");
  ASSERT_EQ(flags.size(), 3u);
  EXPECT_EQ(flags[0].flag, "--n-layer");
  EXPECT_EQ(flags[1].group, "Model");
  EXPECT_EQ(flags[2].flag, "--zero");
  EXPECT_EQ(flags[2].group, "ZeRO/FSDP");
}

TEST_F(TrainCli, EveryFlagOfHelpIsInTheReferencePage) {
  const CliRun help = run_train("--help");
  ASSERT_EQ(help.exit_code, 0) << help.output;
  const std::vector<HelpFlag> flags = flags_of_help(help.output);
  // train has about 60 flags; a handful means the help's layout changed and this test no longer reads it.
  ASSERT_GE(flags.size(), 40u) << "could not read the flags of train --help:\n" << help.output;
  const std::string page = read_file("docs/reference.md");
  ASSERT_FALSE(page.empty()) << "docs/reference.md is missing or empty (the tests run in the repository root)";
  for (const HelpFlag& f : flags)
    EXPECT_TRUE(names_flag(page, f.flag))
        << "train --help lists " << f.flag << " (group \"" << f.group
        << "\"), but docs/reference.md never names it: add it to the page's flag index";
}

}  // namespace
}  // namespace sl
