#include "sink/destination_url.h"

#include <algorithm>
#include <cctype>
#include <vector>

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

Result<std::string> destination_identity(const SinkUrl& url) {
  if (url.directory) {
    TM_ASSIGN(std::string directory, FileDestination::normalize_directory(*url.directory));
    return file_destination_identity(directory);
  }
  auto lowercase = [](std::string text) {
    std::transform(text.begin(), text.end(), text.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return text;
  };
  if (url.s3) {
    // Scheme and host are case-insensitive; a path after them is not.
    std::string endpoint = url.s3->endpoint;
    const auto host = endpoint.find("://");
    const auto path = endpoint.find('/', host == std::string::npos ? 0 : host + 3);
    endpoint = lowercase(endpoint.substr(0, path)) +
               (path == std::string::npos ? "" : endpoint.substr(path));
    return "s3://" + endpoint + "/" + url.s3->bucket +
           (url.s3->prefix.empty() ? "" : "/" + url.s3->prefix);
  }
  if (!url.kafka) return invalid_usage("an empty sink destination");
  std::vector<std::string> brokers;
  std::string_view rest = url.kafka->brokers;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    brokers.push_back(lowercase(std::string(rest.substr(0, comma))));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  std::sort(brokers.begin(), brokers.end());
  brokers.erase(std::unique(brokers.begin(), brokers.end()), brokers.end());
  std::string out = "kafka://";
  for (std::size_t i = 0; i < brokers.size(); ++i) out += (i > 0 ? "," : "") + brokers[i];
  return out + "/" + url.kafka->topic;
}

Result<std::unique_ptr<SinkDestination>> open_sink_destination(
    const SinkUrl& url, Envelope envelope, SinkFormat format, const std::string& shard,
    const std::string& sink_name, std::shared_ptr<MemoryPool> pool,
    std::shared_ptr<DestinationClaim> claim) {
  if (claim) {
    TM_ASSIGN(const std::string identity, destination_identity(url));
    if (claim->destination() != identity) {
      return invalid_usage("sink destination " + identity + ": the claim given covers " +
                           claim->destination());
    }
  }
  if (url.directory) {
    TM_ASSIGN(auto file, FileDestination::open(*url.directory, envelope, format, std::move(claim)));
    return std::unique_ptr<SinkDestination>(std::move(file));
  }
  if (url.s3) {
    TM_ASSIGN(S3Credentials credentials, s3_credentials_from_environment());
    S3DestinationOptions options;
    options.pool = std::move(pool);
    options.claim = std::move(claim);
    TM_ASSIGN(auto objects,
              S3Destination::open(*url.s3, std::move(credentials), envelope, format, options));
    return std::unique_ptr<SinkDestination>(std::move(objects));
  }
  if (!url.kafka) return invalid_usage("an empty sink destination");
  KafkaDestinationOptions options;
  // One producer id per (shard, sink): a restarted sink fences its zombie.
  options.sink_id = "tidemark/" + shard + "/" + sink_name;
  options.pool = std::move(pool);
  options.claim = std::move(claim);
  // A queue that fits: at most half the pool (a server's sink pool is a
  // quarter of its --memory-limit; under 128 MiB, 16 MiB would not fit).
  options.queue_bytes = kKafkaQueueBytes;
  if (options.pool) options.queue_bytes = std::min(kKafkaQueueBytes, options.pool->capacity() / 2);
  TM_ASSIGN(auto producer, KafkaDestination::open(*url.kafka, envelope, options));
  return std::unique_ptr<SinkDestination>(std::move(producer));
}

}  // namespace tidemark
