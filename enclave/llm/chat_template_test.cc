// Tests of the chat-template engine: byte-for-byte against goldens written by the reference
// (@huggingface/jinja, tests/conformance/llm/chat_template_reference.mjs) for the templates of
// the model families we serve, against the shared tiny-llama model's own prompts, and unit tests
// of the subset, its errors and its limits.
#include "enclave/llm/chat_template.h"

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cloister::llm {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using OrderedJson = nlohmann::ordered_json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

const std::string kTemplates = std::string(CLOISTER_LLM_TESTDATA_DIR) + "/chat_templates/";

// Renders `source` with `context` (a JSON text, order kept) and a fake clock.
absl::StatusOr<std::string> RenderText(std::string_view source, std::string_view context,
                                       ChatTemplateOptions options = {}) {
  static const FakeClock clock;
  if (options.clock == nullptr) options.clock = &clock;
  absl::StatusOr<std::unique_ptr<ChatTemplate>> parsed = ChatTemplate::Parse(source, options);
  if (!parsed.ok()) return parsed.status();
  return (*parsed)->Render(OrderedJson::parse(context));
}

std::string Render(std::string_view source, std::string_view context = "{}") {
  absl::StatusOr<std::string> out = RenderText(source, context);
  EXPECT_TRUE(out.ok()) << source << ": " << out.status();
  return out.ok() ? *out : "<error>";
}

absl::Status ParseStatus(std::string_view source) { return ChatTemplate::Parse(source).status(); }

std::string Message(const absl::Status& status) { return std::string(status.message()); }

// ---- goldens from the reference ----

TEST(ChatTemplateGoldenTest, EveryTemplateAndConversationMatchesTheReference) {
  const OrderedJson templates = OrderedJson::parse(ReadFile(kTemplates + "templates.json"));
  const OrderedJson conversations = OrderedJson::parse(ReadFile(kTemplates + "conversations.json"));
  const OrderedJson goldens = OrderedJson::parse(ReadFile(kTemplates + "goldens.json"));
  ASSERT_EQ(goldens.size(), templates.size() * conversations.size());
  std::map<std::string, OrderedJson> template_by_name, conversation_by_name;
  for (const auto& t : templates) template_by_name[t["name"]] = t;
  for (const auto& c : conversations) conversation_by_name[c["name"]] = c;
  const FakeClock clock;  // the instant the reference script pins
  ChatTemplateOptions options;
  options.clock = &clock;
  int texts = 0, errors = 0;
  for (const auto& golden : goldens) {
    const OrderedJson& entry = template_by_name.at(golden["template"].get<std::string>());
    const OrderedJson& conversation = conversation_by_name.at(golden["conversation"].get<std::string>());
    SCOPED_TRACE(golden["template"].get<std::string>() + " x " +
                 golden["conversation"].get<std::string>());
    const std::string source = ReadFile(kTemplates + entry["file"].get<std::string>());
    auto parsed = ChatTemplate::Parse(source, options);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    OrderedJson context = {{"messages", conversation["messages"]},
                           {"add_generation_prompt", conversation["add_generation_prompt"]},
                           {"bos_token", entry["bos_token"]},
                           {"eos_token", entry["eos_token"]}};
    if (conversation.contains("tools")) context["tools"] = conversation["tools"];
    if (conversation.contains("extra")) {
      for (const auto& [key, value] : conversation["extra"].items()) context[key] = value;
    }
    absl::StatusOr<std::string> rendered = (*parsed)->Render(context);
    if (golden.contains("text")) {
      ++texts;
      ASSERT_TRUE(rendered.ok()) << rendered.status();
      EXPECT_EQ(*rendered, golden["text"].get<std::string>());
    } else {
      ++errors;
      ASSERT_FALSE(rendered.ok()) << "rendered: " << *rendered;
      EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument);
      const std::string message = golden["error"].get<std::string>();
      if (source.find(message) != std::string::npos) {  // a raise_exception in the template
        EXPECT_THAT(Message(rendered.status()), EndsWith(message));
      }
    }
  }
  EXPECT_GT(texts, 90);
  EXPECT_GT(errors, 10);
}

TEST(ChatTemplateGoldenTest, SharedTinyLlamaTemplateRendersItsReferencePrompts) {
  const std::string dir = std::string(CLOISTER_LLM_MODELS_DIR) + "/tiny-llama/";
  const nlohmann::json config = nlohmann::json::parse(ReadFile(dir + "tokenizer_config.json"));
  absl::StatusOr<std::string> source = SelectChatTemplate(config, "");
  ASSERT_TRUE(source.ok()) << source.status();
  auto parsed = ChatTemplate::Parse(*source);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const nlohmann::json reference = nlohmann::json::parse(ReadFile(dir + "reference.json"));
  int checked = 0;
  for (const auto& prompt : reference["prompts"]) {
    if (prompt.value("kind", "") != "chat") continue;
    SCOPED_TRACE(prompt["name"].get<std::string>());
    nlohmann::json context = {{"messages", prompt["messages"]},
                              {"add_generation_prompt", true},
                              {"bos_token", "<|begin_of_text|>"},
                              {"eos_token", "<|eot_id|>"}};
    absl::StatusOr<std::string> rendered = (*parsed)->Render(context);
    ASSERT_TRUE(rendered.ok()) << rendered.status();
    EXPECT_EQ(*rendered, prompt["text"].get<std::string>());
    ++checked;
  }
  EXPECT_GE(checked, 1);
}

TEST(ChatTemplateGoldenTest, SeedCorpusTemplatesParse) {
  // The fuzzer's seeds are real templates; each must parse so the fuzzer starts from depth.
  for (const char* name : {"llama2.jinja", "llama3.jinja", "llama31.jinja", "mistral.jinja",
                           "qwen25.jinja", "smollm.jinja", "zephyr.jinja", "constructs.jinja"}) {
    EXPECT_TRUE(ChatTemplate::Parse(ReadFile(kTemplates + name)).ok()) << name;
  }
}

// ---- the subset ----

TEST(ChatTemplateTest, TextExpressionsAndComments) {
  EXPECT_EQ(Render("a{{ 'b' }}c{# hidden #}d"), "abcd");
  EXPECT_EQ(Render("{{ x }}|{{ y.z }}|{{ none }}", R"({"x": 5})"), "5||");
  EXPECT_EQ(Render("{{ [1, 'a', none] }} {{ {'k': true} }} {{ 2.0 }} {{ 0.25 }}"),
            "[1, \"a\", null] {\"k\": true} 2.0 0.25");
  EXPECT_EQ(Render("one trailing newline dropped\n"), "one trailing newline dropped");
}

TEST(ChatTemplateTest, WhitespaceControlAndBlockTrimming) {
  EXPECT_EQ(Render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(Render("a \n {%- if true -%} \n b {%- endif %}"), "ab");
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before it.
  EXPECT_EQ(Render("{% if true %}\n    yes\n    {% endif %}\nend"), "    yes\nend");
  EXPECT_EQ(Render("x\n  {# note #}\ny"), "x\ny");
  EXPECT_EQ(Render("{{ 'a' }}\nb"), "a\nb");  // not after an expression
}

TEST(ChatTemplateTest, Conditionals) {
  const char* source = "{% if n > 2 %}big{% elif n == 2 %}two{% else %}small{% endif %}";
  EXPECT_EQ(Render(source, R"({"n": 3})"), "big");
  EXPECT_EQ(Render(source, R"({"n": 2})"), "two");
  EXPECT_EQ(Render(source, R"({"n": 1})"), "small");
  EXPECT_EQ(Render("{{ 'y' if a else 'n' }}{{ 'z' if not a }}", R"({"a": []})"), "nz");
  EXPECT_EQ(Render("{{ a and b }} {{ a or b }} {{ 0 or '' or 'last' }}", R"({"a": 1, "b": "B"})"),
            "B 1 last");
}

TEST(ChatTemplateTest, Loops) {
  EXPECT_EQ(Render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
                   "{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
                   R"({"xs": ["a", "b"]})"),
            "1021truefalse2;2110falsetrue2;");
  EXPECT_EQ(Render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Render("{% for k, v in d | items %}{{ k }}={{ v }},{% endfor %}",
                   R"({"d": {"b": 1, "a": 2}})"),
            "b=1,a=2,");
  EXPECT_EQ(Render("{% for k in d %}{{ k }}{% endfor %}", R"({"d": {"x": 1, "y": 2}})"), "xy");
  EXPECT_EQ(Render("{% for x in xs if x % 2 %}{{ x }}/{{ loop.length }} {% endfor %}",
                   R"({"xs": [1, 2, 3, 4, 5]})"),
            "1/3 3/3 5/3 ");
  EXPECT_EQ(Render("{% for x in range(5) %}{% if x == 1 %}{% continue %}{% endif %}"
                   "{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "02");
  // Python semantics where the reference shows JavaScript: output before a break is kept, a
  // string and an undefined value can be looped over.
  EXPECT_EQ(Render("{% for x in [1, 2] %}{{ x }}{% break %}{% endfor %}"), "1");
  EXPECT_EQ(Render("{% for c in 'h\xC3\xA9' %}[{{ c }}]{% endfor %}"), "[h][\xC3\xA9]");
  EXPECT_EQ(Render("{% for x in missing %}x{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(Render("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}"), "37");
  // A set inside a loop stays inside it.
  EXPECT_EQ(Render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
}

TEST(ChatTemplateTest, NamespacesMacrosAndCallBlocks) {
  EXPECT_EQ(Render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}"
                   "{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(Render("{% macro greet(name, punctuation='!') %}Hi {{ name }}{{ punctuation }}"
                   "{% endmacro %}{{ greet('Ann') }} {{ greet('Bo', punctuation='?') }}"),
            "Hi Ann! Hi Bo?");
  EXPECT_EQ(Render("{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}inside{% endcall %}"),
            "[inside]");
  EXPECT_EQ(Render("{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}"
                   "{% call(item) each([1, 2]) %}<{{ item }}>{% endcall %}"),
            "<1><2>");
  EXPECT_EQ(Render("{% set a, b = 'x', 'y' %}{% set block %}{{ a }}{{ b }}{% endset %}{{ block }}"),
            "xy");
}

TEST(ChatTemplateTest, Filters) {
  EXPECT_EQ(Render("{{ '  t  ' | trim }}|{{ 'Ab' | upper }}|{{ 'Ab' | lower }}|{{ 'hello big world' | title }}"
                   "|{{ 'hELLO' | capitalize }}"),
            "t|AB|ab|Hello Big World|Hello");
  EXPECT_EQ(Render("{{ x | default('d') }}|{{ '' | default('d') }}|{{ '' | d('d', true) }}"), "d||d");
  EXPECT_EQ(Render("{{ [1, 2, 3] | first }}{{ [1, 2, 3] | last }}{{ 'abc' | first }}{{ [1, 2] | length }}"
                   "{{ {'a': 1} | length }}"),
            "13a21");
  EXPECT_EQ(Render("{{ ['a', 'b'] | join(', ') }}|{{ [1, 2] | join }}|{{ 'aXbX' | replace('X', '-') }}"),
            "a, b|12|a-b-");
  EXPECT_EQ(Render("{{ 'ab' | list }}|{{ 3 | string }}|{{ '12' | int + 1 }}|{{ 'x' | int }}|{{ -2.7 | int }}"
                   "|{{ '1.5' | float }}|{{ 2 | float }}"),
            "[\"a\", \"b\"]|3|13|0|-2|1.5|2.0");
  EXPECT_EQ(Render("{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(1, true) }}"), "a\n  b\n\n  c| a\n b");
  EXPECT_EQ(Render("{{ xs | selectattr('on') | map(attribute='n') | join }}"
                   "{{ xs | rejectattr('on') | map(attribute='n') | join }}"
                   "{{ xs | selectattr('n', 'equalto', 'b') | map(attribute='n') | join }}"
                   "{{ xs | map(attribute='missing', default='?') | join }}",
                   R"({"xs": [{"n": "a", "on": true}, {"n": "b", "on": false}, {"n": "c", "on": 1}]})"),
            "acbb???");
  EXPECT_EQ(Render("{{ ['x', 'code', 'y'] | reject('equalto', 'code') | join(',') }}"), "x,y");
  EXPECT_EQ(Render("{{ '<b>' | safe }}"), "<b>");
}

TEST(ChatTemplateTest, ToJson) {
  const char* context = R"({"v": {"z": [1, 2.5, "\u00e9\n"], "a": {}, "m": null}})";
  EXPECT_EQ(Render("{{ v | tojson }}", context), "{\"z\": [1, 2.5, \"\xC3\xA9\\n\"], \"a\": {}, \"m\": null}");
  EXPECT_EQ(Render("{{ v | tojson(indent=2) }}", context),
            "{\n  \"z\": [\n    1,\n    2.5,\n    \"\xC3\xA9\\n\"\n  ],\n  \"a\": {},\n  \"m\": null\n}");
  EXPECT_EQ(Render("{{ v | tojson(sort_keys=true) }}", context),
            "{\"a\": {}, \"m\": null, \"z\": [1, 2.5, \"\xC3\xA9\\n\"]}");
  EXPECT_EQ(Render("{{ '\xC3\xA9\xF0\x9F\x98\x80' | tojson(ensure_ascii=true) }}"), "\"\\u00e9\\ud83d\\ude00\"");
  // Without ordered_json the keys come sorted, as nlohmann::json stores them.
  auto parsed = ChatTemplate::Parse("{{ v | tojson }}");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*(*parsed)->Render(nlohmann::json::parse(R"({"v": {"b": 1, "a": 2}})")), "{\"a\": 2, \"b\": 1}");
}

TEST(ChatTemplateTest, TestsAndOperators) {
  EXPECT_EQ(Render("{{ x is defined }}{{ y is undefined }}{{ none is none }}{{ 's' is string }}"
                   "{{ 1.5 is number }}{{ 1 is integer }}{{ 1.5 is integer }}{{ {} is mapping }}"
                   "{{ [] is sequence }}{{ 's' is iterable }}{{ true is boolean }}{{ true is true }}"
                   "{{ false is false }}{{ 1 is equalto 1 }}{{ 1 is eq(2) }}{{ 'a' is in ['a'] }}"
                   "{{ x is not none }}",
                   R"({"x": 1})"),
            "truetruetruetruetruetruefalsetruetruetruetruetruetruetruefalsetruetrue");
  EXPECT_EQ(Render("{{ 1 + 2 * 3 }} {{ 2 ** 3 ** 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }}"
                   " {{ 1 + 1.5 }} {{ 'a' ~ 1 ~ none }} {{ [1] + [2] }}"),
            "7 64 3 -4 2 3.5 2.5 a1 [1, 2]");
  EXPECT_EQ(Render("{{ 'b' in 'abc' }}{{ 'z' not in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}"
                   "{{ 'a' < 'b' }}{{ 2 >= 3 }}"),
            "truetruetruetruetruefalse");
  // == is Python's: no loose JavaScript equality, lists and dicts by value.
  EXPECT_EQ(Render("{{ '1' == 1 }}{{ 1 == 1.0 }}{{ [1, [2]] == [1, [2]] }}{{ {'a': 1} == {'a': 1} }}"
                   "{{ '' == false }}{{ x == y }}",
                   "{}"),
            "falsetruetruetruefalsetrue");
}

TEST(ChatTemplateTest, StringsAndMappings) {
  EXPECT_EQ(Render("{{ ' a '.strip() }}|{{ 'xxa'.lstrip('x') }}|{{ 'a  '.rstrip() }}|{{ 'a,b'.split(',') }}"
                   "|{{ ' a  b '.split() }}|{{ 'a-b-c'.split('-', 1) }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}"
                   "|{{ 'ab cd'.title() }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'ab'.startswith('a') }}"
                   "{{ 'ab'.endswith(('x', 'b')) }}|{{ '-'.join(['a', 'b']) }}"),
            "a|a|a|[\"a\", \"b\"]|[\"a\", \"b\"]|[\"a\", \"b-c\"]|ABab|Ab Cd|bba|truetrue|a-b");
  EXPECT_EQ(Render("{{ d.get('a') }}{{ d.get('z', 'dflt') }}{{ d.get('z') }}{{ d.keys() }}{{ d.values() }}"
                   "{{ d.items() }}{{ d['a'] }}{{ d.a }}",
                   R"({"d": {"a": 1}})"),
            "1dflt[\"a\"][1][[\"a\", 1]]11");
  // Code points, not UTF-16 units: the emoji is one character.
  EXPECT_EQ(Render("{{ s | length }}|{{ s[1] }}|{{ s[-1] }}|{{ s[::-1] }}|{{ s[1:3] }}",
                   R"({"s": "a\u00e9\ud83d\ude00"})"),
            "3|\xC3\xA9|\xF0\x9F\x98\x80|\xF0\x9F\x98\x80\xC3\xA9" "a|\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_EQ(Render("{{ [1, 2, 3, 4][::2] }}{{ [1, 2, 3][-2:] }}{{ [1, 2, 3][5:] }}{{ [1, 2, 3][:-1] }}"),
            "[1, 3][2, 3][][1, 2]");
  // upper/lower change ASCII letters only.
  EXPECT_EQ(Render("{{ '\xC3\xA9" "a' | upper }}"), "\xC3\xA9" "A");
  EXPECT_EQ(Render("{{ 'tab\\tnl\\nq\\'dq\\\"bs\\\\ \\u00e9 \\x41 \\ud83d\\ude00 \\d' }}"),
            "tab\tnl\nq'dq\"bs\\ \xC3\xA9 A \xF0\x9F\x98\x80 \\d");
  EXPECT_EQ(Render("{{ 'con' 'cat' }}"), "concat");
}

TEST(ChatTemplateTest, StrftimeNowUsesTheInjectedClock) {
  const FakeClock clock(absl::FromCivil(absl::CivilSecond(2024, 7, 5, 14, 3, 9), absl::UTCTimeZone()));
  ChatTemplateOptions options;
  options.clock = &clock;
  absl::StatusOr<std::string> out = RenderText(
      "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|"
      "{{ strftime_now('%B %-d, %A %a %y %I%p %j %%') }}",
      "{}", options);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "05 Jul 2024|2024-07-05 14:03:09|July 5, Friday Fri 24 02PM 187 %");
}

// ---- errors ----

TEST(ChatTemplateTest, UnsupportedConstructsAreParseErrorsWithTheLine) {
  EXPECT_EQ(Message(ParseStatus("line one\n{% if x %}\n{{ text | wordwrap }}\n{% endif %}")),
            "chat template line 3: the filter 'wordwrap' is not supported");
  EXPECT_EQ(Message(ParseStatus("{% include 'other.jinja' %}")),
            "chat template line 1: the statement 'include' is not supported");
  EXPECT_EQ(Message(ParseStatus("\n{{ x is divisible }}")),
            "chat template line 2: the test 'divisible' is not supported");
  EXPECT_EQ(Message(ParseStatus("{{ 'a'.format(1) }}")),
            "chat template line 1: the method 'format' is not supported");
  EXPECT_EQ(Message(ParseStatus("{% for x in xs recursive %}{% endfor %}")),
            "chat template line 1: recursive for loops are not supported");
  EXPECT_EQ(Message(ParseStatus("{{ f(*args) }}")),
            "chat template line 1: argument unpacking with '*' is not supported");
}

TEST(ChatTemplateTest, MalformedTemplatesAreParseErrors) {
  EXPECT_THAT(Message(ParseStatus("{% if x %}\nno end")), HasSubstr("the block opened on line 1 needs '{% endif %}'"));
  EXPECT_THAT(Message(ParseStatus("{{ 'open")), HasSubstr("string literal is never closed"));
  EXPECT_THAT(Message(ParseStatus("{# open")), HasSubstr("comment '{#' is never closed"));
  EXPECT_THAT(Message(ParseStatus("{{ x ")), HasSubstr("'}}' is missing"));
  EXPECT_EQ(Message(ParseStatus("a\n{% endfor %}")),
            "chat template line 2: 'endfor' without a block to close");
  EXPECT_EQ(Message(ParseStatus("{% break %}")), "chat template line 1: 'break' outside a for loop");
  EXPECT_THAT(Message(ParseStatus("{{ 1 + }}")), HasSubstr("expected an expression"));
  EXPECT_THAT(Message(ParseStatus("{{ x ? y }}")), HasSubstr("unexpected character '?'"));
  EXPECT_THAT(Message(ParseStatus("{{ 99999999999999999999 }}")), HasSubstr("too large"));
  EXPECT_THAT(Message(ParseStatus("{{ '\\u12' }}")), HasSubstr("hexadecimal"));
  for (absl::Status status : {ParseStatus("{% if %}"), ParseStatus("{{ }}"), ParseStatus("{% %}")}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(ChatTemplateTest, RenderErrorsNameTheLine) {
  absl::StatusOr<std::string> raised =
      RenderText("ok\n{{ raise_exception('Roles must alternate') }}", "{}");
  ASSERT_FALSE(raised.ok());
  EXPECT_EQ(raised.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(raised.status()), "chat template line 2: raise_exception: Roles must alternate");
  EXPECT_EQ(Message(RenderText("\n\n{{ 'a' + 1 }}", "{}").status()),
            "chat template line 3: cannot apply '+' to string and integer");
  EXPECT_THAT(Message(RenderText("{{ 1 // 0 }}", "{}").status()), HasSubstr("division by zero"));
  EXPECT_THAT(Message(RenderText("{{ 9223372036854775807 + 1 }}", "{}").status()), HasSubstr("overflow"));
  EXPECT_THAT(Message(RenderText("{{ x() }}", "{}").status()), HasSubstr("'x' is not a function"));
  EXPECT_THAT(Message(RenderText("{% for x in 5 %}{% endfor %}", "{}").status()),
              HasSubstr("cannot iterate over a integer"));
  EXPECT_THAT(Message(RenderText("{% set x = 1 %}{% set x.a = 2 %}", "{}").status()),
              HasSubstr("not a namespace()"));
  EXPECT_THAT(Message(RenderText("{% set ns = namespace() %}{% set ns.self = ns %}", "{}").status()),
              HasSubstr("cannot hold another namespace"));
  EXPECT_THAT(Message(RenderText("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", "{}").status()),
              HasSubstr("takes at most 1 arguments"));
  EXPECT_THAT(Message(RenderText("{{ 'a' | tojson(width=1) }}", "{}").status()),
              HasSubstr("has no argument 'width'"));
  auto parsed = ChatTemplate::Parse("x");
  ASSERT_TRUE(parsed.ok());
  EXPECT_THAT(Message((*parsed)->Render(nlohmann::json::array()).status()),
              HasSubstr("context must be a JSON object"));
}

// ---- limits ----

TEST(ChatTemplateTest, LimitsStopRunawayTemplates) {
  ChatTemplateOptions small;
  small.max_output_size = 1000;
  small.max_loop_iterations = 500;
  small.max_work = 100'000;
  small.max_list_count = 100;
  small.max_depth = 40;
  auto code = [&](std::string_view source, std::string_view context = "{}") {
    return RenderText(source, context, small).status().code();
  };
  const auto kExhausted = absl::StatusCode::kResourceExhausted;
  EXPECT_EQ(code("{% for i in range(90) %}{% for j in range(90) %}x{% endfor %}{% endfor %}"), kExhausted);
  EXPECT_EQ(code("{% for i in range(99) %}{{ 'abcdefghijklmnopqrstuvwxyz' }}{% endfor %}"), kExhausted);
  EXPECT_EQ(code("{{ range(1000) }}"), kExhausted);
  EXPECT_EQ(code("{% set ns = namespace(s='ab') %}{% for i in range(20) %}{% set ns.s = ns.s + ns.s %}"
                 "{% endfor %}"),
            kExhausted);
  EXPECT_EQ(code("{% set ns = namespace(l=[1]) %}{% for i in range(20) %}{% set ns.l = ns.l + ns.l %}"
                 "{% endfor %}"),
            kExhausted);
  EXPECT_EQ(code("{% set ns = namespace(l=[]) %}{% for i in range(100) %}{% set ns.l = [ns.l] %}"
                 "{% endfor %}"),
            kExhausted);
  EXPECT_EQ(code("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), kExhausted);
  EXPECT_EQ(code("{{ 'x' * 5000 }}"), kExhausted);
  EXPECT_EQ(code("{{ 'aaaa' | replace('a', 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa') | replace('a', "
                 "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa') }}"),
            kExhausted);
  std::string deep_context = std::string(60, '[') + std::string(60, ']');
  EXPECT_EQ(code("{{ x }}", "{\"x\": " + deep_context + "}"), kExhausted);
  // Nesting in the source is a parse error, not a stack overflow.
  EXPECT_EQ(ChatTemplate::Parse("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChatTemplate::Parse("{{ " + std::string(5000, '-') + "1 }}").status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string chain = "{{ 1";
  for (int i = 0; i < 1000; ++i) chain += " + 1";
  EXPECT_EQ(ChatTemplate::Parse(chain + " }}").status().code(), absl::StatusCode::kInvalidArgument);
  std::string nested_ifs;
  for (int i = 0; i < 1000; ++i) nested_ifs += "{% if true %}";
  EXPECT_EQ(ChatTemplate::Parse(nested_ifs).status().code(), absl::StatusCode::kInvalidArgument);
  ChatTemplateOptions tiny_source;
  tiny_source.max_source_size = 10;
  EXPECT_THAT(Message(ChatTemplate::Parse("{{ 'more than ten bytes' }}", tiny_source).status()),
              HasSubstr("more than the 10-byte limit"));
  // Within the limits the same constructs work.
  EXPECT_TRUE(RenderText("{% for i in range(20) %}{{ i }}{% endfor %}", "{}", small).ok());
}

TEST(ChatTemplateTest, RenderIsSafeFromSeveralThreads) {
  auto parsed = ChatTemplate::Parse(ReadFile(kTemplates + "qwen25.jinja"));
  ASSERT_TRUE(parsed.ok());
  const ChatTemplate& chat = **parsed;
  const nlohmann::json context = {
      {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"add_generation_prompt", true}};
  const std::string expected = *chat.Render(context);
  std::vector<std::thread> threads;
  std::vector<int> matches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) matches[t] += chat.Render(context).value_or("") == expected;
    });
  }
  for (auto& thread : threads) thread.join();
  for (int m : matches) EXPECT_EQ(m, 50);
}

// ---- SelectChatTemplate ----

TEST(SelectChatTemplateTest, PicksByName) {
  const nlohmann::json single = {{"chat_template", "{{ x }}"}};
  EXPECT_EQ(*SelectChatTemplate(single, ""), "{{ x }}");
  EXPECT_EQ(*SelectChatTemplate(single, "default"), "{{ x }}");
  EXPECT_EQ(SelectChatTemplate(single, "tool_use").status().code(), absl::StatusCode::kNotFound);
  const nlohmann::json listed = nlohmann::json::parse(
      R"({"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]})");
  EXPECT_EQ(*SelectChatTemplate(listed, ""), "D");
  EXPECT_EQ(*SelectChatTemplate(listed, "tool_use"), "T");
  EXPECT_EQ(SelectChatTemplate(listed, "rag").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(SelectChatTemplate(nlohmann::json::object(), "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(SelectChatTemplate({{"chat_template", 5}}, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SelectChatTemplate(nlohmann::json::parse(R"({"chat_template": [{"name": 1}]})"), "")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cloister::llm
