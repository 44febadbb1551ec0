#include "proto/yaml_message.h"

#include <cstdint>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "base/status.h"

namespace cloister::proto {
namespace {

namespace pb = ::google::protobuf;

constexpr char kLinePayload[] = "cloister.proto.yaml_line";

// TeeType -> "TEE_TYPE_".
std::string EnumPrefix(const pb::EnumDescriptor& type) {
  std::string prefix;
  for (char c : type.name()) {
    if (absl::ascii_isupper(c) && !prefix.empty()) prefix.push_back('_');
    prefix.push_back(absl::ascii_toupper(c));
  }
  return prefix + "_";
}

// "a", "a or b", "a, b or c".
std::string JoinWithOr(const std::vector<std::string>& words) {
  if (words.size() < 2) return absl::StrJoin(words, "");
  std::vector<std::string> head(words.begin(), words.end() - 1);
  return absl::StrCat(absl::StrJoin(head, ", "), " or ", words.back());
}

YAML::Mark MarkOr(const YAML::Node& node, const YAML::Mark& fallback) {
  YAML::Mark mark = node.Mark();
  return mark.is_null() ? fallback : mark;
}

bool IsPlain(const YAML::Node& node) { return node.IsScalar() && node.Tag() == "?"; }

}  // namespace

std::string EnumYamlName(const pb::EnumValueDescriptor& value) {
  std::string name = value.name();
  std::string prefix = EnumPrefix(*value.type());
  if (absl::StartsWith(name, prefix)) name = name.substr(prefix.size());
  return absl::StrReplaceAll(absl::AsciiStrToLower(name), {{"_", "-"}});
}

int ErrorLine(const absl::Status& status) {
  auto payload = status.GetPayload(kLinePayload);
  int line = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &line)) return 0;
  return line;
}

YamlMessageReader::YamlMessageReader(absl::string_view source_name, YamlReadOptions options)
    : source_(source_name), options_(std::move(options)) {}

absl::Status YamlMessageReader::ErrorAt(const YAML::Mark& mark, absl::string_view path,
                                        absl::string_view what) const {
  const int line = mark.is_null() ? 1 : mark.line + 1;
  std::string where;
  if (!path.empty())
    where = Config() ? absl::StrCat(path, ": ") : absl::StrCat("field '", path, "': ");
  absl::Status status =
      absl::InvalidArgumentError(absl::StrCat(source_, ":", line, ": ", where, what));
  status.SetPayload(kLinePayload, absl::Cord(absl::StrCat(line)));
  return status;
}

std::string YamlMessageReader::Describe(const YAML::Node& node) const {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return Config() ? "nothing" : "nothing (null)";
    case YAML::NodeType::Scalar:
      if (Config()) return "a scalar";
      return IsPlain(node) ? absl::StrCat("'", node.Scalar(), "'")
                           : absl::StrCat("the string '", node.Scalar(), "'");
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return Config() ? "a map" : "a mapping";
    default:
      return "nothing";
  }
}

namespace {
// A value that should have been a scalar of some kind: config messages quote the text.
std::string Shown(const YamlMessageReader& reader, YamlWording wording, const YAML::Node& node) {
  if (wording == YamlWording::kConfig && node.IsScalar())
    return absl::StrCat("'", node.Scalar(), "'");
  return reader.Describe(node);
}

YAML::Mark Closest(const std::map<std::string, YAML::Mark>& marks, absl::string_view path,
                   const YAML::Mark& root) {
  std::string probe(path);
  while (!probe.empty()) {
    auto it = marks.find(probe);
    if (it != marks.end()) return it->second;
    size_t cut = probe.find_last_of(".[");
    if (cut == std::string::npos) break;
    probe.resize(cut);
  }
  return root;
}
}  // namespace

YAML::Mark YamlMessageReader::KeyMark(absl::string_view path) const {
  return Closest(key_marks_, path, root_mark_);
}

YAML::Mark YamlMessageReader::ValueMark(absl::string_view path) const {
  return Closest(value_marks_, path, root_mark_);
}

bool YamlMessageReader::Failed(absl::string_view path) const {
  auto inside = [](absl::string_view outer, absl::string_view inner) {
    return inner == outer || (absl::StartsWith(inner, outer) && inner.size() > outer.size() &&
                              (inner[outer.size()] == '.' || inner[outer.size()] == '['));
  };
  for (const std::string& failed : failed_) {
    if (inside(path, failed) || inside(failed, path)) return true;
  }
  return false;
}

absl::Status YamlMessageReader::Keep(absl::Status status, const std::string& path) {
  if (status.ok() || !options_.keep_going) return status;
  errors_.push_back(std::move(status));
  failed_.insert(path);
  return absl::OkStatus();
}

absl::Status YamlMessageReader::ReadMessage(const YAML::Node& map, pb::Message& message,
                                            const std::string& path) {
  if (path.empty()) root_mark_ = map.Mark();
  if (!map.IsMap()) {
    const YAML::Mark mark = Config() ? ValueMark(path) : KeyMark(path);
    return ErrorAt(
        mark, path,
        absl::StrCat("expected ", Config() ? "a map" : "a mapping", ", got ", Describe(map)));
  }
  if (!path.empty() && !value_marks_.contains(path)) value_marks_[path] = map.Mark();
  std::map<std::string, std::pair<int, std::string>> seen;  // field -> line and key
  const pb::Descriptor* descriptor = message.GetDescriptor();
  const pb::Reflection* reflection = message.GetReflection();
  auto is_inline = [&](const pb::FieldDescriptor* field) {
    return field->type() == pb::FieldDescriptor::TYPE_MESSAGE && !field->is_repeated() &&
           options_.inline_fields.contains(field->full_name());
  };
  // At the root each entry stands on its own: a mistake in one does not hide the others.
  auto settle = [&](absl::Status status, const std::string& entry_path) {
    return path.empty() ? Keep(std::move(status), entry_path) : status;
  };
  for (const auto& entry : map) {
    // Copies: yaml-cpp's iterator hands out temporaries (nodes are shared handles).
    const YAML::Node key = entry.first;
    const YAML::Node value = entry.second;
    if (!key.IsScalar()) {
      RETURN_IF_ERROR(settle(
          Config() ? ErrorAt(key.Mark(), path.empty() ? "(key)" : path, "expected a field name")
                   : ErrorAt(key.Mark(), path, "field names must be plain words"),
          "(key)"));
      continue;
    }
    const std::string& name = key.Scalar();
    const std::string entry_path = path.empty() ? name : absl::StrCat(path, ".", name);
    // The field this key names: one of the message's own, an alias, or one of an inline
    // message's fields (then written into that message).
    pb::Message* target = &message;
    const pb::FieldDescriptor* field = descriptor->FindFieldByName(name);
    if (field != nullptr && is_inline(field)) field = nullptr;
    if (field == nullptr) {
      auto alias = options_.aliases.find(absl::StrCat(descriptor->full_name(), ".", name));
      if (alias != options_.aliases.end()) field = descriptor->FindFieldByName(alias->second);
    }
    for (int i = 0; field == nullptr && i < descriptor->field_count(); ++i) {
      const pb::FieldDescriptor* holder = descriptor->field(i);
      if (!is_inline(holder)) continue;
      field = holder->message_type()->FindFieldByName(name);
      if (field != nullptr) target = reflection->MutableMessage(&message, holder);
    }
    if (field == nullptr) {
      absl::Status unknown;
      if (Config()) {
        unknown = ErrorAt(key.Mark(), path, absl::StrCat("unknown field '", name, "'"));
      } else {
        std::vector<std::string> known;
        for (int i = 0; i < descriptor->field_count(); ++i) {
          const pb::FieldDescriptor* f = descriptor->field(i);
          if (!is_inline(f)) {
            known.push_back(f->name());
            continue;
          }
          for (int j = 0; j < f->message_type()->field_count(); ++j)
            known.push_back(f->message_type()->field(j)->name());
        }
        unknown =
            ErrorAt(key.Mark(), entry_path,
                    absl::StrCat("unknown field; expected one of: ", absl::StrJoin(known, ", ")));
      }
      RETURN_IF_ERROR(settle(unknown, entry_path));
      continue;
    }
    auto [first, inserted] = seen.emplace(field->full_name(), std::pair{key.Mark().line + 1, name});
    if (!inserted) {
      std::string spelled =
          first->second.second == name ? "" : absl::StrCat(", as '", first->second.second, "'");
      RETURN_IF_ERROR(settle(
          ErrorAt(key.Mark(), entry_path,
                  absl::StrCat("appears twice (first on line ", first->second.first, spelled, ")")),
          entry_path));
      continue;
    }
    key_marks_[entry_path] = key.Mark();
    RETURN_IF_ERROR(settle(ReadField(key.Mark(), value, *target, *field, entry_path), entry_path));
  }
  if (path.empty() && options_.keep_going && !errors_.empty()) {
    std::vector<std::string> lines;
    for (const absl::Status& error : errors_) lines.emplace_back(error.message());
    return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
  }
  return absl::OkStatus();
}

absl::Status YamlMessageReader::ReadField(const YAML::Mark& key_mark, const YAML::Node& value,
                                          pb::Message& message, const pb::FieldDescriptor& field,
                                          const std::string& path) {
  value_marks_[path] = MarkOr(value, key_mark);
  // Config messages point at the value, policy messages at the key (mostly the same line).
  const YAML::Mark here = Config() ? value_marks_[path] : key_mark;
  if (field.is_repeated()) {
    if (!value.IsSequence()) {
      return ErrorAt(here, path, absl::StrCat("expected a list, got ", Describe(value)));
    }
    for (size_t i = 0; i < value.size(); ++i) {
      const YAML::Node element = value[i];
      const std::string element_path = absl::StrCat(path, "[", i, "]");
      const YAML::Mark mark = MarkOr(element, key_mark);
      key_marks_[element_path] = mark;
      value_marks_[element_path] = mark;
      if (field.type() == pb::FieldDescriptor::TYPE_MESSAGE) {
        pb::Message* item = message.GetReflection()->AddMessage(&message, &field);
        RETURN_IF_ERROR(Keep(ReadMessage(element, *item, element_path), element_path));
      } else {
        RETURN_IF_ERROR(ReadScalar(mark, element, message, field, element_path));
      }
    }
    return absl::OkStatus();
  }
  if (field.type() == pb::FieldDescriptor::TYPE_MESSAGE) {
    return ReadMessage(value, *message.GetReflection()->MutableMessage(&message, &field), path);
  }
  return ReadScalar(here, value, message, field, path);
}

absl::Status YamlMessageReader::ReadScalar(const YAML::Mark& mark, const YAML::Node& value,
                                           pb::Message& message, const pb::FieldDescriptor& field,
                                           const std::string& path) {
  const pb::Reflection* reflection = message.GetReflection();
  const bool repeated = field.is_repeated();
  const bool readable = Config() ? value.IsScalar() : IsPlain(value);
  switch (field.cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_STRING: {
      if (field.type() != pb::FieldDescriptor::TYPE_STRING || !value.IsScalar()) {
        return ErrorAt(mark, path,
                       absl::StrCat(Config() ? "expected a string, got " : "expected text, got ",
                                    Describe(value)));
      }
      if (Config() && value.Scalar().empty()) return ErrorAt(mark, path, "must not be empty");
      repeated ? reflection->AddString(&message, &field, value.Scalar())
               : reflection->SetString(&message, &field, value.Scalar());
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_BOOL: {
      const std::string text = value.IsScalar() ? value.Scalar() : "";
      const bool is_true = text == "true" || (!Config() && (text == "True" || text == "TRUE"));
      const bool is_false = text == "false" || (!Config() && (text == "False" || text == "FALSE"));
      if (!readable || (!is_true && !is_false)) {
        return ErrorAt(
            mark, path,
            absl::StrCat("expected true or false, got ", Shown(*this, options_.wording, value)));
      }
      repeated ? reflection->AddBool(&message, &field, is_true)
               : reflection->SetBool(&message, &field, is_true);
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_INT64:
    case pb::FieldDescriptor::CPPTYPE_INT32:
    case pb::FieldDescriptor::CPPTYPE_UINT64:
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      return ReadInteger(mark, value, message, field, path);
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
    case pb::FieldDescriptor::CPPTYPE_FLOAT: {
      double number = 0;
      if (!readable || !absl::SimpleAtod(value.Scalar(), &number)) {
        return ErrorAt(
            mark, path,
            absl::StrCat("expected a number, got ", Shown(*this, options_.wording, value)));
      }
      auto range = options_.ranges.find(field.full_name());
      if (range != options_.ranges.end() &&
          !(number >= range->second.min && number <= range->second.max)) {
        return ErrorAt(mark, path,
                       absl::StrCat(value.Scalar(), " is outside ", range->second.min, "..",
                                    range->second.max));
      }
      if (field.cpp_type() == pb::FieldDescriptor::CPPTYPE_FLOAT) {
        const float narrow = static_cast<float>(number);
        repeated ? reflection->AddFloat(&message, &field, narrow)
                 : reflection->SetFloat(&message, &field, narrow);
      } else {
        repeated ? reflection->AddDouble(&message, &field, number)
                 : reflection->SetDouble(&message, &field, number);
      }
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_ENUM: {
      const pb::EnumDescriptor* type = field.enum_type();
      std::vector<std::string> names;
      for (int i = 0; i < type->value_count(); ++i) {
        const pb::EnumValueDescriptor* candidate = type->value(i);
        if (candidate->number() == 0) continue;  // "unspecified" is not a choice
        names.push_back(EnumYamlName(*candidate));
        if (value.IsScalar() && names.back() == value.Scalar()) {
          repeated ? reflection->AddEnum(&message, &field, candidate)
                   : reflection->SetEnum(&message, &field, candidate);
          return absl::OkStatus();
        }
      }
      if (Config()) {
        return ErrorAt(mark, path,
                       absl::StrCat(field.name(), " must be ", JoinWithOr(names), ", not ",
                                    Shown(*this, options_.wording, value)));
      }
      return ErrorAt(
          mark, path,
          absl::StrCat("expected one of ", absl::StrJoin(names, ", "), "; got ", Describe(value)));
    }
    default:
      return ErrorAt(mark, path, "this field type cannot be written in YAML");
  }
}

absl::Status YamlMessageReader::ReadInteger(const YAML::Mark& mark, const YAML::Node& value,
                                            pb::Message& message, const pb::FieldDescriptor& field,
                                            const std::string& path) {
  int64_t number = 0;
  if (options_.byte_suffixes && absl::EndsWith(field.name(), "_bytes")) {
    if (!value.IsScalar()) {
      return ErrorAt(mark, path, absl::StrCat("expected a size, got ", Describe(value)));
    }
    const std::string bad = absl::StrCat("expected a size in bytes (like 1048576 or 64MiB), got '",
                                         value.Scalar(), "'");
    absl::string_view text = value.Scalar();
    uint64_t unit = 1;
    for (const auto& [suffix, shift] :
         {std::pair<absl::string_view, int>{"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}}) {
      if (absl::EndsWith(text, suffix)) {
        text.remove_suffix(suffix.size());
        unit = uint64_t{1} << shift;
        break;
      }
    }
    uint64_t count = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &count) || text.empty() ||
        text[0] == '-' || count > (uint64_t{1} << 50) / unit) {
      return ErrorAt(mark, path, bad);
    }
    number = static_cast<int64_t>(count * unit);
  } else {
    const bool readable = Config() ? value.IsScalar() : IsPlain(value);
    if (!readable || !absl::SimpleAtoi(value.Scalar(), &number)) {
      return ErrorAt(
          mark, path,
          absl::StrCat(Config() ? "expected an integer, got " : "expected a whole number, got ",
                       Shown(*this, options_.wording, value)));
    }
  }
  auto range = options_.ranges.find(field.full_name());
  if (range != options_.ranges.end() &&
      (number < range->second.min || number > range->second.max)) {
    return ErrorAt(mark, path,
                   absl::StrCat(number, " is outside ", static_cast<int64_t>(range->second.min),
                                "..", static_cast<int64_t>(range->second.max)));
  }
  const pb::Reflection* reflection = message.GetReflection();
  const bool repeated = field.is_repeated();
  auto out_of_range = [&] { return ErrorAt(mark, path, absl::StrCat(number, " is out of range")); };
  switch (field.cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT64:
      repeated ? reflection->AddInt64(&message, &field, number)
               : reflection->SetInt64(&message, &field, number);
      break;
    case pb::FieldDescriptor::CPPTYPE_INT32:
      if (number < INT32_MIN || number > INT32_MAX) return out_of_range();
      repeated ? reflection->AddInt32(&message, &field, static_cast<int32_t>(number))
               : reflection->SetInt32(&message, &field, static_cast<int32_t>(number));
      break;
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      if (number < 0) return out_of_range();
      repeated ? reflection->AddUInt64(&message, &field, static_cast<uint64_t>(number))
               : reflection->SetUInt64(&message, &field, static_cast<uint64_t>(number));
      break;
    default:
      if (number < 0 || number > UINT32_MAX) return out_of_range();
      repeated ? reflection->AddUInt32(&message, &field, static_cast<uint32_t>(number))
               : reflection->SetUInt32(&message, &field, static_cast<uint32_t>(number));
      break;
  }
  return absl::OkStatus();
}

}  // namespace cloister::proto
