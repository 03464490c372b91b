// Conformance: the one GoogleTest suite every Blob and Consensus backend
// must pass, so all backends are held to identical, observable behaviour.
//
// The suites are value-parameterized over backends. A backend is a name and
// a factory returning a fresh, empty instance; anything the instance needs
// to clean up (a temporary directory) should be owned by the returned
// shared_ptr (e.g. with the aliasing constructor) so it is released with it.
//
// Usage, in exactly ONE test file of a binary (this header defines tests):
//   #include "tidemark/testing/conformance.h"
//   INSTANTIATE_TEST_SUITE_P(Mem, BlobConformance,
//                            ::testing::Values(BlobBackend{"mem", [] { ... }}),
//                            BackendName());
//
// Every key used here is valid under tidemark/blob_key.h. Each test opens its own
// backend instance and keeps under a few thousand operations, so a backend
// that fsyncs each write still runs the suite in about a second.
//
// Thread-safety: the concurrency tests use 8 threads against one instance.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "tidemark/seqno_bounds.h"
#include "tidemark/location.h"

namespace tidemark {

struct BlobBackend {
  std::string name;
  std::function<Result<std::shared_ptr<Blob>>()> open;
};

struct ConsensusBackend {
  std::string name;
  std::function<Result<std::shared_ptr<Consensus>>()> open;
};

inline void PrintTo(const BlobBackend& backend, std::ostream* out) {
  *out << backend.name;
}
inline void PrintTo(const ConsensusBackend& backend, std::ostream* out) {
  *out << backend.name;
}

// Names each instantiated test after its backend.
struct BackendName {
  template <typename Backend>
  std::string operator()(const ::testing::TestParamInfo<Backend>& info) const {
    return info.param.name;
  }
};

namespace conformance {

inline constexpr int kThreads = 8;

// Every object under `prefix`, key -> size.
inline std::map<std::string, std::uint64_t> list_objects(Blob& blob, std::string_view prefix) {
  std::map<std::string, std::uint64_t> out;
  auto listed = blob.list(prefix, [&](std::string_view key, std::uint64_t size) {
    EXPECT_TRUE(out.emplace(std::string(key), size).second) << "listed twice: " << key;
  });
  EXPECT_TRUE(listed.has_value()) << listed.error().to_string();
  return out;
}

// A value that is recognisably whole: one repeated character, whose length
// encodes the writer and round. Any mix of two writes breaks one of these.
inline std::string whole_value(int writer, int round) {
  return std::string(static_cast<std::size_t>(1000 + 100 * round + writer),
                     static_cast<char>('a' + writer));
}

inline bool is_whole_value(const std::string& value) {
  if (value.size() < 1000) return false;
  int writer = value[0] - 'a';
  if (writer < 0 || writer >= kThreads) return false;
  if (value.find_first_not_of(value[0]) != std::string::npos) return false;
  return (value.size() - 1000 - static_cast<std::size_t>(writer)) % 100 == 0;
}

}  // namespace conformance

// Blob ----------------------------------------------------------------------

class BlobConformance : public ::testing::TestWithParam<BlobBackend> {
 protected:
  void SetUp() override {
    auto opened = GetParam().open();
    ASSERT_TRUE(opened.has_value()) << opened.error().to_string();
    blob_ = std::move(*opened);
    ASSERT_NE(blob_, nullptr);
  }

  std::optional<std::string> get(std::string_view key) {
    auto got = blob_->get(key);
    EXPECT_TRUE(got.has_value()) << key << ": " << got.error().to_string();
    return got.has_value() ? *got : std::nullopt;
  }

  void set(std::string_view key, std::string_view bytes) {
    auto done = blob_->set(key, bytes);
    ASSERT_TRUE(done.has_value()) << key << ": " << done.error().to_string();
  }

  std::shared_ptr<Blob> blob_;
};

TEST_P(BlobConformance, GetOfAbsentKeyIsNullopt) {
  EXPECT_EQ(get("absent"), std::nullopt);
  EXPECT_EQ(get("absent/deeper/key"), std::nullopt);
}

TEST_P(BlobConformance, SetThenGetRoundTripsAnyBytes) {
  set("text", "hello");
  EXPECT_EQ(get("text"), "hello");

  set("empty", "");
  EXPECT_EQ(get("empty"), std::string());  // present and empty, not absent

  std::string binary;
  for (int i = 0; i < 256; ++i) binary.push_back(static_cast<char>(i));
  binary += std::string("\0\0tail\0", 7);
  set("shard/s/part/binary", binary);
  EXPECT_EQ(get("shard/s/part/binary"), binary);

  std::string large(1 << 20, '\0');
  for (std::size_t i = 0; i < large.size(); ++i) large[i] = static_cast<char>(i * 7 % 251);
  set("large", large);
  EXPECT_EQ(get("large"), large);
}

TEST_P(BlobConformance, SetOverwrites) {
  set("key", "a much longer first value");
  set("key", "short");
  EXPECT_EQ(get("key"), "short");
  set("key", "");
  EXPECT_EQ(get("key"), std::string());
}

TEST_P(BlobConformance, GetRange) {
  set("range", "0123456789");
  auto range = [&](std::uint64_t offset, std::uint64_t length) -> std::string {
    auto got = blob_->get_range("range", offset, length);
    EXPECT_TRUE(got.has_value()) << got.error().to_string();
    return got.value_or("<error>");
  };
  EXPECT_EQ(range(0, 10), "0123456789");
  EXPECT_EQ(range(2, 3), "234");
  EXPECT_EQ(range(8, 10), "89");  // past the end: shorter
  EXPECT_EQ(range(10, 5), "");
  EXPECT_EQ(range(1000, 5), "");
  EXPECT_EQ(range(3, 0), "");
  EXPECT_EQ(range(4, UINT64_MAX), "456789");  // offset + length overflows

  auto absent = blob_->get_range("absent", 0, 10);
  ASSERT_FALSE(absent.has_value());
  EXPECT_EQ(absent.error().kind, ErrorKind::kNotFound) << absent.error().to_string();
}

TEST_P(BlobConformance, RemovePresentAndAbsent) {
  set("dir/key", "bytes");
  ASSERT_TRUE(blob_->remove("dir/key").has_value());
  EXPECT_EQ(get("dir/key"), std::nullopt);
  EXPECT_TRUE(conformance::list_objects(*blob_, "").empty());

  // Removing what is not there succeeds, at any depth.
  EXPECT_TRUE(blob_->remove("dir/key").has_value());
  EXPECT_TRUE(blob_->remove("never").has_value());
  EXPECT_TRUE(blob_->remove("never/under/here").has_value());

  // A removed key can be set again.
  set("dir/key", "again");
  EXPECT_EQ(get("dir/key"), "again");
}

TEST_P(BlobConformance, RemoveMany) {
  set("a/1", "1");
  set("a/2", "2");
  set("b/1", "3");
  set("keep", "4");
  ASSERT_TRUE(blob_->remove_many({"a/1", "b/1", "a/2", "absent", "never/here"}).has_value());
  EXPECT_EQ(conformance::list_objects(*blob_, "").size(), 1u);
  EXPECT_EQ(get("keep"), "4");
  EXPECT_TRUE(blob_->remove_many({}).has_value());
  auto bad = blob_->remove_many({"../escape"});
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().kind, ErrorKind::kInvalidUsage);
}

TEST_P(BlobConformance, ListByPrefix) {
  const std::map<std::string, std::string> objects = {
      {"shard/a/part/1", "1"}, {"shard/a/part/2", "22"}, {"shard/a/rollup/1", "333"},
      {"shard/ab/part/1", ""}, {"shard/b/part/1", "x"},  {"other", "yy"},
  };
  for (const auto& [key, bytes] : objects) set(key, bytes);

  auto expect_listing = [&](std::string_view prefix, std::vector<std::string> keys) {
    std::map<std::string, std::uint64_t> expected;
    for (const auto& key : keys) expected[key] = objects.at(key).size();
    EXPECT_EQ(conformance::list_objects(*blob_, prefix), expected) << "prefix " << prefix;
  };
  expect_listing("shard/a/part/", {"shard/a/part/1", "shard/a/part/2"});
  expect_listing("shard/a/", {"shard/a/part/1", "shard/a/part/2", "shard/a/rollup/1"});
  // A prefix is a string prefix, not a directory: "shard/a" also matches "shard/ab/...".
  expect_listing("shard/a",
                 {"shard/a/part/1", "shard/a/part/2", "shard/a/rollup/1", "shard/ab/part/1"});
  expect_listing("shard/a/part/1", {"shard/a/part/1"});
  expect_listing("", {"shard/a/part/1", "shard/a/part/2", "shard/a/rollup/1", "shard/ab/part/1",
                      "shard/b/part/1", "other"});
  expect_listing("nothing/", {});
  expect_listing("shard/c", {});
}

TEST_P(BlobConformance, InvalidKeysAreInvalidUsage) {
  for (std::string_view key : {"", "../x", "/abs", "a//b", "a/", "a/./b", "a/../b", ".", "..",
                               "a b", "a\\b", "tab\tkey", ".tmp-x", "dir/.tmp-x"}) {
    SCOPED_TRACE(std::string("key \"") + std::string(key) + "\"");
    auto got = blob_->get(key);
    ASSERT_FALSE(got.has_value());
    EXPECT_EQ(got.error().kind, ErrorKind::kInvalidUsage);
    auto range = blob_->get_range(key, 0, 1);
    ASSERT_FALSE(range.has_value());
    EXPECT_EQ(range.error().kind, ErrorKind::kInvalidUsage);
    auto stored = blob_->set(key, "x");
    ASSERT_FALSE(stored.has_value());
    EXPECT_EQ(stored.error().kind, ErrorKind::kInvalidUsage);
    auto removed = blob_->remove(key);
    ASSERT_FALSE(removed.has_value());
    EXPECT_EQ(removed.error().kind, ErrorKind::kInvalidUsage);
  }
  for (std::string_view prefix : {"../", "/", "/abs", "a//", "a/../", "a b"}) {
    auto listed = blob_->list(prefix, [](std::string_view, std::uint64_t) {});
    ASSERT_FALSE(listed.has_value()) << prefix;
    EXPECT_EQ(listed.error().kind, ErrorKind::kInvalidUsage) << prefix;
  }
  // Keys may contain dots and start with one, as long as no component is "." or "..".
  set("a.b-c_D9/.hidden/..x", "ok");
  EXPECT_EQ(get("a.b-c_D9/.hidden/..x"), "ok");
}

TEST_P(BlobConformance, ConcurrentSetsLeaveWholeValues) {
  constexpr int kRounds = 10;
  std::atomic<bool> writing{true};
  std::atomic<int> torn_reads{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> writers;
  for (int writer = 0; writer < conformance::kThreads; ++writer) {
    writers.emplace_back([&, writer] {
      for (int round = 0; round < kRounds; ++round) {
        std::string value = conformance::whole_value(writer, round);
        if (!blob_->set("concurrent/distinct/" + std::to_string(writer), value)) ++failures;
        if (!blob_->set("concurrent/shared", value)) ++failures;
      }
    });
  }
  // A reader racing the writers sees whole values only (set is atomic).
  std::thread reader([&] {
    while (writing.load()) {
      auto got = blob_->get("concurrent/shared");
      if (!got.has_value()) {
        ++failures;
      } else if (got->has_value() && !conformance::is_whole_value(**got)) {
        ++torn_reads;
      }
    }
  });
  for (auto& thread : writers) thread.join();
  writing = false;
  reader.join();

  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(torn_reads.load(), 0);
  for (int writer = 0; writer < conformance::kThreads; ++writer) {
    EXPECT_EQ(get("concurrent/distinct/" + std::to_string(writer)),
              conformance::whole_value(writer, kRounds - 1));
  }
  auto shared = get("concurrent/shared");
  ASSERT_TRUE(shared.has_value());
  EXPECT_TRUE(conformance::is_whole_value(*shared));
  EXPECT_EQ(conformance::list_objects(*blob_, "concurrent/").size(),
            static_cast<std::size_t>(conformance::kThreads + 1));
}

// Consensus -----------------------------------------------------------------

class ConsensusConformance : public ::testing::TestWithParam<ConsensusBackend> {
 protected:
  void SetUp() override {
    auto opened = GetParam().open();
    ASSERT_TRUE(opened.has_value()) << opened.error().to_string();
    consensus_ = std::move(*opened);
    ASSERT_NE(consensus_, nullptr);
  }

  std::optional<VersionedData> head(std::string_view key) {
    auto got = consensus_->head(key);
    EXPECT_TRUE(got.has_value()) << key << ": " << got.error().to_string();
    return got.has_value() ? *got : std::nullopt;
  }

  // The outcome of a compare_and_set that must not fail.
  std::optional<CasOutcome> cas(std::string_view key, std::optional<SeqNo> expected, SeqNo seqno,
                                std::string data = "") {
    auto outcome = consensus_->compare_and_set(key, expected, VersionedData{seqno, data});
    EXPECT_TRUE(outcome.has_value()) << key << ": " << outcome.error().to_string();
    return outcome.has_value() ? std::optional(*outcome) : std::nullopt;
  }

  std::vector<VersionedData> scan(std::string_view key, SeqNo from, std::size_t limit) {
    auto got = consensus_->scan(key, from, limit);
    EXPECT_TRUE(got.has_value()) << key << ": " << got.error().to_string();
    return got.value_or(std::vector<VersionedData>{});
  }

  // Writes versions 1..count with data "v<seqno>".
  void write_versions(std::string_view key, SeqNo count) {
    for (SeqNo seqno = 1; seqno <= count; ++seqno) {
      std::optional<SeqNo> expected = seqno == 1 ? std::nullopt : std::optional(seqno - 1);
      ASSERT_EQ(cas(key, expected, seqno, "v" + std::to_string(seqno)), CasOutcome::kCommitted);
    }
  }

  static std::vector<SeqNo> seqnos(const std::vector<VersionedData>& versions) {
    std::vector<SeqNo> out;
    for (const auto& version : versions) out.push_back(version.seqno);
    return out;
  }

  std::shared_ptr<Consensus> consensus_;
};

TEST_P(ConsensusConformance, HeadOfAbsentKeyIsNullopt) {
  EXPECT_EQ(head("absent"), std::nullopt);
}

TEST_P(ConsensusConformance, CompareAndSetFromNothing) {
  EXPECT_EQ(cas("key", std::nullopt, 1, "one"), CasOutcome::kCommitted);
  EXPECT_EQ(head("key"), (VersionedData{1, "one"}));
  // Expecting "nothing yet" again loses: there is a version now.
  EXPECT_EQ(cas("key", std::nullopt, 2, "two"), CasOutcome::kExpectationMismatch);
  EXPECT_EQ(cas("key", 1, 2, "two"), CasOutcome::kCommitted);
  EXPECT_EQ(head("key"), (VersionedData{2, "two"}));
}

// head_seqnos: each key's head seqno in the keys' order (absent keys,
// repeated keys and an empty list included), after truncation too.
TEST_P(ConsensusConformance, HeadSeqnosReadsEveryKeyInOrder) {
  write_versions("a", 3);
  write_versions("c", 1);
  ASSERT_TRUE(consensus_->truncate("a", 3));
  auto got = consensus_->head_seqnos({"c", "absent", "a", "c"});
  ASSERT_TRUE(got.has_value()) << got.error().to_string();
  EXPECT_EQ(*got, (std::vector<std::optional<SeqNo>>{1, std::nullopt, 3, 1}));
  auto none = consensus_->head_seqnos({});
  ASSERT_TRUE(none.has_value()) << none.error().to_string();
  EXPECT_TRUE(none->empty());
}

TEST_P(ConsensusConformance, CompareAndSetManyLandsEachOnItsOwn) {
  write_versions("a", 2);
  std::vector<CasRequest> requests = {
      {"a", 2, {3, "a3"}},             // lands
      {"b", 5, {6, "b6"}},             // a mismatch: "b" has no version
      {"c", std::nullopt, {1, "c1"}},  // lands
      {"a", 2, {4, "a4"}},             // after the first: a mismatch
      {"d", 3, {3, "d3"}},             // invalid: next must exceed expected
      {"c", 1, {2, "c2"}},             // sees the earlier "c" request
  };
  auto outcomes = consensus_->compare_and_set_many(requests);
  ASSERT_EQ(outcomes.size(), requests.size());
  for (std::size_t i : {0, 1, 2, 3, 5}) {
    ASSERT_TRUE(outcomes[i].has_value()) << i << ": " << outcomes[i].error().to_string();
  }
  EXPECT_EQ(*outcomes[0], CasOutcome::kCommitted);
  EXPECT_EQ(*outcomes[1], CasOutcome::kExpectationMismatch);
  EXPECT_EQ(*outcomes[2], CasOutcome::kCommitted);
  EXPECT_EQ(*outcomes[3], CasOutcome::kExpectationMismatch);
  ASSERT_FALSE(outcomes[4].has_value());
  EXPECT_EQ(outcomes[4].error().kind, ErrorKind::kInvalidUsage);
  EXPECT_EQ(*outcomes[5], CasOutcome::kCommitted);
  EXPECT_EQ(head("a"), (VersionedData{3, "a3"}));
  EXPECT_EQ(head("b"), std::nullopt);
  EXPECT_EQ(head("c"), (VersionedData{2, "c2"}));
  EXPECT_EQ(head("d"), std::nullopt);
  auto seqnos = consensus_->head_seqnos({"a", "c"});
  ASSERT_TRUE(seqnos.has_value()) << seqnos.error().to_string();
  EXPECT_EQ(*seqnos, (std::vector<std::optional<SeqNo>>{3, 2}));
  EXPECT_TRUE(consensus_->compare_and_set_many({}).empty());
}

TEST_P(ConsensusConformance, TruncateManyTruncatesEachOnItsOwn) {
  write_versions("a", 4);
  write_versions("b", 3);
  auto deleted = consensus_->truncate_many({{"a", 3}, {"absent", 1}, {"b", 9}, {"b", 2}});
  ASSERT_EQ(deleted.size(), 4u);
  ASSERT_TRUE(deleted[0].has_value()) << deleted[0].error().to_string();
  EXPECT_EQ(*deleted[0], 2u);
  ASSERT_FALSE(deleted[1].has_value());
  EXPECT_EQ(deleted[1].error().kind, ErrorKind::kInvalidUsage);
  ASSERT_FALSE(deleted[2].has_value());
  EXPECT_EQ(deleted[2].error().kind, ErrorKind::kInvalidUsage);
  ASSERT_TRUE(deleted[3].has_value()) << deleted[3].error().to_string();
  EXPECT_EQ(*deleted[3], 1u);
  auto a = consensus_->scan("a", 0, 10);
  ASSERT_TRUE(a.has_value());
  ASSERT_EQ(a->size(), 2u);
  EXPECT_EQ(a->front().seqno, 3u);
  auto b = consensus_->scan("b", 0, 10);
  ASSERT_TRUE(b.has_value());
  ASSERT_EQ(b->size(), 2u);
  EXPECT_EQ(b->front().seqno, 2u);
}

TEST_P(ConsensusConformance, StaleExpectationIsAMismatchNotAnError) {
  write_versions("key", 3);
  EXPECT_EQ(cas("key", 2, 4), CasOutcome::kExpectationMismatch);  // behind
  EXPECT_EQ(cas("key", 7, 8), CasOutcome::kExpectationMismatch);  // ahead
  EXPECT_EQ(cas("absent", 1, 2), CasOutcome::kExpectationMismatch);
  EXPECT_EQ(head("key"), (VersionedData{3, "v3"}));
  EXPECT_EQ(head("absent"), std::nullopt);
}

TEST_P(ConsensusConformance, NextSeqnoMustExceedExpected) {
  write_versions("key", 3);
  for (SeqNo next : {SeqNo{3}, SeqNo{2}, SeqNo{0}}) {
    auto outcome = consensus_->compare_and_set("key", 3, VersionedData{next, "x"});
    ASSERT_FALSE(outcome.has_value()) << next;
    EXPECT_EQ(outcome.error().kind, ErrorKind::kInvalidUsage) << outcome.error().to_string();
  }
  // Checked before the expectation is compared, even for an absent key.
  auto outcome = consensus_->compare_and_set("absent", 5, VersionedData{5, "x"});
  ASSERT_FALSE(outcome.has_value());
  EXPECT_EQ(outcome.error().kind, ErrorKind::kInvalidUsage);
  EXPECT_EQ(head("key"), (VersionedData{3, "v3"}));
}

TEST_P(ConsensusConformance, SeqnosMayJumpUpToTheMaximum) {
  EXPECT_EQ(cas("key", std::nullopt, 10), CasOutcome::kCommitted);
  EXPECT_EQ(cas("key", 10, 1000), CasOutcome::kCommitted);
  auto too_big = consensus_->compare_and_set("key", 1000, VersionedData{kMaxSeqNo + 1, ""});
  ASSERT_FALSE(too_big.has_value());
  EXPECT_EQ(too_big.error().kind, ErrorKind::kInvalidUsage);
  EXPECT_EQ(cas("key", 1000, kMaxSeqNo, "last"), CasOutcome::kCommitted);
  EXPECT_EQ(head("key"), (VersionedData{kMaxSeqNo, "last"}));
  EXPECT_EQ(seqnos(scan("key", 0, 10)), (std::vector<SeqNo>{10, 1000, kMaxSeqNo}));
  EXPECT_TRUE(scan("key", kMaxSeqNo + 1, 10).empty());
  EXPECT_TRUE(scan("key", UINT64_MAX, 10).empty());
}

TEST_P(ConsensusConformance, DataRoundTripsAnyBytes) {
  std::string binary("\0\x01\xff\0tail", 7);
  EXPECT_EQ(cas("key", std::nullopt, 1, ""), CasOutcome::kCommitted);
  EXPECT_EQ(head("key"), (VersionedData{1, ""}));
  EXPECT_EQ(cas("key", 1, 2, binary), CasOutcome::kCommitted);
  EXPECT_EQ(head("key"), (VersionedData{2, binary}));
  EXPECT_EQ(scan("key", 0, 10), (std::vector<VersionedData>{{1, ""}, {2, binary}}));
}

TEST_P(ConsensusConformance, ScanOrdersAndLimits) {
  write_versions("key", 5);
  auto all = scan("key", 0, 100);
  EXPECT_EQ(seqnos(all), (std::vector<SeqNo>{1, 2, 3, 4, 5}));
  for (const auto& version : all) EXPECT_EQ(version.data, "v" + std::to_string(version.seqno));
  EXPECT_EQ(seqnos(scan("key", 3, 100)), (std::vector<SeqNo>{3, 4, 5}));
  EXPECT_EQ(seqnos(scan("key", 2, 2)), (std::vector<SeqNo>{2, 3}));
  EXPECT_EQ(seqnos(scan("key", 5, 1)), (std::vector<SeqNo>{5}));
  EXPECT_TRUE(scan("key", 6, 100).empty());
  EXPECT_TRUE(scan("key", 0, 0).empty());
  EXPECT_TRUE(scan("absent", 0, 100).empty());
  EXPECT_EQ(scan("key", 0, SIZE_MAX).size(), 5u);
}

TEST_P(ConsensusConformance, TruncateDeletesOlderVersions) {
  write_versions("key", 5);
  auto truncated = consensus_->truncate("key", 3);
  ASSERT_TRUE(truncated.has_value()) << truncated.error().to_string();
  EXPECT_EQ(*truncated, 2u);
  EXPECT_EQ(seqnos(scan("key", 0, 100)), (std::vector<SeqNo>{3, 4, 5}));

  truncated = consensus_->truncate("key", 3);  // nothing left below 3
  ASSERT_TRUE(truncated.has_value());
  EXPECT_EQ(*truncated, 0u);

  truncated = consensus_->truncate("key", 5);  // up to the head, which stays
  ASSERT_TRUE(truncated.has_value());
  EXPECT_EQ(*truncated, 2u);
  EXPECT_EQ(head("key"), (VersionedData{5, "v5"}));
  EXPECT_EQ(seqnos(scan("key", 0, 100)), (std::vector<SeqNo>{5}));

  // The log goes on after a truncation.
  EXPECT_EQ(cas("key", 5, 6, "v6"), CasOutcome::kCommitted);
  EXPECT_EQ(seqnos(scan("key", 0, 100)), (std::vector<SeqNo>{5, 6}));
}

TEST_P(ConsensusConformance, TruncateBeyondHeadIsInvalidUsage) {
  write_versions("key", 3);
  for (SeqNo seqno : {SeqNo{4}, kMaxSeqNo, SeqNo{UINT64_MAX}}) {
    auto truncated = consensus_->truncate("key", seqno);
    ASSERT_FALSE(truncated.has_value()) << seqno;
    EXPECT_EQ(truncated.error().kind, ErrorKind::kInvalidUsage) << truncated.error().to_string();
  }
  auto absent = consensus_->truncate("absent", 0);
  ASSERT_FALSE(absent.has_value());
  EXPECT_EQ(absent.error().kind, ErrorKind::kInvalidUsage);
  // Nothing was deleted, and the head is still readable.
  EXPECT_EQ(head("key"), (VersionedData{3, "v3"}));
  EXPECT_EQ(seqnos(scan("key", 0, 100)), (std::vector<SeqNo>{1, 2, 3}));
}

TEST_P(ConsensusConformance, KeysAreIndependent) {
  write_versions("a", 3);
  write_versions("ab", 2);  // one key a prefix of another
  EXPECT_EQ(cas("b", std::nullopt, 7, "b7"), CasOutcome::kCommitted);
  EXPECT_EQ(head("a"), (VersionedData{3, "v3"}));
  EXPECT_EQ(head("ab"), (VersionedData{2, "v2"}));
  EXPECT_EQ(head("b"), (VersionedData{7, "b7"}));

  auto truncated = consensus_->truncate("a", 3);
  ASSERT_TRUE(truncated.has_value());
  EXPECT_EQ(*truncated, 2u);
  EXPECT_EQ(seqnos(scan("ab", 0, 100)), (std::vector<SeqNo>{1, 2}));
  EXPECT_EQ(cas("ab", 3, 4), CasOutcome::kExpectationMismatch);  // "a"'s seqno means nothing here
}

TEST_P(ConsensusConformance, ConcurrentCompareAndSetCommitsEachSeqnoOnce) {
  // Each thread loops "read head, then CaS(head, head + 1)": lost races are
  // mismatches, and every seqno must be committed exactly once.
  constexpr int kIncrements = 200;
  std::atomic<int> committed{0};
  std::atomic<int> failures{0};
  std::vector<std::vector<SeqNo>> won(conformance::kThreads);
  std::vector<std::thread> threads;
  for (int thread = 0; thread < conformance::kThreads; ++thread) {
    threads.emplace_back([&, thread] {
      std::string data = "thread " + std::to_string(thread);
      while (committed.load() < kIncrements) {
        auto current = consensus_->head("race");
        if (!current.has_value()) {
          ++failures;
          return;
        }
        std::optional<SeqNo> expected;
        if (current->has_value()) expected = (*current)->seqno;
        SeqNo next = expected.value_or(0) + 1;
        auto outcome = consensus_->compare_and_set("race", expected, VersionedData{next, data});
        if (!outcome.has_value()) {
          ++failures;
          return;
        }
        if (*outcome == CasOutcome::kCommitted) {
          won[thread].push_back(next);
          ++committed;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_EQ(failures.load(), 0);

  std::map<SeqNo, int> winner;
  for (int thread = 0; thread < conformance::kThreads; ++thread) {
    for (SeqNo seqno : won[thread]) {
      EXPECT_TRUE(winner.emplace(seqno, thread).second) << "seqno " << seqno << " won twice";
    }
  }
  auto total = static_cast<SeqNo>(committed.load());
  EXPECT_GE(total, static_cast<SeqNo>(kIncrements));
  EXPECT_EQ(winner.size(), total);
  auto final_head = head("race");
  ASSERT_TRUE(final_head.has_value());
  EXPECT_EQ(final_head->seqno, total);
  // The log holds 1..total, each written by the thread that saw it commit.
  auto log = scan("race", 0, SIZE_MAX);
  ASSERT_EQ(log.size(), total);
  for (SeqNo index = 0; index < total; ++index) {
    EXPECT_EQ(log[index].seqno, index + 1);
    EXPECT_EQ(log[index].data, "thread " + std::to_string(winner[index + 1]));
  }
}

}  // namespace tidemark
