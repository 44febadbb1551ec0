#include "host/server/session_table.h"

#include "base/clock.h"
#include "gtest/gtest.h"

namespace cloister::host {
namespace {

TEST(SessionTableTest, OwnerUnknownAndOtherTenant) {
  FakeClock clock;
  SessionTable table(&clock, absl::Hours(1), 10);
  table.Add("s1", "acme");
  EXPECT_TRUE(table.CheckAccess("s1", "acme").ok());
  absl::Status other = table.CheckAccess("s1", "globex");
  absl::Status unknown = table.CheckAccess("s2", "acme");
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown.message(), "unknown session; open a new session");
  // Another tenant's session is refused exactly as an unknown one; only the host's audit log
  // learns the difference, from a payload the caller never sees.
  EXPECT_EQ(other.code(), unknown.code());
  EXPECT_EQ(other.message(), unknown.message());
  EXPECT_TRUE(other.GetPayload(kForeignSessionPayload).has_value());
  EXPECT_FALSE(unknown.GetPayload(kForeignSessionPayload).has_value());
}

TEST(SessionTableTest, SessionsExpire) {
  FakeClock clock;
  SessionTable table(&clock, absl::Hours(1), 10);
  table.Add("s1", "acme");
  clock.Advance(absl::Minutes(59));
  EXPECT_TRUE(table.CheckAccess("s1", "acme").ok());
  clock.Advance(absl::Minutes(2));
  EXPECT_EQ(table.CheckAccess("s1", "acme").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.size(), 0u);
}

TEST(SessionTableTest, PerTenantLimitAndSweep) {
  FakeClock clock;
  SessionTable table(&clock, absl::Hours(1), 2);
  table.Add("a1", "acme");
  table.Add("a2", "acme");
  EXPECT_EQ(table.CheckCapacity("acme").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(table.CheckCapacity("globex").ok());
  clock.Advance(absl::Hours(2));
  // Expired sessions no longer count once swept.
  EXPECT_TRUE(table.CheckCapacity("acme").ok());
  EXPECT_EQ(table.size(), 0u);
}

}  // namespace
}  // namespace cloister::host
