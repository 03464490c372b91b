#include "sink/kafka_reader.h"

#include <librdkafka/rdkafka.h>

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "util/try.h"

namespace tidemark {
namespace {

using Clock = std::chrono::steady_clock;

struct ConsumerDeleter {
  void operator()(rd_kafka_t* handle) const {
    rd_kafka_consumer_close(handle);
    rd_kafka_destroy(handle);
  }
};
using ConsumerPtr = std::unique_ptr<rd_kafka_t, ConsumerDeleter>;

Result<ConsumerPtr> new_consumer(const std::string& brokers, bool read_committed) {
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char errstr[512];
  const std::pair<const char*, std::string> settings[] = {
      {"bootstrap.servers", brokers},
      {"group.id", "tidemark-reader"},  // required by librdkafka; nothing is committed
      {"isolation.level", read_committed ? "read_committed" : "read_uncommitted"},
      {"enable.partition.eof", "true"},
      {"enable.auto.commit", "false"},
      {"enable.auto.offset.store", "false"},
      {"queued.max.messages.kbytes", std::to_string(kFetchQueueKiB)},
      // The end of a partition is known only from a fetch response, which
      // the broker holds up to this long when there is nothing new.
      {"fetch.wait.max.ms", "50"},
  };
  for (const auto& [name, value] : settings) {
    if (rd_kafka_conf_set(conf, name, value.c_str(), errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
      rd_kafka_conf_destroy(conf);
      return invalid_usage(std::string("kafka: ") + name + ": " + errstr);
    }
  }
  rd_kafka_t* handle = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
  if (handle == nullptr) {
    rd_kafka_conf_destroy(conf);
    return invalid_usage(std::string("kafka: ") + errstr);
  }
  return ConsumerPtr(handle);
}

}  // namespace

int slice_ms(Clock::time_point deadline, const Cancellation* cancel) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  const auto most = cancel != nullptr ? std::min<long long>(left, kCancelSliceMs) : left;
  return static_cast<int>(std::clamp<long long>(most, 1, INT32_MAX));
}

Result<std::vector<std::int32_t>> topic_partitions(rd_kafka_t* consumer, const std::string& topic,
                                                   std::chrono::milliseconds timeout,
                                                   const Cancellation* cancel) {
  const std::string where = "topic " + topic;
  rd_kafka_topic_t* handle = rd_kafka_topic_new(consumer, topic.c_str(), nullptr);
  const rd_kafka_metadata_t* metadata = nullptr;
  const auto deadline = Clock::now() + timeout;
  rd_kafka_resp_err_t err;
  for (;;) {
    err = rd_kafka_metadata(consumer, 0, handle, &metadata, slice_ms(deadline, cancel));
    if (err != RD_KAFKA_RESP_ERR__TIMED_OUT || Clock::now() >= deadline) break;
    if (is_cancelled(cancel)) {
      rd_kafka_topic_destroy(handle);
      return cancelled_error("kafka: reading " + where);
    }
  }
  rd_kafka_topic_destroy(handle);
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return determinate("kafka: reading " + where + ": " + rd_kafka_err2str(err));
  }
  std::vector<std::int32_t> partitions;
  rd_kafka_resp_err_t topic_err = RD_KAFKA_RESP_ERR_NO_ERROR;
  for (int i = 0; i < metadata->topic_cnt; ++i) {
    if (topic != metadata->topics[i].topic) continue;
    topic_err = metadata->topics[i].err;
    for (int p = 0; p < metadata->topics[i].partition_cnt; ++p) {
      partitions.push_back(metadata->topics[i].partitions[p].id);
    }
  }
  rd_kafka_metadata_destroy(metadata);
  if (topic_err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) return std::vector<std::int32_t>{};
  if (topic_err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return determinate("kafka: reading " + where + ": " + rd_kafka_err2str(topic_err));
  }
  return partitions;
}

namespace {

std::optional<std::string_view> time_header(rd_kafka_message_t* message) {
  rd_kafka_headers_t* headers = nullptr;
  if (rd_kafka_message_headers(message, &headers) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return std::nullopt;
  }
  const void* value = nullptr;
  std::size_t size = 0;
  if (rd_kafka_header_get_last(headers, "tidemark-time", &value, &size) !=
      RD_KAFKA_RESP_ERR_NO_ERROR) {
    return std::nullopt;
  }
  return std::string_view(static_cast<const char*>(value), size);
}

}  // namespace

Status consume_topic(const std::string& brokers, const std::string& topic,
                     std::chrono::milliseconds timeout,
                     const std::function<Status(const KafkaMessageView&)>& fn,
                     const Cancellation* cancel) {
  const std::string where = "topic " + topic + " on " + brokers;
  TM_ASSIGN(ConsumerPtr consumer, new_consumer(brokers, true));
  TM_ASSIGN(auto partitions, topic_partitions(consumer.get(), topic, timeout, cancel));
  if (partitions.empty()) return {};

  // The end to read to: each partition's high watermark now, which a
  // read_uncommitted request reports. A read_committed consumer sees the
  // end only up to the last stable offset, before any transaction still
  // open (another producer's); reading on until the high watermark means
  // every record written before this call is seen once decided, instead of
  // stopping short of it (for a sink: a stale progress, then duplicates).
  std::map<std::int32_t, std::int64_t> end;
  {
    TM_ASSIGN(ConsumerPtr probe, new_consumer(brokers, false));
    for (std::int32_t p : partitions) {
      std::int64_t low = 0, high = 0;
      const auto deadline = Clock::now() + timeout;
      rd_kafka_resp_err_t err;
      for (;;) {
        err = rd_kafka_query_watermark_offsets(probe.get(), topic.c_str(), p, &low, &high,
                                               slice_ms(deadline, cancel));
        if (err != RD_KAFKA_RESP_ERR__TIMED_OUT || Clock::now() >= deadline) break;
        if (is_cancelled(cancel)) return cancelled_error("kafka: reading " + where);
      }
      if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        return determinate("kafka: reading " + where + ": the end of partition " +
                           std::to_string(p) + ": " + rd_kafka_err2str(err));
      }
      if (high > low) end[p] = high;  // empty partitions need no read
    }
  }
  if (end.empty()) return {};

  rd_kafka_topic_partition_list_t* list =
      rd_kafka_topic_partition_list_new(static_cast<int>(partitions.size()));
  for (std::int32_t p : partitions) {
    rd_kafka_topic_partition_list_add(list, topic.c_str(), p)->offset = RD_KAFKA_OFFSET_BEGINNING;
  }
  rd_kafka_resp_err_t err = rd_kafka_assign(consumer.get(), list);
  rd_kafka_topic_partition_list_destroy(list);
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return determinate("kafka: reading " + where + ": " + rd_kafka_err2str(err));
  }
  std::size_t at_end = 0;
  auto reached = [&](std::int32_t partition, std::int64_t next_offset) {
    auto it = end.find(partition);
    if (it != end.end() && next_offset >= it->second) {
      end.erase(it);
      ++at_end;
    }
  };
  const std::size_t to_read = end.size();
  // The deadline moves on with every message: only a stalled read times out.
  auto deadline = Clock::now() + timeout;
  while (at_end < to_read) {
    if (Clock::now() > deadline) return determinate("kafka: timed out reading " + where);
    if (is_cancelled(cancel)) return cancelled_error("kafka: reading " + where);
    rd_kafka_message_t* message = rd_kafka_consumer_poll(consumer.get(), 100);
    if (message == nullptr) continue;
    std::unique_ptr<rd_kafka_message_t, void (*)(rd_kafka_message_t*)> owned(
        message, &rd_kafka_message_destroy);
    deadline = Clock::now() + timeout;
    if (message->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
      reached(message->partition, message->offset);
      continue;
    }
    if (message->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      return determinate("kafka: reading " + where + ": " + rd_kafka_message_errstr(message));
    }
    KafkaMessageView view;
    view.partition = message->partition;
    view.offset = message->offset;
    view.key = std::string_view(static_cast<const char*>(message->key), message->key_len);
    if (message->payload != nullptr) {
      view.value = std::string_view(static_cast<const char*>(message->payload), message->len);
    }
    view.time = time_header(message);
    TM_TRY(fn(view));
    reached(message->partition, message->offset + 1);
  }
  return {};
}

Result<KafkaSinkAudit> audit_kafka_sink(
    const KafkaAddress& address, const std::string& sink_id, std::chrono::milliseconds timeout,
    const std::function<Status(const KafkaMessageView&)>& committed) {
  KafkaSinkAudit audit;
  // Committed offset ranges per data partition, in progress-record order.
  std::map<std::int32_t, std::vector<std::pair<std::int64_t, std::int64_t>>> ranges;
  TM_TRY(consume_topic(
      address.brokers, address.progress_topic, timeout, [&](const KafkaMessageView& m) -> Status {
        if (m.key != sink_id || !m.value) return {};
        TM_ASSIGN(auto record, KafkaProgressRecord::parse(*m.value));
        if (record.topic != address.topic) return {};
        if (record.snapshot) {
          // A part of a snapshot: before the snapshot is complete, each
          // further on at the same as_of.
          if (audit.frontier ||
              (audit.snapshot && (audit.snapshot->as_of != record.snapshot->as_of ||
                                  audit.snapshot->pairs >= record.snapshot->pairs))) {
            return corruption("kafka sink " + sink_id + ": a snapshot part of " +
                              std::to_string(record.snapshot->pairs) + " pairs at " +
                              std::to_string(record.snapshot->as_of) + " does not follow " +
                              (audit.frontier ? "progress " + audit.frontier->to_string()
                                              : std::to_string(audit.snapshot->pairs) + " pairs"));
          }
          audit.snapshot = record.snapshot;
        } else if (audit.frontier && !(*audit.frontier < record.frontier)) {
          return corruption("kafka sink " + sink_id + ": progress went from " +
                            audit.frontier->to_string() + " to " + record.frontier.to_string());
        }
        if (!record.snapshot) {
          audit.frontier = record.frontier;
          audit.snapshot.reset();
        }
        ++audit.transactions;
        for (const auto& range : record.offsets) {
          auto& list = ranges[range.partition];
          if (!list.empty() && range.first <= list.back().second) {
            return corruption("kafka sink " + sink_id + ": two transactions claim partition " +
                              std::to_string(range.partition) + " offset " +
                              std::to_string(range.first));
          }
          list.emplace_back(range.first, range.last);
        }
        return {};
      }));
  std::map<std::int32_t, std::size_t> cursor;  // per partition: the first range not passed
  std::map<std::int32_t, std::int64_t> first_seen;
  TM_TRY(consume_topic(address.brokers, address.topic, timeout,
                       [&](const KafkaMessageView& m) -> Status {
                         first_seen.try_emplace(m.partition, m.offset);
                         const auto it = ranges.find(m.partition);
                         bool inside = false;
                         if (it != ranges.end()) {
                           std::size_t& i = cursor[m.partition];
                           while (i < it->second.size() && it->second[i].second < m.offset) ++i;
                           inside = i < it->second.size() && it->second[i].first <= m.offset;
                         }
                         if (!inside) {
                           ++audit.outside;
                           return {};
                         }
                         ++audit.committed;
                         return committed ? committed(m) : Status{};
                       }));
  // Committed messages the topic no longer holds (retention, compaction):
  // the audit cannot vouch for them.
  for (const auto& [partition, list] : ranges) {
    const auto seen = first_seen.find(partition);
    if (seen == first_seen.end() || seen->second > list.front().first) {
      return determinate("kafka sink " + sink_id + ": partition " + std::to_string(partition) +
                         " of " + address.topic + " no longer holds committed offset " +
                         std::to_string(list.front().first) +
                         " (deleted by retention?): the audit is incomplete");
    }
  }
  return audit;
}

}  // namespace tidemark
