// The chat-template engine's text and value helpers: UTF-8 walking (invalid bytes as U+FFFD),
// JavaScript's whitespace, ASCII case, and the kinds, truthiness and float printing of values.
#include <charconv>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "enclave/llm/chat_template_internal.h"

namespace cloister::llm::chat_template_internal {

// ---------------------------------------------------------------------------------------------
// UTF-8 helpers.

uint32_t DecodeNext(std::string_view text, size_t* position) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const size_t i = *position;
  const unsigned char lead = byte(i);
  auto continuation = [&](size_t k) { return i + k < text.size() && (byte(i + k) & 0xC0) == 0x80; };
  if (lead < 0x80) {
    *position = i + 1;
    return lead;
  }
  if (lead >= 0xC2 && lead <= 0xDF && continuation(1)) {
    *position = i + 2;
    return ((lead & 0x1Fu) << 6) | (byte(i + 1) & 0x3Fu);
  }
  if (lead >= 0xE0 && lead <= 0xEF && continuation(1) && continuation(2)) {
    const uint32_t cp = ((lead & 0x0Fu) << 12) | ((byte(i + 1) & 0x3Fu) << 6) | (byte(i + 2) & 0x3Fu);
    if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) {
      *position = i + 3;
      return cp;
    }
  }
  if (lead >= 0xF0 && lead <= 0xF4 && continuation(1) && continuation(2) && continuation(3)) {
    const uint32_t cp = ((lead & 0x07u) << 18) | ((byte(i + 1) & 0x3Fu) << 12) |
                        ((byte(i + 2) & 0x3Fu) << 6) | (byte(i + 3) & 0x3Fu);
    if (cp >= 0x10000 && cp <= 0x10FFFF) {
      *position = i + 4;
      return cp;
    }
  }
  *position = i + 1;
  return 0xFFFD;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::vector<size_t> CodePointOffsets(std::string_view text) {
  std::vector<size_t> offsets;
  size_t position = 0;
  while (position < text.size()) {
    offsets.push_back(position);
    DecodeNext(text, &position);
  }
  offsets.push_back(text.size());
  return offsets;
}

size_t CodePointCount(std::string_view text) {
  size_t count = 0;
  for (size_t position = 0; position < text.size(); ++count) DecodeNext(text, &position);
  return count;
}

bool IsSpace(uint32_t cp) {
  return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

size_t LeadingSpaceSize(std::string_view text) {
  size_t position = 0;
  while (position < text.size()) {
    size_t next = position;
    if (!IsSpace(DecodeNext(text, &next))) break;
    position = next;
  }
  return position;
}

size_t WithoutTrailingSpaceSize(std::string_view text) {
  size_t end = 0;
  size_t position = 0;
  while (position < text.size()) {
    if (!IsSpace(DecodeNext(text, &position))) end = position;
  }
  return end;
}
std::string TitleCase(std::string_view text) {
  std::string out(text);
  bool previous_cased = false;
  for (char& c : out) {
    if (IsAsciiAlpha(c)) {
      c = previous_cased ? AsciiLower(c) : AsciiUpper(c);
      previous_cased = true;
    } else {
      previous_cased = false;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Values.

const char* KindName(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::kUndefined: return "undefined";
    case Value::Kind::kNone: return "none";
    case Value::Kind::kBoolean: return "boolean";
    case Value::Kind::kInteger: return "integer";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "string";
    case Value::Kind::kList: return "list";
    case Value::Kind::kObject: return "mapping";
    case Value::Kind::kNamespace: return "namespace";
    case Value::Kind::kFunction: return "function";
  }
  return "value";
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return false;
    case Value::Kind::kBoolean: return v.boolean;
    case Value::Kind::kInteger: return v.integer != 0;
    case Value::Kind::kFloat: return v.number != 0;
    case Value::Kind::kString: return !v.string->empty();
    case Value::Kind::kList: return !v.list->empty();
    case Value::Kind::kObject: return !v.object->entries.empty();
    case Value::Kind::kNamespace:
    case Value::Kind::kFunction: return true;
  }
  return false;
}

std::string FormatFloat(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  char buffer[64];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, d);
  std::string text(buffer, end);
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

}  // namespace cloister::llm::chat_template_internal
