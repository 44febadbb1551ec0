// The `cloister` command line (cli.h): `cloister status`, the appliance at a glance from
// cloisterd's operator port.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cloister/ops/v1/ops.grpc.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "sdk/cli_internal.h"

namespace cloister::sdk::cli_internal {

namespace {

// ---- status (operator port) ----

std::string AgeText(double seconds) {
  if (seconds < 0) return "-";
  int64_t whole = static_cast<int64_t>(seconds);
  if (whole < 120) return absl::StrCat(whole, "s");
  if (whole < 7200) return absl::StrCat(whole / 60, "m", whole % 60, "s");
  return absl::StrCat(whole / 3600, "h", (whole % 3600) / 60, "m");
}

// Columns padded to their widest cell, two spaces apart.
void PrintTable(std::ostream& out, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

}  // namespace

Result RunStatus(const Flags& flags, CliIo& io) {
  std::string address =
      Setting(flags, io, "operator", "CLOISTER_OPERATOR", "127.0.0.1:7701").value_or("");
  absl::Duration timeout = absl::Seconds(10);
  if (auto text = flags.Get("timeout"); text.has_value()) {
    double seconds = 0;
    if (!absl::SimpleAtod(*text, &seconds) || !(seconds > 0)) {
      return Usage(absl::StrCat("--timeout must be a number of seconds above 0, not '", *text, "'"));
    }
    timeout = absl::Seconds(seconds);
  }
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = ops::v1::Operator::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  ops::v1::StatusResponse status;
  grpc::Status rpc = stub->Status(&context, ops::v1::StatusRequest(), &status);
  if (!rpc.ok()) {
    return Refused(absl::StrCat("cannot get status from the operator port at ", address, ": ",
                                rpc.error_message()));
  }
  if (flags.Has("json")) {
    std::string json;
    google::protobuf::util::JsonPrintOptions options;
    options.always_print_primitive_fields = true;
    options.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(status, &json, options);
    io.out << json << "\n";
    return std::nullopt;
  }
  io.out << "cloisterd (operator port " << address << "): up " << AgeText(status.uptime_seconds())
         << ", " << status.workers_size() << " workers, " << status.queued_requests()
         << " queued, " << status.batches_in_flight() << " batches in flight, "
         << status.sessions() << " sessions, " << status.models() << " models\n";
  if (!status.audit_log_path().empty()) {
    io.out << "audit log " << status.audit_log_path() << ": " << status.audit_entries()
           << " entries, signed through entry " << status.audit_signed_entries() << "\n";
  }
  io.out << "\n";
  std::vector<std::vector<std::string>> workers = {
      {"WORKER", "TEE", "GPU", "IN FLIGHT", "EVIDENCE AGE", "SIGNING KEY"}};
  for (const auto& worker : status.workers()) {
    std::string key = worker.signing_public_key_hex();
    workers.push_back({absl::StrCat(worker.index()), worker.tee(),
                       worker.gpu().empty() ? "-" : worker.gpu(),
                       absl::StrCat(worker.batches_in_flight()),
                       AgeText(worker.evidence_age_seconds()),
                       key.empty() ? "-" : key.substr(0, 16) + "..."});
  }
  PrintTable(io.out, workers);
  io.out << "\n";
  std::vector<std::vector<std::string>> tenants = {{"TENANT", "PRIORITY", "WEIGHT", "QUEUED",
                                                    "ADMITTED", "REFUSED", "EXPIRED", "BATCHES",
                                                    "SESSIONS", "MODELS"}};
  for (const auto& tenant : status.tenants()) {
    tenants.push_back({tenant.id(), tenant.priority(), absl::StrCat(tenant.weight()),
                       absl::StrCat(tenant.queued_requests()), absl::StrCat(tenant.admitted()),
                       absl::StrCat(tenant.refused()), absl::StrCat(tenant.expired()),
                       absl::StrCat(tenant.batches()), absl::StrCat(tenant.sessions()),
                       absl::StrCat(tenant.models())});
  }
  PrintTable(io.out, tenants);
  return std::nullopt;
}

}  // namespace cloister::sdk::cli_internal
