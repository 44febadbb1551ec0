#include "sdk/npy.h"

#include <bit>
#include <cctype>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/file.h"
#include "base/status.h"

namespace cloister::sdk {
namespace {

constexpr absl::string_view kMagic = "\x93NUMPY";
constexpr size_t kMaxHeaderSize = size_t{1} << 20;  // far above any real tensor header
constexpr size_t kMaxDimensions = 64;               // numpy's own limit
constexpr size_t kHeaderAlignment = 64;

struct DtypeEntry {
  char kind;  // 'f', 'i', 'u', 'b' as in the descr string
  size_t element_size;
  absl::string_view datatype;
};

constexpr DtypeEntry kDtypes[] = {
    {'f', 2, "FP16"},   {'f', 4, "FP32"},   {'f', 8, "FP64"},   {'i', 1, "INT8"},
    {'i', 2, "INT16"},  {'i', 4, "INT32"},  {'i', 8, "INT64"},  {'u', 1, "UINT8"},
    {'u', 2, "UINT16"}, {'u', 4, "UINT32"}, {'u', 8, "UINT64"}, {'b', 1, "BOOL"},
};

const DtypeEntry* FindByDatatype(absl::string_view datatype) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.datatype == datatype) return &e;
  }
  return nullptr;
}

const DtypeEntry* FindByKind(char kind, size_t element_size) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.kind == kind && e.element_size == element_size) return &e;
  }
  return nullptr;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

// ---- A parser for the Python literal subset that .npy headers use. ----

struct PyValue {
  enum class Kind { kString, kBool, kNone, kInt, kTuple, kList, kDict };
  Kind kind = Kind::kNone;
  std::string text;  // kString
  bool boolean = false;
  int64_t integer = 0;
  std::vector<PyValue> items;                           // kTuple, kList
  // kDict (string keys only): keys[i] maps to values[i]. Two vectors rather than pairs, since a
  // std::pair cannot hold the still incomplete PyValue.
  std::vector<std::string> keys;
  std::vector<PyValue> values;
};

absl::string_view KindName(PyValue::Kind kind) {
  switch (kind) {
    case PyValue::Kind::kString:
      return "a string";
    case PyValue::Kind::kBool:
      return "a boolean";
    case PyValue::Kind::kNone:
      return "None";
    case PyValue::Kind::kInt:
      return "an integer";
    case PyValue::Kind::kTuple:
      return "a tuple";
    case PyValue::Kind::kList:
      return "a list";
    case PyValue::Kind::kDict:
      return "a dict";
  }
  return "a value";
}

class LiteralParser {
 public:
  LiteralParser(absl::string_view text, absl::string_view file_name)
      : text_(text), file_name_(file_name) {}

  // Parses one value that must span the whole text (surrounding whitespace allowed).
  absl::StatusOr<PyValue> ParseAll() {
    ASSIGN_OR_RETURN(PyValue value, ParseValue(0));
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after the header dict");
    return value;
  }

 private:
  static constexpr int kMaxNesting = 8;

  absl::Status Error(absl::string_view problem) const {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name_, ": malformed .npy header: ", problem, " at offset ", pos_));
  }

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Consume(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  bool ConsumeWord(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    size_t end = pos_ + word.size();
    if (end < text_.size() &&
        (std::isalnum(static_cast<unsigned char>(text_[end])) || text_[end] == '_')) {
      return false;
    }
    pos_ = end;
    return true;
  }

  absl::StatusOr<PyValue> ParseValue(int depth) {
    if (depth > kMaxNesting) return Error("nesting too deep");
    SkipSpace();
    if (pos_ >= text_.size()) return Error("unexpected end of header");
    char c = text_[pos_];
    PyValue value;
    if (c == '\'' || c == '"') {
      value.kind = PyValue::Kind::kString;
      ASSIGN_OR_RETURN(value.text, ParseString());
      return value;
    }
    if (c == '{') return ParseDict(depth);
    if (c == '(' || c == '[') return ParseSequence(depth);
    if (c == '-' || c == '+' || std::isdigit(static_cast<unsigned char>(c))) return ParseInt();
    if (ConsumeWord("True")) {
      value.kind = PyValue::Kind::kBool;
      value.boolean = true;
      return value;
    }
    if (ConsumeWord("False")) {
      value.kind = PyValue::Kind::kBool;
      return value;
    }
    if (ConsumeWord("None")) return value;
    return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  absl::StatusOr<std::string> ParseString() {
    char quote = text_[pos_++];
    std::string out;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      char c = text_[pos_++];
      if (c == '\n') return Error("unterminated string");
      if (c == '\\') {
        if (pos_ >= text_.size()) break;
        char escaped = text_[pos_++];
        switch (escaped) {
          case '\\':
          case '\'':
          case '"':
            out.push_back(escaped);
            break;
          case 'n':
            out.push_back('\n');
            break;
          case 't':
            out.push_back('\t');
            break;
          default:
            return Error("unsupported escape in string");
        }
        continue;
      }
      out.push_back(c);
    }
    if (pos_ >= text_.size()) return Error("unterminated string");
    ++pos_;  // closing quote
    return out;
  }

  absl::StatusOr<PyValue> ParseInt() {
    bool negative = false;
    if (text_[pos_] == '-' || text_[pos_] == '+') {
      negative = text_[pos_] == '-';
      ++pos_;
      SkipSpace();
    }
    size_t start = pos_;
    uint64_t magnitude = 0;
    bool overflow = false;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      uint64_t digit = text_[pos_] - '0';
      if (magnitude > (std::numeric_limits<uint64_t>::max() - digit) / 10) overflow = true;
      magnitude = magnitude * 10 + digit;
      ++pos_;
    }
    if (pos_ == start) return Error("expected digits");
    // Python 2 era files may carry a long suffix: (3L, 4L).
    if (pos_ < text_.size() && (text_[pos_] == 'L' || text_[pos_] == 'l')) ++pos_;
    if (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) ||
                                text_[pos_] == '.' || text_[pos_] == '_')) {
      return Error("expected an integer");
    }
    constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    if (overflow || magnitude > kMax) return Error("integer out of range");
    PyValue value;
    value.kind = PyValue::Kind::kInt;
    value.integer = negative ? -static_cast<int64_t>(magnitude) : static_cast<int64_t>(magnitude);
    return value;
  }

  // A tuple "(a, b)" / "(a,)" / "()" or a list "[a, b]". "(a)" is just `a`, as in Python.
  absl::StatusOr<PyValue> ParseSequence(int depth) {
    char open = text_[pos_++];
    char close = open == '(' ? ')' : ']';
    PyValue value;
    value.kind = open == '(' ? PyValue::Kind::kTuple : PyValue::Kind::kList;
    bool saw_comma = false;
    while (true) {
      if (Consume(close)) break;
      ASSIGN_OR_RETURN(PyValue item, ParseValue(depth + 1));
      value.items.push_back(std::move(item));
      if (Consume(',')) {
        saw_comma = true;
        continue;
      }
      if (Consume(close)) break;
      return Error(absl::StrCat("expected ',' or '", std::string(1, close), "'"));
    }
    if (open == '(' && value.items.size() == 1 && !saw_comma) {
      PyValue inner = std::move(value.items[0]);
      return inner;
    }
    return value;
  }

  absl::StatusOr<PyValue> ParseDict(int depth) {
    ++pos_;  // '{'
    PyValue value;
    value.kind = PyValue::Kind::kDict;
    while (true) {
      if (Consume('}')) break;
      SkipSpace();
      if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
        return Error("expected a string key");
      }
      ASSIGN_OR_RETURN(std::string key, ParseString());
      if (!Consume(':')) return Error("expected ':' after a key");
      ASSIGN_OR_RETURN(PyValue item, ParseValue(depth + 1));
      for (const std::string& existing : value.keys) {
        if (existing == key) return Error(absl::StrCat("duplicate key '", key, "'"));
      }
      value.keys.push_back(std::move(key));
      value.values.push_back(std::move(item));
      if (Consume(',')) continue;
      if (Consume('}')) break;
      return Error("expected ',' or '}'");
    }
    return value;
  }

  absl::string_view text_;
  absl::string_view file_name_;
  size_t pos_ = 0;
};

uint32_t ReadLittleEndian(ByteSpan bytes) {
  uint32_t value = 0;
  for (size_t i = bytes.size(); i-- > 0;) value = value << 8 | bytes[i];
  return value;
}

absl::Status Invalid(absl::string_view file_name, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(file_name, ": ", problem));
}

absl::StatusOr<const DtypeEntry*> ParseDescr(const PyValue& descr, absl::string_view file_name) {
  if (descr.kind != PyValue::Kind::kString) {
    return Invalid(file_name, absl::StrCat("unsupported dtype: 'descr' is ", KindName(descr.kind),
                                           " (structured arrays are not supported)"));
  }
  const std::string& text = descr.text;
  auto unsupported = [&]() {
    return Invalid(file_name, absl::StrCat("unsupported dtype '", text,
                                           "' (supported: float16/32/64, int8/16/32/64, "
                                           "uint8/16/32/64, bool)"));
  };
  if (text.size() < 3) return unsupported();
  char order = text[0];
  char kind = text[1];
  absl::string_view digits = absl::string_view(text).substr(2);
  if (digits.size() != 1 || digits[0] < '1' || digits[0] > '8') return unsupported();
  size_t element_size = digits[0] - '0';
  const DtypeEntry* entry = FindByKind(kind, element_size);
  if (entry == nullptr) return unsupported();
  if (order == '>' || order == '!') {
    if (element_size == 1) return entry;  // byte order is meaningless for one byte
    return Invalid(file_name, absl::StrCat("big-endian dtype '", text,
                                           "' is not supported; save it as little-endian"));
  }
  if (order == '|' || order == '<' || order == '=') {
    // '=' is native order; every platform this code builds for is little-endian.
    static_assert(std::endian::native == std::endian::little);
    if (order == '|' && element_size != 1) return unsupported();
    return entry;
  }
  return unsupported();
}

}  // namespace

absl::StatusOr<size_t> DatatypeElementSize(std::string_view datatype_text) {
  absl::string_view datatype(datatype_text.data(), datatype_text.size());
  const DtypeEntry* entry = FindByDatatype(datatype);
  if (entry == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported tensor datatype '", datatype, "'"));
  }
  return entry->element_size;
}

absl::StatusOr<uint64_t> ShapeElementCount(const std::vector<int64_t>& shape) {
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t count = 1;
  bool overflow = false;
  for (int64_t dimension : shape) {
    if (dimension < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeText(shape), " has a negative dimension"));
    }
    uint64_t d = static_cast<uint64_t>(dimension);
    if (d != 0 && count > kMax / d) {
      overflow = true;  // keep going: a later zero dimension does not make this valid input
    } else {
      count *= d;
    }
  }
  if (overflow) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", ShapeText(shape), " has too many elements"));
  }
  return count;
}

absl::StatusOr<NpyArray> ParseNpy(ByteSpan file_bytes, std::string_view file_name_text) {
  absl::string_view file_name(file_name_text.data(), file_name_text.size());
  if (file_bytes.size() < kMagic.size() || ToString(file_bytes.first(kMagic.size())) != kMagic) {
    return Invalid(file_name, "not a .npy file (bad magic)");
  }
  if (file_bytes.size() < kMagic.size() + 2) return Invalid(file_name, "truncated header");
  uint8_t major = file_bytes[6];
  uint8_t minor = file_bytes[7];
  size_t length_size;
  if (major == 1 && minor == 0) {
    length_size = 2;
  } else if ((major == 2 || major == 3) && minor == 0) {
    length_size = 4;
  } else {
    return Invalid(file_name, absl::StrCat("unsupported .npy format version ", major, ".", minor));
  }
  size_t preamble_size = 8 + length_size;
  if (file_bytes.size() < preamble_size) return Invalid(file_name, "truncated header");
  uint64_t header_size = ReadLittleEndian(file_bytes.subspan(8, length_size));
  if (header_size > kMaxHeaderSize) {
    return Invalid(file_name, absl::StrCat("header of ", header_size, " bytes is too large"));
  }
  if (file_bytes.size() - preamble_size < header_size) {
    return Invalid(file_name, absl::StrCat("truncated header (", header_size, " bytes announced, ",
                                           file_bytes.size() - preamble_size, " present)"));
  }
  std::string header = ToString(file_bytes.subspan(preamble_size, header_size));
  // Versions 1 and 2 are latin-1, version 3 is UTF-8; the keys and values we accept are
  // ASCII either way, so no decoding is needed, but a NUL byte is never valid.
  if (header.find('\0') != std::string::npos) {
    return Invalid(file_name, "malformed .npy header: NUL byte in header");
  }

  LiteralParser parser(header, file_name);
  ASSIGN_OR_RETURN(PyValue dict, parser.ParseAll());
  if (dict.kind != PyValue::Kind::kDict) {
    return Invalid(file_name, absl::StrCat("malformed .npy header: it is ", KindName(dict.kind),
                                           ", not a dict"));
  }
  const PyValue* descr = nullptr;
  const PyValue* fortran_order = nullptr;
  const PyValue* shape = nullptr;
  for (size_t i = 0; i < dict.keys.size(); ++i) {
    const std::string& key = dict.keys[i];
    const PyValue& value = dict.values[i];
    if (key == "descr") {
      descr = &value;
    } else if (key == "fortran_order") {
      fortran_order = &value;
    } else if (key == "shape") {
      shape = &value;
    } else {
      return Invalid(file_name, absl::StrCat("malformed .npy header: unexpected key '", key, "'"));
    }
  }
  if (descr == nullptr || fortran_order == nullptr || shape == nullptr) {
    std::string missing = descr == nullptr           ? "descr"
                          : fortran_order == nullptr ? "fortran_order"
                                                     : "shape";
    return Invalid(file_name, absl::StrCat("malformed .npy header: missing key '", missing, "'"));
  }

  ASSIGN_OR_RETURN(const DtypeEntry* dtype, ParseDescr(*descr, file_name));
  if (fortran_order->kind != PyValue::Kind::kBool) {
    return Invalid(file_name, absl::StrCat("malformed .npy header: 'fortran_order' is ",
                                           KindName(fortran_order->kind), ", not a boolean"));
  }
  if (fortran_order->boolean) {
    return Invalid(file_name,
                   "Fortran-order arrays are not supported; save with np.ascontiguousarray()");
  }
  if (shape->kind != PyValue::Kind::kTuple) {
    return Invalid(file_name, absl::StrCat("malformed .npy header: 'shape' is ",
                                           KindName(shape->kind), ", not a tuple"));
  }
  if (shape->items.size() > kMaxDimensions) {
    return Invalid(file_name, absl::StrCat("shape has ", shape->items.size(),
                                           " dimensions, more than ", kMaxDimensions));
  }
  NpyArray array;
  array.datatype = std::string(dtype->datatype);
  for (const PyValue& item : shape->items) {
    if (item.kind != PyValue::Kind::kInt) {
      return Invalid(file_name, absl::StrCat("malformed .npy header: a shape dimension is ",
                                             KindName(item.kind), ", not an integer"));
    }
    array.shape.push_back(item.integer);
  }
  auto count = ShapeElementCount(array.shape);
  if (!count.ok()) return Invalid(file_name, count.status().message());
  if (*count > std::numeric_limits<uint64_t>::max() / dtype->element_size) {
    return Invalid(file_name, absl::StrCat("shape ", ShapeText(array.shape), " is too large"));
  }
  uint64_t expected_size = *count * dtype->element_size;
  uint64_t data_size = file_bytes.size() - preamble_size - header_size;
  if (data_size != expected_size) {
    return Invalid(file_name,
                   absl::StrCat("data is ", data_size, " bytes but shape ", ShapeText(array.shape),
                                " of ", array.datatype, " needs ", expected_size));
  }
  ByteSpan data = file_bytes.subspan(preamble_size + header_size);
  array.data.assign(data.begin(), data.end());
  return array;
}

absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string contents, ReadFile(path));
  return ParseNpy(AsBytes(contents), path);
}

absl::StatusOr<Bytes> SerializeNpy(const NpyArray& array) {
  const DtypeEntry* dtype = FindByDatatype(array.datatype);
  if (dtype == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write datatype '", array.datatype, "' as .npy"));
  }
  if (array.shape.size() > kMaxDimensions) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape has ", array.shape.size(), " dimensions, more than ", kMaxDimensions));
  }
  ASSIGN_OR_RETURN(uint64_t count, ShapeElementCount(array.shape));
  if (count > std::numeric_limits<uint64_t>::max() / dtype->element_size ||
      count * dtype->element_size != array.data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(array.datatype, " tensor of shape ", ShapeText(array.shape), " has ",
                     array.data.size(), " bytes of data, expected ", count * dtype->element_size));
  }
  std::string descr = dtype->element_size == 1
                          ? absl::StrCat("|", std::string(1, dtype->kind), "1")
                          : absl::StrCat("<", std::string(1, dtype->kind), dtype->element_size);
  std::string dict = absl::StrCat(
      "{'descr': '", descr, "', 'fortran_order': False, 'shape': ", ShapeText(array.shape), ", }");
  // Version 1.0 has a 2-byte header length, which any header with at most kMaxDimensions
  // dimensions fits comfortably, so version 2.0 is never needed for writing.
  constexpr size_t kPreambleSize = 10;
  size_t unpadded = kPreambleSize + dict.size() + 1;  // +1 for the final newline
  size_t padded = (unpadded + kHeaderAlignment - 1) / kHeaderAlignment * kHeaderAlignment;
  size_t header_size = padded - kPreambleSize;
  CLOISTER_CHECK(header_size <= 0xffff);
  dict.append(padded - unpadded, ' ');
  dict.push_back('\n');
  CLOISTER_CHECK(dict.size() == header_size);

  Bytes out;
  out.reserve(padded + array.data.size());
  Append(out, AsBytes(std::string_view(kMagic.data(), kMagic.size())));
  out.push_back(1);  // version 1.0
  out.push_back(0);
  out.push_back(static_cast<uint8_t>(header_size & 0xff));
  out.push_back(static_cast<uint8_t>(header_size >> 8));
  Append(out, AsBytes(dict));
  Append(out, array.data);
  return out;
}

absl::Status WriteNpyFile(const std::string& path, const NpyArray& array) {
  ASSIGN_OR_RETURN(Bytes bytes, SerializeNpy(array));
  return WriteFileAtomic(
      path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), 0644);
}

cloister::api::v1::Tensor ToTensor(std::string name, NpyArray array) {
  cloister::api::v1::Tensor tensor;
  tensor.set_name(std::move(name));
  tensor.set_datatype(std::move(array.datatype));
  for (int64_t dimension : array.shape) tensor.add_shape(dimension);
  tensor.set_raw(ToString(array.data));
  return tensor;
}

absl::Status ValidateTensor(const cloister::api::v1::Tensor& tensor) {
  std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
  auto element_size = DatatypeElementSize(tensor.datatype());
  if (!element_size.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor.name(), "': ", element_size.status().message()));
  }
  auto count = ShapeElementCount(shape);
  if (!count.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor.name(), "': ", count.status().message()));
  }
  if (*count > std::numeric_limits<uint64_t>::max() / *element_size ||
      *count * *element_size != tensor.raw().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor.name(), "' of shape ", ShapeText(shape), " and type ",
                     tensor.datatype(), " has ", tensor.raw().size(), " bytes of data"));
  }
  return absl::OkStatus();
}

absl::StatusOr<NpyArray> FromTensor(const cloister::api::v1::Tensor& tensor) {
  RETURN_IF_ERROR(ValidateTensor(tensor));
  NpyArray array;
  array.datatype = tensor.datatype();
  array.shape.assign(tensor.shape().begin(), tensor.shape().end());
  array.data.assign(tensor.raw().begin(), tensor.raw().end());
  return array;
}

}  // namespace cloister::sdk
