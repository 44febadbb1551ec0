#include "enclave/llm/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace cloister::llm {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::filesystem::path TokenizersDir() {
  return std::filesystem::path(CLOISTER_LLM_TESTDATA_DIR) / "tokenizers";
}

// The folder holding a golden's tokenizer: the testdata folder of that name, or the shared model.
std::filesystem::path TokenizerFolder(const std::string& name) {
  if (name == "tiny-llama") return std::filesystem::path(CLOISTER_LLM_MODELS_DIR) / "tiny-llama";
  return TokenizersDir() / name;
}

std::unique_ptr<Tokenizer> LoadFolder(const std::filesystem::path& folder) {
  std::string config;
  if (std::filesystem::exists(folder / "tokenizer_config.json")) {
    config = ReadFile(folder / "tokenizer_config.json");
  }
  auto tokenizer = Tokenizer::Load(ReadFile(folder / "tokenizer.json"), config);
  EXPECT_TRUE(tokenizer.ok()) << folder << ": " << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

bool IsValidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    unsigned char lead = static_cast<unsigned char>(text[i]);
    size_t length = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC2 ? 2 : 0;
    if (length == 0 || i + length > text.size()) return false;
    for (size_t k = 1; k < length; ++k) {
      if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return false;
    }
    i += length;
  }
  return true;
}

// Streams ids one at a time; every chunk must be whole UTF-8 and the whole must equal `expected`.
void ExpectStreamEquals(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, bool skip,
                        const std::string& expected, const std::string& label) {
  StreamDecoder stream(tokenizer, skip);
  std::string text;
  for (int32_t id : ids) {
    auto chunk = stream.Push(id);
    ASSERT_TRUE(chunk.ok()) << label << ": " << chunk.status();
    EXPECT_TRUE(IsValidUtf8(*chunk)) << label << ": chunk is not whole UTF-8";
    text += *chunk;
  }
  text += stream.Finish();
  EXPECT_EQ(text, expected) << label << " (streamed, skip_special_tokens=" << skip << ")";
}

std::vector<int32_t> Ids(const Json& json) { return json.get<std::vector<int32_t>>(); }

// ---------------------------------------------------------------------------------------------
// Goldens written by transformers.js (tests/conformance/llm/tokenizer_reference.mjs).

std::vector<std::string> GoldenNames() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(TokenizersDir())) {
    const std::string file = entry.path().filename().string();
    const std::string suffix = ".golden.json";
    if (file.size() > suffix.size() && file.ends_with(suffix)) {
      names.push_back(file.substr(0, file.size() - suffix.size()));
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(TokenizerGoldenTest, EveryTestdataFolderHasAGolden) {
  const std::vector<std::string> names = GoldenNames();
  EXPECT_GE(names.size(), 7u);
  for (const auto& entry : std::filesystem::directory_iterator(TokenizersDir())) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name << " has no golden";
  }
  EXPECT_NE(std::find(names.begin(), names.end(), "tiny-llama"), names.end());
}

class TokenizerGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerGoldenTest, MatchesTransformersJs) {
  const std::string name = GetParam();
  const Json golden = Json::parse(ReadFile(TokenizersDir() / (name + ".golden.json")));
  std::unique_ptr<Tokenizer> tokenizer = LoadFolder(TokenizerFolder(name));
  ASSERT_NE(tokenizer, nullptr);

  EXPECT_EQ(tokenizer->bos_token(), golden["bos_token"].is_null() ? "" : golden["bos_token"].get<std::string>());
  EXPECT_EQ(tokenizer->eos_token(), golden["eos_token"].is_null() ? "" : golden["eos_token"].get<std::string>());
  if (golden["bos_id"].is_null()) {
    EXPECT_FALSE(tokenizer->bos_id().has_value());
  } else {
    EXPECT_EQ(tokenizer->bos_id(), golden["bos_id"].get<int32_t>());
  }
  if (golden["eos_id"].is_null()) {
    EXPECT_FALSE(tokenizer->eos_id().has_value());
  } else {
    EXPECT_EQ(tokenizer->eos_id(), golden["eos_id"].get<int32_t>());
  }

  ASSERT_GE(golden["cases"].size(), 40u);
  for (const Json& item : golden["cases"]) {
    const std::string text = item["text"];
    const std::string label = name + " \"" + text.substr(0, 60) + "\"";
    auto with_special = tokenizer->Encode(text, /*add_special_tokens=*/true);
    ASSERT_TRUE(with_special.ok()) << label << ": " << with_special.status();
    EXPECT_EQ(*with_special, Ids(item["ids_with_special_tokens"])) << label;
    auto without_special = tokenizer->Encode(text, /*add_special_tokens=*/false);
    ASSERT_TRUE(without_special.ok()) << label << ": " << without_special.status();
    EXPECT_EQ(*without_special, Ids(item["ids_without_special_tokens"])) << label;

    const std::vector<int32_t> ids = Ids(item["ids_with_special_tokens"]);
    auto decoded = tokenizer->Decode(ids, /*skip_special_tokens=*/false);
    ASSERT_TRUE(decoded.ok()) << label << ": " << decoded.status();
    EXPECT_EQ(*decoded, item["decoded"].get<std::string>()) << label;
    auto decoded_skip = tokenizer->Decode(ids, /*skip_special_tokens=*/true);
    ASSERT_TRUE(decoded_skip.ok()) << label << ": " << decoded_skip.status();
    EXPECT_EQ(*decoded_skip, item["decoded_skip_special_tokens"].get<std::string>()) << label;

    ExpectStreamEquals(*tokenizer, ids, false, item["decoded"], label);
    ExpectStreamEquals(*tokenizer, ids, true, item["decoded_skip_special_tokens"], label);
  }
  ASSERT_GE(golden["decode_cases"].size(), 40u);
  for (const Json& item : golden["decode_cases"]) {
    const std::vector<int32_t> ids = Ids(item["ids"]);
    const std::string label = name + " decode " + item["ids"].dump().substr(0, 60);
    auto decoded = tokenizer->Decode(ids, false);
    ASSERT_TRUE(decoded.ok()) << label << ": " << decoded.status();
    EXPECT_EQ(*decoded, item["decoded"].get<std::string>()) << label;
    auto decoded_skip = tokenizer->Decode(ids, true);
    ASSERT_TRUE(decoded_skip.ok()) << label << ": " << decoded_skip.status();
    EXPECT_EQ(*decoded_skip, item["decoded_skip_special_tokens"].get<std::string>()) << label;
    ExpectStreamEquals(*tokenizer, ids, false, item["decoded"], label);
    ExpectStreamEquals(*tokenizer, ids, true, item["decoded_skip_special_tokens"], label);
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, TokenizerGoldenTest, ::testing::ValuesIn(GoldenNames()),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// ---------------------------------------------------------------------------------------------
// The shared tiny model's own references.

TEST(TokenizerTinyLlamaTest, ReferenceChecksAndPrompts) {
  const auto folder = TokenizerFolder("tiny-llama");
  std::unique_ptr<Tokenizer> tokenizer = LoadFolder(folder);
  ASSERT_NE(tokenizer, nullptr);
  const Json reference = Json::parse(ReadFile(folder / "reference.json"));
  EXPECT_EQ(tokenizer->vocab_size(), 2048);
  EXPECT_EQ(tokenizer->bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(tokenizer->bos_id(), 2043);
  EXPECT_EQ(tokenizer->eos_token(), "<|eot_id|>");
  EXPECT_EQ(tokenizer->eos_id(), 2047);
  EXPECT_TRUE(tokenizer->IsSpecial(2044));
  EXPECT_FALSE(tokenizer->IsSpecial(100));
  EXPECT_EQ(tokenizer->TokenToId("<|end_of_text|>"), 2044);
  EXPECT_EQ(tokenizer->TokenToId("no such token"), std::nullopt);

  ASSERT_EQ(reference["tokenizer_checks"].size(), 20u);
  for (const Json& check : reference["tokenizer_checks"]) {
    const std::string text = check["text"];
    auto ids = tokenizer->Encode(text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, Ids(check["ids"])) << text;
    auto decoded = tokenizer->Decode(Ids(check["ids"]), false);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, check["decoded"].get<std::string>()) << text;
    ExpectStreamEquals(*tokenizer, Ids(check["ids"]), false, check["decoded"], text);
  }
  ASSERT_EQ(reference["prompts"].size(), 6u);
  for (const Json& prompt : reference["prompts"]) {
    const std::string name = prompt["name"];
    const bool chat = prompt["kind"] == "chat";
    auto ids = tokenizer->Encode(prompt["text"].get<std::string>(), /*add_special_tokens=*/!chat);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, Ids(prompt["prompt_ids"])) << name;
    auto generated = tokenizer->Decode(Ids(prompt["generated_ids"]), /*skip_special_tokens=*/true);
    ASSERT_TRUE(generated.ok()) << generated.status();
    EXPECT_EQ(*generated, prompt["generated_text"].get<std::string>()) << name;
    ExpectStreamEquals(*tokenizer, Ids(prompt["generated_ids"]), true, prompt["generated_text"], name);
  }
}

// ---------------------------------------------------------------------------------------------
// Behaviour the goldens do not reach, checked by hand on tiny tokenizers.

// A character-level BPE over "a".."e", space and two merges, with the given added tokens.
std::string TinyTokenizerJson(const std::string& added_tokens, const std::string& extra = "") {
  return R"({"version": "1.0", "added_tokens": [)" + added_tokens + R"(],
    "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null)" + extra + R"(,
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "d": 3, "e": 4, " ": 5, "ab": 6, "abc": 7},
              "merges": ["a b", ["ab", "c"]]}})";
}

TEST(TokenizerTest, MergesInBothFormsAndRanks) {
  auto tokenizer = Tokenizer::Load(TinyTokenizerJson(""), "");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(*(*tokenizer)->Encode("abcab d", false), (std::vector<int32_t>{7, 6, 5, 3}));
  EXPECT_EQ((*tokenizer)->vocab_size(), 8);
  // No decoder: tokens joined with spaces, as the reference does.
  EXPECT_EQ(*(*tokenizer)->Decode(std::vector<int32_t>{7, 6}, false), "abc ab");
}

TEST(TokenizerTest, SingleWordLstripRstrip) {
  auto tokenizer = Tokenizer::Load(
      TinyTokenizerJson(R"({"id": 8, "content": "cd", "single_word": true, "special": false, "normalized": false},
                           {"id": 9, "content": "ee", "lstrip": true, "rstrip": true, "special": true})"),
      "");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  // "cd" is a token only as a whole word.
  EXPECT_EQ(*(*tokenizer)->Encode("a cd b", false), (std::vector<int32_t>{0, 5, 8, 5, 1}));
  EXPECT_EQ(*(*tokenizer)->Encode("acd", false), (std::vector<int32_t>{0, 2, 3}));
  // "ee" swallows the spaces on both sides.
  EXPECT_EQ(*(*tokenizer)->Encode("a  ee  b", false), (std::vector<int32_t>{0, 9, 1}));
  EXPECT_TRUE((*tokenizer)->IsSpecial(9));
  EXPECT_FALSE((*tokenizer)->IsSpecial(8));
  EXPECT_EQ(*(*tokenizer)->Decode(std::vector<int32_t>{0, 9, 1}, true), "a b");
}

TEST(TokenizerTest, UnknownCharactersUseUnkAndFuse) {
  const std::string json = R"({"added_tokens": [], "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true,
      "vocab": {"<unk>": 0, "a": 1}, "merges": []}})";
  auto tokenizer = Tokenizer::Load(json, "");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(*(*tokenizer)->Encode("axyza", false), (std::vector<int32_t>{1, 0, 1}));
}

TEST(TokenizerTest, LongInputsStayFast) {
  std::unique_ptr<Tokenizer> tokenizer = LoadFolder(TokenizersDir() / "llama3");
  ASSERT_NE(tokenizer, nullptr);
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "The quick brown fox jumps over the lazy dog 12345. ";
  auto ids = tokenizer->Encode(text, true);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_GT(ids->size(), 30000u);
  auto decoded = tokenizer->Decode(*ids, true);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->size(), text.size());
  // One 200 kB word: BPE must not be quadratic.
  std::unique_ptr<Tokenizer> sp = LoadFolder(TokenizersDir() / "sp_bpe");
  ASSERT_NE(sp, nullptr);
  auto word = sp->Encode(std::string(200000, 'e'), false);
  ASSERT_TRUE(word.ok()) << word.status();
  EXPECT_EQ(*sp->Decode(*word, false), std::string(200000, 'e'));
}

TEST(TokenizerTest, ConfigTokensAsObjects) {
  auto tokenizer = Tokenizer::Load(
      TinyTokenizerJson(R"({"id": 8, "content": "<s>", "special": true})"),
      R"({"bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>"})");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->bos_token(), "<s>");
  EXPECT_EQ((*tokenizer)->bos_id(), 8);
  EXPECT_EQ((*tokenizer)->eos_token(), "</s>");
  EXPECT_EQ((*tokenizer)->eos_id(), std::nullopt);
}

// ---------------------------------------------------------------------------------------------
// Errors.

absl::Status LoadError(const std::string& json, const std::string& config = "") {
  auto tokenizer = Tokenizer::Load(json, config);
  return tokenizer.ok() ? absl::OkStatus() : tokenizer.status();
}

TEST(TokenizerErrorTest, UnsupportedModelType) {
  EXPECT_EQ(LoadError(R"({"model": {"type": "Unigram", "vocab": []}})").message(),
            "tokenizer.json: model.type \"Unigram\" is not supported");
}

TEST(TokenizerErrorTest, UnsupportedComponentsNameTheirKey) {
  EXPECT_TRUE(LoadError(TinyTokenizerJson("", R"(, "unknown_key": 1)")).ok());  // ignored, as HF does
  const std::string base = R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, )";
  EXPECT_EQ(LoadError(base + R"("normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "BertNormalizer"}]}})").message(),
            "tokenizer.json: normalizer.normalizers[1].type \"BertNormalizer\" is not supported");
  EXPECT_EQ(LoadError(base + R"("pre_tokenizer": {"type": "Whitespace"}})").message(),
            "tokenizer.json: pre_tokenizer.type \"Whitespace\" is not supported");
  EXPECT_EQ(LoadError(base + R"("decoder": {"type": "WordPiece"}})").message(),
            "tokenizer.json: decoder.type \"WordPiece\" is not supported");
  EXPECT_EQ(LoadError(base + R"("post_processor": {"type": "BertProcessing"}})").message(),
            "tokenizer.json: post_processor.type \"BertProcessing\" is not supported");
  EXPECT_EQ(LoadError(base + R"("pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(a"}}})").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(LoadError(base + R"("pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(a"}}})").message(),
              HasSubstr("pre_tokenizer.pattern.Regex is not a valid regex"));
}

TEST(TokenizerErrorTest, BadJson) {
  EXPECT_THAT(LoadError("{\"model\": ").message(), HasSubstr("tokenizer.json: invalid JSON"));
  EXPECT_EQ(LoadError("[1]").message(), "tokenizer.json: must be a JSON object");
  EXPECT_EQ(LoadError("{}").message(), "tokenizer.json: model is missing");
  EXPECT_THAT(LoadError(TinyTokenizerJson(""), "{oops").message(), HasSubstr("tokenizer_config.json: invalid JSON"));
  EXPECT_THAT(LoadError(std::string(100, '[') + std::string(100, ']')).message(),
              HasSubstr("JSON nesting deeper than"));
}

TEST(TokenizerErrorTest, MergesReferringToUnknownTokens) {
  EXPECT_EQ(LoadError(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a x"]}})").message(),
            "tokenizer.json: model.merges[0] refers to \"x\", which is not in model.vocab");
  EXPECT_EQ(LoadError(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [["a", "b"]]}})").message(),
            "tokenizer.json: model.merges[0] makes \"ab\", which is not in model.vocab");
  EXPECT_EQ(LoadError(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]}})").message(),
            "tokenizer.json: model.merges[0] must be two tokens separated by one space");
}

TEST(TokenizerErrorTest, BadIds) {
  EXPECT_THAT(LoadError(R"({"model": {"type": "BPE", "vocab": {"a": -1}}})").message(),
              HasSubstr("model.vocab[\"a\"] must be an integer id"));
  EXPECT_THAT(LoadError(R"({"model": {"type": "BPE", "vocab": {"a": 2000000}}})").message(),
              HasSubstr("the id space must be dense"));
  EXPECT_THAT(LoadError(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}}})").message(),
              HasSubstr("gives id 0 to two tokens"));
}

TEST(TokenizerErrorTest, DecodeIdsOutOfRange) {
  auto tokenizer = Tokenizer::Load(TinyTokenizerJson(""), "");
  ASSERT_TRUE(tokenizer.ok());
  EXPECT_EQ((*tokenizer)->Decode(std::vector<int32_t>{0, 8}, false).status().message(),
            "tokenizer: token id 8 is out of range [0, 8)");
  EXPECT_EQ((*tokenizer)->Decode(std::vector<int32_t>{-1}, false).status().code(),
            absl::StatusCode::kOutOfRange);
  StreamDecoder stream(**tokenizer, false);
  EXPECT_FALSE(stream.Push(99).ok());
  EXPECT_TRUE(stream.Push(0).ok());
}

TEST(TokenizerErrorTest, InvalidUtf8Text) {
  auto tokenizer = Tokenizer::Load(TinyTokenizerJson(""), "");
  ASSERT_TRUE(tokenizer.ok());
  EXPECT_EQ((*tokenizer)->Encode("a\xC3", false).status().message(), "tokenizer: text is not valid UTF-8");
}

TEST(TokenizerErrorTest, FuzzSeedsDoNotCrash) {
  // The fuzzer's seed corpus, replayed here too, must load or fail cleanly.
  const auto corpus = std::filesystem::path(CLOISTER_LLM_TESTDATA_DIR).parent_path() / "fuzz_corpus" / "tokenizer";
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(corpus)) {
    auto tokenizer = Tokenizer::Load(ReadFile(entry.path()), "");
    if (tokenizer.ok()) {
      auto ids = (*tokenizer)->Encode("Hello <s> wörld 123", true);
      if (ids.ok()) EXPECT_TRUE((*tokenizer)->Decode(*ids, false).ok());
    }
    ++files;
  }
  EXPECT_GE(files, 3u);
}

// ---------------------------------------------------------------------------------------------
// Streaming.

TEST(StreamDecoderTest, SentencePieceLeadingSpaceOnlyOnce) {
  std::unique_ptr<Tokenizer> tokenizer = LoadFolder(TokenizersDir() / "sp_bpe");
  ASSERT_NE(tokenizer, nullptr);
  auto ids = tokenizer->Encode("Hello world again", false);
  ASSERT_TRUE(ids.ok());
  StreamDecoder stream(*tokenizer, true);
  std::string text;
  for (int32_t id : *ids) text += *stream.Push(id);
  text += stream.Finish();
  EXPECT_EQ(text, "Hello world again");
  // After Finish the decoder starts a new sequence (the first token loses its space again).
  for (int32_t id : *ids) text += *stream.Push(id);
  text += stream.Finish();
  EXPECT_EQ(text, "Hello world againHello world again");
}

TEST(StreamDecoderTest, HoldsBackIncompleteUtf8) {
  std::unique_ptr<Tokenizer> tokenizer = LoadFolder(TokenizersDir() / "sp_bpe");
  ASSERT_NE(tokenizer, nullptr);
  const int32_t e6 = *tokenizer->TokenToId("<0xE6>"), b5 = *tokenizer->TokenToId("<0xB5>"),
                b7 = *tokenizer->TokenToId("<0xB7>");  // U+6D77
  StreamDecoder stream(*tokenizer, false);
  EXPECT_EQ(*stream.Push(e6), "");
  EXPECT_EQ(*stream.Push(b5), "");
  EXPECT_EQ(*stream.Push(b7), "\xE6\xB5\xB7");
  EXPECT_EQ(*stream.Push(e6), "");
  EXPECT_EQ(stream.Finish(), "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace cloister::llm
