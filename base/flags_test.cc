#include "base/flags.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace cloister {
namespace {

TEST(FlagsTest, FillsEveryKindAndRefusesBadInput) {
  int count = 0;
  std::vector<int> list;
  double ratio = 0;
  bool on = false;
  std::string word;
  const std::vector<FlagSpec> specs = {{"--count", IntFlag{&count, 1}},
                                       {"--list", IntListFlag{&list, 1}},
                                       {"--ratio", DoubleFlag{&ratio}},
                                       {"--on", SwitchFlag{&on}},
                                       {"--word", StringFlag{&word, {"a", "b"}}}};
  ASSERT_TRUE(ParseFlags({"--count", "3", "--list=1,2", "--ratio", "1e-3", "--on", "--word", "b"},
                         specs)
                  .ok());
  EXPECT_EQ(count, 3);
  EXPECT_EQ(list, (std::vector<int>{1, 2}));
  EXPECT_DOUBLE_EQ(ratio, 1e-3);
  EXPECT_TRUE(on);
  EXPECT_EQ(word, "b");

  EXPECT_EQ(ParseFlags({"--count", "0"}, specs).message(),
            "--count needs an integer >= 1, got \"0\"");
  EXPECT_EQ(ParseFlags({"--count"}, specs).message(), "--count needs a value");
  EXPECT_EQ(ParseFlags({"--list", "1,x"}, specs).message(),
            "--list needs an integer >= 1, got \"x\"");
  EXPECT_EQ(ParseFlags({"--ratio", "tiny"}, specs).message(),
            "--ratio needs a number, got \"tiny\"");
  EXPECT_EQ(ParseFlags({"--on=1"}, specs).message(), "--on takes no value");
  EXPECT_EQ(ParseFlags({"--word", "c"}, specs).message(),
            "--word must be one of a, b, not \"c\"");
  EXPECT_EQ(ParseFlags({"--other"}, specs).message(), "unknown flag \"--other\"");
  EXPECT_EQ(ParseFlags({"bare"}, specs).message(), "unknown flag \"bare\"");
  EXPECT_TRUE(WantsHelp({"--x", "-h"}));
  EXPECT_FALSE(WantsHelp({"--x"}));
}

TEST(FlagsTest, SyntaxCollectsBareArgumentsAndWordsUnknownFlags) {
  std::string model;
  std::vector<std::string> dirs;
  const std::vector<FlagSpec> specs = {{"--model", StringFlag{&model, {}}}};
  const FlagSyntax syntax{.positional = &dirs,
                          .inline_values = false,
                          .unknown_flag = [](const std::string& arg) {
                            return "unknown option " + arg;
                          }};
  ASSERT_TRUE(ParseFlags({"a", "--model", "m.onnx", "", "b"}, specs, syntax).ok());
  EXPECT_EQ(model, "m.onnx");
  EXPECT_EQ(dirs, (std::vector<std::string>{"a", "", "b"}));

  EXPECT_EQ(ParseFlags({"--model=m.onnx"}, specs, syntax).message(),
            "unknown option --model=m.onnx");
  EXPECT_EQ(ParseFlags({"-x"}, specs, syntax).message(), "unknown option -x");
  EXPECT_EQ(ParseFlags({"--model"}, specs, syntax).message(), "--model needs a value");
}

TEST(FlagsTest, RepeatedFlagsAppendAndNonEmptyRefusesAnEmptyValue) {
  std::vector<std::string> stops;
  std::string tenant = "unset";
  const std::vector<FlagSpec> specs = {{"--stop", StringListFlag{&stops}},
                                       {"--tenant", StringFlag{&tenant, {}, true}}};
  ASSERT_TRUE(ParseFlags({"--stop", "a", "--stop=", "--stop", "b"}, specs).ok());
  EXPECT_EQ(stops, (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(ParseFlags({"--stop"}, specs).message(), "--stop needs a value");
  EXPECT_EQ(ParseFlags({"--tenant", ""}, specs).message(), "--tenant needs a value");
  EXPECT_EQ(tenant, "unset");
  ASSERT_TRUE(ParseFlags({"--tenant", "acme"}, specs).ok());
  EXPECT_EQ(tenant, "acme");
}

TEST(FlagsTest, OptionalFlagsStayUnsetUntilGivenAndMissingValuesCanBeReworded) {
  std::optional<std::string> listen;
  const std::vector<FlagSpec> specs = {{"--listen", OptionalStringFlag{&listen, true}}};
  const FlagSyntax syntax{.needs_value = [](const std::string& flag) {
    return "flag " + flag + " needs a value";
  }};
  ASSERT_TRUE(ParseFlags({}, specs, syntax).ok());
  EXPECT_FALSE(listen.has_value());
  EXPECT_EQ(ParseFlags({"--listen"}, specs, syntax).message(), "flag --listen needs a value");
  EXPECT_EQ(ParseFlags({"--listen="}, specs, syntax).message(), "flag --listen needs a value");
  EXPECT_FALSE(listen.has_value());
  ASSERT_TRUE(ParseFlags({"--listen=127.0.0.1:0"}, specs, syntax).ok());
  EXPECT_EQ(listen, "127.0.0.1:0");
}

TEST(FlagsTest, CustomFlagsCheckTheirOwnValuesInOrder) {
  std::vector<std::string> seen;
  const std::vector<FlagSpec> specs = {
      {"--port", CustomFlag{[&](const std::string& value) -> absl::Status {
         if (value.empty()) return absl::InvalidArgumentError("--port needs a port number");
         seen.push_back(value);
         return absl::OkStatus();
       }}}};
  ASSERT_TRUE(ParseFlags({"--port", "80", "--port=443"}, specs).ok());
  EXPECT_EQ(seen, (std::vector<std::string>{"80", "443"}));
  // The first error wins: the bad value before the unknown flag.
  EXPECT_EQ(ParseFlags({"--port=", "--other"}, specs).message(), "--port needs a port number");
  EXPECT_EQ(ParseFlags({"--port"}, specs).message(), "--port needs a value");
}

TEST(FlagsTest, AStoppingSwitchEndsTheParse) {
  bool help = false;
  int count = 0;
  const std::vector<FlagSpec> specs = {{"--help", SwitchFlag{&help, /*stop=*/true}},
                                       {"--count", IntFlag{&count, 1}}};
  ASSERT_TRUE(ParseFlags({"--count", "2", "--help", "--bogus", "--count", "0"}, specs).ok());
  EXPECT_TRUE(help);
  EXPECT_EQ(count, 2);
  help = false;
  EXPECT_EQ(ParseFlags({"--bogus", "--help"}, specs).message(), "unknown flag \"--bogus\"");
  EXPECT_FALSE(help);
}

TEST(FlagsTest, FlagPrefixAndSwitchValueWording) {
  std::vector<std::string> files;
  bool json = false;
  const std::vector<FlagSpec> specs = {{"--json", SwitchFlag{&json}}};
  const FlagSyntax syntax{
      .positional = &files, .flag_prefix = "--", .takes_no_value = [](const std::string& flag) {
        return "flag " + flag + " takes no value";
      }};
  ASSERT_TRUE(ParseFlags({"-h", "--json", "-", "a"}, specs, syntax).ok());
  EXPECT_TRUE(json);
  EXPECT_EQ(files, (std::vector<std::string>{"-h", "-", "a"}));
  EXPECT_EQ(ParseFlags({"--json=yes"}, specs, syntax).message(), "flag --json takes no value");
  EXPECT_EQ(ParseFlags({"--"}, specs, syntax).message(), "unknown flag \"--\"");
  // The default prefix: a single dash marks a flag.
  files.clear();
  EXPECT_EQ(ParseFlags({"a", "-h"}, specs, {.positional = &files}).message(),
            "unknown flag \"-h\"");
  EXPECT_EQ(files, (std::vector<std::string>{"a"}));
}

}  // namespace
}  // namespace cloister
