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

}  // namespace
}  // namespace cloister
