// The `cloister` command line (cli.h): the subcommands that act as a tenant (keygen, attest,
// upload, models, delete, infer).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "attest/verifier.h"
#include "base/file.h"
#include "base/status.h"
#include "sdk/cli.h"
#include "sdk/cli_internal.h"
#include "sdk/client.h"
#include "sdk/identity.h"
#include "sdk/model_dir.h"
#include "sdk/npy.h"

namespace cloister::sdk::cli_internal {

namespace api = ::cloister::api::v1;

CliError RefusedForModel(const absl::Status& status, const std::string& name) {
  if (absl::IsNotFound(status) && status.message() == "model not found") {
    return Refused(
        absl::StrCat("model not found: no model '", name,
                     "' uploaded with this identity key (`cloister models` lists yours)"));
  }
  return Refused(status);
}

Result RunKeygen(const Flags& flags, CliIo& io) {
  auto path = RequiredSetting(flags, io, "key", "CLOISTER_KEY", "key file");
  if (!path.ok()) return Usage(path.status());
  TenantIdentity identity = TenantIdentity::Generate();
  absl::Status saved = identity.Save(*path);
  if (!saved.ok()) return Refused(saved);
  if (flags.Has("json")) {
    io.out << "{\"key\":" << JsonString(*path)
           << ",\"public_key\":" << JsonString(identity.public_key_hex()) << "}\n";
  } else {
    io.out << "wrote identity key " << *path << "\npublic key: " << identity.public_key_hex()
           << "\nkeep this file safe: it owns every model you upload with it\n";
  }
  return std::nullopt;
}

namespace {

void PrintVerdict(const attest::Verdict& verdict, bool json, std::ostream& out) {
  if (json) {
    std::vector<std::string> checks;
    for (const attest::Check& check : verdict.checks) {
      checks.push_back(absl::StrCat("{\"name\":", JsonString(check.name), ",\"result\":",
                                    JsonString(std::string(attest::CheckResultName(check.result))),
                                    ",\"detail\":", JsonString(check.detail), "}"));
    }
    std::vector<std::string> claims;
    for (const auto& [key, value] : verdict.claims) {
      claims.push_back(absl::StrCat(JsonString(key), ":", JsonString(value)));
    }
    out << "{\"verdict\":" << JsonString(verdict.pass ? "pass" : "fail") << ",\"checks\":["
        << absl::StrJoin(checks, ",") << "],\"claims\":{" << absl::StrJoin(claims, ",") << "}}\n";
    return;
  }
  out << "attestation: " << (verdict.pass ? "PASS" : "FAIL") << "\n";
  for (const attest::Check& check : verdict.checks) {
    absl::string_view mark = check.result == attest::Check::kPass   ? "pass"
                             : check.result == attest::Check::kFail ? "FAIL"
                                                                    : "skip";
    out << "  [" << mark << "] " << check.name;
    if (!check.detail.empty()) out << ": " << check.detail;
    out << "\n";
  }
  if (!verdict.claims.empty()) {
    out << "claims:\n";
    for (const auto& [key, value] : verdict.claims) out << "  " << key << ": " << value << "\n";
  }
}

}  // namespace

Result RunAttest(const Flags& flags, CliIo& io) {
  auto options = LoadConnection(flags, io, /*need_key=*/false);
  if (!options.ok()) return Usage(options.status());
  auto verdict = Attest(*options);
  if (!verdict.ok()) return Refused(verdict.status());
  PrintVerdict(*verdict, flags.Has("json"), io.out);
  if (!verdict->pass) {
    io.err << "cloister: attestation failed: " << verdict->FailedSummary() << "\n";
    return CliError{kExitRefused, ""};  // already reported
  }
  return std::nullopt;
}

namespace {

// OK when `path` is a regular file this process can open for reading.
absl::Status CheckReadableFile(const std::string& path, absl::string_view what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open ", what, " ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  ::close(fd);
  if (!regular)
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is not a regular file"));
  return absl::OkStatus();
}

}  // namespace

Result RunUpload(const Flags& flags, CliIo& io) {
  auto model_path = RequiredFlag(flags, "model", "upload");
  if (!model_path.ok()) return Usage(model_path.status());
  auto name = RequiredFlag(flags, "name", "upload");
  if (!name.ok()) return Usage(name.status());
  // Check the model file is readable, or the folder a checkpoint, before connecting.
  struct stat model_st;
  if (::stat(model_path->c_str(), &model_st) == 0 && S_ISDIR(model_st.st_mode)) {
    if (auto listed = ListModelDir(*model_path); !listed.ok()) return Usage(listed.status());
  } else if (absl::Status readable = CheckReadableFile(*model_path, "model file");
             !readable.ok()) {
    return Usage(readable);
  }
  auto options = LoadConnection(flags, io, /*need_key=*/true);
  if (!options.ok()) return Usage(options.status());
  auto client = Client::Connect(*options);
  if (!client.ok()) return Refused(client.status());

  bool show = io.show_progress && !flags.Has("json");
  UploadProgress progress;
  if (show) {
    progress = [&io, &name](uint64_t sent, uint64_t total) {
      double percent = total == 0 ? 100.0 : 100.0 * static_cast<double>(sent) / total;
      io.err << absl::StrFormat("\ruploading %s: %3.0f%% (%.1f of %.1f MiB)", *name, percent,
                                sent / 1048576.0, total / 1048576.0)
             << std::flush;
    };
  }
  auto model = (*client)->UploadModel(*model_path, *name, progress);
  if (show) io.err << "\n";
  if (!model.ok()) return Refused(model.status());
  if (flags.Has("json")) {
    io.out << ModelJson(*model) << "\n";
  } else {
    io.out << "uploaded ";
    PrintModelHuman(io.out, *model);
  }
  return std::nullopt;
}

Result RunModels(const Flags& flags, CliIo& io) {
  auto options = LoadConnection(flags, io, /*need_key=*/true);
  if (!options.ok()) return Usage(options.status());
  auto client = Client::Connect(*options);
  if (!client.ok()) return Refused(client.status());
  auto models = (*client)->ListModels();
  if (!models.ok()) return Refused(models.status());
  if (flags.Has("json")) {
    std::vector<std::string> items;
    for (const api::ModelInfo& model : *models) items.push_back(ModelJson(model));
    io.out << "{\"models\":[" << absl::StrJoin(items, ",") << "]}\n";
  } else if (models->empty()) {
    io.out << "no models\n";
  } else {
    for (const api::ModelInfo& model : *models) PrintModelHuman(io.out, model);
  }
  return std::nullopt;
}

Result RunDelete(const Flags& flags, CliIo& io) {
  auto name = RequiredFlag(flags, "model", "delete");
  if (!name.ok()) return Usage(name.status());
  auto options = LoadConnection(flags, io, /*need_key=*/true);
  if (!options.ok()) return Usage(options.status());
  auto client = Client::Connect(*options);
  if (!client.ok()) return Refused(client.status());
  absl::Status deleted = (*client)->DeleteModel(*name);
  if (!deleted.ok()) return RefusedForModel(deleted, *name);
  if (flags.Has("json")) {
    io.out << "{\"deleted\":" << JsonString(*name) << "}\n";
  } else {
    io.out << "deleted model " << *name << "\n";
  }
  return std::nullopt;
}

Result RunInfer(const Flags& flags, CliIo& io) {
  auto name = RequiredFlag(flags, "model", "infer");
  if (!name.ok()) return Usage(name.status());
  bool json = flags.Has("json");
  std::optional<std::string> output_dir = flags.Get("output-dir");
  if (json && output_dir.has_value()) {
    return Usage("--json and --output-dir exclude each other: print or write files, not both");
  }
  std::vector<std::string> input_specs = flags.All("input");
  if (input_specs.empty()) {
    return Usage("`cloister infer` needs at least one --input NAME=FILE.npy");
  }
  // Read every input before connecting: a typo should not cost an attestation round trip.
  std::vector<api::Tensor> inputs;
  std::set<std::string> input_names;
  for (const std::string& spec : input_specs) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
      return Usage(absl::StrCat("--input wants NAME=FILE.npy, not '", spec, "'"));
    }
    std::string input_name = spec.substr(0, eq);
    if (!input_names.insert(input_name).second) {
      return Usage(absl::StrCat("input '", input_name, "' given more than once"));
    }
    auto array = ReadNpyFile(spec.substr(eq + 1));
    if (!array.ok()) return Usage(array.status());
    inputs.push_back(ToTensor(input_name, *std::move(array)));
  }
  std::string dir = output_dir.value_or(".");
  if (!json) {
    absl::Status made = MakeDirs(dir, 0755);
    if (!made.ok()) return Usage(made);
  }
  auto options = LoadConnection(flags, io, /*need_key=*/true);
  if (!options.ok()) return Usage(options.status());
  auto client = Client::Connect(*options);
  if (!client.ok()) return Refused(client.status());
  auto outputs = (*client)->Infer(*name, std::move(inputs), flags.All("output"));
  if (!outputs.ok()) return RefusedForModel(outputs.status(), *name);

  if (json) {
    std::vector<std::string> items;
    for (const api::Tensor& tensor : *outputs) {
      auto item = TensorToJson(tensor);
      if (!item.ok()) return Refused(item.status());
      items.push_back(*std::move(item));
    }
    io.out << "{\"outputs\":[" << absl::StrJoin(items, ",") << "]}\n";
    return std::nullopt;
  }
  std::set<std::string> used_files;
  for (const api::Tensor& tensor : *outputs) {
    auto array = FromTensor(tensor);
    if (!array.ok()) return Refused(array.status());
    std::string base = SanitizeOutputName(tensor.name());
    std::string file = base;
    for (int n = 2; !used_files.insert(file).second; ++n) file = absl::StrCat(base, "_", n);
    std::string path = absl::StrCat(dir, "/", file, ".npy");
    absl::Status written = WriteNpyFile(path, *array);
    if (!written.ok()) return Refused(written);
    io.out << "wrote " << path << "  (" << tensor.name() << ", " << tensor.datatype() << " "
           << ShapeHuman(tensor.shape()) << ")\n";
  }
  return std::nullopt;
}

}  // namespace cloister::sdk::cli_internal
