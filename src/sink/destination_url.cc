#include "sink/destination_url.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <tuple>
#include <utility>
#include <vector>

#include "sink/file_destination.h"
#include "util/number.h"
#include "util/try.h"
#if TIDEMARK_WITH_S3
#include "sink/s3_destination.h"
#endif

namespace tidemark {
namespace {

// What a build without a destination's library says of its URLs.
[[maybe_unused]] std::unexpected<Error> not_built(std::string_view url, std::string_view kind,
                                                  std::string_view option) {
  return invalid_usage("sink destination " + std::string(url) + ": this build of Tidemark has no " +
                       std::string(kind) + " destinations (built with " + std::string(option) +
                       "=OFF)");
}

}  // namespace

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
#if TIDEMARK_WITH_S3
    TM_ASSIGN(S3Url address, parse_s3_url(url));
    out.s3 = std::move(address);
    return out;
#else
    return not_built(url, "S3", "TIDEMARK_WITH_S3");
#endif
  }
  if (url.starts_with("kafka://")) {
#if TIDEMARK_WITH_KAFKA
    TM_ASSIGN(KafkaAddress address, KafkaAddress::parse(url));
    if (format != SinkFormat::kJson) {
      return invalid_usage("sink destination " + std::string(url) +
                           ": Kafka messages are json (--format csv is for files)");
    }
    out.kafka = std::move(address);
    return out;
#else
    return not_built(url, "Kafka", "TIDEMARK_WITH_KAFKA");
#endif
  }
  return invalid_usage("sink destination " + std::string(url) +
                       ": expected file:///dir, s3://bucket/prefix?endpoint=http://host:port or "
                       "kafka://host:port[,host:port]/topic");
}

namespace {

std::string lowercase(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// "host", "host:port", "[v6]" or "[v6]:port": the host (lowercased) and
// the port, if any; nullopt when malformed (an empty host, a port that is
// not 1..65535).
std::optional<std::pair<std::string, std::optional<std::string>>> split_host_port(
    std::string_view text) {
  std::string_view host = text, port;
  bool has_port = false;
  if (text.starts_with('[')) {
    const auto close = text.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = text.substr(0, close + 1);
    std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return std::nullopt;
      port = rest.substr(1);
      has_port = true;
    }
  } else if (const auto colon = text.rfind(':'); colon != std::string_view::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    has_port = true;
  }
  if (host.empty() || host == "[]" || host.find_first_of("/?#@ ,") != std::string_view::npos) {
    return std::nullopt;
  }
  if (!has_port) return std::pair{lowercase(host), std::optional<std::string>{}};
  const auto value = parse_decimal(port, 1, 65535);
  if (!value) return std::nullopt;
  return std::pair{lowercase(host), std::optional<std::string>{std::to_string(*value)}};
}

// "http[s]://host[:port][/path]" as scheme, host and port (the scheme's
// default when `default_port` and none is given).
std::optional<std::tuple<std::string, std::string, std::optional<std::string>>> split_endpoint(
    std::string_view endpoint, bool default_port) {
  const auto sep = endpoint.find("://");
  if (sep == std::string_view::npos) return std::nullopt;
  const std::string scheme = lowercase(endpoint.substr(0, sep));
  if (scheme != "http" && scheme != "https") return std::nullopt;
  std::string_view authority = endpoint.substr(sep + 3);
  authority = authority.substr(0, authority.find('/'));
  auto host = split_host_port(authority);
  if (!host) return std::nullopt;
  if (!host->second && default_port) host->second = scheme == "https" ? "443" : "80";
  return std::tuple{scheme, host->first, host->second};
}

template <typename Visit>
void for_each_item(std::string_view list, Visit visit) {
  while (!list.empty()) {
    const auto comma = list.find(',');
    visit(list.substr(0, comma));
    if (comma == std::string_view::npos) break;
    list = list.substr(comma + 1);
  }
}

}  // namespace

Result<std::string> destination_identity(const SinkUrl& url) {
  if (url.directory) {
    TM_ASSIGN(std::string directory, FileDestination::normalize_directory(*url.directory));
    return file_destination_identity(directory);
  }
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

Result<DestinationAllowList> DestinationAllowList::parse(std::string_view s3_endpoints,
                                                         std::string_view kafka_brokers) {
  DestinationAllowList out;
  std::optional<std::string> bad;
  for_each_item(s3_endpoints, [&](std::string_view item) {
    auto endpoint = split_endpoint(item, /*default_port=*/false);
    if (!endpoint) {
      if (!bad) bad = "S3 endpoint \"" + std::string(item) + "\" is not http[s]://host[:port]";
      return;
    }
    out.s3_.push_back(Host{std::get<0>(*endpoint), std::get<1>(*endpoint), std::get<2>(*endpoint)});
  });
  for_each_item(kafka_brokers, [&](std::string_view item) {
    auto broker = split_host_port(item);
    if (!broker) {
      if (!bad) bad = "Kafka broker \"" + std::string(item) + "\" is not host[:port]";
      return;
    }
    out.kafka_.push_back(Host{"", broker->first, broker->second});
  });
  if (bad) return invalid_usage("allowed destinations: " + *bad);
  out.s3_text_ = s3_endpoints;
  out.kafka_text_ = kafka_brokers;
  return out;
}

bool DestinationAllowList::allows(const std::vector<Host>& list, const Host& wanted) {
  return std::any_of(list.begin(), list.end(), [&](const Host& entry) {
    return entry.scheme == wanted.scheme && entry.host == wanted.host &&
           (!entry.port || entry.port == wanted.port);
  });
}

Status DestinationAllowList::check(const SinkUrl& url) const {
  if (url.s3) {
    auto endpoint = split_endpoint(url.s3->endpoint, /*default_port=*/true);
    if (!endpoint || !allows(s3_, Host{std::get<0>(*endpoint), std::get<1>(*endpoint),
                                       std::get<2>(*endpoint)})) {
      return invalid_usage("S3 endpoint " + url.s3->endpoint +
                           " is not one this server's sinks may reach (the server's "
                           "--allow-s3-endpoints lists them)");
    }
  }
  if (url.kafka) {
    std::optional<std::string> refused;
    for_each_item(url.kafka->brokers, [&](std::string_view item) {
      auto broker = split_host_port(item);
      if (!refused && (!broker || !allows(kafka_, Host{"", broker->first, broker->second}))) {
        refused = std::string(item);
      }
    });
    if (refused) {
      return invalid_usage("Kafka broker " + *refused +
                           " is not one this server's sinks may reach (the server's "
                           "--allow-kafka-brokers lists them)");
    }
  }
  return {};
}

Result<std::unique_ptr<SinkDestination>> open_sink_destination(
    const SinkUrl& url, Envelope envelope, SinkFormat format, const std::string& shard,
    const std::string& sink_name, std::shared_ptr<MemoryPool> pool,
    std::shared_ptr<DestinationClaim> claim, std::shared_ptr<const Cancellation> cancel,
    std::optional<std::chrono::milliseconds> pool_wait,
    std::function<void(const std::string&)> on_trouble) {
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
#if !TIDEMARK_WITH_S3
    return not_built("s3://" + url.s3->bucket, "S3", "TIDEMARK_WITH_S3");
#else
    TM_ASSIGN(S3Credentials credentials, s3_credentials_from_environment());
    S3DestinationOptions options;
    options.pool = std::move(pool);
    options.pool_wait = pool_wait;
    options.claim = std::move(claim);
    options.cancel = std::move(cancel);
    TM_ASSIGN(auto objects,
              S3Destination::open(*url.s3, std::move(credentials), envelope, format, options));
    return std::unique_ptr<SinkDestination>(std::move(objects));
#endif
  }
  if (!url.kafka) return invalid_usage("an empty sink destination");
#if !TIDEMARK_WITH_KAFKA
  return not_built("kafka://" + url.kafka->brokers, "Kafka", "TIDEMARK_WITH_KAFKA");
#else
  KafkaDestinationOptions options;
  // One producer id per (shard, sink): a restarted sink fences its zombie.
  options.sink_id = "tidemark/" + shard + "/" + sink_name;
  options.pool = std::move(pool);
  options.pool_wait = pool_wait;
  options.claim = std::move(claim);
  options.cancel = std::move(cancel);
  options.on_trouble = std::move(on_trouble);
  // A queue that fits: at most half the pool (a server's sink pool is a
  // quarter of its --memory-limit; under 128 MiB, 16 MiB would not fit).
  options.queue_bytes = kKafkaQueueBytes;
  if (options.pool) options.queue_bytes = std::min(kKafkaQueueBytes, options.pool->capacity() / 2);
  TM_ASSIGN(auto producer, KafkaDestination::open(*url.kafka, envelope, options));
  return std::unique_ptr<SinkDestination>(std::move(producer));
#endif
}

}  // namespace tidemark
