// Sink destination URLs: parsing, then opening.
//
//   file:///abs/dir                                  FileDestination
//   s3://bucket/prefix?endpoint=http://host:port[&region=R&part_size=S...]
//                                                    S3Destination
//   kafka://host:port[,host:port]/topic[?progress_topic=NAME]   KafkaDestination
//
// parse_sink_url checks a URL and a format without touching anything
// (InvalidUsage naming what is wrong); destination_identity names the
// place it writes, normalised, so that two URLs of one destination compare
// equal; open_sink_destination opens it for the sink `sink_name` of shard
// `shard`: the Kafka producer id is "tidemark/<shard>/<sink_name>" and its
// queue (kKafkaQueueBytes, or half the pool's capacity when that is less)
// is reserved from `pool`; an S3 destination's buffer (part_size + 64 KiB)
// is reserved from `pool` too, and its credentials come from the
// environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY). `claim` (a
// SinkClaim of this URL, sink_claim.h) is checked before every commit;
// without one the caller promises that nothing else writes the
// destination (a file destination then locks its directory itself).
// `cancel`, once cancelled, makes an S3 or Kafka destination's calls give
// up within about a second, opening included (a file's are local).
//
// Identities: file:///<absolute, lexically normal directory>;
// s3://<endpoint, scheme and host lowercased>/<bucket>[/<prefix>];
// kafka://<brokers lowercased, sorted, without repeats>/<topic> (the
// progress topic is not part of it: two sinks never share a data topic).
// One place reached by two spellings (a symlinked directory, a host name
// and its address, another bootstrap list of one cluster) has two
// identities: the flock of a file destination still sees one directory,
// but leases of the others are per spelling.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "s3/s3_client.h"
#include "sink/destination.h"
#include "sink/destination_claim.h"
#include "sink/envelope.h"
#include "sink/kafka_destination.h"
#include "tidemark/memory_pool.h"
#include "util/cancel.h"

namespace tidemark {

inline constexpr std::uint64_t kKafkaQueueBytes = 16ull << 20;
// The pool `tidemark sink run` (and its benchmark) gives one sink: the
// Kafka producer's queue, or the S3 destination's buffer, is reserved from
// it.
inline constexpr std::uint64_t kSinkPoolBytes = 64ull << 20;

struct SinkUrl {
  std::optional<std::string> directory;  // file://
  std::optional<S3Url> s3;               // s3://
  std::optional<KafkaAddress> kafka;     // kafka://
};

[[nodiscard]] Result<SinkUrl> parse_sink_url(std::string_view url, SinkFormat format);

[[nodiscard]] Result<std::string> destination_identity(const SinkUrl& url);

// The S3 endpoints and Kafka brokers that sinks created over HTTP may
// reach (`tidemark serve --allow-s3-endpoints`, `--allow-kafka-brokers`).
// An empty list allows none. Entries: "http[s]://host[:port]" for S3,
// "host[:port]" for Kafka; hosts compare case-insensitively, as spelled (a
// name and its address are two entries), and an entry without a port
// allows every port of its host. A Kafka URL is allowed when every
// bootstrap broker it names is; the cluster then sends the producer to
// the brokers it advertises, which only the cluster's configuration
// bounds. An S3 endpoint's path is not compared.
class DestinationAllowList {
 public:
  // Comma-separated entries; InvalidUsage naming a malformed one.
  [[nodiscard]] static Result<DestinationAllowList> parse(std::string_view s3_endpoints,
                                                          std::string_view kafka_brokers);

  // InvalidUsage naming the first endpoint or broker not allowed (and the
  // flag that would allow it). A file:// URL always passes: its directory
  // has its own check.
  [[nodiscard]] Status check(const SinkUrl& url) const;

  // The lists as parse() was given them (another server parses them again
  // to tell which sinks this one may run: sink/server_presence.h).
  const std::string& s3_endpoints() const { return s3_text_; }
  const std::string& kafka_brokers() const { return kafka_text_; }

 private:
  struct Host {
    std::string scheme;               // S3 only: "http" or "https"
    std::string host;                 // lowercased; an IPv6 address keeps its brackets
    std::optional<std::string> port;  // none: every port
  };
  static bool allows(const std::vector<Host>& list, const Host& wanted);
  std::vector<Host> s3_;
  std::vector<Host> kafka_;
  std::string s3_text_, kafka_text_;
};

[[nodiscard]] Result<std::unique_ptr<SinkDestination>> open_sink_destination(
    const SinkUrl& url, Envelope envelope, SinkFormat format, const std::string& shard,
    const std::string& sink_name, std::shared_ptr<MemoryPool> pool,
    std::shared_ptr<DestinationClaim> claim, std::shared_ptr<const Cancellation> cancel = nullptr,
    std::optional<std::chrono::milliseconds> pool_wait = std::nullopt,
    std::function<void(const std::string&)> on_trouble = nullptr);

}  // namespace tidemark
