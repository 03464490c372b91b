#include "util/process_identity.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

namespace tidemark {
namespace {

TEST(ProcessIdentityTest, ThisProcessIsAliveAndNamedForPeople) {
  const ProcessIdentity self = this_process();
  EXPECT_EQ(self.pid, ::getpid());
  EXPECT_FALSE(self.machine.empty()) << "this test needs /proc";
  EXPECT_GT(self.start_ticks, 0u);
  EXPECT_EQ(liveness(self), Liveness::kAlive);
  EXPECT_EQ(this_process(), self);
  const std::string text = describe(self);
  EXPECT_NE(text.find("pid " + std::to_string(::getpid())), std::string::npos) << text;
  EXPECT_NE(text.find(self.host), std::string::npos) << text;
  EXPECT_NE(text.find("started 20"), std::string::npos) << text;
}

TEST(ProcessIdentityTest, AReusedPidIsNotTheProcessItNamed) {
  ProcessIdentity other = this_process();
  other.start_ticks += 1;  // what a pid reused by a later process looks like
  EXPECT_EQ(liveness(other), Liveness::kDead);
}

TEST(ProcessIdentityTest, AKilledChildIsDeadBeforeAndAfterItIsReaped) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (;;) ::pause();
  }
  auto identity = process_identity(child);
  ASSERT_TRUE(identity.has_value());
  EXPECT_EQ(identity->pid, child);
  EXPECT_EQ(identity->machine, this_process().machine);
  EXPECT_EQ(liveness(*identity), Liveness::kAlive);
  ::kill(child, SIGSTOP);  // a stopped process still runs, as far as holders go
  EXPECT_EQ(liveness(*identity), Liveness::kAlive);
  ::kill(child, SIGKILL);
  // Killed but not reaped: a zombie, dead.
  for (int i = 0; i < 400 && liveness(*identity) != Liveness::kDead; ++i) ::usleep(5000);
  EXPECT_EQ(liveness(*identity), Liveness::kDead);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  EXPECT_EQ(liveness(*identity), Liveness::kDead);
  EXPECT_FALSE(process_identity(child).has_value());
}

TEST(ProcessIdentityTest, AnotherMachinesProcessCannotBeTold) {
  ProcessIdentity other = this_process();
  other.machine = "another-boot/pid:[1]";
  EXPECT_EQ(liveness(other), Liveness::kUnknown);
  other.machine.clear();
  EXPECT_EQ(liveness(other), Liveness::kUnknown);
}

TEST(ProcessIdentityTest, TimesAreUtc) {
  EXPECT_EQ(format_utc(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(format_utc(1'700'000'000'123), "2023-11-14T22:13:20Z");
}

}  // namespace
}  // namespace tidemark
