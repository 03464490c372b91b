// s3rver stopped and started again by the commands scripts/test-services.sh
// exports (TIDEMARK_TEST_S3_STOP / _START), as the nemesis tests restart
// it: objects written before the stop are read back after the start, calls
// in between fail as infrastructure errors, and a blob open across the
// restart works again afterwards. Twice, so a restarted server can itself
// be restarted. Skipped without TIDEMARK_TEST_S3 and the two commands.
//
// It stops the s3rver every S3 test shares, so ctest runs it alone
// (RUN_SERIAL, CMakeLists.txt).
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "testing/s3_test_prefix.h"

namespace tidemark {
namespace {

// Starts the server again if the test ends (say, at a failed assertion)
// while it is stopped, so the tests after it find it running.
struct StartedAgainOnExit {
  const char* start;
  bool stopped = false;
  ~StartedAgainOnExit() {
    if (stopped && std::system(start) != 0) ADD_FAILURE() << "could not start s3rver again";
  }
};

TEST(S3RestartTest, ObjectsSurviveAStopAndAStart) {
  std::optional<std::string> server = s3_test_server();
  const char* stop = std::getenv("TIDEMARK_TEST_S3_STOP");
  const char* start = std::getenv("TIDEMARK_TEST_S3_START");
  if (!server || stop == nullptr || start == nullptr) {
    GTEST_SKIP() << "TIDEMARK_TEST_S3 and TIDEMARK_TEST_S3_STOP / _START are not set "
                    "(scripts/test-services.sh sets them)";
  }
  // Two tries a request: a stopped server fails a call in well under a second.
  auto blob = open_fresh_s3_blob(*server, "&max_attempts=2");
  ASSERT_TRUE(blob.has_value()) << blob.error().to_string();
  std::string large(3 * 1024 * 1024, '\0');
  for (std::size_t i = 0; i < large.size(); ++i) large[i] = static_cast<char>(i * 31 % 251);
  ASSERT_TRUE((*blob)->set("small", "before the restart").has_value());
  ASSERT_TRUE((*blob)->set("large", large).has_value());

  StartedAgainOnExit guard{start};
  for (int restart = 0; restart < 2; ++restart) {
    SCOPED_TRACE("restart " + std::to_string(restart));
    guard.stopped = true;
    ASSERT_EQ(std::system(stop), 0) << stop;
    auto down = (*blob)->get("small");
    ASSERT_FALSE(down.has_value()) << "s3rver answered while stopped";
    EXPECT_EQ(down.error().kind, ErrorKind::kDeterminate) << down.error().to_string();
    auto refused = (*blob)->set("while-down", "x");
    ASSERT_FALSE(refused.has_value());
    EXPECT_TRUE(refused.error().is(ErrorKind::kDeterminate) ||
                refused.error().is(ErrorKind::kIndeterminate))
        << refused.error().to_string();
    ASSERT_EQ(std::system(start), 0) << start;
    guard.stopped = false;

    auto small = (*blob)->get("small");
    ASSERT_TRUE(small.has_value()) << small.error().to_string();
    EXPECT_EQ(small->value_or("<absent>"), "before the restart");
    auto read_back = (*blob)->get("large");
    ASSERT_TRUE(read_back.has_value()) << read_back.error().to_string();
    EXPECT_TRUE(read_back->has_value() && **read_back == large);
    const std::string key = "after-" + std::to_string(restart);
    ASSERT_TRUE((*blob)->set(key, key).has_value());
  }
  auto after = (*blob)->get("after-0");
  ASSERT_TRUE(after.has_value()) << after.error().to_string();
  EXPECT_EQ(after->value_or("<absent>"), "after-0");
}

}  // namespace
}  // namespace tidemark
