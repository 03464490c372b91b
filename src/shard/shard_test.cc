// Unit tests of the shard layer over the in-memory backends: state
// encoding, the rules of compare_and_append, snapshots and listens.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <thread>

#include "location/faulty.h"
#include "location/mem_blob.h"
#include "location/mem_consensus.h"
#include "part/part.h"
#include "shard/context.h"
#include "shard/machine.h"
#include "shard/merge.h"
#include "shard/state.h"
#include "shard/transitions.h"
#include "testing/shard_util.h"
#include "tidemark/client.h"
#include "tidemark/read.h"
#include "tidemark/write.h"
#include "util/clock.h"

namespace tidemark {
namespace {

using testing::Collection;
using testing::model_at;
using testing::read_listen;
using testing::read_snapshot;

// A consensus that can be told to apply the next compare_and_set and then
// report it as indeterminate, the worst case for idempotency.
class ApplyThenFail final : public ForwardingConsensus {
 public:
  using ForwardingConsensus::ForwardingConsensus;
  std::atomic<int> apply_then_fail{0};
  std::atomic<int> fail_without_applying{0};
  std::atomic<int> cas_calls{0};

  Result<CasOutcome> compare_and_set(std::string_view key, std::optional<SeqNo> expected,
                                     VersionedData next) override {
    ++cas_calls;
    if (fail_without_applying > 0) {
      --fail_without_applying;
      return indeterminate("test: timed out before sending");
    }
    auto result = ForwardingConsensus::compare_and_set(key, expected, std::move(next));
    if (apply_then_fail > 0) {
      --apply_then_fail;
      return indeterminate("test: timed out after sending");
    }
    return result;
  }
};

class ShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    blob_ = std::make_shared<MemBlob>();
    consensus_ = std::make_shared<ApplyThenFail>(std::make_shared<MemConsensus>());
    ClientOptions options;
    options.part_target_bytes = 4096;  // several parts per batch
    options.block_bytes = 512;         // several blocks per part
    options.listen_poll_interval = std::chrono::milliseconds(1);
    // These tests count batches and parts as appended; compaction has tests
    // of its own (compaction_test.cc).
    options.background_compaction = false;
    client_ = *Client::open(Location{blob_, consensus_}, options);
    ASSERT_TRUE(client_->create_shard("orders"));
    shard_ = *client_->open_shard("orders");
    writer_ = std::move(*shard_->open_writer());
  }

  // For tests that watch blob objects: no part travels inline.
  void blob_parts_only() {
    ClientOptions options = client_->options();
    options.inline_part_max_bytes = 0;
    reopen(options);
  }
  // One append [t, t + 1) of one update per time t < `appends`, each
  // added to *all.
  void append_one_each(int appends, std::vector<Update>* all) {
    for (int i = 0; i < appends; ++i) {
      Time t = static_cast<Time>(i);
      std::vector<Update> one{Update{"k" + std::to_string(i), "1", t, 1}};
      all->push_back(one[0]);
      std::vector<Batch> batches;
      batches.push_back(make_batch(one, t, t + 1));
      ASSERT_TRUE(append(batches, t, t + 1));
    }
  }
  // After append_one_each: a fresh client, `early` (a handle opened before
  // the appends) and the writer's handle agree.
  void expect_handles_agree(Shard& early, const std::vector<Update>& all) {
    const Time appends = all.size();
    auto fresh = *(*Client::open(client_->location(), client_->options()))->open_shard("orders");
    auto info = *fresh->inspect();
    EXPECT_EQ(info.upper, Frontier::at(appends));
    EXPECT_EQ(info.batches, appends);
    EXPECT_EQ(early.inspect()->seqno, info.seqno);
    EXPECT_EQ(*read_snapshot(early, appends - 1), model_at(all, appends - 1));
    EXPECT_EQ(*read_snapshot(*fresh, 100), model_at(all, 100));
    EXPECT_EQ(*read_snapshot(*shard_, appends - 1), model_at(all, appends - 1));
  }
  // The client, shard and writer again, with `options`.
  void reopen(const ClientOptions& options) {
    writer_.reset();
    shard_.reset();
    client_ = *Client::open(Location{blob_, consensus_}, options);
    shard_ = *client_->open_shard("orders");
    writer_ = std::move(*shard_->open_writer());
  }

  std::size_t part_objects() {
    std::size_t n = 0;
    EXPECT_TRUE(
        blob_->list(shard_part_prefix("orders"), [&](std::string_view, std::uint64_t) { ++n; }));
    return n;
  }

  Batch make_batch(const std::vector<Update>& updates, Time lower, Time upper) {
    auto batch = writer_->batch(updates, Frontier::at(lower), Frontier::at(upper));
    EXPECT_TRUE(batch) << batch.error().to_string();
    return std::move(*batch);
  }

  Status append(std::vector<Batch>& batches, Time expected, Time next) {
    return writer_->compare_and_append(batches, Frontier::at(expected), Frontier::at(next));
  }

  std::shared_ptr<MemBlob> blob_;
  std::shared_ptr<ApplyThenFail> consensus_;
  std::shared_ptr<Client> client_;
  std::shared_ptr<Shard> shard_;
  std::unique_ptr<WriteHandle> writer_;
};

std::vector<Update> numbered(int n, Time time, const std::string& prefix = "k") {
  std::vector<Update> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(Update{prefix + std::to_string(i), "\"v" + std::to_string(i) + "\"", time, 1});
  }
  return out;
}

// --- Value types ------------------------------------------------------------

TEST(FrontierTest, ClosedIsAboveEveryTime) {
  EXPECT_LT(Frontier::at(UINT64_MAX), Frontier::closed());
  EXPECT_LT(Frontier::at(3), Frontier::at(4));
  EXPECT_TRUE(Frontier::at(5).includes(5));
  EXPECT_TRUE(Frontier::at(5).is_past(4));
  EXPECT_FALSE(Frontier::closed().includes(UINT64_MAX));
  EXPECT_EQ(Frontier::closed().to_json(), "null");
  Description d{Frontier::at(2), Frontier::at(4), Frontier::at(0)};
  EXPECT_FALSE(d.contains(1));
  EXPECT_TRUE(d.contains(2));
  EXPECT_TRUE(d.contains(3));
  EXPECT_FALSE(d.contains(4));
}

TEST(ConsolidateTest, SumsEqualUpdatesAndDropsZeros) {
  std::vector<Update> updates{
      {"b", "1", 1, 2}, {"a", "1", 1, 1}, {"b", "1", 1, -2}, {"a", "1", 1, 4}, {"a", "1", 2, 1}};
  consolidate(updates);
  std::vector<Update> expected{{"a", "1", 1, 5}, {"a", "1", 2, 1}};
  EXPECT_EQ(updates, expected);
}

TEST(ConsolidateTest, ASumBeyondAnI64IsCarriedExactly) {
  std::vector<Update> updates{{"b", "1", 1, INT64_MIN}, {"a", "1", 1, INT64_MAX}, {"a", "1", 1, 1},
                              {"b", "1", 1, INT64_MIN}, {"a", "1", 1, INT64_MAX}, {"c", "1", 1, 1},
                              {"b", "1", 1, INT64_MIN}};
  consolidate(updates);
  // a: 2 * MAX + 1 = MAX, MAX, 1; b: 3 * MIN = MIN, MIN, MIN (no remainder).
  std::vector<Update> expected{{"a", "1", 1, INT64_MAX}, {"a", "1", 1, INT64_MAX},
                               {"a", "1", 1, 1},         {"b", "1", 1, INT64_MIN},
                               {"b", "1", 1, INT64_MIN}, {"b", "1", 1, INT64_MIN},
                               {"c", "1", 1, 1}};
  EXPECT_EQ(updates, expected);
  // Intermediate sums beyond an i64 that come back into range are one update.
  std::vector<Update> back{{"a", "1", 1, INT64_MAX},
                           {"a", "1", 1, INT64_MAX},
                           {"a", "1", 1, INT64_MIN},
                           {"a", "1", 1, INT64_MIN}};
  consolidate(back);
  EXPECT_EQ(back, (std::vector<Update>{{"a", "1", 1, -2}}));
  EXPECT_TRUE(continues_carry(INT64_MAX, 1));
  EXPECT_TRUE(continues_carry(INT64_MIN, -1));
  EXPECT_FALSE(continues_carry(INT64_MAX, -1));
  EXPECT_FALSE(continues_carry(INT64_MAX - 1, 1));
}

TEST(StateTest, EncodeDecodeRoundTrip) {
  ShardState state;
  state.name = "s";
  state.seqno = 7;
  state.upper = Frontier::at(20);
  state.since = Frontier::at(3);
  state.writers["w1"].last_token = "tok";
  state.readers["r1"] = ReaderState{Frontier::at(3), 12345, 0, {}};
  state.readers["c-sink"] = ReaderState{Frontier::at(4), 0, 0, {}};
  state.producers["p1"] = ProducerState{41, 17, 99'000};
  PartRef part{"shard/s/part/x", 100, 5, 80, 1, 9, Frontier::at(0), Frontier::at(10), nullptr};
  state.batches.push_back(HollowBatch{
      Description{Frontier::at(0), Frontier::at(10), Frontier::at(0)}, PartList({part})});
  std::string bytes = encode_state(state);
  auto decoded = decode_state("s", VersionedData{7, bytes});
  ASSERT_TRUE(decoded) << decoded.error().to_string();
  EXPECT_EQ(*decoded, state);
  // Every truncation is a clean corruption error naming the shard.
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    auto cut = decode_state("s", VersionedData{7, bytes.substr(0, n)});
    ASSERT_FALSE(cut) << n;
    EXPECT_EQ(cut.error().kind, ErrorKind::kCorruption);
    EXPECT_NE(cut.error().message.find("shard s"), std::string::npos);
  }
}

// Inline parts (PartRef::data) travel in full states and diffs; a batch
// without them encodes as it did before they existed.
TEST(StateTest, InlinePartsRoundTripInStatesAndDiffs) {
  ShardState before;
  before.name = "s";
  before.seqno = 3;
  before.upper = Frontier::at(10);
  PartRef blob_part{"shard/s/part/a", 100, 5, 80, 1, 9, Frontier::at(0), Frontier::at(10), nullptr};
  before.batches.push_back(HollowBatch{
      Description{Frontier::at(0), Frontier::at(10), Frontier::at(0)}, PartList({blob_part})});
  const std::string plain = encode_state(before);
  // The flags byte of a batch without inline parts: 0 (not ordered).
  ASSERT_NE(plain.find(std::string("\x00\x01", 2)), std::string::npos);

  ShardState after = before;
  after.seqno = 4;
  after.upper = Frontier::at(20);
  PartRef small{"shard/s/part/b", 6, 2, 4, 10, 19, Frontier::at(10), Frontier::at(20), nullptr};
  small.data = std::make_shared<const std::string>("inline");
  after.batches.push_back(HollowBatch{
      Description{Frontier::at(10), Frontier::at(20), Frontier::at(0)}, PartList({small})});
  EXPECT_EQ(inline_bytes(before), 0u);
  EXPECT_EQ(inline_bytes(after), 6u);

  auto full = decode_state("s", VersionedData{4, encode_state(after)});
  ASSERT_TRUE(full) << full.error().to_string();
  EXPECT_EQ(*full, after);
  ASSERT_TRUE(full->batches[1].parts[0].is_inline());
  EXPECT_EQ(*full->batches[1].parts[0].data, "inline");
  EXPECT_FALSE(full->batches[0].parts[0].is_inline());

  auto diffed =
      apply_version("s", &before, VersionedData{4, encode_diff(before, after, RollupRef{3, "r"})});
  ASSERT_TRUE(diffed) << diffed.error().to_string();
  EXPECT_EQ(*diffed, after);
  EXPECT_EQ(*diffed->batches[1].parts[0].data, "inline");

  // Inline bytes that are not the size the reference gives are corrupt.
  ShardState wrong = after;
  PartRef lying = small;
  lying.size = 7;
  wrong.batches[1].parts = PartList({lying});
  auto refused = decode_state("s", VersionedData{4, encode_state(wrong)});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().kind, ErrorKind::kCorruption);
}

TEST(StateTest, DiffsReproduceEveryKindOfChange) {
  std::mt19937_64 rng(7);
  auto batch = [&](Time lower, Time upper) {
    PartRef part{"shard/s/part/" + std::to_string(rng()),
                 10,
                 1,
                 8,
                 lower,
                 lower,
                 Frontier::at(lower),
                 Frontier::at(upper),
                 nullptr};
    return HollowBatch{Description{Frontier::at(lower), Frontier::at(upper), Frontier::at(0)},
                       PartList({part})};
  };
  ShardState before;
  before.name = "s";
  before.seqno = 10;
  before.upper = Frontier::at(40);
  for (Time t = 0; t < 40; t += 4) before.batches.push_back(batch(t, t + 4));
  before.writers["a"].last_token = "1";
  before.writers["b"].last_token = "2";
  before.readers["gone"] = ReaderState{Frontier::at(1), 50, 0, {}};
  before.producers["stays"] = ProducerState{5, 30, 1000};
  before.producers["leaves"] = ProducerState{9, 31, 1000};

  std::vector<ShardState> afters;
  ShardState append = before;  // an append
  append.upper = Frontier::at(44);
  append.batches.push_back(batch(40, 44));
  append.writers["a"].last_token = "3";
  afters.push_back(append);
  ShardState merge = before;  // batches 3..5 replaced by one (as compaction will)
  merge.batches.erase(merge.batches.begin() + 3, merge.batches.begin() + 6);
  merge.batches.insert(merge.batches.begin() + 3, batch(12, 24));
  merge.since = Frontier::at(9);
  afters.push_back(merge);
  ShardState writers = before;  // a writer gone, another new
  writers.writers.erase("b");
  writers.writers["c"];
  afters.push_back(writers);
  ShardState readers = before;  // readers come, move and go
  readers.readers["r1"] = ReaderState{Frontier::at(5), 99, 0, {}};
  readers.readers["c-x"] = ReaderState{Frontier::at(2), 0, 0, {}};
  afters.push_back(readers);
  ShardState producers = before;  // producers come, move on and expire
  producers.producers["new"] = ProducerState{0, 44, 2000};
  producers.producers["stays"].sequence = 6;
  producers.producers.erase("leaves");
  afters.push_back(producers);
  ShardState same = before;  // nothing changed
  afters.push_back(same);
  ShardState cleared = before;  // everything gone
  cleared.batches.clear();
  cleared.writers.clear();
  cleared.producers.clear();
  afters.push_back(cleared);

  for (ShardState after : afters) {
    after.seqno = before.seqno + 1;
    std::string diff = encode_diff(before, after, RollupRef{3, "abc"});
    EXPECT_FALSE(is_full_version(diff));
    EXPECT_EQ(*version_rollup("s", VersionedData{11, diff}), (RollupRef{3, "abc"}));
    auto applied = apply_version("s", &before, VersionedData{11, diff});
    ASSERT_TRUE(applied) << applied.error().to_string();
    EXPECT_EQ(*applied, after);
    // A diff needs the state just before it.
    EXPECT_FALSE(apply_version("s", nullptr, VersionedData{11, diff}));
    EXPECT_FALSE(apply_version("s", &before, VersionedData{12, diff}));
    for (std::size_t n = 0; n < diff.size(); ++n) {
      auto cut = apply_version("s", &before, VersionedData{11, diff.substr(0, n)});
      ASSERT_FALSE(cut) << n;
      EXPECT_EQ(cut.error().kind, ErrorKind::kCorruption);
    }
  }
  // An append's diff carries the new batch only, not the whole state.
  EXPECT_LT(encode_diff(before, append, RollupRef{3, "abc"}).size() * 5,
            encode_state(append).size());
}

TEST(StateTest, SinceFollowsTheLeastHoldAndLeasesExpire) {
  ShardState state;
  state.name = "s";
  state.upper = Frontier::at(100);
  register_reader(state, "a", false, /*expires*/ 1000, /*now*/ 0);
  register_reader(state, "b", false, 2000, 0);
  register_reader(state, "c-sink", true, 0, 0);
  ASSERT_TRUE(downgrade_reader_since(state, "a", Frontier::at(50), 10));
  ASSERT_TRUE(downgrade_reader_since(state, "c-sink", Frontier::at(30), 10));
  EXPECT_EQ(state.since, Frontier::at(0));  // b still holds 0
  ASSERT_TRUE(downgrade_reader_since(state, "b", Frontier::at(40), 10));
  EXPECT_EQ(state.since, Frontier::at(30));  // the critical hold
  // A hold never moves back, and since never passes upper.
  ASSERT_TRUE(downgrade_reader_since(state, "b", Frontier::at(5), 10));
  EXPECT_EQ(state.readers["b"].since, Frontier::at(40));
  ASSERT_TRUE(downgrade_reader_since(state, "c-sink", Frontier::at(500), 10));
  EXPECT_EQ(state.since, Frontier::at(40));
  // a's lease (1000) runs out: at 1500 it is gone and b (40) is the least.
  ASSERT_TRUE(heartbeat_reader(state, "b", 3000, 1500));
  EXPECT_FALSE(state.readers.contains("a"));
  EXPECT_EQ(heartbeat_reader(state, "a", 3000, 1500).error().kind, ErrorKind::kNotFound);
  EXPECT_EQ(downgrade_reader_since(state, "a", Frontier::at(60), 1500).error().kind,
            ErrorKind::kNotFound);
  // Critical readers never expire; a re-registered one keeps its hold.
  register_reader(state, "c-sink", true, 0, 1'000'000);
  EXPECT_EQ(state.readers["c-sink"].since, Frontier::at(500));
  EXPECT_FALSE(state.readers.contains("b"));
  EXPECT_EQ(state.since, Frontier::at(100));  // only the critical hold, capped at upper
  remove_reader(state, "c-sink", 1'000'000);
  EXPECT_TRUE(state.readers.empty());
  EXPECT_EQ(state.since, Frontier::at(100));  // since never goes back
}

TEST(StateTest, UnknownWriterIsInvalidUsage) {
  ShardState state;
  state.name = "s";
  AppendRequest request{.writer_id = "nobody",
                        .idempotency_token = "t",
                        .expected_upper = Frontier::at(0),
                        .new_upper = Frontier::at(1),
                        .parts = {},
                        .lease_expires_ms = 0,
                        .producers = {},
                        .producer_expires_ms = 0,
                        .max_producers = 0};
  auto result = apply_append(state, request);
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().kind, ErrorKind::kInvalidUsage);
  EXPECT_NE(result.error().message.find("unknown writer"), std::string::npos);
}

TEST(StateTest, ProducersContinueTheirSequenceExactly) {
  using Verdict = ProducerCheck::Verdict;
  ShardState state;
  state.name = "s";
  register_writer(state, "w", 1000, 0);
  auto append = [&](Time t, std::vector<ProducerRange> ranges) {
    const std::string token = "t" + std::to_string(t);
    AppendRequest request{.writer_id = "w",
                          .idempotency_token = token,
                          .expected_upper = state.upper,
                          .new_upper = Frontier::at(t + 1),
                          .parts = {},
                          .lease_expires_ms = 0,
                          .producers = ranges,
                          .producer_expires_ms = 500 + t,
                          .max_producers = 2};
    ShardState copy = state;
    auto result = apply_append(copy, request);
    if (result) state = copy;
    return result;
  };
  // A new producer starts at 0; a range then moves it to its last record.
  EXPECT_EQ(check_producer(state, "a", 0, 2).verdict, Verdict::kNext);
  EXPECT_EQ(check_producer(state, "a", 3, 2).verdict, Verdict::kGap);
  ASSERT_TRUE(append(0, {{"a", 0, 9, 0}}));
  EXPECT_EQ(state.producers.at("a"), (ProducerState{9, 0, 500}));
  // Records up to 9 are duplicates, 10 is next, 11 leaves a gap.
  EXPECT_EQ(check_producer(state, "a", 4, 2).verdict, Verdict::kDuplicate);
  EXPECT_EQ(check_producer(state, "a", 10, 2).verdict, Verdict::kNext);
  EXPECT_EQ(check_producer(state, "a", 11, 2).verdict, Verdict::kGap);
  EXPECT_EQ(check_producer(state, "a", 11, 2).expected, 10u);
  // An append that repeats committed records changes nothing at all.
  const ShardState before = state;
  auto repeated = append(1, {{"b", 0, 0, 1}, {"a", 5, 12, 1}});
  ASSERT_FALSE(repeated);
  EXPECT_EQ(repeated.error().kind, ErrorKind::kSequenceMismatch);
  EXPECT_EQ(state, before);
  // Two ranges of one producer in one append continue each other.
  ASSERT_TRUE(append(2, {{"a", 10, 12, 2}, {"b", 0, 3, 2}, {"a", 13, 20, 2}}));
  EXPECT_EQ(state.producers.at("a").sequence, 20u);
  EXPECT_EQ(state.producers.at("b").sequence, 3u);
  // The shard keeps at most max_producers: a third is refused.
  EXPECT_EQ(check_producer(state, "c", 0, 2).verdict, Verdict::kFull);
  EXPECT_FALSE(append(3, {{"c", 0, 0, 3}}));
  // Producers expire once their time passes with nothing committed.
  EXPECT_FALSE(expire_leases(state, 501));
  EXPECT_TRUE(expire_leases(state, 503));
  EXPECT_TRUE(state.producers.empty());
  EXPECT_EQ(check_producer(state, "a", 21, 2).verdict, Verdict::kGap);
}

TEST(StateTest, ShardNames) {
  EXPECT_TRUE(validate_shard_name("orders.v1_2-x"));
  EXPECT_FALSE(validate_shard_name(""));
  EXPECT_FALSE(validate_shard_name(std::string(129, 'a')));
  EXPECT_TRUE(validate_shard_name(std::string(128, 'a')));
  EXPECT_FALSE(validate_shard_name("a/b"));
  EXPECT_FALSE(validate_shard_name(".."));
  EXPECT_FALSE(validate_shard_name(".tmp-x"));
  EXPECT_TRUE(validate_shard_name(".x"));
}

// Format 7 and 8 carry the owners of readers and writers, the incarnation
// and the tombstone flag; both change only in full versions.
TEST(StateTest, OwnersIncarnationsAndTombstonesRoundTrip) {
  ShardState state;
  state.name = "s";
  state.seqno = 4;
  state.upper = Frontier::at(9);
  state.incarnation = 3;
  state.writers["w1"] = WriterState{"tok", 500, "host-a:12"};
  state.readers["r1"] = ReaderState{Frontier::at(2), 900, 4, "host-b:34"};
  auto decoded = decode_state("s", VersionedData{4, encode_state(state)});
  ASSERT_TRUE(decoded) << decoded.error().to_string();
  EXPECT_EQ(*decoded, state);
  EXPECT_EQ(decoded->writers.at("w1").owner, "host-a:12");
  EXPECT_EQ(decoded->incarnation, 3u);

  ShardState after = state;
  after.seqno = 5;
  after.readers["r2"] = ReaderState{Frontier::at(3), 950, 5, "host-c:56"};
  after.writers["w1"].owner = "host-d:78";
  ASSERT_TRUE(diff_can_carry(state, after));
  auto applied =
      apply_version("s", &*decoded, VersionedData{5, encode_diff(state, after, RollupRef{4, {}})});
  ASSERT_TRUE(applied) << applied.error().to_string();
  EXPECT_EQ(*applied, after);
  EXPECT_EQ(applied->readers.at("r2").owner, "host-c:56");
  EXPECT_EQ(applied->incarnation, 3u);  // carried over from the state before

  // A tombstone holds nothing; a diff cannot say "deleted".
  ShardState buried = after;
  auto done = bury(buried, false);
  ASSERT_TRUE(done && *done);
  EXPECT_TRUE(buried.deleted);
  EXPECT_TRUE(buried.batches.empty() && buried.readers.empty() && buried.writers.empty());
  EXPECT_FALSE(diff_can_carry(after, buried));
  EXPECT_FALSE(*bury(buried, false));  // once is enough
  auto tomb = decode_state("s", VersionedData{6, encode_state(buried)});
  ASSERT_TRUE(tomb) << tomb.error().to_string();
  EXPECT_TRUE(tomb->deleted);
  // A tombstone that still holds data is corrupt.
  ShardState lying = buried;
  lying.writers["w9"];
  auto refused = decode_state("s", VersionedData{6, encode_state(lying)});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().kind, ErrorKind::kCorruption);
  // Revived: empty, the next incarnation.
  ASSERT_TRUE(revive(buried));
  EXPECT_FALSE(buried.deleted);
  EXPECT_EQ(buried.incarnation, 4u);
  EXPECT_EQ(buried.upper, Frontier::at(0));
  EXPECT_FALSE(revive(buried));

  // A sink's hold (a critical reader) refuses the delete, naming it,
  // unless forced.
  ShardState held = after;
  held.readers["c-sink-x"] = ReaderState{Frontier::at(1), 0, 0, {}};
  auto no = bury(held, false);
  ASSERT_FALSE(no);
  EXPECT_EQ(no.error().kind, ErrorKind::kHeld);
  EXPECT_NE(no.error().message.find("c-sink-x"), std::string::npos) << no.error().message;
  EXPECT_FALSE(held.deleted);
  EXPECT_TRUE(*bury(held, true));
}

// States and diffs written by the previous format (5 and 6, from a build
// before owners existed) still read: owners empty, incarnation 0.
TEST(StateTest, FormatsFiveAndSixStillRead) {
  const std::string v5(
      "\x05\x01\x73\x00\x14\x00\x03\x01\x02\x77\x31\x03\x74\x6f\x6b\xf4\x03\x02\x06\x63\x2d\x73"
      "\x69\x6e\x6b\x00\x04\x00\x00\x02\x72\x31\x00\x03\xb9\x60\x06\x01\x02\x70\x31\x29\x11\xb8"
      "\x85\x06\x01\x00\x00\x00\x0a\x00\x00\x00\x01\x0e\x73\x68\x61\x72\x64\x2f\x73\x2f\x70\x61"
      "\x72\x74\x2f\x78\x64\x05\x50\x01\x09\x00\x00\x00\x0a",
      79);
  const std::string v6(
      "\x06\x07\x00\x00\x1e\x00\x03\x01\x02\x77\x32\x00\x84\x07\x00\x01\x02\x72\x32\x00\x05\x89"
      "\x06\x08\x00\x00\x00\x01\x00\x00",
      30);
  ASSERT_TRUE(is_full_version(v5));
  auto state = decode_state("s", VersionedData{7, v5});
  ASSERT_TRUE(state) << state.error().to_string();
  EXPECT_EQ(state->upper, Frontier::at(20));
  EXPECT_EQ(state->writers.at("w1").last_token, "tok");
  EXPECT_EQ(state->writers.at("w1").lease_expires_ms, 500u);
  EXPECT_EQ(state->writers.at("w1").owner, "");
  EXPECT_EQ(state->readers.at("r1").seqno, 6u);
  EXPECT_EQ(state->producers.at("p1").sequence, 41u);
  EXPECT_EQ(state->batches.size(), 1u);
  EXPECT_EQ(state->incarnation, 0u);
  EXPECT_FALSE(state->deleted);
  EXPECT_FALSE(is_full_version(v6));
  auto next = apply_version("s", &*state, VersionedData{8, v6});
  ASSERT_TRUE(next) << next.error().to_string();
  EXPECT_EQ(next->upper, Frontier::at(30));
  EXPECT_EQ(next->writers.at("w2").lease_expires_ms, 900u);
  EXPECT_EQ(next->readers.at("r2").lease_expires_ms, 777u);
  EXPECT_EQ(next->readers.at("r2").owner, "");
}

// --- Shards -----------------------------------------------------------------

TEST_F(ShardTest, CreateListAndDuplicates) {
  auto again = client_->create_shard("orders");
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().kind, ErrorKind::kAlreadyExists);
  ASSERT_TRUE(client_->create_shard("alpha"));
  EXPECT_EQ(*client_->list_shards(), (std::vector<std::string>{"alpha", "orders"}));
  EXPECT_EQ(client_->open_shard("missing").error().kind, ErrorKind::kNotFound);
  EXPECT_EQ(client_->create_shard("bad name").error().kind, ErrorKind::kInvalidUsage);
}

TEST_F(ShardTest, AppendThenSnapshot) {
  std::vector<Update> updates = numbered(300, 1);
  updates.push_back(Update{"k1", "\"v1\"", 2, -1});
  updates.push_back(Update{"z", "1", 0, 3});
  std::vector<Batch> batches;
  batches.push_back(make_batch(updates, 0, 3));
  ASSERT_GT(batches[0].parts().size(), 1u) << "the test wants several parts";
  ASSERT_TRUE(append(batches, 0, 3));
  EXPECT_EQ(writer_->upper(), Frontier::at(3));
  for (Time as_of = 0; as_of < 3; ++as_of) {
    auto got = read_snapshot(*shard_, as_of);
    ASSERT_TRUE(got) << got.error().to_string();
    EXPECT_EQ(*got, model_at(updates, as_of)) << "as_of " << as_of;
  }
  auto info = shard_->inspect();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->upper, Frontier::at(3));
  EXPECT_EQ(info->batches, 1u);
  EXPECT_EQ(info->updates, 302u);
}

TEST_F(ShardTest, SnapshotRefusesIncompleteAndCompactedTimes) {
  std::vector<Batch> batches;
  batches.push_back(make_batch(numbered(3, 4), 0, 5));
  ASSERT_TRUE(append(batches, 0, 5));
  auto not_ready = shard_->snapshot(5);
  ASSERT_FALSE(not_ready);
  EXPECT_EQ(not_ready.error().kind, ErrorKind::kNotReady);
  EXPECT_NE(not_ready.error().message.find("upper is 5"), std::string::npos);

  auto context = std::make_shared<ShardMachine>("orders", client_->location().consensus,
                                                client_->location().blob);
  ASSERT_TRUE(context->apply([](ShardState& s) -> Result<TransitionResult> {
    s.since = Frontier::at(2);
    return TransitionResult::kWrite;
  }));
  auto compacted = shard_->snapshot(1);
  ASSERT_FALSE(compacted);
  EXPECT_EQ(compacted.error().kind, ErrorKind::kSinceViolation);
  EXPECT_TRUE(shard_->snapshot(2));
  EXPECT_EQ(shard_->listen(1, 5).error().kind, ErrorKind::kSinceViolation);
}

TEST_F(ShardTest, ReadHandlesHoldSinceAndCriticalOnesSurviveRestarts) {
  std::vector<Batch> batches;
  batches.push_back(make_batch(numbered(5, 3), 0, 10));
  ASSERT_TRUE(append(batches, 0, 10));
  auto leased = *shard_->open_reader(ReaderOptions{});
  auto sink = *shard_->open_critical_reader("sink-a");
  ASSERT_TRUE(sink->downgrade_since(Frontier::at(6)));
  EXPECT_EQ(shard_->inspect()->since, Frontier::at(0));  // the leased reader holds 0
  ASSERT_TRUE(leased->downgrade_since(Frontier::at(4)));
  EXPECT_EQ(shard_->inspect()->since, Frontier::at(4));
  EXPECT_EQ(leased->snapshot(3).error().kind, ErrorKind::kSinceViolation);
  EXPECT_TRUE(leased->snapshot(4));
  leased.reset();  // a leased hold goes with its handle
  EXPECT_EQ(shard_->inspect()->since, Frontier::at(6));
  // The sink's process restarts: its hold is where it left it.
  sink.reset();
  auto again = *shard_->open_critical_reader("sink-a");
  EXPECT_EQ(*again->since(), Frontier::at(6));
  ASSERT_TRUE(again->expire());
  EXPECT_EQ(again->since().error().kind, ErrorKind::kNotFound);
}

// inspect shows who holds the since; release_reader drops a hold that
// nothing uses any more (a sink that will not run again), and the since
// then follows the holds that remain.
TEST_F(ShardTest, HoldsAreListedAndReleased) {
  std::vector<Batch> batches;
  batches.push_back(make_batch(numbered(5, 3), 0, 10));
  ASSERT_TRUE(append(batches, 0, 10));
  auto gone = *shard_->open_critical_reader("sink-gone");
  auto live = *shard_->open_critical_reader("sink-live");
  ASSERT_TRUE(gone->downgrade_since(Frontier::at(3)));
  ASSERT_TRUE(live->downgrade_since(Frontier::at(7)));
  auto leased = *shard_->open_reader(ReaderOptions{});
  ShardInfo info = *shard_->inspect();
  EXPECT_EQ(info.since, Frontier::at(3));  // the stale sink's hold
  leased.reset();
  info = *shard_->inspect();
  ASSERT_EQ(info.readers.size(), 2u);
  EXPECT_EQ(info.readers[0].id, "c-sink-gone");
  EXPECT_EQ(info.readers[0].since, Frontier::at(3));
  EXPECT_TRUE(info.readers[0].critical);
  EXPECT_EQ(info.readers[1].id, "c-sink-live");
  ASSERT_EQ(info.writers.size(), 1u);  // the fixture's writer
  EXPECT_GT(info.writers[0].lease_expires_ms, 0u);
  EXPECT_EQ(info.readers[0].owner, client_->options().owner);
  EXPECT_EQ(info.writers[0].owner, client_->options().owner);
  std::string expected = R"("readers":[{"id":"c-sink-gone","since":3,"critical":true,)"
                         R"("expires_ms":null,"owner":")" +
                         client_->options().owner + "\"},";
  EXPECT_NE(info.to_json().find(expected), std::string::npos) << info.to_json();

  auto reader = *shard_->open_reader(ReaderOptions{});
  info = *shard_->inspect();
  ASSERT_EQ(info.readers.size(), 3u);
  const ReaderInfo& r = info.readers[2];  // "r-..." sorts last
  EXPECT_EQ(r.id, reader->id());
  EXPECT_FALSE(r.critical);
  EXPECT_GT(r.lease_expires_ms, 0u);
  ASSERT_TRUE(shard_->release_reader(reader->id()));  // a leased hold too

  ASSERT_TRUE(shard_->release_reader("c-sink-gone"));
  info = *shard_->inspect();
  EXPECT_EQ(info.since, Frontier::at(7));
  ASSERT_EQ(info.readers.size(), 1u);
  EXPECT_EQ(info.readers[0].id, "c-sink-live");
  auto again = shard_->release_reader("c-sink-gone");
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().kind, ErrorKind::kNotFound);
  // The released handle finds its hold gone rather than moving it.
  EXPECT_EQ(gone->downgrade_since(Frontier::at(9)).error().kind, ErrorKind::kNotFound);
}

// Each reader and writer names the process that registered it: the
// client's owner, "<host name>:<pid>" unless the options say otherwise.
TEST_F(ShardTest, ReadersAndWritersNameTheirOwner) {
  const std::string& owner = client_->options().owner;
  EXPECT_EQ(owner.substr(owner.rfind(':') + 1), std::to_string(getpid()));
  ClientOptions named = client_->options();
  named.owner = "sink runner 7";
  auto other = *Client::open(client_->location(), named);
  auto shard = *other->open_shard("orders");
  auto writer = *shard->open_writer();
  auto reader = *shard->open_reader(ReaderOptions{});
  ShardInfo info = *shard_->inspect();
  ASSERT_EQ(info.writers.size(), 2u);
  ASSERT_EQ(info.readers.size(), 1u);
  EXPECT_EQ(info.readers[0].owner, "sink runner 7");
  int named_writers = 0;
  for (const WriterInfo& w : info.writers) {
    named_writers += w.owner == "sink runner 7" ? 1 : 0;
    EXPECT_TRUE(w.owner == "sink runner 7" || w.owner == owner) << w.owner;
  }
  EXPECT_EQ(named_writers, 1);
}

// delete_shard: the tombstone stops every handle, garbage collection
// removes the data, the name goes; the name can then be created again and
// shares nothing with the old shard.
TEST_F(ShardTest, DeleteRemovesTheShardAndItsData) {
  blob_parts_only();
  std::vector<Update> all;
  ASSERT_NO_FATAL_FAILURE(append_one_each(5, &all));
  ASSERT_TRUE(shard_->compact());
  auto reader = *shard_->open_reader(ReaderOptions{});
  std::size_t objects = 0;
  ASSERT_TRUE(blob_->list("shard/orders/", [&](std::string_view, std::uint64_t) { ++objects; }));
  ASSERT_GT(objects, 0u);
  ASSERT_TRUE(client_->create_shard("other"));

  auto deleted = client_->delete_shard("orders");
  ASSERT_TRUE(deleted) << deleted.error().to_string();
  EXPECT_EQ(deleted->objects_deleted, objects);
  EXPECT_GT(deleted->versions_truncated, 0u);
  EXPECT_EQ(*client_->list_shards(), std::vector<std::string>{"other"});
  std::size_t left = 0;
  ASSERT_TRUE(blob_->list("shard/orders/", [&](std::string_view, std::uint64_t) { ++left; }));
  EXPECT_EQ(left, 0u);
  // One version stays: the tombstone, for handles that come late.
  auto versions = client_->location().consensus->scan(shard_consensus_key("orders"), 0, 100);
  ASSERT_TRUE(versions);
  EXPECT_EQ(versions->size(), 1u);

  // Handles opened before fail cleanly, reads and writes alike.
  auto snapshot = shard_->snapshot(3);
  ASSERT_FALSE(snapshot);
  EXPECT_EQ(snapshot.error().kind, ErrorKind::kNotFound);
  EXPECT_NE(snapshot.error().message.find("shard orders was deleted"), std::string::npos)
      << snapshot.error().message;
  EXPECT_TRUE(shard_->deleted());
  std::vector<Batch> none;
  EXPECT_EQ(append(none, 5, 6).error().kind, ErrorKind::kNotFound);
  EXPECT_EQ(reader->downgrade_since(Frontier::at(4)).error().kind, ErrorKind::kNotFound);
  EXPECT_EQ(client_->open_shard("orders").error().kind, ErrorKind::kNotFound);
  EXPECT_EQ(client_->delete_shard("orders").error().kind, ErrorKind::kNotFound);

  // Created again: empty, from time 0; the old handle still refuses it.
  ASSERT_TRUE(client_->create_shard("orders"));
  auto fresh = *client_->open_shard("orders");
  ShardInfo info = *fresh->inspect();
  EXPECT_EQ(info.upper, Frontier::at(0));
  EXPECT_EQ(info.updates, 0u);
  EXPECT_FALSE(fresh->deleted());
  auto writer = *fresh->open_writer();
  std::vector<Update> one{Update{"again", "1", 0, 1}};
  std::vector<Batch> batches;
  batches.push_back(*writer->batch(one, Frontier::at(0), Frontier::at(1)));
  ASSERT_TRUE(writer->compare_and_append(batches, Frontier::at(0), Frontier::at(1)));
  auto got = read_snapshot(*fresh, 0);
  ASSERT_TRUE(got) << got.error().to_string();
  EXPECT_EQ(*got, model_at(one, 0));
  auto stale = shard_->snapshot(0);
  ASSERT_FALSE(stale);
  EXPECT_NE(stale.error().message.find("created again"), std::string::npos)
      << stale.error().message;
  // The other shard never noticed.
  EXPECT_TRUE((*client_->open_shard("other"))->inspect());
}

// A sink's hold refuses the delete (naming it) unless forced; a shard
// never written deletes too.
TEST_F(ShardTest, DeleteRespectsSinkHoldsUnlessForced) {
  std::vector<Batch> batches;
  batches.push_back(make_batch(numbered(5, 3), 0, 10));
  ASSERT_TRUE(append(batches, 0, 10));
  auto sink = *shard_->open_critical_reader("sink-a");
  auto held = client_->delete_shard("orders");
  ASSERT_FALSE(held);
  EXPECT_EQ(held.error().kind, ErrorKind::kHeld);
  EXPECT_NE(held.error().message.find("c-sink-a"), std::string::npos) << held.error().message;
  EXPECT_TRUE(shard_->snapshot(5));  // untouched
  ASSERT_TRUE(client_->delete_shard("orders", /*force=*/true));
  EXPECT_EQ(sink->since().error().kind, ErrorKind::kNotFound);

  ASSERT_TRUE(client_->create_shard("empty"));
  ASSERT_TRUE(client_->delete_shard("empty"));
  EXPECT_TRUE(client_->list_shards()->empty());
  EXPECT_EQ(client_->delete_shard("bad name").error().kind, ErrorKind::kInvalidUsage);
}

// A blob store that refuses deletes once armed.
class RefusingDeletes final : public ForwardingBlob {
 public:
  using ForwardingBlob::ForwardingBlob;
  std::atomic<bool> refuse{false};
  Status remove(std::string_view key) override {
    if (refuse) return make_error(ErrorKind::kDeterminate, "test: deletes refused");
    return ForwardingBlob::remove(key);
  }
  Status remove_many(const std::vector<std::string>& keys) override {
    if (refuse) return make_error(ErrorKind::kDeterminate, "test: deletes refused");
    return ForwardingBlob::remove_many(keys);
  }
};

// A delete cut short (the store refuses deletes) leaves the shard listed,
// deleted and unopenable; run again, it finishes.
TEST_F(ShardTest, AnUnfinishedDeleteFinishesWhenRunAgain) {
  auto refusing = std::make_shared<RefusingDeletes>(blob_);
  ClientOptions options = client_->options();
  options.inline_part_max_bytes = 0;
  options.write_retry =
      RetryPolicy{std::chrono::milliseconds(1), std::chrono::milliseconds(1), 2, {}};
  auto client = *Client::open(Location{refusing, consensus_}, options);
  auto shard = *client->open_shard("orders");
  auto writer = *shard->open_writer();
  std::vector<Batch> batches;
  batches.push_back(*writer->batch(numbered(5, 3), Frontier::at(0), Frontier::at(10)));
  ASSERT_TRUE(writer->compare_and_append(batches, Frontier::at(0), Frontier::at(10)));
  writer.reset();
  refusing->refuse = true;
  auto cut = client->delete_shard("orders");
  ASSERT_FALSE(cut);
  EXPECT_NE(cut.error().message.find("deletes refused"), std::string::npos)
      << cut.error().to_string();
  EXPECT_EQ(*client->list_shards(), std::vector<std::string>{"orders"});
  auto open = client->open_shard("orders");
  ASSERT_FALSE(open);
  EXPECT_NE(open.error().message.find("run it again"), std::string::npos) << open.error().message;
  EXPECT_EQ(client->create_shard("orders").error().kind, ErrorKind::kAlreadyExists);
  refusing->refuse = false;
  auto finished = client->delete_shard("orders");
  ASSERT_TRUE(finished) << finished.error().to_string();
  EXPECT_GT(finished->objects_deleted, 0u);
  EXPECT_TRUE(client->list_shards()->empty());
  std::size_t left = 0;
  ASSERT_TRUE(blob_->list("shard/orders/", [&](std::string_view, std::uint64_t) { ++left; }));
  EXPECT_EQ(left, 0u);
}

TEST_F(ShardTest, AnExpiredLeaseStopsHoldingSince) {
  ReaderOptions no_heartbeat;
  no_heartbeat.lease = std::chrono::milliseconds(50);
  no_heartbeat.heartbeat = false;
  auto silent = *shard_->open_reader(no_heartbeat);
  ReaderOptions beating;
  beating.lease = std::chrono::milliseconds(60);
  auto alive = *shard_->open_reader(beating);
  std::vector<Batch> none;
  ASSERT_TRUE(append(none, 0, 10));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // The live reader's heartbeats (every 20 ms) kept it; the silent one expired.
  ASSERT_TRUE(alive->downgrade_since(Frontier::at(7)));
  EXPECT_EQ(shard_->inspect()->since, Frontier::at(7));
  EXPECT_EQ(silent->downgrade_since(Frontier::at(8)).error().kind, ErrorKind::kNotFound);
}

// Rollups in blob: the path of a state too large to start its chain
// inside a commit (here every state past the first few appends).
TEST_F(ShardTest, StateIsStoredAsDiffsWithPeriodicRollups) {
  ClientOptions options = client_->options();
  options.inline_part_max_bytes = 0;  // diffs of one batch of blob parts (inline: SmallAppends...)
  options.inline_rollup_max_bytes = 512;
  reopen(options);
  // A second handle caches the state early and must catch up later.
  auto early = *client_->open_shard("orders");
  ASSERT_TRUE(early->inspect());
  const int appends = 2 * static_cast<int>(kRollupInterval) + 20;
  std::vector<Update> all;
  ASSERT_NO_FATAL_FAILURE(append_one_each(appends, &all));
  // Every consensus version but the first is a small diff; the full states
  // (rollups), one per kRollupInterval versions, are in blob.
  auto versions = *consensus_->scan(shard_consensus_key("orders"), 0, 10'000);
  ASSERT_GT(versions.size(), static_cast<std::size_t>(appends));
  std::size_t full = 0, largest_diff = 0;
  for (const VersionedData& v : versions) {
    if (is_full_version(v.data)) {
      ++full;
    } else {
      largest_diff = std::max(largest_diff, v.data.size());
    }
  }
  EXPECT_EQ(full, 1u);
  EXPECT_LT(largest_diff, 300u) << "a diff grew with the shard";
  std::size_t rollups = 0, largest_rollup = 0;
  ASSERT_TRUE(
      blob_->list(shard_rollup_prefix("orders"), [&](std::string_view key, std::uint64_t size) {
        ++rollups;
        largest_rollup = std::max<std::size_t>(largest_rollup, size);
        auto ref = parse_rollup_key(key, shard_rollup_prefix("orders"));
        ASSERT_TRUE(ref);
        EXPECT_FALSE(ref->id.empty()) << "a rollup key of its own for each write";
      }));
  EXPECT_EQ(rollups, (versions.size() - 1) / kRollupInterval);
  EXPECT_GT(largest_rollup, 20 * largest_diff);
  expect_handles_agree(*early, all);
}

// Issue 19: every kRollupInterval versions, a commit first wrote a rollup
// to blob (on the embedded default a file, its sync and its directory's
// sync, on the commit path). A small state now starts its new chain inside
// the commit, as a full version: a stream of small appends writes nothing
// to blob, and every reader, caching or fresh, still folds at most
// kRollupInterval diffs onto one full state.
TEST_F(ShardTest, SmallStatesStartTheirChainsInsideTheCommit) {
  auto early = *client_->open_shard("orders");
  ASSERT_TRUE(early->inspect());
  const int appends = 2 * static_cast<int>(kRollupInterval) + 20;
  std::vector<Update> all;
  ASSERT_NO_FATAL_FAILURE(append_one_each(appends, &all));
  auto versions = *consensus_->scan(shard_consensus_key("orders"), 0, 10'000);
  ASSERT_GT(versions.size(), static_cast<std::size_t>(appends));
  std::vector<SeqNo> full;
  std::size_t largest_diff = 0, smallest_full = SIZE_MAX;
  for (const VersionedData& v : versions) {
    if (is_full_version(v.data)) {
      if (!full.empty()) smallest_full = std::min(smallest_full, v.data.size());
      full.push_back(v.seqno);
      continue;
    }
    largest_diff = std::max(largest_diff, v.data.size());
    ASSERT_FALSE(full.empty());
    // A diff names the full version its chain starts from, by seqno alone.
    EXPECT_EQ(*version_rollup("orders", v), (RollupRef{full.back(), {}})) << v.seqno;
  }
  ASSERT_EQ(full.size(), 1 + (versions.size() - 1) / kRollupInterval);
  for (std::size_t i = 0; i < full.size(); ++i) EXPECT_EQ(full[i], 1 + i * kRollupInterval);
  EXPECT_LT(largest_diff, 400u) << "a diff grew with the shard";
  EXPECT_GT(smallest_full, 20 * largest_diff) << "the later full versions carry the whole state";
  std::size_t objects = 0;
  ASSERT_TRUE(blob_->list("", [&](std::string_view, std::uint64_t) { ++objects; }));
  EXPECT_EQ(objects, 0u) << "no rollup (and no part) in blob";
  expect_handles_agree(*early, all);
}

// Issue 19: a small append wrote a part file (a create, a sync, a rename
// and a directory sync) before its consensus write. Its part now travels
// inline, in the consensus write: no blob object, and it reads back from
// snapshots and listens, and from a fresh client.
TEST_F(ShardTest, SmallAppendsTravelInlineWithNoBlobObject) {
  std::vector<Update> all;
  for (Time t = 0; t < 5; ++t) {
    std::vector<Update> updates = numbered(3, t, "t" + std::to_string(t) + "-");
    all.insert(all.end(), updates.begin(), updates.end());
    std::vector<Batch> batches;
    batches.push_back(make_batch(updates, t, t + 1));
    ASSERT_TRUE(batches[0].parts()[0].is_inline());
    ASSERT_TRUE(append(batches, t, t + 1));
  }
  EXPECT_EQ(part_objects(), 0u);
  // Each diff carries its append's part: one batch, not the shard.
  auto versions = *consensus_->scan(shard_consensus_key("orders"), 0, 100);
  for (const VersionedData& v : versions) {
    if (!is_full_version(v.data)) {
      EXPECT_LT(v.data.size(), 300u + 4096u);
    }
  }
  auto state = *shard_->inspect();
  EXPECT_EQ(state.batches, 5u);
  EXPECT_EQ(state.parts, 5u);
  EXPECT_EQ(*read_snapshot(*shard_, 4), model_at(all, 4));
  auto fresh = *(*Client::open(client_->location(), client_->options()))->open_shard("orders");
  EXPECT_EQ(*read_snapshot(*fresh, 4), model_at(all, 4));
  auto listener = fresh->listen(0, 5);
  ASSERT_TRUE(listener) << listener.error().to_string();
  auto listened = read_listen(**listener);
  ASSERT_TRUE(listened) << listened.error().to_string();
  EXPECT_EQ(listened->updates.size(), 12u);  // times 1 to 4: from 0 is exclusive
  // A batch over the limit is a blob part, as before.
  std::vector<Batch> big;
  std::vector<Update> many;
  for (int i = 0; i < 3000; ++i) {
    many.push_back(Update{"big" + std::to_string(i), std::to_string(i * 7919), 5, 1});
  }
  big.push_back(make_batch(many, 5, 6));
  EXPECT_FALSE(big[0].parts().back().is_inline());
  ASSERT_TRUE(append(big, 5, 6));
  EXPECT_GT(part_objects(), 0u);
  all.insert(all.end(), many.begin(), many.end());
  EXPECT_EQ(*read_snapshot(*fresh, 5), model_at(all, 5));
}

// Issue 19: an appender's builder may encode a batch on its own thread only
// if that does no I/O (BatchBuilder::finish_inline): a batch of one inline
// part comes back finished, with nothing written; any other is left, its
// part encoded, for finish() to write, which must be given the same upper.
TEST_F(ShardTest, FinishInlineDoesNoIoAndLeavesTheUploadToFinish) {
  std::vector<Update> all = numbered(3, 0, "small-");
  BatchBuilder small = writer_->builder(Frontier::at(0));
  for (const Update& u : all) ASSERT_TRUE(small.add(u.key, u.value, u.time, u.diff));
  auto finished = small.finish_inline(Frontier::at(1));
  ASSERT_TRUE(finished) << finished.error().to_string();
  ASSERT_TRUE(finished->has_value());
  ASSERT_EQ((*finished)->parts().size(), 1u);
  EXPECT_TRUE((*finished)->parts()[0].is_inline());
  EXPECT_EQ(part_objects(), 0u);
  EXPECT_FALSE(small.finish_inline(Frontier::at(1))) << "already finished";
  std::vector<Batch> batches;
  batches.push_back(std::move(**finished));
  ASSERT_TRUE(append(batches, 0, 1));

  // One part (under part_target_bytes) too large for inline: 4,000 bytes
  // at random. Nothing is written until finish().
  std::string noise(4000, ' ');
  std::uint32_t x = 12345;
  for (char& c : noise) {
    x = x * 1103515245u + 12345u;
    c = static_cast<char>(x >> 24);
  }
  const std::vector<Update> many{Update{"big", noise, 1, 1}};
  BatchBuilder big = writer_->builder(Frontier::at(1));
  for (const Update& u : many) ASSERT_TRUE(big.add(u.key, u.value, u.time, u.diff));
  auto left = big.finish_inline(Frontier::at(2));
  ASSERT_TRUE(left) << left.error().to_string();
  EXPECT_FALSE(left->has_value());
  EXPECT_EQ(part_objects(), 0u) << "finish_inline wrote to the blob store";
  auto stored = big.finish(Frontier::at(2));
  ASSERT_TRUE(stored) << stored.error().to_string();
  ASSERT_EQ(stored->parts().size(), 1u);
  EXPECT_FALSE(stored->parts()[0].is_inline());
  EXPECT_EQ(part_objects(), 1u);
  batches.clear();
  batches.push_back(std::move(*stored));
  ASSERT_TRUE(append(batches, 1, 2));
  all.insert(all.end(), many.begin(), many.end());
  EXPECT_EQ(*read_snapshot(*shard_, 1), model_at(all, 1));

  // finish() after finish_inline() must end where it was encoded for.
  BatchBuilder other = writer_->builder(Frontier::at(2));
  for (const Update& u : many) ASSERT_TRUE(other.add(u.key, u.value, 2, u.diff));
  left = other.finish_inline(Frontier::at(3));
  ASSERT_TRUE(left && !left->has_value());
  auto wrong = other.finish(Frontier::at(4));
  ASSERT_FALSE(wrong);
  EXPECT_TRUE(wrong.error().is(ErrorKind::kInvalidUsage)) << wrong.error().to_string();
  EXPECT_EQ(part_objects(), 1u);

  // A bad upper fails as finish() does, with nothing written.
  BatchBuilder bad = writer_->builder(Frontier::at(3));
  ASSERT_TRUE(bad.add("k", "v", 5, 1));
  auto refused = bad.finish_inline(Frontier::at(5));
  ASSERT_FALSE(refused);
  EXPECT_TRUE(refused.error().is(ErrorKind::kInvalidUsage)) << refused.error().to_string();
}

// The state holds at most inline_state_max_bytes of inline parts: an append
// that would pass it writes its parts to the blob store first. Compaction
// moves inline parts out once they reach half of it, and nothing is lost or
// doubled on the way.
TEST_F(ShardTest, InlinePartsStayWithinTheirBoundAndCompactionMovesThemOut) {
  ClientOptions options = client_->options();
  options.inline_state_max_bytes = 4096;
  auto client = *Client::open(client_->location(), options);
  auto shard = *client->open_shard("orders");
  auto writer = std::move(*shard->open_writer());
  ShardMachine machine("orders", consensus_, blob_);  // to read the state itself
  std::vector<Update> all;
  std::uint64_t most = 0;
  for (Time t = 0; t < 40; ++t) {
    std::vector<Update> updates = numbered(4, t, "t" + std::to_string(t) + "-");
    all.insert(all.end(), updates.begin(), updates.end());
    std::vector<Batch> batches;
    batches.push_back(*writer->batch(updates, Frontier::at(t), Frontier::at(t + 1)));
    ASSERT_TRUE(batches[0].parts()[0].is_inline());
    ASSERT_TRUE(writer->compare_and_append(batches, Frontier::at(t), Frontier::at(t + 1)));
    auto state = *machine.fetch();
    most = std::max(most, inline_bytes(*state));
    EXPECT_LE(inline_bytes(*state), options.inline_state_max_bytes);
  }
  const std::size_t spilled = part_objects();
  EXPECT_GT(spilled, 0u) << "no append found the state full";
  EXPECT_GT(most, options.inline_state_max_bytes / 2);
  EXPECT_EQ(*read_snapshot(*shard, 39), model_at(all, 39));
  // Compaction merges from the oldest inline part on into blob parts.
  auto compacted = shard->compact();
  ASSERT_TRUE(compacted) << compacted.error().to_string();
  EXPECT_GT(compacted->merges, 0u);
  auto state = *machine.fetch();
  EXPECT_LT(inline_bytes(*state), options.inline_state_max_bytes / 2);
  EXPECT_EQ(*read_snapshot(*shard, 39), model_at(all, 39));
  auto listener = shard->listen(0, 40);
  ASSERT_TRUE(listener) << listener.error().to_string();
  auto listened = read_listen(**listener);
  ASSERT_TRUE(listened) << listened.error().to_string();
  EXPECT_EQ(listened->updates.size(), 39u * 4);
}

TEST_F(ShardTest, ManyBatchesCommitWithOneConsensusWrite) {
  std::vector<Batch> batches;
  batches.push_back(make_batch(numbered(10, 2, "a"), 2, 4));
  batches.push_back(make_batch(numbered(10, 5, "b"), 5, 7));
  batches.push_back(make_batch(numbered(10, 2, "c"), 1, 8));  // overlapping is fine
  auto before = shard_->inspect()->seqno;
  int calls_before = consensus_->cas_calls;
  ASSERT_TRUE(append(batches, 0, 9));
  EXPECT_EQ(consensus_->cas_calls - calls_before, 1);
  EXPECT_EQ(shard_->inspect()->seqno, before + 1);
  auto got = read_snapshot(*shard_, 8);
  EXPECT_EQ(got->size(), 30u);
}

TEST_F(ShardTest, UpperMismatchNamesBothUppersAndKeepsTheBatch) {
  blob_parts_only();  // it counts the part objects a stale batch leaves
  std::vector<Batch> first;
  first.push_back(make_batch(numbered(2, 0), 0, 2));
  ASSERT_TRUE(append(first, 0, 2));
  std::vector<Batch> stale;
  stale.push_back(make_batch(numbered(2, 1, "x"), 1, 3));
  auto result = append(stale, 1, 3);
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().kind, ErrorKind::kUpperMismatch);
  EXPECT_EQ(result.error().expected_upper, std::optional<Time>(1));
  EXPECT_EQ(result.error().current_upper, std::optional<Time>(2));
  EXPECT_EQ(writer_->upper(), Frontier::at(2));
  EXPECT_FALSE(stale[0].empty());  // still the caller's to retry or drop
  std::size_t with_stale = part_objects();
  stale.clear();  // dropping a definitely failed batch deletes its parts
  EXPECT_LT(part_objects(), with_stale);
  EXPECT_EQ(read_snapshot(*shard_, 1)->size(), 2u);
}

TEST_F(ShardTest, TypedUsageErrors) {
  auto kind_of = [](const Status& s) { return s ? std::optional<ErrorKind>{} : s.error().kind; };
  // An update below its batch's lower, or not below its upper.
  BatchBuilder below = writer_->builder(Frontier::at(5));
  EXPECT_EQ(kind_of(below.add("k", "v", 4, 1)), ErrorKind::kInvalidUsage);
  BatchBuilder above = writer_->builder(Frontier::at(0));
  ASSERT_TRUE(above.add("k", "v", 9, 1));
  auto finished = above.finish(Frontier::at(9));
  ASSERT_FALSE(finished);
  EXPECT_EQ(finished.error().kind, ErrorKind::kInvalidUsage);

  std::vector<Batch> batches;
  batches.push_back(make_batch(numbered(1, 3), 3, 5));
  // upper < lower.
  EXPECT_EQ(kind_of(writer_->compare_and_append(batches, Frontier::at(4), Frontier::at(2))),
            ErrorKind::kInvalidUsage);
  // An empty interval with data.
  EXPECT_EQ(kind_of(append(batches, 0, 0)), ErrorKind::kInvalidUsage);
  // A batch outside [expected, new).
  EXPECT_EQ(kind_of(append(batches, 0, 4)), ErrorKind::kInvalidUsage);
  EXPECT_EQ(kind_of(append(batches, 4, 9)), ErrorKind::kInvalidUsage);
  // A batch from another shard.
  ASSERT_TRUE(client_->create_shard("other"));
  auto other = (*client_->open_shard("other"))->open_writer();
  std::vector<Batch> foreign;
  foreign.push_back(std::move(*(*other)->batch(numbered(1, 0), Frontier::at(0), Frontier::at(1))));
  auto result = writer_->compare_and_append(foreign, Frontier::at(0), Frontier::at(1));
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().kind, ErrorKind::kInvalidUsage);
  EXPECT_NE(result.error().message.find("another shard"), std::string::npos);
  // None of it changed the shard.
  EXPECT_EQ(shard_->inspect()->upper, Frontier::at(0));
  // An empty append just advances the upper.
  std::vector<Batch> none;
  EXPECT_TRUE(append(none, 0, 2));
  EXPECT_EQ(shard_->inspect()->batches, 0u);
  EXPECT_EQ(shard_->inspect()->upper, Frontier::at(2));
}

TEST_F(ShardTest, AbandonedBuilderDeletesItsParts) {
  {
    BatchBuilder builder = writer_->builder(Frontier::at(0));
    for (int i = 0; i < 2000; ++i) ASSERT_TRUE(builder.add("key" + std::to_string(i), "v", 1, 1));
  }
  EXPECT_EQ(part_objects(), 0u);
}

TEST_F(ShardTest, IndeterminateAppendRetriedWithItsTokenCommitsOnce) {
  std::vector<Batch> batches;
  batches.push_back(make_batch(numbered(5, 0), 0, 1));
  // Applied, then every retry inside the machine fails too: the caller is
  // told "indeterminate" and keeps the batch.
  consensus_->apply_then_fail = 1;
  consensus_->fail_without_applying = 100;
  auto result = writer_->compare_and_append(batches, Frontier::at(0), Frontier::at(1), "tok-1");
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().kind, ErrorKind::kIndeterminate);
  consensus_->fail_without_applying = 0;
  // The retry with the same token finds it committed: no double count.
  ASSERT_TRUE(writer_->compare_and_append(batches, Frontier::at(0), Frontier::at(1), "tok-1"));
  EXPECT_EQ(*read_snapshot(*shard_, 0), model_at(numbered(5, 0), 0));
  EXPECT_EQ(shard_->inspect()->batches, 1u);
}

TEST_F(ShardTest, IndeterminateWriteThatLandedIsRecognisedInternally) {
  std::vector<Batch> batches;
  batches.push_back(make_batch(numbered(5, 0), 0, 1));
  consensus_->apply_then_fail = 1;
  ASSERT_TRUE(append(batches, 0, 1));
  EXPECT_EQ(shard_->inspect()->batches, 1u);
  EXPECT_EQ(read_snapshot(*shard_, 0)->size(), 5u);
}

TEST_F(ShardTest, RegisteredRangeWiderThanInlineReadsBack) {
  // Early parts of a large batch are written before the upper is known, so
  // their inline upper is open; the registration [0, 100) is wider below.
  std::vector<Update> updates = numbered(500, 7);
  std::vector<Batch> batches;
  batches.push_back(make_batch(updates, 5, 10));
  ASSERT_GT(batches[0].parts().size(), 2u);
  ASSERT_TRUE(append(batches, 0, 100));
  EXPECT_EQ(*read_snapshot(*shard_, 99), model_at(updates, 99));
  EXPECT_TRUE(read_snapshot(*shard_, 6)->empty());
}

TEST_F(ShardTest, TruncatedBatchReadsOnlyItsRegisteredRange) {
  // Another replica already wrote [0, 5); ours covers [0, 10) with the same
  // data below 5, so it appends truncated to [5, 10).
  std::vector<Update> all;
  for (Time t = 0; t < 10; ++t) all.push_back(Update{"k", std::to_string(t), t, 1});
  std::vector<Update> early(all.begin(), all.begin() + 5);
  std::vector<Batch> replica;
  replica.push_back(make_batch(early, 0, 5));
  ASSERT_TRUE(append(replica, 0, 5));
  std::vector<Batch> ours;
  ours.push_back(make_batch(all, 0, 10));
  ASSERT_FALSE(append(ours, 0, 10));
  ASSERT_TRUE(ours[0].truncate(Frontier::at(5)));
  EXPECT_FALSE(ours[0].truncate(Frontier::at(11)));
  ASSERT_TRUE(append(ours, 5, 10));
  EXPECT_EQ(*read_snapshot(*shard_, 9), model_at(all, 9));
}

TEST_F(ShardTest, ABatchOfManyPartsIsSortedIntoOneRun) {
  // Keys in a shuffled order over three times, with updates that cancel or
  // sum across parts (each part is sorted on its own, so only the merge
  // meets them).
  std::vector<Update> updates;
  const auto value = [](int k) { return std::string(24, static_cast<char>('a' + k % 13)); };
  for (int i = 0; i < 12000; ++i) {
    const int k = (i * 7919) % 12000;
    updates.push_back(Update{"k" + std::to_string(k), value(k), static_cast<Time>(k % 3), 1});
  }
  for (int k = 0; k < 12000; k += 5) {
    updates.push_back(
        Update{"k" + std::to_string(k), value(k), static_cast<Time>(k % 3), k % 2 == 0 ? -1 : 2});
  }
  // The builder cuts a part once it buffers part_target_bytes (4096), so
  // there are at least this many before the sort: more than one merge
  // takes, so it merges more than once.
  std::uint64_t buffered = 0;
  for (const Update& u : updates) buffered += u.key.size() + u.value.size();
  ASSERT_GT(buffered / (4096 + 32), BatchBuilder::kRunFanIn);
  std::vector<Batch> batches;
  batches.push_back(make_batch(updates, 0, 3));
  const std::vector<PartRef> parts = batches[0].parts();
  ASSERT_GT(parts.size(), 1u);
  EXPECT_TRUE(batches[0].ordered());
  // Only the run is left: the parts merged into it are deleted.
  EXPECT_EQ(part_objects(), parts.size());
  std::vector<Update> consolidated = updates;
  consolidate(consolidated);
  std::uint64_t count = 0;
  for (const PartRef& part : parts) count += part.count;
  EXPECT_EQ(count, consolidated.size());
  // The parts are read as one run, which checks their order across parts.
  auto merge =
      MergeCursor::open(blob_, std::vector<MergeCursor::PartRun>{{parts, true}}, TimeWindow{});
  ASSERT_TRUE(merge) << merge.error().to_string();
  std::uint64_t read = 0;
  for (;;) {
    auto next = merge->next();
    ASSERT_TRUE(next) << next.error().to_string();
    if (!*next) break;
    ++read;
  }
  EXPECT_EQ(read, count);

  ASSERT_TRUE(append(batches, 0, 3));
  auto state = ShardMachine("orders", consensus_, blob_).fetch();
  ASSERT_TRUE(state) << state.error().to_string();
  ASSERT_EQ((*state)->batches.size(), 1u);
  EXPECT_TRUE((*state)->batches[0].ordered);
  EXPECT_EQ(read_inputs(**state), 1u) << "a read opens one part at a time";
  for (Time as_of = 0; as_of < 3; ++as_of) {
    auto got = read_snapshot(*shard_, as_of);
    ASSERT_TRUE(got) << got.error().to_string();
    EXPECT_EQ(*got, model_at(updates, as_of)) << "as_of " << as_of;
  }
  auto listener = shard_->listen(0, 3);
  ASSERT_TRUE(listener) << listener.error().to_string();
  auto listened = read_listen(**listener);
  ASSERT_TRUE(listened) << listened.error().to_string();
  std::vector<Update> expected;
  for (const Update& u : consolidated) {
    if (u.time > 0) expected.push_back(u);
  }
  std::vector<Update> got = listened->updates;
  consolidate(got);  // sorts as `expected` is
  EXPECT_EQ(got, expected);
}

TEST_F(ShardTest, ABatchOfFewPartsStaysLooseAndTwoBatchesAreLoose) {
  std::vector<Batch> batches;
  batches.push_back(make_batch(numbered(300, 1), 0, 2));
  ASSERT_GT(batches[0].parts().size(), 1u);
  ASSERT_LE(batches[0].parts().size(), BatchBuilder::kMaxLooseParts);
  EXPECT_FALSE(batches[0].ordered());
  ASSERT_TRUE(append(batches, 0, 2));
  // Two batches in one call are registered as one batch of loose parts,
  // even when each alone is ordered.
  std::vector<Batch> two;
  two.push_back(make_batch(numbered(6000, 2, "a"), 2, 3));
  two.push_back(make_batch(numbered(6000, 3, "b"), 3, 4));
  ASSERT_TRUE(two[0].ordered());
  ASSERT_TRUE(two[1].ordered());
  ASSERT_TRUE(append(two, 2, 4));
  auto state = ShardMachine("orders", consensus_, blob_).fetch();
  ASSERT_TRUE(state) << state.error().to_string();
  ASSERT_EQ((*state)->batches.size(), 2u);
  EXPECT_FALSE((*state)->batches[0].ordered);
  EXPECT_FALSE((*state)->batches[1].ordered);
  std::vector<Update> all = numbered(300, 1);
  for (const Update& u : numbered(6000, 2, "a")) all.push_back(u);
  for (const Update& u : numbered(6000, 3, "b")) all.push_back(u);
  EXPECT_EQ(*read_snapshot(*shard_, 3), model_at(all, 3));
}

TEST_F(ShardTest, IrreconcilablePartIsACorruptionNamingIt) {
  std::vector<Batch> batches;
  batches.push_back(make_batch(numbered(3, 1), 0, 2));
  std::string key = batches[0].parts()[0].key;
  ASSERT_TRUE(append(batches, 0, 2));
  // Re-register the part at [50, 60): its inline description says [0, 2).
  ShardMachine machine("orders", client_->location().consensus, client_->location().blob);
  ASSERT_TRUE(machine.apply([](ShardState& s) -> Result<TransitionResult> {
    s.upper = Frontier::at(60);
    HollowBatch moved = s.batches[0];
    moved.desc = Description{Frontier::at(50), Frontier::at(60), Frontier::at(0)};
    std::vector<PartRef> parts = moved.parts.get();
    for (PartRef& p : parts) {
      p.lower = Frontier::at(50);
      p.upper = Frontier::at(60);
      p.time_min = 50;
      p.time_max = 59;
    }
    moved.parts = PartList(std::move(parts));
    s.batches.push_back(moved);
    return TransitionResult::kWrite;
  }));
  auto snapshot = read_snapshot(*shard_, 59);
  ASSERT_FALSE(snapshot);
  EXPECT_EQ(snapshot.error().kind, ErrorKind::kCorruption);
  EXPECT_NE(snapshot.error().message.find(key), std::string::npos);
}

// A part object that holds more payload than the shard registered for it
// (replaced in the blob store, say) is refused before a block is read: its
// blocks are bounded by its payload (check_part_footer), so the bound must
// be the registered one.
TEST_F(ShardTest, APartHoldingMorePayloadThanRegisteredIsACorruptionNamingIt) {
  std::vector<Batch> batches;
  batches.push_back(make_batch(numbered(3, 1), 0, 2));
  const std::string key = batches[0].parts()[0].key;
  ASSERT_TRUE(append(batches, 0, 2));
  ShardMachine machine("orders", client_->location().consensus, client_->location().blob);
  ASSERT_TRUE(machine.apply([](ShardState& s) -> Result<TransitionResult> {
    std::vector<PartRef> parts = s.batches[0].parts.get();
    parts[0].bytes -= 1;
    s.batches[0].parts = PartList(std::move(parts));
    return TransitionResult::kWrite;
  }));
  auto snapshot = read_snapshot(*shard_, 1);
  ASSERT_FALSE(snapshot);
  EXPECT_EQ(snapshot.error().kind, ErrorKind::kCorruption);
  EXPECT_NE(snapshot.error().message.find(key), std::string::npos);
  EXPECT_NE(snapshot.error().message.find("payload bytes but the shard registered"),
            std::string::npos)
      << snapshot.error().message;
}

TEST_F(ShardTest, CorruptPartIsAnErrorNamingIt) {
  blob_parts_only();  // its blob object is corrupted (an inline part: the next test)
  std::vector<Batch> batches;
  batches.push_back(make_batch(numbered(50, 1), 0, 2));
  std::string key = batches[0].parts()[0].key;
  ASSERT_TRUE(append(batches, 0, 2));
  std::string bytes = **blob_->get(key);
  bytes[bytes.size() / 2] ^= 0x5a;
  ASSERT_TRUE(blob_->set(key, bytes));
  auto snapshot = read_snapshot(*shard_, 1);
  ASSERT_FALSE(snapshot);
  EXPECT_EQ(snapshot.error().kind, ErrorKind::kCorruption);
  EXPECT_NE(snapshot.error().message.find(key), std::string::npos);
}

// An inline part's bytes pass the same checks as a blob object's: a flipped
// byte is a Corruption naming the part, never a wrong answer.
TEST_F(ShardTest, CorruptInlinePartIsAnErrorNamingIt) {
  std::vector<Batch> batches;
  batches.push_back(make_batch(numbered(50, 1), 0, 2));
  ASSERT_TRUE(batches[0].parts()[0].is_inline());
  const std::string key = batches[0].parts()[0].key;
  ASSERT_TRUE(append(batches, 0, 2));
  ShardMachine machine("orders", client_->location().consensus, client_->location().blob);
  ASSERT_TRUE(machine.apply([](ShardState& s) -> Result<TransitionResult> {
    std::vector<PartRef> parts = s.batches[0].parts.get();
    std::string bytes = *parts[0].data;
    bytes[bytes.size() / 2] ^= 0x5a;
    parts[0].data = std::make_shared<const std::string>(std::move(bytes));
    s.batches[0].parts = PartList(std::move(parts));
    return TransitionResult::kWrite;
  }));
  auto fresh = *(*Client::open(client_->location(), client_->options()))->open_shard("orders");
  auto snapshot = read_snapshot(*fresh, 1);
  ASSERT_FALSE(snapshot);
  EXPECT_EQ(snapshot.error().kind, ErrorKind::kCorruption);
  EXPECT_NE(snapshot.error().message.find(key), std::string::npos) << snapshot.error().message;
}

TEST_F(ShardTest, ListenEmitsInTimeOrderWithProgress) {
  std::vector<Update> first, second;
  for (int i = 0; i < 200; ++i) {
    first.push_back(Update{"k" + std::to_string(i % 17), std::to_string(i), Time(i % 5), 1});
    second.push_back(Update{"q" + std::to_string(i % 13), std::to_string(i), Time(5 + i % 3), 1});
  }
  std::vector<Batch> a, b;
  a.push_back(make_batch(first, 0, 5));
  ASSERT_TRUE(append(a, 0, 5));
  b.push_back(make_batch(second, 5, 10));
  ASSERT_TRUE(append(b, 5, 10));

  for (std::uint64_t buffer : {std::uint64_t{1} << 20, std::uint64_t{600}}) {
    ClientOptions options = client_->options();
    options.listen_buffer_bytes = buffer;  // 600 bytes forces split passes
    auto client = *Client::open(client_->location(), options);
    auto shard = *client->open_shard("orders");
    auto listener = shard->listen(1, 9);
    ASSERT_TRUE(listener) << listener.error().to_string();
    auto out = read_listen(**listener);
    ASSERT_TRUE(out) << out.error().to_string();
    std::vector<Update> expected;
    for (const auto& u : first)
      if (u.time > 1) expected.push_back(u);
    for (const auto& u : second)
      if (u.time < 9) expected.push_back(u);
    consolidate(expected);
    std::vector<Update> got = out->updates;
    EXPECT_TRUE(std::is_sorted(got.begin(), got.end(),
                               [](const Update& x, const Update& y) { return x.time < y.time; }));
    consolidate(got);
    EXPECT_EQ(got, expected) << "buffer " << buffer;
    ASSERT_FALSE(out->progress.empty());
    EXPECT_EQ(out->progress.back(), Frontier::at(9));
  }
}

// --- A listen over a batch larger than its buffer ----------------------------

// A listen's events in order, one line each: "TIME KEY VALUE DIFF" for an
// update, "progress P" for a progress.
Result<std::vector<std::string>> listen_lines(Listener& listener) {
  std::vector<std::string> out;
  for (;;) {
    TM_ASSIGN(auto event, listener.next());
    if (!event) break;
    if (event->kind == ListenEvent::Kind::kProgress) {
      out.push_back("progress " + event->progress.to_string());
    } else {
      out.push_back(std::to_string(event->time) + " " + std::string(event->key) + " " +
                    std::string(event->value) + " " + std::to_string(event->diff));
    }
  }
  return out;
}

class ListenSortTest : public ShardTest {
 protected:
  void SetUp() override {
    ShardTest::SetUp();
    std::string path =
        (std::filesystem::temp_directory_path() / "tidemark-listen-sort-XXXXXX").string();
    ASSERT_NE(::mkdtemp(path.data()), nullptr);
    dir_ = path;
    // Parts of 16 KiB: the batch below is a few loose parts, so equal
    // updates in different parts meet only in the listen's merge.
    ClientOptions options = client_->options();
    options.part_target_bytes = 16 << 10;
    reopen(options);
    append_wide_batches();
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  // One batch [0, 50) of about 4,000 updates over 49 times, with repeats
  // of one (key, value, time) in other parts (cancelling ones too), a sum
  // past i64, and one update of 2,000 bytes; then a batch [50, 60).
  void append_wide_batches() {
    std::vector<Update> updates;
    for (int i = 0; i < 3000; ++i) {
      // Values of several lengths, so that runs end at varying places.
      updates.push_back(Update{"k" + std::to_string(i % 300),
                               "v" + std::to_string(i % 7) + std::string(i % 11, '.'),
                               Time(1 + i % 49), 1});
    }
    updates.push_back(Update{"max", "", 5, INT64_MAX});
    updates.push_back(Update{"big", std::string(2000, 'b'), 20, 1});
    for (int i = 0; i < 3000; i += 5) {
      Update u = updates[i];
      u.diff = i % 2 == 0 ? -1 : 1;  // cancels, or makes a 2
      updates.push_back(u);
      if (i % 3 == 0) updates.push_back(u);  // makes a -1, or a 3
    }
    updates.push_back(Update{"max", "", 5, INT64_MAX});
    // Through a builder, which cuts a part every 16 KiB in the order given
    // (a batch made from a vector is consolidated whole).
    BatchBuilder builder = writer_->builder(Frontier::at(0));
    for (const Update& u : updates) ASSERT_TRUE(builder.add(u.key, u.value, u.time, u.diff));
    auto built = builder.finish(Frontier::at(50));
    ASSERT_TRUE(built) << built.error().to_string();
    std::vector<Batch> batches;
    batches.push_back(std::move(*built));
    ASSERT_GT(batches[0].parts().size(), 1u);
    ASSERT_LE(batches[0].parts().size(), BatchBuilder::kMaxLooseParts);
    ASSERT_TRUE(append(batches, 0, 50));
    std::vector<Update> second = numbered(30, 55, "q");
    batches.clear();
    batches.push_back(make_batch(second, 50, 60));
    ASSERT_TRUE(append(batches, 50, 60));

    updates.insert(updates.end(), second.begin(), second.end());
    std::erase_if(updates, [](const Update& u) { return u.time == 0; });  // listen --from 0
    consolidate(updates);
    std::stable_sort(updates.begin(), updates.end(),
                     [](const Update& a, const Update& b) { return a.time < b.time; });
    for (const Update& u : updates) {
      expected_.push_back(std::to_string(u.time) + " " + u.key + " " + u.value + " " +
                          std::to_string(u.diff));
    }
    expected_.push_back("progress 60");
  }

  // A shard handle whose listens have this buffer and scratch directory.
  std::shared_ptr<Shard> open_with(std::uint64_t listen_buffer_bytes, std::string scratch) {
    ClientOptions options = client_->options();
    options.listen_buffer_bytes = listen_buffer_bytes;
    options.scratch_directory = std::move(scratch);
    auto client = *Client::open(client_->location(), options);
    return *client->open_shard("orders");
  }

  // Files this process has open in dir_.
  std::size_t open_scratch_files() const {
    std::size_t n = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
      std::error_code error;
      const std::string target = std::filesystem::read_symlink(entry.path(), error).string();
      if (!error && target.starts_with(dir_ + "/")) ++n;
    }
    return n;
  }

  std::string dir_;
  std::vector<std::string> expected_;
};

// A 600-byte buffer sorts the batch in hundreds of spilled runs, merged 64
// at a time and then once more: the events are exactly those of a buffer
// that holds it all (and of consolidating it whole and sorting it by time).
TEST_F(ListenSortTest, ATinyBufferGivesTheSameEventsAsAHugeOne) {
  for (std::uint64_t buffer : {std::uint64_t{1} << 30, std::uint64_t{600}}) {
    auto listener = open_with(buffer, dir_)->listen(0, 60);
    ASSERT_TRUE(listener) << listener.error().to_string();
    auto lines = listen_lines(**listener);
    ASSERT_TRUE(lines) << lines.error().to_string();
    EXPECT_EQ(*lines, expected_) << "buffer " << buffer;
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

// Scratch files have no name, and close with the listener.
TEST_F(ListenSortTest, ScratchFilesGoWithTheListener) {
  auto listener = open_with(600, dir_)->listen(0, 60);
  ASSERT_TRUE(listener) << listener.error().to_string();
  auto first = (*listener)->next();
  ASSERT_TRUE(first && *first) << (first ? "" : first.error().to_string());
  EXPECT_GT(open_scratch_files(), 0u);
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
  listener->reset();
  EXPECT_EQ(open_scratch_files(), 0u);
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

// A scratch directory that cannot be made fails the listen with an error
// naming it, before any event; a listen whose buffer holds the batch never
// needs it.
TEST_F(ListenSortTest, AnUnwritableScratchDirectoryIsAnErrorNamingIt) {
  std::ofstream(dir_ + "/file") << "not a directory\n";
  const std::string scratch = dir_ + "/file/scratch";
  auto listener = open_with(600, scratch)->listen(0, 60);
  ASSERT_TRUE(listener) << listener.error().to_string();
  auto event = (*listener)->next();
  ASSERT_FALSE(event);
  EXPECT_EQ(event.error().kind, ErrorKind::kDeterminate);
  EXPECT_NE(event.error().message.find(scratch), std::string::npos) << event.error().message;

  auto roomy = open_with(1 << 20, scratch)->listen(0, 60);
  ASSERT_TRUE(roomy) << roomy.error().to_string();
  auto lines = listen_lines(**roomy);
  ASSERT_TRUE(lines) << lines.error().to_string();
  EXPECT_EQ(*lines, expected_);
}

// A scratch write that fails (past RLIMIT_FSIZE here, as on a full disk)
// fails the poll with an error naming the directory; once writes work
// again the same listener reads that window again and goes on exactly.
TEST_F(ListenSortTest, AFailedScratchWriteFailsThePollAndTheListenGoesOnExactly) {
  auto listener = open_with(600, dir_)->listen(0, 60);
  ASSERT_TRUE(listener) << listener.error().to_string();
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* previous = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 4 << 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  auto failed = (*listener)->poll();
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().kind, ErrorKind::kDeterminate);
  EXPECT_NE(failed.error().message.find(dir_), std::string::npos) << failed.error().message;
  auto lines = listen_lines(**listener);
  ASSERT_TRUE(lines) << lines.error().to_string();
  EXPECT_EQ(*lines, expected_);
}

TEST_F(ShardTest, ListenWaitsForNewAppends) {
  auto listener = shard_->listen(0, 4);
  ASSERT_TRUE(listener);
  auto nothing = (*listener)->poll();
  ASSERT_TRUE(nothing);
  EXPECT_FALSE(nothing->has_value());
  std::thread appender([&] {
    auto writer = *shard_->open_writer();
    for (Time t = 0; t < 4; ++t) {
      std::vector<Batch> batches;
      batches.push_back(*writer->batch(numbered(2, t, "t" + std::to_string(t)), Frontier::at(t),
                                       Frontier::at(t + 1)));
      ASSERT_TRUE(writer->compare_and_append(batches, Frontier::at(t), Frontier::at(t + 1)));
    }
  });
  auto out = read_listen(**listener);
  appender.join();
  ASSERT_TRUE(out);
  EXPECT_EQ(out->updates.size(), 6u);  // times 1, 2, 3 (from 0 excludes time 0)
  EXPECT_EQ(out->progress.back(), Frontier::at(4));
  EXPECT_TRUE(std::is_sorted(out->progress.begin(), out->progress.end()));
}

// A consumer that stops after any progress line P and listens again at
// ListenStart::at_progress(P) gets exactly the rest of the stream: nothing
// skipped (time P included, and time 0 from progress 0), nothing twice.
TEST_F(ShardTest, AListenResumedAtAnyProgressGoesOnExactly) {
  struct Line {
    std::optional<Update> update;
    Frontier progress;
  };
  auto listener = *shard_->listen(ListenStart::at_progress(Frontier::at(0)), 40);
  std::vector<Line> stream;
  auto drain_until = [&](Frontier upper) {
    for (;;) {
      auto event = listener->next();
      ASSERT_TRUE(event) << event.error().to_string();
      ASSERT_TRUE(event->has_value());
      if ((*event)->kind == ListenEvent::Kind::kProgress) {
        stream.push_back(Line{std::nullopt, (*event)->progress});
        if (!((*event)->progress < upper)) return;
      } else {
        const ListenEvent& e = **event;
        stream.push_back(
            Line{Update{std::string(e.key), std::string(e.value), e.time, e.diff}, Frontier()});
      }
    }
  };
  // Batches over one time, several times, none (an empty batch), and
  // updates that cancel within a batch, each seen to its progress before
  // the next is appended, so the stream has a progress line per append.
  Time lower = 0;
  for (Time width : {1, 3, 1, 5, 2, 1, 4, 6, 1, 2, 3, 11}) {
    std::vector<Update> updates;
    for (Time t = lower; t < lower + width; ++t) {
      if (t % 7 == 3) continue;  // times with nothing at them
      for (int i = 0; i < 3; ++i) {
        updates.push_back(Update{"k" + std::to_string((t + i) % 4), std::to_string(i), t, 1});
      }
      if (t % 5 == 2) updates.push_back(Update{"k0", "0", t, -1});
    }
    std::vector<Batch> batches;
    batches.push_back(make_batch(updates, lower, lower + width));
    ASSERT_TRUE(append(batches, lower, lower + width));
    lower += width;
    drain_until(Frontier::at(lower));
  }
  ASSERT_EQ(lower, 40u);
  auto end = listener->next();
  ASSERT_TRUE(end);
  EXPECT_FALSE(end->has_value());
  ASSERT_TRUE(stream.front().update);
  EXPECT_EQ(stream.front().update->time, 0u);  // progress 0 starts at time 0

  std::size_t resumed = 0;
  for (std::size_t i = 0; i < stream.size(); ++i) {
    if (stream[i].update) continue;
    std::vector<Update> expected;
    for (std::size_t j = i + 1; j < stream.size(); ++j) {
      if (stream[j].update) expected.push_back(*stream[j].update);
    }
    auto again = shard_->listen(ListenStart::at_progress(stream[i].progress), 40);
    ASSERT_TRUE(again) << again.error().to_string();
    auto out = read_listen(**again);
    ASSERT_TRUE(out) << out.error().to_string();
    EXPECT_EQ(out->updates, expected) << "resumed at progress " << stream[i].progress.to_string();
    if (stream[i].progress < Frontier::at(40)) {
      ASSERT_FALSE(out->progress.empty());
      EXPECT_LT(stream[i].progress, out->progress.front());  // no progress line twice
      EXPECT_EQ(out->progress.back(), Frontier::at(40));
    } else {
      EXPECT_TRUE(out->progress.empty());
    }
    ++resumed;
  }
  EXPECT_EQ(resumed, 12u);

  // The stream's last progress of a closed shard: an empty listen.
  auto closed = shard_->listen(ListenStart::at_progress(Frontier::closed()));
  ASSERT_TRUE(closed);
  auto none = (*closed)->next();
  ASSERT_TRUE(none);
  EXPECT_FALSE(none->has_value());
}

// Resuming at P reads times >= P, exact only while the since has not
// passed P - 1: compaction moves what is below the since up to it.
TEST_F(ShardTest, AListenResumedBelowTheSinceIsRefused) {
  std::vector<Batch> batches;
  batches.push_back(make_batch(numbered(5, 3), 0, 10));
  ASSERT_TRUE(append(batches, 0, 10));
  auto sink = *shard_->open_critical_reader("sink-a");
  ASSERT_TRUE(sink->downgrade_since(Frontier::at(6)));
  for (Time refused : {0, 5, 6}) {
    auto listener = shard_->listen(ListenStart::at_progress(Frontier::at(refused)), 10);
    ASSERT_FALSE(listener) << refused;
    EXPECT_EQ(listener.error().kind, ErrorKind::kSinceViolation);
    EXPECT_NE(listener.error().message.find("progress " + std::to_string(refused)),
              std::string::npos)
        << listener.error().message;
  }
  EXPECT_EQ(shard_->listen(5, 10).error().kind, ErrorKind::kSinceViolation);
  EXPECT_TRUE(shard_->listen(ListenStart::at_progress(Frontier::at(7)), 10));
  EXPECT_TRUE(shard_->listen(6, 10));  // the same start, spelled `from`
}

// --- A listen with its snapshot ----------------------------------------------

// listen_snapshot: the consolidated snapshot at as_of as updates at as_of,
// progress as_of + 1, then the changes after it. Summed up to any progress
// line P the stream is the snapshot at P - 1: nothing missing between the
// two halves, nothing twice. Appends made while it runs are part of it.
TEST_F(ShardTest, AListenWithItsSnapshotIsTheSnapshotThenEveryChangeAfterIt) {
  std::vector<Update> all;
  auto append_times = [&](Time lower, Time upper) {
    std::vector<Update> updates;
    for (Time t = lower; t < upper; ++t) {
      for (int i = 0; i < 4; ++i) {
        updates.push_back(Update{"k" + std::to_string((t + i) % 6), std::to_string(i % 2), t, 1});
      }
      if (t % 3 == 1) updates.push_back(Update{"k" + std::to_string(t % 6), "1", t, -1});
    }
    all.insert(all.end(), updates.begin(), updates.end());
    std::vector<Batch> batches;
    batches.push_back(make_batch(updates, lower, upper));
    ASSERT_TRUE(append(batches, lower, upper));
  };
  append_times(0, 4);
  append_times(4, 10);
  Time upper = 10;
  for (std::optional<Time> as_of : {std::optional<Time>(0), std::optional<Time>(3),
                                    std::optional<Time>(12), std::optional<Time>()}) {
    SCOPED_TRACE(as_of ? std::to_string(*as_of) : "the latest");
    auto opened = shard_->listen_snapshot(as_of, upper + 5);
    ASSERT_TRUE(opened) << opened.error().to_string();
    const Time expected_as_of = as_of.value_or(upper - 1);
    ASSERT_EQ(opened->as_of, std::optional<Time>(expected_as_of));
    // More appends after it opened, read by its changes.
    std::thread appender([&] { append_times(upper, upper + 5); });
    auto out = read_listen(*opened->listener);
    appender.join();
    ASSERT_TRUE(out) << out.error().to_string();

    // The snapshot first: consolidated rows at as_of, sorted.
    const Collection snapshot = model_at(all, expected_as_of);
    ASSERT_GE(out->updates.size(), snapshot.size());
    Collection got;
    for (std::size_t i = 0; i < snapshot.size(); ++i) {
      const Update& u = out->updates[i];
      EXPECT_EQ(u.time, expected_as_of);
      got[{u.key, u.value}] += u.diff;
    }
    EXPECT_EQ(got, snapshot);
    // Then every update after as_of, in time order, none at or below it.
    std::vector<Update> changes(out->updates.begin() + snapshot.size(), out->updates.end());
    std::vector<Update> expected_changes;
    for (const Update& u : all) {
      if (u.time > expected_as_of && u.time < upper + 5) expected_changes.push_back(u);
    }
    consolidate(expected_changes);
    EXPECT_TRUE(std::is_sorted(changes.begin(), changes.end(),
                               [](const Update& x, const Update& y) { return x.time < y.time; }));
    consolidate(changes);
    EXPECT_EQ(changes, expected_changes);
    // Progress: as_of + 1 first, rising, never twice, ending at until.
    ASSERT_FALSE(out->progress.empty());
    EXPECT_EQ(out->progress.front(), Frontier::at(expected_as_of + 1));
    for (std::size_t i = 1; i < out->progress.size(); ++i) {
      EXPECT_LT(out->progress[i - 1], out->progress[i]);
    }
    EXPECT_EQ(out->progress.back(), Frontier::at(upper + 5));
    // Everything up to the last progress sums to the snapshot there.
    Collection summed;
    for (const Update& u : out->updates) summed[{u.key, u.value}] += u.diff;
    std::erase_if(summed, [](const auto& entry) { return entry.second == 0; });
    EXPECT_EQ(summed, model_at(all, upper + 4));
    upper += 5;
  }
}

TEST_F(ShardTest, AListenWithItsSnapshotRefusesWhatItCannotReadExactly) {
  // An empty shard: no complete time, so an empty snapshot and every
  // change from time 0.
  auto empty = shard_->listen_snapshot(std::nullopt, 2);
  ASSERT_TRUE(empty) << empty.error().to_string();
  EXPECT_FALSE(empty->as_of.has_value());
  std::vector<Batch> batches;
  batches.push_back(make_batch(numbered(3, 0), 0, 2));
  ASSERT_TRUE(append(batches, 0, 2));
  auto out = read_listen(*empty->listener);
  ASSERT_TRUE(out) << out.error().to_string();
  EXPECT_EQ(out->updates.size(), 3u);
  EXPECT_EQ(out->progress, std::vector<Frontier>{Frontier::at(2)});
  empty->listener.reset();  // its reader's hold goes with it

  // Not final yet; below the since; an until not after as_of.
  auto early = shard_->listen_snapshot(2);
  ASSERT_FALSE(early);
  EXPECT_EQ(early.error().kind, ErrorKind::kNotReady);
  auto sink = *shard_->open_critical_reader("sink-a");
  ASSERT_TRUE(sink->downgrade_since(Frontier::at(1)));
  auto below = shard_->listen_snapshot(0);
  ASSERT_FALSE(below);
  EXPECT_EQ(below.error().kind, ErrorKind::kSinceViolation);
  auto until = shard_->listen_snapshot(1, 1);
  ASSERT_FALSE(until);
  EXPECT_EQ(until.error().kind, ErrorKind::kInvalidUsage);

  // as_of 1 until 2: the snapshot and its progress line, then done.
  auto at_one = shard_->listen_snapshot(1, 2);
  ASSERT_TRUE(at_one) << at_one.error().to_string();
  auto lines = read_listen(*at_one->listener);
  ASSERT_TRUE(lines);
  EXPECT_EQ(lines->updates.size(), 3u);
  EXPECT_EQ(lines->progress, std::vector<Frontier>{Frontier::at(2)});

  // A closed shard: the whole snapshot, then progress null and the end.
  ASSERT_TRUE(writer_->compare_and_append({}, Frontier::at(2), Frontier::closed()));
  auto closed = shard_->listen_snapshot();
  ASSERT_TRUE(closed) << closed.error().to_string();
  auto rest = read_listen(*closed->listener);
  ASSERT_TRUE(rest);
  EXPECT_EQ(rest->updates.size(), 3u);
  EXPECT_EQ(rest->progress, std::vector<Frontier>{Frontier::closed()});
}

// --- The listens of a shard share one reader -----------------------------------

// The listens of a shard in one process are one reader entry in its state
// (every commit writes the readers), registered by the first and dropped
// with the last. Its hold is what each listen's own would have been: the
// since they found, kept while any of them runs, whatever other holds do.
TEST_F(ShardTest, TheListensOfAShardShareOneReaderThatHoldsTheSinceTheyFound) {
  std::vector<Update> all;
  for (Time t = 0; t < 10; ++t) {
    std::vector<Update> updates = numbered(3, t, "t" + std::to_string(t) + "-");
    all.insert(all.end(), updates.begin(), updates.end());
    std::vector<Batch> batches;
    batches.push_back(make_batch(updates, t, t + 1));
    ASSERT_TRUE(append(batches, t, t + 1));
  }
  auto inspect = [&] {
    auto info = shard_->inspect();
    EXPECT_TRUE(info) << info.error().to_string();
    return info ? *info : ShardInfo{};
  };
  auto sink = *shard_->open_critical_reader("sink-a");
  ASSERT_TRUE(sink->downgrade_since(Frontier::at(2)));
  EXPECT_EQ(inspect().since, Frontier::at(2));
  std::vector<std::unique_ptr<Listener>> listens;
  for (Time from : {2, 4, 7}) {
    auto listen = shard_->listen(from, 20);
    ASSERT_TRUE(listen) << listen.error().to_string();
    listens.push_back(std::move(*listen));
  }
  for (int i = 0; i < 100; ++i) {
    auto listen = shard_->listen(5, 20);
    ASSERT_TRUE(listen) << listen.error().to_string();
    listens.push_back(std::move(*listen));
  }
  EXPECT_EQ(inspect().readers.size(), 2u);  // the sink's and the listens' one
  // The sink moves on; the listens hold the since where they found it.
  ASSERT_TRUE(sink->downgrade_since(Frontier::at(6)));
  EXPECT_EQ(inspect().since, Frontier::at(2));
  EXPECT_EQ(shard_->listen(1, 20).error().kind, ErrorKind::kSinceViolation);
  EXPECT_EQ(inspect().readers.size(), 2u);  // a refused listen leaves no reader
  // Reads stay exact through a compaction.
  ASSERT_TRUE(shard_->compact());
  std::vector<Batch> more;
  more.push_back(make_batch(numbered(2, 10, "t10-"), 10, 20));
  ASSERT_TRUE(append(more, 10, 20));
  auto rest = read_listen(*listens[1]);  // from 4
  ASSERT_TRUE(rest) << rest.error().to_string();
  std::vector<Update> expected;
  for (const Update& u : all) {
    if (u.time > 4) expected.push_back(u);
  }
  for (const Update& u : numbered(2, 10, "t10-")) expected.push_back(u);
  consolidate(expected);
  std::vector<Update> got = rest->updates;
  consolidate(got);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(rest->progress.back(), Frontier::at(20));
  // Once the last listen ends the shared reader goes, and the since
  // follows the remaining hold.
  listens.pop_back();
  EXPECT_EQ(inspect().readers.size(), 2u);
  listens.clear();
  ShardInfo after = inspect();
  EXPECT_EQ(after.readers.size(), 1u);
  EXPECT_EQ(after.since, Frontier::at(6));
  // A refused listen with no other listen running leaves no reader either.
  EXPECT_EQ(shard_->listen(3, 20).error().kind, ErrorKind::kSinceViolation);
  EXPECT_EQ(inspect().readers.size(), 1u);
  // A listen now registers anew, at the since it finds.
  auto again = shard_->listen(6, 20);
  ASSERT_TRUE(again) << again.error().to_string();
  EXPECT_EQ(inspect().readers.size(), 2u);
  again->reset();
  EXPECT_EQ(inspect().readers.size(), 1u);
}

// --- Reads ride out faults ---------------------------------------------------

class FaultyReadsTest : public ShardTest {
 protected:
  void SetUp() override {
    ShardTest::SetUp();
    blob_parts_only();  // reads of blob parts under faults
    // Ten batches of several parts and blocks each.
    for (Time t = 0; t < 10; ++t) {
      std::vector<Update> updates = numbered(150, t, "k" + std::to_string(t % 3) + "-");
      model_.insert(model_.end(), updates.begin(), updates.end());
      std::vector<Batch> batches;
      batches.push_back(make_batch(updates, t, t + 1));
      ASSERT_TRUE(append(batches, t, t + 1));
    }
    faulty_blob_ = std::make_shared<FaultyBlob>(blob_);
    faulty_consensus_ = std::make_shared<FaultyConsensus>(consensus_);
    ClientOptions options = client_->options();
    options.read_retry = RetryPolicy{std::chrono::milliseconds(1), std::chrono::milliseconds(5), 0,
                                     std::chrono::seconds(20)};
    options.listen_buffer_bytes = 2000;  // windows split: more reads
    faulty_client_ = *Client::open(Location{faulty_blob_, faulty_consensus_}, options);
    faulty_shard_ = *faulty_client_->open_shard("orders");
  }

  void set_faults(double blob_rate, double consensus_rate, std::uint64_t seed) {
    faulty_blob_->set_config(FaultConfig{.determinate_rate = blob_rate, .seed = seed});
    faulty_consensus_->set_config(FaultConfig{.determinate_rate = consensus_rate, .seed = seed});
  }

  std::vector<Update> model_;
  std::shared_ptr<FaultyBlob> faulty_blob_;
  std::shared_ptr<FaultyConsensus> faulty_consensus_;
  std::shared_ptr<Client> faulty_client_;
  std::shared_ptr<Shard> faulty_shard_;
};

TEST_F(FaultyReadsTest, SnapshotsAndListensAreExactUnderFaults) {
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    set_faults(0.3, 0.3, seed);
    auto snapshot = testing::read_snapshot(*faulty_shard_, 9);
    ASSERT_TRUE(snapshot) << snapshot.error().to_string();
    EXPECT_EQ(*snapshot, testing::model_at(model_, 9));

    auto listener = faulty_shard_->listen(2, 10);
    ASSERT_TRUE(listener) << listener.error().to_string();
    auto out = read_listen(**listener);
    ASSERT_TRUE(out) << out.error().to_string();
    std::vector<Update> expected;
    for (const Update& u : model_) {
      if (u.time > 2) expected.push_back(u);
    }
    consolidate(expected);
    std::vector<Update> got = out->updates;
    EXPECT_TRUE(std::is_sorted(got.begin(), got.end(),
                               [](const Update& x, const Update& y) { return x.time < y.time; }));
    consolidate(got);
    EXPECT_EQ(got, expected) << "seed " << seed;
    EXPECT_EQ(out->progress.back(), Frontier::at(10));
  }
  EXPECT_GT(faulty_blob_->injected_determinate(), 10u);
}

// A stream that meets an outage mid-way goes on where it was: every row
// once, none missing. (Parts here are larger than the 64 KiB tail a reader
// fetches on open, so blocks load as the stream goes. Read-ahead is off:
// it fetches these small parts ahead, and whether any read is left to meet
// the outage then depends on timing; under ThreadSanitizer none was. Where
// read-ahead is on, a span that fails is forgotten and the block read that
// needs it goes to the blob as here: ReadAheadTest's
// AFailingReadFailsWhereTheSequentialReadFails.)
TEST_F(FaultyReadsTest, AnOutageMidStreamResumesWhereItWas) {
  MergeCursor::set_read_ahead_for_testing(false);
  struct Reset {
    ~Reset() { MergeCursor::reset_read_ahead_for_testing(); }
  } reset;
  ClientOptions options = client_->options();
  options.part_target_bytes = 1 << 20;
  options.block_bytes = 4096;
  auto writer_client = *Client::open(Location{blob_, consensus_}, options);
  ASSERT_TRUE(writer_client->create_shard("big"));
  auto big = *writer_client->open_shard("big");
  auto writer = *big->open_writer();
  std::mt19937_64 rng(5);
  std::vector<Update> all;
  for (Time t = 0; t < 3; ++t) {
    std::vector<Update> updates;
    for (int i = 0; i < 6000; ++i) {
      updates.push_back(Update{"k" + std::to_string(rng() % 100000),
                               "\"" + std::to_string(rng()) + std::to_string(rng()) + "\"", t, 1});
    }
    all.insert(all.end(), updates.begin(), updates.end());
    std::vector<Batch> batches;
    batches.push_back(*writer->batch(updates, Frontier::at(t), Frontier::at(t + 1)));
    ASSERT_TRUE(writer->compare_and_append(batches, Frontier::at(t), Frontier::at(t + 1)));
  }
  auto shard = *faulty_client_->open_shard("big");
  auto cursor = shard->snapshot(2);
  ASSERT_TRUE(cursor);
  testing::Collection rows;
  int read = 0;
  std::thread outage;
  for (;;) {
    if (read == 100) {
      set_faults(1, 1, 1);  // everything fails for 300 ms
      outage = std::thread([this] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        set_faults(0, 0, 1);
      });
    }
    auto row = cursor->next();
    ASSERT_TRUE(row) << row.error().to_string();
    if (!*row) break;
    ++read;
    auto [it, fresh] =
        rows.emplace(std::pair{std::string((*row)->key), std::string((*row)->value)}, (*row)->diff);
    EXPECT_TRUE(fresh) << "row twice: " << it->first.first;
  }
  outage.join();
  EXPECT_EQ(rows, testing::model_at(all, 2));
  EXPECT_GT(faulty_blob_->injected_determinate(), 0u) << "the outage met no read";
}

// Past the deadline a read gives up with the last error, saying so.
TEST_F(FaultyReadsTest, AReadGivesUpAtItsDeadline) {
  ClientOptions options = faulty_client_->options();
  options.read_retry.deadline = std::chrono::milliseconds(200);
  auto client = *Client::open(faulty_client_->location(), options);
  auto shard = *client->open_shard("orders");
  set_faults(1, 0, 1);
  const auto started = std::chrono::steady_clock::now();
  auto snapshot = testing::read_snapshot(*shard, 9);
  ASSERT_FALSE(snapshot);
  EXPECT_EQ(snapshot.error().kind, ErrorKind::kDeterminate);
  EXPECT_NE(snapshot.error().message.find("gave up after"), std::string::npos)
      << snapshot.error().message;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
}

// --- ShardMachine's riders (machine.h) ---------------------------------------
// Background transitions committed in the next carrying apply's write,
// rolled back out of it when they fail, and applying themselves when it
// fails or never comes.

// Registers writer `id`: one visible, idempotent change per transition.
Transition add_writer(std::string id) {
  return [id = std::move(id)](ShardState& s) -> Result<TransitionResult> {
    const std::uint64_t now = wall_clock_millis();
    register_writer(s, id, now + 600'000, now, "test");
    return TransitionResult::kWrite;
  };
}

class MachineRidersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    consensus_ = std::make_shared<ApplyThenFail>(std::make_shared<MemConsensus>());
    blob_ = std::make_shared<MemBlob>();
    machine_ = std::make_unique<ShardMachine>("orders", consensus_, blob_);
    // A carrying apply just ran: riders wait for the next.
    ASSERT_TRUE(machine_->apply(add_writer("first"), Carry::kRiders));
  }

  // Starts apply_riding(transition) on a thread of its own, and returns
  // once it waits in the queue.
  std::future<Result<StatePtr>> ride(Transition transition) {
    auto ridden = std::async(std::launch::async, [this, transition = std::move(transition)] {
      return machine_->apply_riding(transition);
    });
    while (machine_->riders_waiting() == 0)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    return ridden;
  }

  StatePtr head() {
    ShardMachine reader("orders", consensus_, blob_);
    auto state = reader.fetch();
    EXPECT_TRUE(state);
    return state ? *state : nullptr;
  }

  std::shared_ptr<ApplyThenFail> consensus_;
  std::shared_ptr<MemBlob> blob_;
  std::unique_ptr<ShardMachine> machine_;
};

TEST_F(MachineRidersTest, ARiderIsCommittedInTheNextCarryingWrite) {
  auto ridden = ride(add_writer("rider"));
  const int before = consensus_->cas_calls;
  auto carried = machine_->apply(add_writer("carrier"), Carry::kRiders);
  ASSERT_TRUE(carried);
  auto rider = ridden.get();
  ASSERT_TRUE(rider) << rider.error().to_string();
  // One consensus write for both, and the rider sees the state it landed in.
  EXPECT_EQ(consensus_->cas_calls - before, 1);
  EXPECT_EQ((*rider)->seqno, (*carried)->seqno);
  EXPECT_EQ(machine_->riders_carried(), 1u);
  StatePtr state = head();
  EXPECT_TRUE(state->writers.contains("carrier"));
  EXPECT_TRUE(state->writers.contains("rider"));
}

TEST_F(MachineRidersTest, AFailingRiderIsRolledBackAndGetsItsOwnError) {
  std::atomic<int> runs{0};
  auto ridden = ride([&](ShardState& s) -> Result<TransitionResult> {
    ++runs;
    register_writer(s, "half-done", wall_clock_millis() + 600'000, wall_clock_millis(), "test");
    return make_error(ErrorKind::kInvalidUsage, "test: this rider fails");
  });
  ASSERT_TRUE(machine_->apply(add_writer("carrier"), Carry::kRiders));
  auto rider = ridden.get();
  ASSERT_FALSE(rider);
  EXPECT_EQ(rider.error().kind, ErrorKind::kInvalidUsage);
  EXPECT_GE(runs.load(), 2);  // in the carrier, then on its own
  EXPECT_EQ(machine_->riders_carried(), 0u);
  StatePtr state = head();
  EXPECT_TRUE(state->writers.contains("carrier"));
  EXPECT_FALSE(state->writers.contains("half-done"));  // its change was rolled back
}

TEST_F(MachineRidersTest, ARiderThatChangesNothingIsNotWrittenForIt) {
  auto ridden =
      ride([](ShardState&) -> Result<TransitionResult> { return TransitionResult::kUnchanged; });
  const int before = consensus_->cas_calls;
  ASSERT_TRUE(machine_->apply(add_writer("carrier"), Carry::kRiders));
  auto rider = ridden.get();
  ASSERT_TRUE(rider);
  EXPECT_EQ(consensus_->cas_calls - before, 1);  // the carrier's write only
  EXPECT_EQ(machine_->riders_carried(), 0u);
}

// The carrier's cached state is stale: its write loses the race, the rider
// applies itself, and both changes land once.
TEST_F(MachineRidersTest, ARiderWhoseCarrierLosesARaceAppliesItself) {
  ShardMachine other("orders", consensus_, blob_);
  ASSERT_TRUE(other.apply(add_writer("elsewhere")));
  auto ridden = ride(add_writer("rider"));
  ASSERT_TRUE(machine_->apply(add_writer("carrier"), Carry::kRiders));
  auto rider = ridden.get();
  ASSERT_TRUE(rider) << rider.error().to_string();
  StatePtr state = head();
  for (const char* id : {"first", "elsewhere", "carrier", "rider"}) {
    EXPECT_TRUE(state->writers.contains(id)) << id;
  }
}

// A rider aboard a write whose outcome is unknown applies itself in doubt:
// a definite refusal afterwards (its writer is gone) may mean that write
// landed, so it is reported as indeterminate, as apply() reports its own.
TEST_F(MachineRidersTest, ARiderReleasedAfterAnIndeterminateWriteIsInDoubt) {
  std::atomic<int> runs{0};
  auto ridden = ride([&](ShardState& s) -> Result<TransitionResult> {
    if (runs++ == 0) {
      register_writer(s, "rider", wall_clock_millis() + 600'000, wall_clock_millis(), "test");
      return TransitionResult::kWrite;
    }
    return make_error(ErrorKind::kLeaseExpired, "test: the rider's writer is gone");
  });
  consensus_->fail_without_applying = 1;  // the write carrying the rider
  ASSERT_TRUE(machine_->apply(add_writer("carrier"), Carry::kRiders));
  auto rider = ridden.get();
  ASSERT_FALSE(rider);
  EXPECT_EQ(rider.error().kind, ErrorKind::kIndeterminate) << rider.error().to_string();
  EXPECT_TRUE(head()->writers.contains("carrier"));
}

TEST_F(MachineRidersTest, ARiderWithNoCarrierAppliesItself) {
  const auto started = std::chrono::steady_clock::now();
  const int before = consensus_->cas_calls;
  auto rider = machine_->apply_riding(add_writer("rider"));
  ASSERT_TRUE(rider);
  // It waited for the carrier that ran just before it, in vain.
  EXPECT_GE(std::chrono::steady_clock::now() - started, kRideWait);
  EXPECT_EQ(consensus_->cas_calls - before, 1);
  EXPECT_TRUE(head()->writers.contains("rider"));
  // No carrier within kRideWindow: the next rider does not queue at all.
  std::this_thread::sleep_for(kRideWindow);
  auto alone =
      std::async(std::launch::async, [&] { return machine_->apply_riding(add_writer("alone")); });
  ASSERT_TRUE(alone.get());
  EXPECT_EQ(machine_->riders_carried(), 0u);
  EXPECT_TRUE(head()->writers.contains("alone"));
}

// Carriers and riders on many threads: every change lands, each rider
// either carried or on its own.
TEST_F(MachineRidersTest, ConcurrentCarriersAndRidersLoseNothing) {
  constexpr int kThreads = 4, kEach = 50;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        if (!machine_->apply(add_writer("c" + std::to_string(t) + "-" + std::to_string(i)),
                             Carry::kRiders)) {
          ++failures;
        }
      }
    });
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        if (!machine_->apply_riding(
                add_writer("r" + std::to_string(t) + "-" + std::to_string(i)))) {
          ++failures;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  StatePtr state = head();
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kEach; ++i) {
      EXPECT_TRUE(state->writers.contains("c" + std::to_string(t) + "-" + std::to_string(i)));
      EXPECT_TRUE(state->writers.contains("r" + std::to_string(t) + "-" + std::to_string(i)));
    }
  }
}

}  // namespace
}  // namespace tidemark
