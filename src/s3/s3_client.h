// S3Client: signed HTTP requests to one S3-compatible endpoint, over a
// bounded pool of kept-alive libcurl connections, retried with backoff.
// S3Blob (s3_blob.h) is built on it; so can be anything else that writes
// to S3 (a sink destination).
//
// URL: s3://BUCKET[/PREFIX]?endpoint=URL[&NAME=VALUE...]
//   PREFIX is empty or components that follow the key rules (blob_key.h);
//   a trailing '/' is ignored. Objects are addressed path-style:
//   {endpoint}/{bucket}/{object name}. Query parameters (values may be
//   percent-encoded):
//     endpoint             required: http:// or https://, host, optional
//                          port and path
//     region               the SigV4 signing region; default us-east-1
//     multipart_threshold  larger objects are uploaded in parts; default
//                          16MiB, at most 5GiB (S3's largest single PUT)
//     part_size            every part but the last; default 8MiB, 5MiB to
//                          5GiB
//     list_page_size       keys per list request, 1 to 1000; default 1000
//     list_version         2 (ListObjectsV2 with continuation tokens; the
//                          default) or 1 (ListObjects with markers, for
//                          servers whose V2 paging is broken, like s3rver
//                          on Node >= 17)
//     max_attempts         tries per request, 1 to 20; default 8
//     stall_timeout        seconds a transfer may make no progress before
//                          it is abandoned (and retried), 1 to 3600;
//                          default 30
//     call_timeout         seconds after the start of a call past which it
//                          starts no new attempt, 1 to 3600; default 60.
//                          With stall_timeout it bounds a call that meets
//                          a server (or a network) that accepts requests
//                          and never answers: about call_timeout +
//                          stall_timeout, where max_attempts alone would
//                          allow max_attempts x stall_timeout
//   Sizes are bytes or parse_size units ("8MiB"). A malformed URL, an
//   unknown parameter, a missing endpoint or a bad bucket name is
//   InvalidUsage. Credentials come from the environment (see
//   s3_credentials_from_environment).
//
// Signing: libcurl's SigV4 (CURLOPT_AWS_SIGV4 "aws:amz:REGION:s3") signs
// every header the request sets. Each request carries x-amz-content-sha256,
// the SHA-256 of its body (curl 7.88 signs it as the payload hash, and S3
// checks the body against it); a request's target must already be in
// canonical form (s3_canonical_query) because curl signs the query as given.
//
// Retries: transport failures (refused, reset, stalled), HTTP 5xx, 429 and
// S3's 400 RequestTimeout are retried with exponential backoff and jitter:
// waits of 25 ms doubling to at most 2 s, with a random half of each, and
// max_attempts tries in all, none started call_timeout after the first. Then the error is
// Determinate, or Indeterminate for a call that mutates if any attempt may have reached S3 (a 5xx,
// or a failure after the request was sent). An answer the call does not accept is final:
// Determinate, unless an earlier attempt of a mutating call may have applied; a 403 message says to
// check the credentials, signature and region. Messages name the operation, subject, method and
// path, HTTP status, and S3's error Code and Message. A garbled answer is an
// error, never a crash.
//
// Bounds: an answer's body is one string, reserved from Content-Length and
// capped at the request's body_limit (bodies of error answers at 64 KiB).
// Request bodies are sent from the caller's memory without copying. At most
// kMaxConnections requests are in flight; more callers wait for a
// connection. Connections wait at most 5 s to connect; a transfer with no
// progress for stall_timeout seconds is abandoned.
//
// Cancellation: a client made with a Cancellation (util/cancel.h) gives up
// once it is cancelled: a transfer in progress within about a second
// (libcurl's progress callback), a wait between retries or for a
// connection at once; the call's error then says it was cancelled
// (Indeterminate for a mutating call that may have reached S3).
//
// Thread-safety: S3Client is safe for concurrent use from many threads. A
// connection (a libcurl easy handle) is used by one thread at a time.
// libcurl is initialised once per process and never cleaned up. The free
// functions are pure.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "crypto/digest.h"
#include "tidemark/error.h"
#include "util/cancel.h"

namespace tidemark {

// A parsed s3:// URL (see above). parse_s3_url(url.to_string()) == url.
struct S3Url {
  std::string bucket;
  std::string prefix;    // "" or valid key components, no leading or trailing '/'
  std::string endpoint;  // "http(s)://host[:port][/path]", no trailing '/'
  std::string region = "us-east-1";
  std::uint64_t multipart_threshold = 16ull << 20;
  std::uint64_t part_size = 8ull << 20;
  std::uint32_t list_page_size = 1000;
  int list_version = 2;
  int max_attempts = 8;
  int stall_timeout_seconds = 30;
  int call_timeout_seconds = 60;

  // The URL, with the parameters that differ from the defaults.
  std::string to_string() const;

  bool operator==(const S3Url&) const = default;
};

// InvalidUsage naming the problem unless `url` is a valid s3:// URL.
[[nodiscard]] Result<S3Url> parse_s3_url(std::string_view url);

struct S3Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // "" unless temporary credentials
};

// From AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (InvalidUsage naming
// the one that is unset or empty) and AWS_SESSION_TOKEN (optional).
[[nodiscard]] Result<S3Credentials> s3_credentials_from_environment();

struct S3Request {
  std::string_view method{};  // GET, HEAD, PUT, POST or DELETE
  // Path and canonical query: "/bucket/name?partNumber=1&uploadId=x".
  std::string target{};
  std::string_view body{};  // must outlive exchange()
  // Hex SHA-256 of `body`; computed when empty.
  std::string body_sha256{};
  std::vector<std::string> headers{};  // "Name: value", all signed
  // The most bytes a 2xx answer's body may have; more is an error.
  std::uint64_t body_limit = UINT64_MAX;
};

struct S3Answer {
  long status = 0;
  std::string body;
  std::string etag;           // the ETag header, quotes and all
  std::string object_sha256;  // the x-amz-meta-tidemark-sha256 header
  // A 206 whose Content-Range starts at or past the object's end (s3rver's
  // answer to any range of an empty object): the body is not waited for.
  bool range_past_end = false;

  // S3's <Error><Code> and <Message> in the body, or "" without them.
  std::string error_code() const;
  std::string error_message() const;
};

// What the caller of exchange() expects, for retries and error messages.
struct S3Call {
  std::string_view operation{};  // "s3 blob: get"
  std::string_view subject{};    // the key or prefix it is about
  // Whether an attempt may change what readers see (decides Determinate
  // versus Indeterminate).
  bool mutates = false;
  std::vector<long> accepted{};  // the statuses the caller handles
  // A problem with an accepted answer, retried like a 5xx; the error is
  // reported if the problem persists. Empty: none.
  std::function<std::optional<Error>(const S3Answer&)> check{};
  int max_attempts = 0;  // 0: the URL's
};

class S3Client {
 public:
  static constexpr std::size_t kMaxConnections = 16;

  // `cancel`: when set and cancelled, every call gives up (see above).
  S3Client(S3Url url, S3Credentials credentials,
           std::shared_ptr<const Cancellation> cancel = nullptr);
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;
  ~S3Client();

  // Sends `request` until an answer has a status in call.accepted (and
  // passes call.check), retrying what is retryable (see above); any other
  // outcome is an error. A 404 NoSuchBucket is never accepted.
  [[nodiscard]] Result<S3Answer> exchange(const S3Request& request, const S3Call& call);

  // "/bucket".
  std::string bucket_path() const;
  // "/bucket/prefix/name", or "/bucket/name" without a prefix. REQUIRES:
  // `name` needs no URI-encoding (blob keys do not).
  std::string object_path(std::string_view name) const;

  const S3Url& url() const { return url_; }

 private:
  struct Connection;  // a libcurl easy handle (s3_client.cc)
  struct Attempt;

  // One try of `request` on a pooled connection.
  Attempt attempt(const S3Request& request, const std::string& body_sha256);

  std::unique_ptr<Connection> acquire_connection();
  void release_connection(std::unique_ptr<Connection> connection);

  const S3Url url_;
  const S3Credentials credentials_;
  const std::string sigv4_;  // "aws:amz:<region>:s3"
  const std::shared_ptr<const Cancellation> cancel_;

  std::mutex pool_mutex_;
  std::condition_variable connection_released_;
  std::vector<std::unique_ptr<Connection>> idle_connections_;  // guarded by pool_mutex_
  std::size_t open_connections_ = 0;  // guarded by pool_mutex_; <= kMaxConnections
};

// Helpers for building requests and reading answers ------------------------

// SigV4's canonical query string: parameters sorted by name, names and
// values URI-encoded the AWS way (A-Za-z0-9-_.~ kept, the rest %XX), a
// parameter without a value written "name=".
std::string s3_canonical_query(std::vector<std::pair<std::string, std::string>> parameters);

// The AWS URI-encoding of `text` (see above); '/' is encoded too.
std::string s3_uri_encode(std::string_view text);

// The contents of each element <name>...</name> (or <name/>) in `xml`, in
// order, still escaped. S3's answers never nest an element in one of the
// same name, so the first closing tag ends each; an unterminated element
// ends the search.
std::vector<std::string_view> xml_elements(std::string_view xml, std::string_view name);
// The first of them, if any.
std::optional<std::string_view> xml_element(std::string_view xml, std::string_view name);
// Decodes &amp; &lt; &gt; &quot; &apos; and numeric character references;
// anything else is kept as it is.
std::string xml_unescape(std::string_view text);
// Escapes & < > " ' for element content.
std::string xml_escape(std::string_view text);

// The problem with a 200 answer to a request S3 may fail after its answer
// started (CompleteMultipartUpload, CopyObject, UploadPartCopy: S3 then
// reports the failure inside the body), as an error of `kind`: an <Error>
// in the body, or a body without the element `result`
// ("CompleteMultipartUploadResult"). nullopt when the answer is a success.
std::optional<Error> s3_error_inside_success(const S3Answer& answer, ErrorKind kind,
                                             std::string_view result);

// `text` without leading and trailing whitespace (XML contents, headers).
std::string_view trim_whitespace(std::string_view text);

// Text from a server made safe for an error message: control characters
// replaced by '?', cut after `limit` characters (marked "...").
std::string printable_excerpt(std::string_view text, std::size_t limit = 300);

}  // namespace tidemark
