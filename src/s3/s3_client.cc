#include "s3/s3_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <set>
#include <type_traits>

#include "tidemark/blob_key.h"
#include "tidemark/retry.h"
#include "util/number.h"
#include "util/size.h"
#include "util/try.h"

namespace tidemark {

namespace {

constexpr std::string_view kScheme = "s3://";
constexpr std::uint64_t kMinPartSize = 5ull << 20;
constexpr std::uint64_t kMaxSinglePut = 5ull << 30;  // also S3's largest part
constexpr std::uint64_t kMaxErrorBody = 64 << 10;
constexpr long kConnectTimeoutMs = 5000;
constexpr long kReceiveBufferBytes = 256 << 10;
constexpr std::chrono::milliseconds kFirstBackoff{25};
constexpr std::chrono::milliseconds kMaxBackoff{2000};

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// nullopt on a malformed escape. '+' stays '+'.
std::optional<std::string> percent_decode(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out.push_back(text[i]);
      continue;
    }
    if (i + 2 >= text.size()) return std::nullopt;
    int high = hex_value(text[i + 1]);
    int low = hex_value(text[i + 2]);
    if (high < 0 || low < 0) return std::nullopt;
    out.push_back(static_cast<char>(high * 16 + low));
    i += 2;
  }
  return out;
}

// S3's rule for new buckets: 3 to 63 characters from [a-z0-9.-], starting
// and ending with a letter or digit.
bool valid_bucket_name(std::string_view name) {
  if (name.size() < 3 || name.size() > 63) return false;
  auto alphanumeric = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  for (char c : name) {
    if (!alphanumeric(c) && c != '.' && c != '-') return false;
  }
  return alphanumeric(name.front()) && alphanumeric(name.back());
}

// "http(s)://host[:port][/path]" without a trailing '/', or nullopt.
std::optional<std::string> normalized_endpoint(std::string_view endpoint) {
  std::string_view rest;
  if (endpoint.starts_with("http://")) {
    rest = endpoint.substr(7);
  } else if (endpoint.starts_with("https://")) {
    rest = endpoint.substr(8);
  } else {
    return std::nullopt;
  }
  std::string_view authority = rest.substr(0, rest.find('/'));
  if (authority.empty()) return std::nullopt;
  for (char c : authority) {
    bool allowed = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                   c == '.' || c == '-' || c == ':' || c == '[' || c == ']';
    if (!allowed) return std::nullopt;  // no userinfo, no spaces, no query
  }
  for (char c : rest.substr(authority.size())) {
    bool allowed = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                   c == '.' || c == '-' || c == '_' || c == '~' || c == '/';
    if (!allowed) return std::nullopt;
  }
  std::string out(endpoint);
  while (out.ends_with('/')) out.pop_back();
  return out;
}

bool valid_region(std::string_view region) {
  if (region.empty() || region.size() > 64) return false;
  return std::all_of(region.begin(), region.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
}

bool has_control_characters(std::string_view text) {
  return std::any_of(text.begin(), text.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

void initialize_curl_once() {
  static std::once_flag initialized;
  // Failure is not fatal here: curl_easy_init then fails and says so.
  std::call_once(initialized, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// Transport failures that retrying cannot fix. (Not
// CURLE_UNSUPPORTED_PROTOCOL: the endpoint is http(s), so that is a server
// answering something other than HTTP, e.g. "HTTP/0.9".)
bool retryable_transport_failure(CURLcode code) {
  switch (code) {
    case CURLE_FAILED_INIT:
    case CURLE_URL_MALFORMAT:
    case CURLE_NOT_BUILT_IN:
    case CURLE_OUT_OF_MEMORY:
    case CURLE_BAD_FUNCTION_ARGUMENT:
    case CURLE_UNKNOWN_OPTION:
      return false;
    default:
      return true;
  }
}

bool retryable_status(const S3Answer& answer) {
  // Not 501 Not Implemented or 505 HTTP Version Not Supported: they stay.
  if (answer.status == 501 || answer.status == 505) return false;
  if (answer.status >= 500 || answer.status == 429) return true;
  // S3 closes idle uploads with "400 RequestTimeout".
  return answer.status == 400 && answer.error_code() == "RequestTimeout";
}

// What one transfer collects, through libcurl's callbacks.
struct Transfer {
  CURL* handle = nullptr;
  S3Answer answer;  // answer.status is the latest status line's
  std::uint64_t body_limit = UINT64_MAX;
  bool reserved = false;
  bool over_limit = false;  // a 2xx body exceeded body_limit: aborted
};

// libcurl's progress callback: non-zero aborts the transfer.
int on_progress(void* context, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<const Cancellation*>(context)->cancelled() ? 1 : 0;
}

std::size_t on_body(char* data, std::size_t size, std::size_t count, void* context) {
  auto* transfer = static_cast<Transfer*>(context);
  const std::size_t bytes = size * count;
  std::string& body = transfer->answer.body;
  const bool success = transfer->answer.status / 100 == 2;
  const std::uint64_t limit = success ? transfer->body_limit : kMaxErrorBody;
  if (!transfer->reserved) {
    transfer->reserved = true;
    curl_off_t length = -1;
    curl_easy_getinfo(transfer->handle, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
    if (length > 0) {
      body.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(length, limit)));
    }
  }
  if (body.size() + bytes > limit) {
    if (!success) {  // keep the start of an error body, drop the rest
      body.append(data, limit - std::min<std::uint64_t>(limit, body.size()));
      return bytes;
    }
    transfer->over_limit = true;
    return 0;  // aborts the transfer
  }
  body.append(data, bytes);
  return bytes;
}

// Whether `line` is the header `name` (lowercase), and its trimmed value
// into *value when given.
bool header_named(std::string_view line, std::string_view name, std::string_view* value) {
  if (line.size() <= name.size() || line[name.size()] != ':') return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    char c = line[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != name[i]) return false;
  }
  std::string_view rest = line.substr(name.size() + 1);
  while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
  while (!rest.empty() && (rest.back() == '\r' || rest.back() == '\n' || rest.back() == ' ')) {
    rest.remove_suffix(1);
  }
  if (value != nullptr) *value = rest;
  return true;
}

// "bytes FIRST-LAST/TOTAL" with FIRST >= TOTAL: a range past the end.
bool range_starts_past_end(std::string_view content_range) {
  if (!content_range.starts_with("bytes ")) return false;
  content_range.remove_prefix(6);
  auto dash = content_range.find('-');
  auto slash = content_range.find('/');
  if (dash == std::string_view::npos || slash == std::string_view::npos || slash < dash) {
    return false;
  }
  auto first = parse_decimal(content_range.substr(0, dash));
  auto total = parse_decimal(content_range.substr(slash + 1));
  return first && total && *first >= *total;
}

std::size_t on_header(char* data, std::size_t size, std::size_t count, void* context) {
  auto* transfer = static_cast<Transfer*>(context);
  const std::size_t bytes = size * count;
  std::string_view line(data, bytes);
  S3Answer& answer = transfer->answer;
  std::string_view value;
  if (line.starts_with("HTTP/")) {
    // A new response (after "100 Continue"): forget the previous one's.
    // "HTTP/1.1 206 Partial Content".
    auto space = line.find(' ');
    answer.status = space == std::string_view::npos
                        ? 0
                        : static_cast<long>(parse_decimal(line.substr(space + 1, 3)).value_or(0));
    answer.etag.clear();
    answer.object_sha256.clear();
    answer.range_past_end = false;
  } else if (header_named(line, "etag", &value)) {
    answer.etag = value;
  } else if (header_named(line, "x-amz-meta-tidemark-sha256", &value)) {
    answer.object_sha256 = value;
  } else if (header_named(line, "content-range", &value)) {
    answer.range_past_end = answer.status == 206 && range_starts_past_end(value);
  } else if ((line == "\r\n" || line == "\n") && answer.range_past_end) {
    // The body of such an answer may never come (s3rver announces one
    // byte and sends none): stop here, the answer is complete.
    return 0;
  }
  return bytes;
}

// xml_elements, stopping after `limit` elements.
std::vector<std::string_view> find_xml_elements(std::string_view xml, std::string_view name,
                                                std::size_t limit) {
  std::vector<std::string_view> out;
  const std::string opening = "<" + std::string(name);
  const std::string closing = "</" + std::string(name) + ">";
  std::size_t at = 0;
  while (out.size() < limit) {
    std::size_t start = xml.find(opening, at);
    if (start == std::string_view::npos) break;
    std::size_t after = start + opening.size();
    if (after >= xml.size()) break;
    char next = xml[after];
    if (next != '>' && next != '/' && next != ' ' && next != '\t' && next != '\r' && next != '\n') {
      at = after;  // a longer name: <KeyCount> is not <Key>
      continue;
    }
    std::size_t tag_end = xml.find('>', after);
    if (tag_end == std::string_view::npos) break;
    if (xml[tag_end - 1] == '/') {
      out.emplace_back();  // <name/>
      at = tag_end + 1;
      continue;
    }
    std::size_t end = xml.find(closing, tag_end + 1);
    if (end == std::string_view::npos) break;
    out.push_back(xml.substr(tag_end + 1, end - tag_end - 1));
    at = end + closing.size();
  }
  return out;
}

struct HeaderList {
  curl_slist* list = nullptr;
  HeaderList() = default;
  HeaderList(const HeaderList&) = delete;
  HeaderList& operator=(const HeaderList&) = delete;
  ~HeaderList() { curl_slist_free_all(list); }
  bool add(const std::string& header) {
    curl_slist* longer = curl_slist_append(list, header.c_str());
    if (longer == nullptr) return false;
    list = longer;
    return true;
  }
};

std::string path_of(std::string_view target) {
  return std::string(target.substr(0, target.find('?')));
}

}  // namespace

// URL --------------------------------------------------------------------

std::string S3Url::to_string() const {
  const S3Url defaults;
  std::string out(kScheme);
  out += bucket;
  if (!prefix.empty()) out += "/" + prefix;
  out += "?endpoint=" + endpoint;
  if (region != defaults.region) out += "&region=" + region;
  if (multipart_threshold != defaults.multipart_threshold) {
    out += "&multipart_threshold=" + std::to_string(multipart_threshold);
  }
  if (part_size != defaults.part_size) out += "&part_size=" + std::to_string(part_size);
  if (list_page_size != defaults.list_page_size) {
    out += "&list_page_size=" + std::to_string(list_page_size);
  }
  if (list_version != defaults.list_version) {
    out += "&list_version=" + std::to_string(list_version);
  }
  if (max_attempts != defaults.max_attempts) {
    out += "&max_attempts=" + std::to_string(max_attempts);
  }
  if (stall_timeout_seconds != defaults.stall_timeout_seconds) {
    out += "&stall_timeout=" + std::to_string(stall_timeout_seconds);
  }
  if (call_timeout_seconds != defaults.call_timeout_seconds) {
    out += "&call_timeout=" + std::to_string(call_timeout_seconds);
  }
  return out;
}

Result<S3Url> parse_s3_url(std::string_view url) {
  auto fail = [&](std::string why) {
    return invalid_usage("s3 URL \"" + printable_excerpt(url) + "\": " + why);
  };
  if (!url.starts_with(kScheme)) {
    return fail("must start with s3:// (s3://bucket/prefix?endpoint=http://host:port)");
  }
  std::string_view rest = url.substr(kScheme.size());
  if (rest.find('#') != std::string_view::npos) return fail("fragments (#) are not supported");
  std::string_view query;
  if (auto mark = rest.find('?'); mark != std::string_view::npos) {
    query = rest.substr(mark + 1);
    rest = rest.substr(0, mark);
  }
  auto slash = rest.find('/');
  std::string_view bucket = rest.substr(0, slash);
  std::string_view prefix = slash == std::string_view::npos ? "" : rest.substr(slash + 1);
  while (prefix.ends_with('/')) prefix.remove_suffix(1);
  if (!valid_bucket_name(bucket)) {
    return fail("\"" + printable_excerpt(bucket) +
                "\" is not a valid bucket name (3 to 63 characters from [a-z0-9.-], starting "
                "and ending with a letter or digit)");
  }
  if (!prefix.empty()) {
    if (auto valid = validate_blob_key(prefix); !valid) {
      return fail("bad prefix: " + valid.error().message);
    }
  }
  S3Url out;
  out.bucket = bucket;
  out.prefix = prefix;

  std::set<std::string, std::less<>> seen;
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (item.empty()) continue;
    auto equals = item.find('=');
    std::string_view name = item.substr(0, equals);
    std::optional<std::string> value =
        percent_decode(equals == std::string_view::npos ? "" : item.substr(equals + 1));
    std::string quoted = "\"" + printable_excerpt(name) + "\"";
    if (!value) return fail("parameter " + quoted + " has a malformed %-escape");
    if (!seen.emplace(name).second) return fail("parameter " + quoted + " is given twice");
    auto bad_value = [&](std::string_view expected) {
      return fail("parameter " + quoted + " is \"" + printable_excerpt(*value) + "\", expected " +
                  std::string(expected));
    };
    auto integer_in = [&](auto* field, std::uint64_t low, std::uint64_t high,
                          std::string_view expected) -> Status {
      auto parsed = parse_decimal(*value, low, high);
      if (!parsed) return bad_value(expected);
      *field = static_cast<std::remove_reference_t<decltype(*field)>>(*parsed);
      return {};
    };
    auto size_in = [&](std::uint64_t* field, std::uint64_t low,
                       std::string_view expected) -> Status {
      auto parsed = parse_size(*value);
      if (!parsed || *parsed < low || *parsed > kMaxSinglePut) return bad_value(expected);
      *field = *parsed;
      return {};
    };
    if (name == "endpoint") {
      std::optional<std::string> endpoint = normalized_endpoint(*value);
      if (!endpoint) {
        return bad_value("http://host[:port][/path] or https://... (no user, query or fragment)");
      }
      out.endpoint = std::move(*endpoint);
    } else if (name == "region") {
      if (!valid_region(*value)) return bad_value("a region name such as us-east-1");
      out.region = *value;
    } else if (name == "multipart_threshold") {
      TM_TRY(size_in(&out.multipart_threshold, 1, "a size from 1 byte to 5GiB"));
    } else if (name == "part_size") {
      TM_TRY(size_in(&out.part_size, kMinPartSize, "a size from 5MiB to 5GiB"));
    } else if (name == "list_page_size") {
      TM_TRY(integer_in(&out.list_page_size, 1, 1000, "1 to 1000"));
    } else if (name == "list_version") {
      TM_TRY(integer_in(&out.list_version, 1, 2, "1 or 2"));
    } else if (name == "max_attempts") {
      TM_TRY(integer_in(&out.max_attempts, 1, 20, "1 to 20"));
    } else if (name == "stall_timeout") {
      TM_TRY(integer_in(&out.stall_timeout_seconds, 1, 3600, "1 to 3600 seconds"));
    } else if (name == "call_timeout") {
      TM_TRY(integer_in(&out.call_timeout_seconds, 1, 3600, "1 to 3600 seconds"));
    } else {
      return fail("unknown parameter " + quoted +
                  " (known: endpoint, region, multipart_threshold, part_size, list_page_size, "
                  "list_version, max_attempts, stall_timeout, call_timeout)");
    }
  }
  if (out.endpoint.empty()) {
    return fail(
        "no endpoint: add ?endpoint=http://host:port (the S3 server, addressed path-style)");
  }
  return out;
}

Result<S3Credentials> s3_credentials_from_environment() {
  auto variable = [](const char* name) -> Result<std::string> {
    const char* value = std::getenv(name);
    std::string text = value == nullptr ? "" : value;
    if (has_control_characters(text)) {
      return invalid_usage(std::string("s3: ") + name + " contains control characters");
    }
    return text;
  };
  S3Credentials out;
  TM_ASSIGN(out.access_key_id, variable("AWS_ACCESS_KEY_ID"));
  TM_ASSIGN(out.secret_access_key, variable("AWS_SECRET_ACCESS_KEY"));
  TM_ASSIGN(out.session_token, variable("AWS_SESSION_TOKEN"));
  if (out.access_key_id.empty()) {
    return invalid_usage(
        "s3: AWS_ACCESS_KEY_ID is not set (the access key id to sign requests with)");
  }
  if (out.secret_access_key.empty()) {
    return invalid_usage(
        "s3: AWS_SECRET_ACCESS_KEY is not set (the secret access key to sign requests with)");
  }
  return out;
}

// Answers ------------------------------------------------------------------

std::string S3Answer::error_code() const {
  auto error = xml_element(body, "Error");
  if (!error) return "";
  auto code = xml_element(*error, "Code");
  return code ? xml_unescape(*code) : "";
}

std::string S3Answer::error_message() const {
  auto error = xml_element(body, "Error");
  if (!error) return "";
  auto message = xml_element(*error, "Message");
  return message ? xml_unescape(*message) : "";
}

// Client -------------------------------------------------------------------

struct S3Client::Connection {
  Connection() : handle(curl_easy_init()) {}
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() {
    if (handle != nullptr) curl_easy_cleanup(handle);
  }

  CURL* const handle;
};

struct S3Client::Attempt {
  std::optional<S3Answer> answer;  // nullopt: the transfer failed
  std::string failure;             // why, when it failed
  bool retryable = true;
  bool maybe_sent = false;  // the request may have reached the server
};

S3Client::S3Client(S3Url url, S3Credentials credentials, std::shared_ptr<const Cancellation> cancel)
    : url_(std::move(url)),
      credentials_(std::move(credentials)),
      sigv4_("aws:amz:" + url_.region + ":s3"),
      cancel_(std::move(cancel)) {
  initialize_curl_once();
}

S3Client::~S3Client() = default;

std::string S3Client::bucket_path() const {
  return "/" + url_.bucket;
}

std::string S3Client::object_path(std::string_view name) const {
  std::string path = "/" + url_.bucket + "/";
  if (!url_.prefix.empty()) path += url_.prefix + "/";
  path += name;
  return path;
}

std::unique_ptr<S3Client::Connection> S3Client::acquire_connection() {
  std::unique_lock lock(pool_mutex_);
  // Every connection busy: each of their transfers ends (or is cancelled)
  // within a stall_timeout; a cancelled waiter looks again each 100 ms.
  while (!connection_released_.wait_for(lock, std::chrono::milliseconds(100), [&] {
    return !idle_connections_.empty() || open_connections_ < kMaxConnections;
  })) {
    if (is_cancelled(cancel_.get())) return nullptr;
  }
  if (!idle_connections_.empty()) {
    // The most recently used: its connection is the likeliest still open.
    std::unique_ptr<Connection> connection = std::move(idle_connections_.back());
    idle_connections_.pop_back();
    return connection;
  }
  ++open_connections_;
  lock.unlock();
  auto connection = std::make_unique<Connection>();
  if (connection->handle == nullptr) {
    lock.lock();
    --open_connections_;
    connection_released_.notify_one();
    return nullptr;
  }
  return connection;
}

void S3Client::release_connection(std::unique_ptr<Connection> connection) {
  // Drop every pointer into the finished request (headers, body, buffers)
  // but keep the live connection.
  curl_easy_reset(connection->handle);
  std::lock_guard lock(pool_mutex_);
  idle_connections_.push_back(std::move(connection));
  connection_released_.notify_one();
}

S3Client::Attempt S3Client::attempt(const S3Request& request, const std::string& body_sha256) {
  Attempt out;
  if (is_cancelled(cancel_.get())) {
    out.retryable = false;
    out.failure = "cancelled";
    return out;
  }
  std::unique_ptr<Connection> connection = acquire_connection();
  if (connection == nullptr) {
    if (is_cancelled(cancel_.get())) {
      out.retryable = false;
      out.failure = "cancelled";
      return out;
    }
    out.failure = "libcurl could not create a handle (out of memory?)";
    return out;
  }
  CURL* handle = connection->handle;

  HeaderList headers;
  bool listed = headers.add("x-amz-content-sha256: " + body_sha256);
  if (!credentials_.session_token.empty()) {
    listed = listed && headers.add("x-amz-security-token: " + credentials_.session_token);
  }
  bool typed = false;
  for (const std::string& header : request.headers) {
    listed = listed && headers.add(header);
    typed = typed || header_named(header, "content-type", nullptr);
  }
  // libcurl would add an unsigned form Content-Type to a body, and S3
  // requires a Content-Type that is sent to be signed.
  if (!typed && (request.method == "PUT" || request.method == "POST")) {
    listed = listed && headers.add("Content-Type: application/octet-stream");
  }
  if (!listed) {
    release_connection(std::move(connection));
    out.failure = "out of memory building the request headers";
    return out;
  }

  Transfer transfer;
  transfer.handle = handle;
  transfer.body_limit = request.body_limit;
  char error_buffer[CURL_ERROR_SIZE] = {};
  const std::string url = url_.endpoint + request.target;
  const std::string method(request.method);

  curl_easy_setopt(handle, CURLOPT_URL, url.c_str());
  curl_easy_setopt(handle, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(handle, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS, kConnectTimeoutMs);
  curl_easy_setopt(handle, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(handle, CURLOPT_LOW_SPEED_TIME, static_cast<long>(url_.stall_timeout_seconds));
  curl_easy_setopt(handle, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(handle, CURLOPT_BUFFERSIZE, kReceiveBufferBytes);
  curl_easy_setopt(handle, CURLOPT_USERAGENT, "tidemark");
  curl_easy_setopt(handle, CURLOPT_AWS_SIGV4, sigv4_.c_str());
  curl_easy_setopt(handle, CURLOPT_USERNAME, credentials_.access_key_id.c_str());
  curl_easy_setopt(handle, CURLOPT_PASSWORD, credentials_.secret_access_key.c_str());
  curl_easy_setopt(handle, CURLOPT_HTTPHEADER, headers.list);
  curl_easy_setopt(handle, CURLOPT_ERRORBUFFER, error_buffer);
  curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, &on_body);
  curl_easy_setopt(handle, CURLOPT_WRITEDATA, &transfer);
  curl_easy_setopt(handle, CURLOPT_HEADERFUNCTION, &on_header);
  curl_easy_setopt(handle, CURLOPT_HEADERDATA, &transfer);
  if (cancel_ != nullptr) {
    // Called about once a second even while nothing moves.
    curl_easy_setopt(handle, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(handle, CURLOPT_XFERINFOFUNCTION, &on_progress);
    curl_easy_setopt(handle, CURLOPT_XFERINFODATA, cancel_.get());
  }
  if (request.method == "GET") {
    curl_easy_setopt(handle, CURLOPT_HTTPGET, 1L);
  } else if (request.method == "HEAD") {
    curl_easy_setopt(handle, CURLOPT_NOBODY, 1L);
  } else if (request.method == "DELETE") {
    curl_easy_setopt(handle, CURLOPT_CUSTOMREQUEST, "DELETE");
  } else {
    // PUT or POST with a body libcurl sends from our memory (POSTFIELDS
    // is not copied) and can rewind itself to resend on a new connection.
    const char* body = request.body.empty() ? "" : request.body.data();
    curl_easy_setopt(handle, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(handle, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(request.body.size()));
    if (request.method != "POST") curl_easy_setopt(handle, CURLOPT_CUSTOMREQUEST, method.c_str());
  }

  CURLcode code = curl_easy_perform(handle);
  curl_off_t request_size = 0;
  curl_easy_getinfo(handle, CURLINFO_REQUEST_SIZE, &request_size);
  long status = 0;
  curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &status);
  transfer.answer.status = status;
  release_connection(std::move(connection));

  // Stopped on purpose after the headers: the answer is whole.
  if (code == CURLE_WRITE_ERROR && transfer.answer.range_past_end) code = CURLE_OK;
  if (code == CURLE_OK) {
    out.answer = std::move(transfer.answer);
    return out;
  }
  out.maybe_sent =
      request_size > 0 || (code != CURLE_COULDNT_RESOLVE_HOST &&
                           code != CURLE_COULDNT_RESOLVE_PROXY && code != CURLE_COULDNT_CONNECT);
  if (transfer.over_limit) {
    out.retryable = false;
    out.failure = "the answer has more than the " + std::to_string(request.body_limit) +
                  " bytes asked for (does the server ignore Range?)";
    return out;
  }
  if (code == CURLE_ABORTED_BY_CALLBACK && is_cancelled(cancel_.get())) {
    out.retryable = false;
    out.failure = "cancelled";
    return out;
  }
  out.retryable = retryable_transport_failure(code);
  out.failure = curl_easy_strerror(code);
  if (error_buffer[0] != '\0')
    out.failure += std::string(" (") + printable_excerpt(error_buffer) + ")";
  return out;
}

Result<S3Answer> S3Client::exchange(const S3Request& request, const S3Call& call) {
  const std::string body_sha256 =
      request.body_sha256.empty() ? sha256_hex(request.body) : request.body_sha256;
  const int max_attempts = call.max_attempts > 0 ? call.max_attempts : url_.max_attempts;
  const std::string context =
      std::string(call.operation) + " \"" + printable_excerpt(call.subject) +
      "\": " + std::string(request.method) + " " + path_of(request.target) + ": ";
  auto describe = [&](const S3Answer& answer) {
    std::string text = "HTTP " + std::to_string(answer.status);
    std::string code = answer.error_code();
    std::string message = answer.error_message();
    if (!code.empty()) text += " " + printable_excerpt(code);
    if (!message.empty()) text += ": " + printable_excerpt(message);
    if (answer.status == 403) {
      text +=
          " (S3 refused the credentials or the request signature: check AWS_ACCESS_KEY_ID, "
          "AWS_SECRET_ACCESS_KEY, the region and the clock)";
    } else if (code == "NoSuchBucket") {
      text += " (bucket \"" + url_.bucket + "\" does not exist at " + url_.endpoint + ")";
    } else if (answer.status / 100 == 3) {
      text += " (a redirect: is the endpoint or region wrong?)";
    }
    return text;
  };

  bool maybe_applied = false;
  std::string last_failure;
  std::optional<Error> persistent_problem;
  // A server that accepts requests and never answers costs each attempt
  // stall_timeout: the deadline keeps max_attempts of them from adding up.
  Backoff backoff(RetryPolicy{kFirstBackoff, kMaxBackoff, max_attempts,
                              std::chrono::seconds(url_.call_timeout_seconds)});
  for (bool first = true;; first = false) {
    if (!first && !backoff.next([&] { return is_cancelled(cancel_.get()); })) break;
    Attempt tried = attempt(request, body_sha256);
    persistent_problem.reset();
    if (!tried.answer) {
      maybe_applied = maybe_applied || tried.maybe_sent;
      last_failure = tried.failure;
      if (!tried.retryable) break;
      continue;
    }
    S3Answer& answer = *tried.answer;
    if (retryable_status(answer)) {
      maybe_applied = true;
      last_failure = describe(answer);
      continue;
    }
    bool accepted =
        std::find(call.accepted.begin(), call.accepted.end(), answer.status) != call.accepted.end();
    if (answer.status == 404 && answer.error_code() == "NoSuchBucket") accepted = false;
    if (!accepted) {
      ErrorKind kind =
          call.mutates && maybe_applied ? ErrorKind::kIndeterminate : ErrorKind::kDeterminate;
      return make_error(kind, context + describe(answer));
    }
    if (call.check) {
      if (std::optional<Error> problem = call.check(answer)) {
        maybe_applied = maybe_applied || call.mutates;
        last_failure = problem->message;
        persistent_problem = std::move(problem);
        continue;
      }
    }
    return std::move(answer);
  }
  if (is_cancelled(cancel_.get())) {
    return cancelled_error(std::string_view(context).substr(0, context.size() - 2),
                           call.mutates && maybe_applied);
  }
  const int attempts = backoff.attempts();
  std::string gave_up = "; gave up after " + std::to_string(attempts) +
                        (attempts == 1 ? " attempt" : " attempts") +
                        (attempts < max_attempts ? " (call_timeout)" : "");
  if (persistent_problem) {
    persistent_problem->message = context + persistent_problem->message + gave_up;
    return std::unexpected(std::move(*persistent_problem));
  }
  ErrorKind kind =
      call.mutates && maybe_applied ? ErrorKind::kIndeterminate : ErrorKind::kDeterminate;
  return make_error(kind, context + last_failure + gave_up);
}

// Helpers --------------------------------------------------------------------

std::optional<Error> s3_error_inside_success(const S3Answer& answer, ErrorKind kind,
                                             std::string_view result) {
  if (xml_element(answer.body, "Error")) {
    return make_error(kind,
                      "HTTP 200 carrying an error: " + printable_excerpt(answer.error_code()) +
                          ": " + printable_excerpt(answer.error_message()))
        .error();
  }
  if (answer.body.find(result) == std::string::npos) {
    return make_error(kind, "the answer is not a " + std::string(result) + ": " +
                                printable_excerpt(answer.body))
        .error();
  }
  return std::nullopt;
}

std::string_view trim_whitespace(std::string_view text) {
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  return text;
}

std::string printable_excerpt(std::string_view text, std::size_t limit) {
  std::string out;
  for (char c : text.substr(0, limit)) {
    out.push_back(static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? '?' : c);
  }
  if (text.size() > limit) out += "...";
  return out;
}

std::string s3_uri_encode(std::string_view text) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '_' || c == '.' || c == '~';
    if (unreserved) {
      out.push_back(c);
    } else {
      auto byte = static_cast<unsigned char>(c);
      out.push_back('%');
      out.push_back(kDigits[byte >> 4]);
      out.push_back(kDigits[byte & 0xf]);
    }
  }
  return out;
}

std::string s3_canonical_query(std::vector<std::pair<std::string, std::string>> parameters) {
  for (auto& [name, value] : parameters) {
    name = s3_uri_encode(name);
    value = s3_uri_encode(value);
  }
  std::sort(parameters.begin(), parameters.end());
  std::string out;
  for (const auto& [name, value] : parameters) {
    if (!out.empty()) out += '&';
    out += name + "=" + value;
  }
  return out;
}

std::vector<std::string_view> xml_elements(std::string_view xml, std::string_view name) {
  return find_xml_elements(xml, name, SIZE_MAX);
}

std::optional<std::string_view> xml_element(std::string_view xml, std::string_view name) {
  std::vector<std::string_view> first = find_xml_elements(xml, name, 1);
  if (first.empty()) return std::nullopt;
  return first.front();
}

std::string xml_unescape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t amp = text.find('&', at);
    if (amp == std::string_view::npos) break;
    out.append(text.substr(at, amp - at));
    std::size_t semicolon = text.find(';', amp);
    if (semicolon == std::string_view::npos || semicolon - amp > 12) {
      out.push_back('&');
      at = amp + 1;
      continue;
    }
    std::string_view entity = text.substr(amp + 1, semicolon - amp - 1);
    std::optional<std::uint32_t> code_point;
    if (entity == "amp") {
      code_point = '&';
    } else if (entity == "lt") {
      code_point = '<';
    } else if (entity == "gt") {
      code_point = '>';
    } else if (entity == "quot") {
      code_point = '"';
    } else if (entity == "apos") {
      code_point = '\'';
    } else if (entity.starts_with("#x") || entity.starts_with("#X")) {
      std::uint32_t value = 0;
      auto [end, error] =
          std::from_chars(entity.data() + 2, entity.data() + entity.size(), value, 16);
      if (error == std::errc() && end == entity.data() + entity.size() && entity.size() > 2) {
        code_point = value;
      }
    } else if (entity.starts_with('#')) {
      if (auto decimal = parse_decimal(entity.substr(1), 0, 0x10ffff)) {
        code_point = static_cast<std::uint32_t>(*decimal);
      }
    }
    if (!code_point || *code_point > 0x10ffff) {
      out.push_back('&');
      at = amp + 1;
      continue;
    }
    // UTF-8.
    std::uint32_t c = *code_point;
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    } else if (c < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (c >> 12)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | (c >> 18)));
      out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    }
    at = semicolon + 1;
  }
  out.append(text.substr(std::min(at, text.size())));
  return out;
}

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

}  // namespace tidemark
