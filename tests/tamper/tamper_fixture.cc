// The tamper tests' shared state (tamper_fixture.h), and the environment that stops the shared
// appliance.
#include "tests/tamper/tamper_fixture.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cloister::tamper_test {

bool SameOutputs(const Outputs& a, const Outputs& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name() != b[i].name() || a[i].datatype() != b[i].datatype() ||
        a[i].raw().size() != b[i].raw().size() ||
        std::vector<int64_t>(a[i].shape().begin(), a[i].shape().end()) !=
            std::vector<int64_t>(b[i].shape().begin(), b[i].shape().end())) {
      return false;
    }
    if (a[i].datatype() != "FP32") {
      if (a[i].raw() != b[i].raw()) return false;
      continue;
    }
    const size_t count = a[i].raw().size() / sizeof(float);
    const auto* x = reinterpret_cast<const float*>(a[i].raw().data());
    const auto* y = reinterpret_cast<const float*>(b[i].raw().data());
    for (size_t k = 0; k < count; ++k) {
      if (std::abs(x[k] - y[k]) > 1e-4f * std::max(1.0f, std::abs(y[k]))) return false;
    }
  }
  return true;
}

std::string* TamperTest::work_ = nullptr;
std::string* TamperTest::plan_path_ = nullptr;
testing::Appliance* TamperTest::appliance_ = nullptr;
testing::GrpcTamperProxy* TamperTest::proxy_ = nullptr;
std::shared_ptr<const sdk::TenantIdentity>* TamperTest::acme_identity_ = nullptr;
std::shared_ptr<const sdk::TenantIdentity>* TamperTest::globex_identity_ = nullptr;
Tensor* TamperTest::input_a_ = nullptr;
Tensor* TamperTest::input_b_ = nullptr;
Outputs* TamperTest::reference_a_ = nullptr;
Outputs* TamperTest::reference_b_ = nullptr;
int TamperTest::plan_counter_ = 0;

namespace {

// Stops the shared appliance after the last test.
class Cleanup : public ::testing::Environment {
 public:
  void TearDown() override { TamperTestAccess::Stop(); }
  struct TamperTestAccess : TamperTest {
    static void Stop() { StopAppliance(); }
  };
};
const ::testing::Environment* const kCleanup = ::testing::AddGlobalTestEnvironment(new Cleanup);

}  // namespace
}  // namespace cloister::tamper_test
