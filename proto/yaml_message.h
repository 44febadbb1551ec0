// Reads YAML into protobuf messages by reflection, so that a file format is defined once, by its
// proto schema: each mapping is a message and each key the name of one of its fields; nested
// messages, repeated fields, strings, booleans, integers, doubles and enums (written without
// their type's prefix, in lower case with dashes: TEE_TYPE_SEV_SNP is `sev-snp`). Unknown and
// repeated keys and values of the wrong type are errors of the form "FILE:LINE: ...". The reader
// remembers where every field was written, so that checks beyond the schema (across fields, on
// the meaning of a value) can report their own errors at the right line.
// Used by attest/policy.cc (attestation policies) and host/config/daemon_config.cc (cloisterd's
// config). Not thread-safe: one reader per document. Reading a loaded document does not throw,
// but callers catch YAML::Exception around it all the same.
#pragma once

#include <yaml-cpp/yaml.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace cloister::proto {

// How errors are worded. The two formats grew up apart and each keeps the messages its users
// and documents know.
enum class YamlWording {
  // "FILE:LINE: field 'PATH': what". An unknown key lists the known ones; a quoted scalar is
  // only ever text; booleans are true/True/TRUE or false/False/FALSE; empty strings are allowed.
  kPolicy,
  // "FILE:LINE: PATH: what". An unknown key is named at its mapping ("tls: unknown field 'x'");
  // numbers and booleans may be quoted; booleans are true or false; empty strings are refused;
  // enums say "NAME must be a, b or c, not 'x'".
  kConfig,
};

// Inclusive bounds of a numeric field.
struct YamlRange {
  double min = 0;
  double max = 0;
};

struct YamlReadOptions {
  YamlWording wording = YamlWording::kPolicy;
  // Message fields (full names, "package.Message.field") whose own fields are written in the
  // enclosing mapping, beside its other keys; their paths in errors leave the field's name out.
  std::set<std::string> inline_fields;
  // Other names accepted for a field: full name of the alias ("package.Message.alias") to the
  // field's name. Errors name the key as written; giving both is a repeated key.
  std::map<std::string, std::string> aliases;
  // Accepted values of numeric fields (full names); "VALUE is outside MIN..MAX" otherwise.
  std::map<std::string, YamlRange> ranges;
  // Integer fields whose name ends in "_bytes" also take a binary suffix (64KiB, 16MiB, 2GiB,
  // 1TiB); at most 2^50 bytes.
  bool byte_suffixes = false;
  // Whether to go on after an error and collect one error per entry of the top-level mapping
  // and per element of every list of mappings (see errors()); otherwise the first error ends
  // the read.
  bool keep_going = false;
};

// The YAML spelling of an enum value: TEE_TYPE_SEV_SNP of enum TeeType is "sev-snp".
std::string EnumYamlName(const google::protobuf::EnumValueDescriptor& value);

class YamlMessageReader {
 public:
  // `source_name` (usually the file's path) starts every error message.
  explicit YamlMessageReader(absl::string_view source_name, YamlReadOptions options = {});

  // Reads the mapping `map` into `message` (over what it holds); `path` names the mapping in
  // errors and is empty for the document's root. InvalidArgument for the first mistake; with
  // keep_going, every collected error joined by newlines (and each in errors()).
  absl::Status ReadMessage(const YAML::Node& map, google::protobuf::Message& message,
                           const std::string& path = "");

  // The errors collected with keep_going, in the order found.
  const std::vector<absl::Status>& errors() const { return errors_; }
  // True when an error was found at `path` or inside it ("tenants" covers "tenants[2].id").
  bool Failed(absl::string_view path) const;
  // True when `path` ("tls.cert_file", "devices[1]") was written in the document.
  bool Written(absl::string_view path) const { return value_marks_.contains(std::string(path)); }

  // Where the key of `path` was written / where its value starts; for a path that was not
  // written, the closest enclosing one that was, or else the document's start.
  YAML::Mark KeyMark(absl::string_view path) const;
  YAML::Mark ValueMark(absl::string_view path) const;

  // InvalidArgument "SOURCE:LINE: <path> what" in this reader's wording, at `mark`; an empty
  // path leaves it out. The line is also kept in the status (ErrorLine).
  absl::Status ErrorAt(const YAML::Mark& mark, absl::string_view path,
                       absl::string_view what) const;
  // The same at KeyMark(path).
  absl::Status Error(absl::string_view path, absl::string_view what) const {
    return ErrorAt(KeyMark(path), path, what);
  }
  // What `node` is, for messages: "a list", "'text'", ... in this reader's wording.
  std::string Describe(const YAML::Node& node) const;

 private:
  absl::Status ReadField(const YAML::Mark& key_mark, const YAML::Node& value,
                         google::protobuf::Message& message,
                         const google::protobuf::FieldDescriptor& field, const std::string& path);
  absl::Status ReadScalar(const YAML::Mark& mark, const YAML::Node& value,
                          google::protobuf::Message& message,
                          const google::protobuf::FieldDescriptor& field, const std::string& path);
  absl::Status ReadInteger(const YAML::Mark& mark, const YAML::Node& value,
                           google::protobuf::Message& message,
                           const google::protobuf::FieldDescriptor& field, const std::string& path);
  absl::Status Keep(absl::Status status, const std::string& path);
  bool Config() const { return options_.wording == YamlWording::kConfig; }

  std::string source_;
  YamlReadOptions options_;
  YAML::Mark root_mark_;
  std::map<std::string, YAML::Mark> key_marks_;
  std::map<std::string, YAML::Mark> value_marks_;
  std::vector<absl::Status> errors_;
  std::set<std::string> failed_;
};

// The 1-based line that ErrorAt put into `status`; 0 for a status it did not make.
int ErrorLine(const absl::Status& status);

}  // namespace cloister::proto
