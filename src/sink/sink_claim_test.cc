#include "sink/sink_claim.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "location/mem_consensus.h"
#include "testing/scratch_directory.h"
#include "sink/file_destination.h"
#include "testing/sink_util.h"

namespace tidemark {
namespace {

namespace fs = std::filesystem;
using testing::ToggledClaim;

SinkUrl url_of(const std::string& text) {
  auto url = parse_sink_url(text, SinkFormat::kJson);
  EXPECT_TRUE(url) << url.error().message;
  return url ? *url : SinkUrl{};
}

std::string identity_of(const std::string& text) {
  auto identity = destination_identity(url_of(text));
  EXPECT_TRUE(identity) << identity.error().message;
  return identity ? *identity : "";
}

class SinkClaimTest : public ::testing::Test {
 protected:
  Result<std::shared_ptr<SinkClaim>> claim(const std::string& sink, const std::string& url,
                                           const std::string& runner = "test runner") {
    return SinkClaim::acquire(consensus_, "s", sink, url_of(url), SinkRunner{runner, ""});
  }

  void expect_held(const Result<std::shared_ptr<SinkClaim>>& claimed, std::string_view needle) {
    ASSERT_FALSE(claimed) << "not refused";
    EXPECT_EQ(claimed.error().kind, ErrorKind::kHeld) << claimed.error().to_string();
    EXPECT_NE(claimed.error().message.find(needle), std::string::npos)
        << claimed.error().message << " does not mention " << needle;
  }

  std::shared_ptr<Consensus> consensus_ = std::make_shared<MemConsensus>();
  ScratchDirectory scratch_;
  std::string directory_ = scratch_.path() + "/out";
};

TEST_F(SinkClaimTest, DestinationsAreNamedOneWayWhateverTheSpelling) {
  EXPECT_EQ(identity_of("file:///a/b/../c/"), "file:///a/c");
  EXPECT_EQ(identity_of("s3://bucket/p/q/?endpoint=http://Host.Example:9000&region=x"),
            "s3://http://host.example:9000/bucket/p/q");
  EXPECT_EQ(identity_of("s3://bucket?endpoint=http://h:1/Path"), "s3://http://h:1/Path/bucket");
  EXPECT_EQ(identity_of("kafka://B:9092,a:9092,b:9092/t?progress_topic=other"),
            "kafka://a:9092,b:9092/t");
}

TEST_F(SinkClaimTest, TwoSinksNeverShareADirectory) {
  auto first = claim("a", "file://" + directory_, "tidemark serve on 127.0.0.1:6875");
  ASSERT_TRUE(first) << first.error().message;
  const std::string temporary = directory_ + "/.00000000000000000003-abc.tmp";
  std::ofstream(temporary) << "a line being written";
  // Another sink name: refused by the directory's lock, naming the holder.
  ASSERT_NO_FATAL_FAILURE(expect_held(claim("b", "file://" + directory_),
                                      "file destination " + directory_ +
                                          " is written by sink a of shard s, run by tidemark "
                                          "serve on 127.0.0.1:6875 (pid " +
                                          std::to_string(::getpid())));
  // Spelled another way: the same directory.
  ASSERT_NO_FATAL_FAILURE(expect_held(claim("b", "file://" + scratch_.path() + "/./x/../out/"),
                                      "is written by sink a"));
  // An unclaimed open is refused too, before it deletes anything.
  auto opened = FileDestination::open(directory_, Envelope::kUpsert, SinkFormat::kJson);
  ASSERT_FALSE(opened);
  EXPECT_EQ(opened.error().kind, ErrorKind::kHeld);
  EXPECT_TRUE(fs::exists(temporary)) << "a refused opener deleted the holder's temporary";

  // The holder itself opens with its claim, which deletes the leftover.
  auto own = FileDestination::open(directory_, Envelope::kUpsert, SinkFormat::kJson, *first);
  ASSERT_TRUE(own) << own.error().message;
  EXPECT_FALSE(fs::exists(temporary));
  own->reset();
  first->reset();
  auto second = claim("b", "file://" + directory_);
  ASSERT_TRUE(second) << second.error().message;
}

TEST_F(SinkClaimTest, ASinkHasOneRunnerWhereverItWrites) {
  auto first = claim("a", "file://" + directory_, "tidemark sink run");
  ASSERT_TRUE(first) << first.error().message;
  ASSERT_NO_FATAL_FAILURE(expect_held(claim("a", "file://" + scratch_.path() + "/elsewhere"),
                                      "sink a of shard s is held by tidemark sink run"));
  // A sink of the same name on another shard is another sink.
  auto other_shard = SinkClaim::acquire(
      consensus_, "t", "a", url_of("file://" + scratch_.path() + "/t"), SinkRunner{"x", ""});
  EXPECT_TRUE(other_shard) << other_shard.error().message;
}

TEST_F(SinkClaimTest, TwoSinksNeverShareATopicOrAPrefix) {
  auto kafka = claim("a", "kafka://b1:9092,b2:9092/out");
  ASSERT_TRUE(kafka) << kafka.error().message;
  ASSERT_NO_FATAL_FAILURE(expect_held(claim("b", "kafka://B2:9092,b1:9092/out?progress_topic=p"),
                                      "destination kafka://b1:9092,b2:9092/out (written by sink a "
                                      "of shard s) is held by test runner"));
  EXPECT_TRUE(claim("c", "kafka://b1:9092,b2:9092/other"));

  auto s3 = claim("d", "s3://bucket/sinks/d?endpoint=http://127.0.0.1:9000");
  ASSERT_TRUE(s3) << s3.error().message;
  ASSERT_NO_FATAL_FAILURE(
      expect_held(claim("e", "s3://bucket/sinks/d/?endpoint=http://127.0.0.1:9000&part_size=6MiB"),
                  "written by sink d of shard s"));
  // A prefix below it holds other objects: not the same destination.
  EXPECT_TRUE(claim("f", "s3://bucket/sinks/d/f?endpoint=http://127.0.0.1:9000"));
  kafka->reset();
  EXPECT_TRUE(claim("b", "kafka://b1:9092,b2:9092/out"));
}

TEST_F(SinkClaimTest, ALockFileDeletedUnderneathIsAClaimLost) {
  auto claimed = claim("a", "file://" + directory_);
  ASSERT_TRUE(claimed) << claimed.error().message;
  EXPECT_TRUE((*claimed)->check());
  fs::remove(directory_ + "/" + std::string(FileDestination::kLockFileName));
  auto checked = (*claimed)->check();
  ASSERT_FALSE(checked);
  EXPECT_EQ(checked.error().kind, ErrorKind::kHeld) << "lost for good: claim again";
}

TEST_F(SinkClaimTest, OpeningWithAClaimOfAnotherDestinationIsInvalidUsage) {
  auto claim = std::make_shared<ToggledClaim>(file_destination_identity(scratch_.path() + "/x"));
  auto opened = open_sink_destination(url_of("file://" + directory_), Envelope::kUpsert,
                                      SinkFormat::kJson, "s", "a", nullptr, claim);
  ASSERT_FALSE(opened);
  EXPECT_EQ(opened.error().kind, ErrorKind::kInvalidUsage);
}

TEST_F(SinkClaimTest, AnUnclaimedFileDestinationHoldsItsDirectoryAgainstClaims) {
  auto unclaimed = FileDestination::open(directory_, Envelope::kUpsert, SinkFormat::kJson);
  ASSERT_TRUE(unclaimed) << unclaimed.error().message;
  ASSERT_NO_FATAL_FAILURE(
      expect_held(claim("a", "file://" + directory_), "is written by a file destination of pid"));
  unclaimed->reset();
  EXPECT_TRUE(claim("a", "file://" + directory_));
}

}  // namespace
}  // namespace tidemark
