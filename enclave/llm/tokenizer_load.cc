// Tokenizer::Load: tokenizer.json's BPE model, added tokens, normalizer, pre-tokenizer,
// post-processor and decoder, and tokenizer_config.json's special tokens and clean-up setting.
// Every error names the file and the key path.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "base/status.h"
#include "enclave/llm/str_cat.h"
#include "enclave/llm/tokenizer.h"
#include "enclave/llm/tokenizer_internal.h"

namespace cloister::llm::tokenizer_internal {

namespace {

// model.vocab: token -> id.
absl::Status ParseVocab(const Json& model, Tokenizer::Parts& parts) {
  const Json* vocab = Find(model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) {
    return Invalid("tokenizer.json", "model.vocab", "must be an object of token -> id");
  }
  if (vocab->size() > static_cast<size_t>(kMaxVocabularySize)) {
    return Invalid("tokenizer.json", "model.vocab", Cat("has more than ", kMaxVocabularySize, " tokens"));
  }
  parts.model_vocab.reserve(vocab->size());
  for (const auto& [token, id_json] : vocab->items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() >= kMaxVocabularySize) {
      return Invalid("tokenizer.json", Cat("model.vocab[\"", token.substr(0, 64), "\"]"),
                     Cat("must be an integer id in [0, ", kMaxVocabularySize, ")"));
    }
    if (token.size() > kMaxTokenSize) {
      return Invalid("tokenizer.json", "model.vocab", Cat("has a token longer than ", kMaxTokenSize, " bytes"));
    }
    parts.model_vocab[token] = static_cast<int32_t>(id_json.get<int64_t>());
  }
  return absl::OkStatus();
}

// One entry of model.merges: "a b" or ["a", "b"].
absl::Status ParseMergePair(const Json& merge, const std::string& path, std::string& left,
                            std::string& right) {
  if (merge.is_string()) {
    const std::string& line = merge.get_ref<const std::string&>();
    size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      return Invalid("tokenizer.json", path, "must be two tokens separated by one space");
    }
    left = line.substr(0, space);
    right = line.substr(space + 1);
  } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
             merge[1].is_string()) {
    left = merge[0].get<std::string>();
    right = merge[1].get<std::string>();
  } else {
    return Invalid("tokenizer.json", path, "must be \"a b\" or [\"a\", \"b\"]");
  }
  return absl::OkStatus();
}

// model.merges, by rank; both sides and the result must be in model.vocab.
absl::Status ParseMerges(const Json& model, Tokenizer::Parts& parts) {
  const Json* merges = Find(model, "merges");
  if (merges == nullptr) return absl::OkStatus();
  if (!merges->is_array()) return Invalid("tokenizer.json", "model.merges", "must be an array");
  if (merges->size() > static_cast<size_t>(kMaxVocabularySize)) {
    return Invalid("tokenizer.json", "model.merges", Cat("has more than ", kMaxVocabularySize, " entries"));
  }
  parts.merges.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const Json& merge = (*merges)[rank];
    std::string left, right;
    const std::string path = Cat("model.merges[", rank, "]");
    RETURN_IF_ERROR(ParseMergePair(merge, path, left, right));
    auto left_it = parts.model_vocab.find(left);
    auto right_it = parts.model_vocab.find(right);
    auto merged_it = parts.model_vocab.find(left + right);
    for (const auto& [it, name] : {std::pair{left_it, &left}, std::pair{right_it, &right}}) {
      if (it == parts.model_vocab.end()) {
        return Invalid("tokenizer.json", path,
                       Cat("refers to \"", name->substr(0, 64), "\", which is not in model.vocab"));
      }
    }
    if (merged_it == parts.model_vocab.end()) {
      return Invalid("tokenizer.json", path,
                     Cat("makes \"", (left + right).substr(0, 64), "\", which is not in model.vocab"));
    }
    // The first (lowest-rank) entry for a pair wins.
    parts.merges.emplace(PairKey(left_it->second, right_it->second),
                         MergeValue{static_cast<int32_t>(rank), merged_it->second});
  }
  return absl::OkStatus();
}

absl::Status ParseModel(const Json& model, Tokenizer::Parts& parts) {
  ASSIGN_OR_RETURN(std::string type, GetType(model, "model"));
  if (type != "BPE") return Unsupported("model", type);
  RETURN_IF_ERROR(ParseVocab(model, parts));
  for (std::string_view key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json* field = Find(model, key);
    if (field != nullptr && !(field->is_string() && field->get<std::string>().empty())) {
      return Invalid("tokenizer.json", Cat("model.", key), "is not supported (must be null)");
    }
  }
  if (const Json* dropout = Find(model, "dropout");
      dropout != nullptr && !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return Invalid("tokenizer.json", "model.dropout", "is not supported (must be null)");
  }
  ASSIGN_OR_RETURN(parts.byte_fallback, GetBool(model, "byte_fallback", "model", false));
  ASSIGN_OR_RETURN(parts.fuse_unk, GetBool(model, "fuse_unk", "model", false));
  ASSIGN_OR_RETURN(parts.ignore_merges, GetBool(model, "ignore_merges", "model", false));
  if (const Json* unk = Find(model, "unk_token"); unk != nullptr) {
    if (!unk->is_string()) return Invalid("tokenizer.json", "model.unk_token", "must be a string");
    auto it = parts.model_vocab.find(unk->get<std::string>());
    if (it == parts.model_vocab.end()) {
      return Invalid("tokenizer.json", "model.unk_token",
                     Cat("\"", unk->get<std::string>().substr(0, 64), "\" is not in model.vocab"));
    }
    parts.unk_id = it->second;
  }
  parts.byte_token_ids.fill(-1);
  if (parts.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = parts.model_vocab.find(std::string_view(name));
      if (it != parts.model_vocab.end()) parts.byte_token_ids[b] = it->second;
    }
  }
  return ParseMerges(model, parts);
}

absl::Status ParseAddedTokens(const Json& root, Tokenizer::Parts& parts) {
  const Json* list = Find(root, "added_tokens");
  if (list == nullptr) return absl::OkStatus();
  if (!list->is_array()) return Invalid("tokenizer.json", "added_tokens", "must be an array");
  if (list->size() > kMaxAddedTokens) {
    return Invalid("tokenizer.json", "added_tokens", Cat("has more than ", kMaxAddedTokens, " entries"));
  }
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& entry = (*list)[i];
    const std::string path = Cat("added_tokens[", i, "]");
    if (!entry.is_object()) return Invalid("tokenizer.json", path, "must be an object");
    AddedToken token;
    ASSIGN_OR_RETURN(token.content, GetString(entry, "content", path, std::nullopt));
    if (token.content.empty() || token.content.size() > kMaxTokenSize) {
      return Invalid("tokenizer.json", path + ".content", Cat("must be 1 to ", kMaxTokenSize, " bytes"));
    }
    const Json* id = Find(entry, "id");
    if (id == nullptr || !id->is_number_integer() || id->get<int64_t>() < 0 ||
        id->get<int64_t>() >= kMaxVocabularySize) {
      return Invalid("tokenizer.json", path + ".id", Cat("must be an integer id in [0, ", kMaxVocabularySize, ")"));
    }
    token.id = static_cast<int32_t>(id->get<int64_t>());
    ASSIGN_OR_RETURN(token.special, GetBool(entry, "special", path, false));
    ASSIGN_OR_RETURN(token.lstrip, GetBool(entry, "lstrip", path, false));
    ASSIGN_OR_RETURN(token.rstrip, GetBool(entry, "rstrip", path, false));
    ASSIGN_OR_RETURN(token.single_word, GetBool(entry, "single_word", path, false));
    ASSIGN_OR_RETURN(token.normalized, GetBool(entry, "normalized", path, !token.special));
    parts.added_tokens.push_back(std::move(token));
  }
  return absl::OkStatus();
}

absl::Status ParsePostProcessor(const Json& json, std::string path, int depth, Tokenizer::Parts& parts) {
  if (depth > kMaxComponentDepth) return Invalid("tokenizer.json", path, "is nested too deeply");
  ASSIGN_OR_RETURN(std::string type, GetType(json, path));
  if (type == "Sequence") {
    const Json* list = Find(json, "processors");
    if (list == nullptr || !list->is_array()) {
      return Invalid("tokenizer.json", path + ".processors", "must be an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(ParsePostProcessor((*list)[i], Cat(path, ".processors[", i, "]"), depth + 1, parts));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only; ids unchanged
  if (type != "TemplateProcessing") return Unsupported(path, type);
  if (parts.has_post_processor) {
    return Invalid("tokenizer.json", path, "is a second TemplateProcessing, which is not supported");
  }
  parts.has_post_processor = true;
  const Json* single = Find(json, "single");
  if (single == nullptr || !single->is_array()) return Invalid("tokenizer.json", path + ".single", "must be an array");
  const Json* special_tokens = Find(json, "special_tokens");
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& item = (*single)[i];
    const std::string item_path = Cat(path, ".single[", i, "]");
    if (const Json* sequence = Find(item, "Sequence"); sequence != nullptr) {
      ASSIGN_OR_RETURN(std::string id, GetString(*sequence, "id", item_path + ".Sequence", "A"));
      if (id != "A") return Invalid("tokenizer.json", item_path, "must refer to sequence \"A\"");
      parts.single_template.emplace_back(std::nullopt);
      continue;
    }
    const Json* special = Find(item, "SpecialToken");
    if (special == nullptr) return Invalid("tokenizer.json", item_path, "must be a SpecialToken or a Sequence");
    ASSIGN_OR_RETURN(std::string name, GetString(*special, "id", item_path + ".SpecialToken", std::nullopt));
    std::vector<int32_t> ids;
    const Json* listed = special_tokens != nullptr ? Find(*special_tokens, name) : nullptr;
    if (listed != nullptr) {
      const Json* id_list = Find(*listed, "ids");
      if (id_list == nullptr || !id_list->is_array() || id_list->size() > 64) {
        return Invalid("tokenizer.json", Cat(path, ".special_tokens[\"", name.substr(0, 64), "\"].ids"),
                       "must be an array of at most 64 ids");
      }
      for (const Json& id : *id_list) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxVocabularySize) {
          return Invalid("tokenizer.json", Cat(path, ".special_tokens[\"", name.substr(0, 64), "\"].ids"),
                         "must hold ids in range");
        }
        ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    } else {
      auto it = parts.token_to_id.find(name);
      if (it == parts.token_to_id.end()) {
        return Invalid("tokenizer.json", item_path, Cat("names \"", name.substr(0, 64), "\", which is not a token"));
      }
      ids.push_back(it->second);
    }
    parts.single_template.emplace_back(std::move(ids));
  }
  return absl::OkStatus();
}

// A tokenizer_config.json token: a string or {"content": ...}.
absl::StatusOr<std::string> ConfigToken(const Json& config, std::string_view key) {
  const Json* value = Find(config, key);
  if (value == nullptr) return std::string();
  if (value->is_string()) return value->get<std::string>();
  if (value->is_object()) {
    const Json* content = Find(*value, "content");
    if (content != nullptr && content->is_string()) return content->get<std::string>();
  }
  return absl::InvalidArgumentError(Cat(
      "tokenizer_config.json: ", key, " must be a string or an object with a string \"content\""));
}

// The id table: the model's tokens, then (AddAddedTokens) the added tokens over them. Returns
// its size.
absl::StatusOr<size_t> BuildIdTable(Tokenizer::Parts* parts) {
  int64_t max_id = -1;
  for (const auto& [token, id] : parts->model_vocab) max_id = std::max<int64_t>(max_id, id);
  for (const AddedToken& token : parts->added_tokens) max_id = std::max<int64_t>(max_id, token.id);
  const size_t entries = parts->model_vocab.size() + parts->added_tokens.size();
  if (max_id + 1 > static_cast<int64_t>(entries) + 65536) {
    return absl::InvalidArgumentError(Cat(
        "tokenizer.json: ids go up to ", max_id, " but there are only ", entries,
        " tokens; the id space must be dense"));
  }
  const size_t size = static_cast<size_t>(max_id + 1);
  parts->id_to_token.resize(size);
  parts->id_present.assign(size, 0);
  parts->id_special.assign(size, 0);
  parts->id_byte_token.assign(size, 0);
  for (const auto& [token, id] : parts->model_vocab) {
    if (parts->id_present[id]) {
      return absl::InvalidArgumentError(Cat("tokenizer.json: model.vocab gives id ", id, " to two tokens"));
    }
    parts->id_to_token[id] = token;
    parts->id_present[id] = 1;
  }
  parts->token_to_id = parts->model_vocab;
  return size;
}

// Puts the added tokens over the id table and into the matchers; returns the special ones.
absl::StatusOr<std::unordered_set<std::string>> AddAddedTokens(Tokenizer::Parts* parts) {
  std::unordered_set<std::string> special_contents;
  for (size_t i = 0; i < parts->added_tokens.size(); ++i) {
    const AddedToken& token = parts->added_tokens[i];
    parts->id_to_token[token.id] = token.content;
    parts->id_present[token.id] = 1;
    parts->token_to_id[token.content] = token.id;
    if (auto it = parts->model_vocab.find(token.content);
        it != parts->model_vocab.end() && it->second != token.id) {
      parts->overridden_ids[it->second] = token.id;
    }
    parts->added_contents.insert(token.content);
    parts->added_by_content[token.content] = static_cast<int32_t>(i);
    if (token.special) special_contents.insert(token.content);
    if (token.normalized && parts->normalizer != nullptr) {
      std::string normalized = token.content;
      RETURN_IF_ERROR(parts->normalizer->Normalize(normalized));
      parts->added_by_content[normalized] = static_cast<int32_t>(i);
      parts->normalized_matcher.Add(std::move(normalized), i);
    } else {
      parts->raw_matcher.Add(token.content, i);
    }
  }
  parts->raw_matcher.Finish();
  parts->normalized_matcher.Finish();
  return special_contents;
}

// tokenizer_config.json's clean_up_tokenization_spaces, bos_token and eos_token.
absl::Status ParseConfig(const Json& config, Tokenizer::Parts* parts) {
  if (const Json* cleanup = Find(config, "clean_up_tokenization_spaces"); cleanup != nullptr) {
    if (!cleanup->is_boolean()) {
      return absl::InvalidArgumentError("tokenizer_config.json: clean_up_tokenization_spaces must be a boolean");
    }
    parts->clean_up_spaces = cleanup->get<bool>();
  }
  ASSIGN_OR_RETURN(parts->bos_token, ConfigToken(config, "bos_token"));
  ASSIGN_OR_RETURN(parts->eos_token, ConfigToken(config, "eos_token"));
  for (auto [token, id] : {std::pair{&parts->bos_token, &parts->bos_id}, std::pair{&parts->eos_token, &parts->eos_id}}) {
    if (token->empty()) continue;
    auto it = parts->token_to_id.find(*token);
    if (it != parts->token_to_id.end()) *id = it->second;
  }
  return absl::OkStatus();
}

}  // namespace

}  // namespace cloister::llm::tokenizer_internal

namespace cloister::llm {

using tokenizer_internal::AddAddedTokens;
using tokenizer_internal::BuildIdTable;
using tokenizer_internal::DecoderInfo;
using tokenizer_internal::Find;
using tokenizer_internal::Json;
using tokenizer_internal::MakeDecoder;
using tokenizer_internal::MakeNormalizer;
using tokenizer_internal::MakePreTokenizer;
using tokenizer_internal::ParseConfig;
using tokenizer_internal::ParseAddedTokens;
using tokenizer_internal::ParseByteToken;
using tokenizer_internal::ParseJson;
using tokenizer_internal::ParseModel;
using tokenizer_internal::ParsePostProcessor;
using tokenizer_internal::kMaxConfigJsonSize;
using tokenizer_internal::kMaxTokenizerJsonSize;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(std::string_view tokenizer_json,
                                                           std::string_view tokenizer_config_json) {
  ASSIGN_OR_RETURN(Json root, ParseJson(tokenizer_json, "tokenizer.json", kMaxTokenizerJsonSize));
  if (!root.is_object()) return absl::InvalidArgumentError("tokenizer.json: must be a JSON object");
  Json config = Json::object();
  if (!tokenizer_config_json.empty()) {
    ASSIGN_OR_RETURN(config, ParseJson(tokenizer_config_json, "tokenizer_config.json", kMaxConfigJsonSize));
    if (!config.is_object()) return absl::InvalidArgumentError("tokenizer_config.json: must be a JSON object");
  }
  try {
    auto parts = std::make_unique<Parts>();
    const Json* model = Find(root, "model");
    if (model == nullptr) return absl::InvalidArgumentError("tokenizer.json: model is missing");
    RETURN_IF_ERROR(ParseModel(*model, *parts));
    RETURN_IF_ERROR(ParseAddedTokens(root, *parts));

    ASSIGN_OR_RETURN(const size_t size, BuildIdTable(parts.get()));

    DecoderInfo decoder_info;
    if (const Json* decoder = Find(root, "decoder"); decoder != nullptr) {
      ASSIGN_OR_RETURN(parts->decoder, MakeDecoder(*decoder, "decoder", 0, &parts->added_contents, decoder_info));
    }
    if (const Json* normalizer = Find(root, "normalizer"); normalizer != nullptr) {
      ASSIGN_OR_RETURN(parts->normalizer, MakeNormalizer(*normalizer, "normalizer", 0));
    }
    if (const Json* pre_tokenizer = Find(root, "pre_tokenizer"); pre_tokenizer != nullptr) {
      ASSIGN_OR_RETURN(parts->pre_tokenizer, MakePreTokenizer(*pre_tokenizer, "pre_tokenizer", 0));
    }

    ASSIGN_OR_RETURN(std::unordered_set<std::string> special_contents,
                     AddAddedTokens(parts.get()));

    if (const Json* extra = Find(config, "additional_special_tokens"); extra != nullptr && extra->is_array()) {
      for (const Json& item : *extra) {
        if (item.is_string()) {
          special_contents.insert(item.get<std::string>());
        } else if (const Json* content = Find(item, "content"); content != nullptr && content->is_string()) {
          special_contents.insert(content->get<std::string>());
        }
      }
    }
    for (size_t id = 0; id < size; ++id) {
      if (!parts->id_present[id]) continue;
      parts->id_special[id] = special_contents.count(parts->id_to_token[id]) > 0;
      parts->id_byte_token[id] = decoder_info.has_byte_fallback &&
                                 ParseByteToken(parts->id_to_token[id]).has_value();
    }

    if (const Json* post = Find(root, "post_processor"); post != nullptr) {
      RETURN_IF_ERROR(ParsePostProcessor(*post, "post_processor", 0, *parts));
      for (const auto& item : parts->single_template) {
        if (!item.has_value()) continue;
        for (int32_t id : *item) {
          if (static_cast<size_t>(id) >= size || !parts->id_present[id]) {
            return absl::InvalidArgumentError(Cat(
                "tokenizer.json: post_processor uses id ", id, ", which has no token"));
          }
        }
      }
    }

    RETURN_IF_ERROR(ParseConfig(config, parts.get()));
    return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(parts)));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(Cat("tokenizer.json: unexpected structure: ", e.what()));
  }
}

}  // namespace cloister::llm
