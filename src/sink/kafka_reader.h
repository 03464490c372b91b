// Reading Kafka topics back: a sink's progress on restart, and an audit of
// what a Kafka sink has committed (tests, the benchmark, operators).
//
// consume_topic reads every partition of a topic from its beginning to its
// high watermark as of the call, with isolation.level=read_committed,
// calling `fn` for each message in partition order (and perhaps for a few
// written after the call). Where another producer's transaction is still
// open, it waits for it to end (or times out): stopping at the last stable
// offset instead could miss a decided record behind it. A topic that does not exist has no
// messages. Memory: one message at a time plus librdkafka's fetch buffers
// (queued.max.messages.kbytes set to kFetchQueueKiB).
//
// audit_kafka_sink reads a sink's progress records first (src/sink/
// kafka_destination.h), then the data topic, and passes on only the data
// messages inside a progress record's offset ranges: the committed ones,
// even on a cluster (librdkafka's mock) that shows aborted transactions to
// read_committed consumers. It assumes the sink is its topic's only
// producer (another producer's messages inside a range would count).
// Overlapping ranges or a frontier that goes backwards are Corruption; a
// partition that no longer holds the first committed offset (retention) is
// a Determinate error, never a short count. Memory: O(transactions) ranges.
//
// Errors: an unreachable cluster or a read that does not reach the end
// within `timeout` is Determinate; `fn`'s error stops the read and is
// returned. With a `cancel` that is cancelled, each gives up within
// kCancelSliceMs with a Determinate error saying so.
//
// Thread-safety: each call uses its own consumer.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sink/kafka_destination.h"
#include "util/cancel.h"

typedef struct rd_kafka_s rd_kafka_t;

namespace tidemark {

// The partitions of `topic` as `handle`'s metadata request sees them; empty
// when the topic does not exist. (A producer's request may create the topic
// where the brokers auto-create topics.)
[[nodiscard]] Result<std::vector<std::int32_t>> topic_partitions(
    rd_kafka_t* handle, const std::string& topic, std::chrono::milliseconds timeout,
    const Cancellation* cancel = nullptr);

// A blocking librdkafka call waits at most this long at a time while it
// can be cancelled.
inline constexpr int kCancelSliceMs = 200;

// The timeout for the next slice of a wait that ends at `deadline`: at
// least 1 ms, at most kCancelSliceMs when `cancel` is set.
int slice_ms(std::chrono::steady_clock::time_point deadline, const Cancellation* cancel);

inline constexpr std::uint64_t kFetchQueueKiB = 4096;

struct KafkaMessageView {
  std::int32_t partition = 0;
  std::int64_t offset = 0;
  std::string_view key;
  std::optional<std::string_view> value;  // nullopt: a tombstone
  std::optional<std::string_view> time;   // the tidemark-time header
};

[[nodiscard]] Status consume_topic(const std::string& brokers, const std::string& topic,
                                   std::chrono::milliseconds timeout,
                                   const std::function<Status(const KafkaMessageView&)>& fn,
                                   const Cancellation* cancel = nullptr);

struct KafkaSinkAudit {
  std::optional<Frontier> frontier;  // the last committed progress
  // The last committed part of a snapshot still in progress (frontier is
  // then nullopt).
  std::optional<SnapshotPosition> snapshot;
  std::uint64_t transactions = 0;  // progress records of this sink
  std::uint64_t committed = 0;     // data messages inside their ranges
  std::uint64_t outside = 0;       // data messages outside every range
};

[[nodiscard]] Result<KafkaSinkAudit> audit_kafka_sink(
    const KafkaAddress& address, const std::string& sink_id, std::chrono::milliseconds timeout,
    const std::function<Status(const KafkaMessageView&)>& committed);

}  // namespace tidemark
