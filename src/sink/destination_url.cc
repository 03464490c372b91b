#include "sink/destination_url.h"

#include <algorithm>

#include "sink/file_destination.h"
#include "sink/s3_destination.h"

namespace tidemark {

Result<SinkUrl> parse_sink_url(std::string_view url, SinkFormat format) {
  constexpr std::string_view kFile = "file://";
  SinkUrl out;
  if (url.starts_with(kFile)) {
    std::string directory(url.substr(kFile.size()));
    if (directory.empty() || directory[0] != '/') {
      return invalid_usage("sink destination " + std::string(url) +
                           ": the directory must be absolute");
    }
    out.directory = std::move(directory);
    return out;
  }
  if (url.starts_with("s3://")) {
    TM_ASSIGN(S3Url address, parse_s3_url(url));
    out.s3 = std::move(address);
    return out;
  }
  if (url.starts_with("kafka://")) {
    TM_ASSIGN(KafkaAddress address, KafkaAddress::parse(url));
    if (format != SinkFormat::kJson) {
      return invalid_usage("sink destination " + std::string(url) +
                           ": Kafka messages are json (--format csv is for files)");
    }
    out.kafka = std::move(address);
    return out;
  }
  return invalid_usage("sink destination " + std::string(url) +
                       ": expected file:///dir, s3://bucket/prefix?endpoint=http://host:port or "
                       "kafka://host:port[,host:port]/topic");
}

Result<std::unique_ptr<SinkDestination>> open_sink_destination(const SinkUrl& url,
                                                               Envelope envelope, SinkFormat format,
                                                               const std::string& shard,
                                                               const std::string& sink_name,
                                                               std::shared_ptr<MemoryPool> pool) {
  if (url.directory) {
    TM_ASSIGN(auto file, FileDestination::open(*url.directory, envelope, format));
    return std::unique_ptr<SinkDestination>(std::move(file));
  }
  if (url.s3) {
    TM_ASSIGN(S3Credentials credentials, s3_credentials_from_environment());
    S3DestinationOptions options;
    options.pool = std::move(pool);
    TM_ASSIGN(auto objects,
              S3Destination::open(*url.s3, std::move(credentials), envelope, format, options));
    return std::unique_ptr<SinkDestination>(std::move(objects));
  }
  if (!url.kafka) return invalid_usage("an empty sink destination");
  KafkaDestinationOptions options;
  // One producer id per (shard, sink): a restarted sink fences its zombie.
  options.sink_id = "tidemark/" + shard + "/" + sink_name;
  options.pool = std::move(pool);
  // A queue that fits: at most half the pool (a server's sink pool is a
  // quarter of its --memory-limit; under 128 MiB, 16 MiB would not fit).
  options.queue_bytes = kKafkaQueueBytes;
  if (options.pool) options.queue_bytes = std::min(kKafkaQueueBytes, options.pool->capacity() / 2);
  TM_ASSIGN(auto producer, KafkaDestination::open(*url.kafka, envelope, options));
  return std::unique_ptr<SinkDestination>(std::move(producer));
}

}  // namespace tidemark
