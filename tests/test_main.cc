// The main() of every test binary (in place of gtest_main): GoogleTest as
// usual, and with TIDEMARK_TEST_NO_SKIP set (scripts/test-services.sh sets
// it, so `make test` and `make test-asan` run with it) a skipped test is a
// failed one.
//
// Tests skip for want of something they need (a PostgreSQL or S3 server; a
// build without ThreadSanitizer for the Kafka tests, which ctest leaves out
// of the TSan run). Where CI provides everything, a skip means a test that
// silently stopped running, so there it fails, with the skip's reason in
// the message. ctest shows a skip as "Skipped" (each test is its
// own ctest entry; see tidemark_test in CMakeLists.txt).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace {

constexpr const char* kNoSkipVariable = "TIDEMARK_TEST_NO_SKIP";

bool skips_are_failures() {
  const char* value = std::getenv(kNoSkipVariable);
  return value != nullptr && *value != '\0' && std::string(value) != "0";
}

// Turns a skipped test into a failed one as it ends. GoogleTest calls
// OnTestEnd on listeners in reverse order, so this runs before the default
// printer reports the test, which then reports it failed (the pattern of
// GoogleTest's own sample10, a leak checker failing tests in OnTestEnd).
class SkipIsFailure : public testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const testing::TestInfo& test) override {
    const testing::TestResult& result = *test.result();
    if (!result.Skipped()) return;
    std::string reasons;
    for (int i = 0; i < result.total_part_count(); ++i) {
      const testing::TestPartResult& part = result.GetTestPartResult(i);
      if (part.skipped()) reasons += std::string("\n  ") + part.message();
    }
    ADD_FAILURE() << "skipped, but " << kNoSkipVariable
                  << " is set: every test must run here. The skip said:" << reasons;
  }
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (skips_are_failures()) {
    testing::UnitTest::GetInstance()->listeners().Append(new SkipIsFailure);
  }
  return RUN_ALL_TESTS();
}
