#include "host/metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace cloister::host {
namespace {

TEST(MetricsTest, CountersAndHistogramsCarryTenantAndPriority) {
  Metrics metrics;
  metrics.SetTenantClasses({{"acme", "realtime"}});
  metrics.RecordRequest("Infer", "acme", absl::StatusCode::kOk);
  metrics.RecordRequest("Infer", "acme", absl::StatusCode::kResourceExhausted);
  // Neither a failed authentication nor an unknown tenant creates a label value.
  metrics.RecordRequest("Infer", "acme", absl::StatusCode::kUnauthenticated);
  metrics.RecordRequest("Infer", "made-up-tenant", absl::StatusCode::kNotFound);
  metrics.RecordBatch("acme", "realtime", 3,
                      {absl::Milliseconds(1), absl::Milliseconds(2), absl::Milliseconds(3)},
                      absl::Milliseconds(20));
  metrics.RecordTransfer("emulated", 1000, absl::Microseconds(500));
  std::string text = metrics.Text();
  EXPECT_TRUE(absl::StrContains(
      text, "cloister_requests_total{method=\"Infer\",priority=\"realtime\",tenant=\"acme\"} 2"))
      << text;
  EXPECT_TRUE(absl::StrContains(text,
                                "cloister_request_errors_total{code=\"RESOURCE_EXHAUSTED\","
                                "method=\"Infer\",priority=\"realtime\",tenant=\"acme\"} 1"))
      << text;
  EXPECT_TRUE(absl::StrContains(text,
                                "cloister_requests_total{method=\"Infer\",priority=\"-\","
                                "tenant=\"-\"} 2"))
      << text;
  EXPECT_FALSE(absl::StrContains(text, "made-up-tenant")) << text;
  EXPECT_TRUE(
      absl::StrContains(text, "cloister_batch_size_count{priority=\"realtime\",tenant=\"acme\"} 1"))
      << text;
  EXPECT_TRUE(absl::StrContains(
      text, "cloister_queue_latency_seconds_count{priority=\"realtime\",tenant=\"acme\"} 3"))
      << text;
  EXPECT_TRUE(absl::StrContains(text,
                                "cloister_execution_latency_seconds_bucket{priority=\"realtime\","
                                "tenant=\"acme\",le=\"0.025\"} 1"))
      << text;
  // 1000 bytes are reported as one 64 KiB unit.
  EXPECT_TRUE(absl::StrContains(text, "cloister_pcie_bytes_total{mode=\"emulated\"} 65536"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "cloister_pcie_transfer_seconds_total{mode=\"emulated\"}"))
      << text;
}

TEST(MetricsTest, GaugesComeFromTheSourceAndVanishWithTheirTenant) {
  Metrics metrics;
  GaugeSnapshot snapshot;
  snapshot.tenants.push_back({"acme", "standard", 4, 2, 1, 1 << 20});
  snapshot.tenants.push_back({"bravo", "batch", 0, 0, 0, 0});
  snapshot.workers.push_back({0, 1, 12.5});
  snapshot.audit_entries = 9;
  snapshot.audit_signed_entries = 7;
  metrics.SetGaugeSource([&snapshot] { return snapshot; });
  std::string text = metrics.Text();
  EXPECT_TRUE(
      absl::StrContains(text, "cloister_queue_depth{priority=\"standard\",tenant=\"acme\"} 4"))
      << text;
  EXPECT_TRUE(
      absl::StrContains(text, "cloister_sessions{priority=\"standard\",tenant=\"acme\"} 2"));
  EXPECT_TRUE(absl::StrContains(text, "cloister_models{priority=\"batch\",tenant=\"bravo\"} 0"));
  EXPECT_TRUE(absl::StrContains(text, "cloister_evidence_age_seconds{worker=\"0\"} 12.5"));
  EXPECT_TRUE(absl::StrContains(text, "cloister_workers 1"));
  EXPECT_TRUE(absl::StrContains(text, "cloister_audit_signed_entries 7"));

  snapshot.tenants.pop_back();
  text = metrics.Text();
  EXPECT_FALSE(absl::StrContains(text, "bravo")) << text;
  EXPECT_TRUE(absl::StrContains(text, "acme"));
}

TEST(MetricsTest, DeviceMemoryOnlyForWorkersWithADevice) {
  Metrics metrics;
  GaugeSnapshot snapshot;
  GaugeSnapshot::Tenant& acme = snapshot.tenants.emplace_back();
  acme.tenant_id = "acme";
  acme.priority = "realtime";
  acme.enclave_model_memory_size = 3000;
  GaugeSnapshot::Worker& gpu = snapshot.workers.emplace_back();
  gpu.index = 0;
  gpu.has_device_memory = true;
  gpu.device_memory_total_size = 80000;
  gpu.device_memory_used_size = 1234;
  snapshot.workers.emplace_back().index = 1;  // CPU only
  metrics.SetGaugeSource([&snapshot] { return snapshot; });
  std::string text = metrics.Text();
  EXPECT_TRUE(absl::StrContains(
      text, "cloister_enclave_model_memory_bytes{priority=\"realtime\",tenant=\"acme\"} 3000"))
      << text;
  EXPECT_TRUE(
      absl::StrContains(text, "cloister_device_memory_bytes{kind=\"total\",worker=\"0\"} 80000"))
      << text;
  EXPECT_TRUE(
      absl::StrContains(text, "cloister_device_memory_bytes{kind=\"used\",worker=\"0\"} 1234"));
  EXPECT_FALSE(
      absl::StrContains(text, "cloister_device_memory_bytes{kind=\"total\",worker=\"1\"}"));

  // A device that stops reporting loses its series.
  snapshot.workers[0].has_device_memory = false;
  text = metrics.Text();
  EXPECT_FALSE(absl::StrContains(text, "cloister_device_memory_bytes{")) << text;
}

std::string HttpGet(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return "";
  }
  std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: localhost\r\n\r\n");
  (void)::write(fd, request.data(), request.size());
  std::string response;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
  ::close(fd);
  return response;
}

TEST(MetricsTest, ServesTheTextFormatOverHttp) {
  Metrics metrics;
  metrics.SetTenantClasses({{"acme", "standard"}});
  metrics.RecordRequest("OpenSession", "acme", absl::StatusCode::kOk);
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(&metrics, "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  std::string response = HttpGet((*server)->port(), "/metrics");
  EXPECT_TRUE(absl::StartsWith(response, "HTTP/1.1 200")) << response;
  EXPECT_TRUE(absl::StrContains(response, "# TYPE cloister_requests_total counter")) << response;
  EXPECT_TRUE(absl::StrContains(response, "method=\"OpenSession\"")) << response;

  // The same port again cannot be bound: a clear error, no exception.
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> second =
      MetricsHttpServer::Start(&metrics, absl::StrCat("127.0.0.1:", (*server)->port()));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(second.status().message(), "cannot serve /metrics on"));
}

TEST(MetricsTest, MetricsAddressFollowsTheOperatorAddress) {
  EXPECT_EQ(MetricsAddressFor("127.0.0.1:7701"), "127.0.0.1:7702");
  EXPECT_EQ(MetricsAddressFor("127.0.0.1:0"), "127.0.0.1:0");
  EXPECT_EQ(MetricsAddressFor("[::1]:9000"), "[::1]:9001");
  EXPECT_EQ(MetricsAddressFor("unix:/run/cloister/operator.sock"), "127.0.0.1:7702");
}

}  // namespace
}  // namespace cloister::host
