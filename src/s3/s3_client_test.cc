// S3Client against a scripted HTTP server (scripted_http_server.h): URL
// parsing, signing, retries and what each failure becomes. No S3 server is
// needed; s3_blob_test.cc covers the blob against a real one.
#include "s3/s3_client.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "testing/s3_test_prefix.h"
#include "testing/scripted_http_server.h"

namespace tidemark {
namespace {

const S3Credentials kCredentials{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};

S3Url url_of(const ScriptedHttpServer& server, std::string_view parameters = {}) {
  auto url =
      parse_s3_url("s3://bucket/pre/fix?endpoint=" + server.endpoint() + std::string(parameters));
  EXPECT_TRUE(url.has_value()) << url.error().to_string();
  return url.value_or(S3Url{});
}

void expect_error(const Result<S3Answer>& result, ErrorKind kind,
                  const std::vector<std::string>& mentions) {
  ASSERT_FALSE(result.has_value()) << "status " << result->status;
  EXPECT_EQ(result.error().kind, kind) << result.error().to_string();
  for (const std::string& mention : mentions) {
    EXPECT_NE(result.error().message.find(mention), std::string::npos)
        << "\"" << mention << "\" not in: " << result.error().to_string();
  }
}

// URLs -----------------------------------------------------------------------

TEST(S3UrlTest, ParsesEveryPart) {
  auto url = parse_s3_url(
      "s3://my-bucket.1/a/b.c/?endpoint=http%3A%2F%2F127.0.0.1:9000/&region=eu-west-3"
      "&multipart_threshold=5MiB&part_size=6291456&list_page_size=2&list_version=1"
      "&max_attempts=3&stall_timeout=7&call_timeout=9");
  ASSERT_TRUE(url.has_value()) << url.error().to_string();
  EXPECT_EQ(url->bucket, "my-bucket.1");
  EXPECT_EQ(url->prefix, "a/b.c");
  EXPECT_EQ(url->endpoint, "http://127.0.0.1:9000");
  EXPECT_EQ(url->region, "eu-west-3");
  EXPECT_EQ(url->multipart_threshold, 5u << 20);
  EXPECT_EQ(url->part_size, 6u << 20);
  EXPECT_EQ(url->list_page_size, 2u);
  EXPECT_EQ(url->list_version, 1);
  EXPECT_EQ(url->max_attempts, 3);
  EXPECT_EQ(url->stall_timeout_seconds, 7);
  EXPECT_EQ(url->call_timeout_seconds, 9);
  auto reparsed = parse_s3_url(url->to_string());
  ASSERT_TRUE(reparsed.has_value()) << reparsed.error().to_string();
  EXPECT_TRUE(*reparsed == *url) << url->to_string();
}

TEST(S3UrlTest, DefaultsAndRoundTrip) {
  auto url = parse_s3_url("s3://tidemark?endpoint=https://s3.example.com/path");
  ASSERT_TRUE(url.has_value()) << url.error().to_string();
  EXPECT_EQ(url->prefix, "");
  EXPECT_EQ(url->endpoint, "https://s3.example.com/path");
  EXPECT_EQ(url->region, "us-east-1");
  EXPECT_EQ(url->multipart_threshold, 16u << 20);
  EXPECT_EQ(url->part_size, 8u << 20);
  EXPECT_EQ(url->list_page_size, 1000u);
  EXPECT_EQ(url->list_version, 2);
  EXPECT_EQ(url->max_attempts, 8);
  EXPECT_EQ(url->stall_timeout_seconds, 30);
  EXPECT_EQ(url->call_timeout_seconds, 60);
  EXPECT_EQ(url->to_string(), "s3://tidemark?endpoint=https://s3.example.com/path");
  auto reparsed = parse_s3_url(url->to_string());
  ASSERT_TRUE(reparsed.has_value()) << reparsed.error().to_string();
  EXPECT_TRUE(*reparsed == *url);
}

TEST(S3UrlTest, MalformedUrlsAreInvalidUsage) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"file:///x", "must start with s3://"},
      {"s3://", "not a valid bucket name"},
      {"s3://ab?endpoint=http://h", "not a valid bucket name"},
      {"s3://Upper?endpoint=http://h", "not a valid bucket name"},
      {"s3://-bucket?endpoint=http://h", "not a valid bucket name"},
      {"s3://bucket_x?endpoint=http://h", "not a valid bucket name"},
      {"s3://bucket", "no endpoint"},
      {"s3://bucket/prefix?region=us-east-1", "no endpoint"},
      {"s3://bucket?endpoint=", "\"endpoint\""},
      {"s3://bucket?endpoint=ftp://h", "\"endpoint\""},
      {"s3://bucket?endpoint=http://user@h", "\"endpoint\""},
      {"s3://bucket?endpoint=http://h?x=1", "\"endpoint\""},
      {"s3://bucket?endpoint=http://h&endpoint=http://g", "given twice"},
      {"s3://bucket?endpoint=http://h&colour=blue", "unknown parameter \"colour\""},
      {"s3://bucket?endpoint=http://h&region=US_EAST", "\"region\""},
      {"s3://bucket?endpoint=http://h&part_size=1MiB", "\"part_size\""},
      {"s3://bucket?endpoint=http://h&multipart_threshold=6GiB", "\"multipart_threshold\""},
      {"s3://bucket?endpoint=http://h&list_page_size=1001", "\"list_page_size\""},
      {"s3://bucket?endpoint=http://h&list_version=3", "\"list_version\""},
      {"s3://bucket?endpoint=http://h&max_attempts=0", "\"max_attempts\""},
      {"s3://bucket?endpoint=http://h&stall_timeout=x", "\"stall_timeout\""},
      {"s3://bucket?endpoint=http://h&call_timeout=0", "\"call_timeout\""},
      {"s3://bucket?endpoint=http://h%2", "malformed %-escape"},
      {"s3://bucket/a//b?endpoint=http://h", "bad prefix"},
      {"s3://bucket/../x?endpoint=http://h", "bad prefix"},
      {"s3://bucket/a b?endpoint=http://h", "bad prefix"},
      {"s3://bucket?endpoint=http://h#top", "fragments"},
  };
  for (const auto& [text, mention] : cases) {
    auto url = parse_s3_url(text);
    ASSERT_FALSE(url.has_value()) << text;
    EXPECT_EQ(url.error().kind, ErrorKind::kInvalidUsage) << text;
    EXPECT_NE(url.error().message.find(mention), std::string::npos)
        << text << ": " << url.error().to_string();
  }
}

TEST(S3CredentialsTest, MissingVariablesAreInvalidUsageNamingThem) {
  {
    ScopedEnvironmentVariable id("AWS_ACCESS_KEY_ID", std::nullopt);
    ScopedEnvironmentVariable secret("AWS_SECRET_ACCESS_KEY", "secret");
    auto credentials = s3_credentials_from_environment();
    ASSERT_FALSE(credentials.has_value());
    EXPECT_EQ(credentials.error().kind, ErrorKind::kInvalidUsage);
    EXPECT_NE(credentials.error().message.find("AWS_ACCESS_KEY_ID"), std::string::npos);
  }
  {
    ScopedEnvironmentVariable id("AWS_ACCESS_KEY_ID", "id");
    ScopedEnvironmentVariable secret("AWS_SECRET_ACCESS_KEY", "");
    auto credentials = s3_credentials_from_environment();
    ASSERT_FALSE(credentials.has_value());
    EXPECT_EQ(credentials.error().kind, ErrorKind::kInvalidUsage);
    EXPECT_NE(credentials.error().message.find("AWS_SECRET_ACCESS_KEY"), std::string::npos);
  }
  {
    ScopedEnvironmentVariable id("AWS_ACCESS_KEY_ID", "id");
    ScopedEnvironmentVariable secret("AWS_SECRET_ACCESS_KEY", "secret");
    ScopedEnvironmentVariable token("AWS_SESSION_TOKEN", "token");
    auto credentials = s3_credentials_from_environment();
    ASSERT_TRUE(credentials.has_value()) << credentials.error().to_string();
    EXPECT_EQ(credentials->access_key_id, "id");
    EXPECT_EQ(credentials->secret_access_key, "secret");
    EXPECT_EQ(credentials->session_token, "token");
  }
}

// Helpers --------------------------------------------------------------------

TEST(S3HelpersTest, CanonicalQuerySortsAndEncodes) {
  EXPECT_EQ(s3_canonical_query({{"uploads", ""}}), "uploads=");
  EXPECT_EQ(s3_canonical_query({{"prefix", "a/b c"},
                                {"list-type", "2"},
                                {"continuation-token", "x+y/z=="},
                                {"max-keys", "2"}}),
            "continuation-token=x%2By%2Fz%3D%3D&list-type=2&max-keys=2&prefix=a%2Fb%20c");
  EXPECT_EQ(s3_uri_encode("AZaz09-_.~"), "AZaz09-_.~");
  EXPECT_EQ(s3_uri_encode(std::string("\xff*\0", 3)), "%FF%2A%00");
}

TEST(S3HelpersTest, Digests) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(md5_base64(""), "1B2M2Y8AsgTpgAmY7PhCfg==");
  EXPECT_EQ(md5_base64("abc"), "kAFQmDzST7DWlj99KOF/cg==");
}

TEST(S3HelpersTest, XmlElementsAndEntities) {
  std::string_view xml =
      R"(<?xml version="1.0"?><R xmlns="x"><KeyCount>2</KeyCount><Contents><Key>a&amp;b</Key>)"
      R"(<Size>1</Size></Contents><Contents><Key>c&#47;&#x41;&lt;&gt;&quot;&apos;</Key><Size/>)"
      R"(</Contents><Empty></Empty><Open>never closed</R>)";
  auto contents = xml_elements(xml, "Contents");
  ASSERT_EQ(contents.size(), 2u);
  EXPECT_EQ(xml_unescape(*xml_element(contents[0], "Key")), "a&b");
  EXPECT_EQ(xml_unescape(*xml_element(contents[1], "Key")), "c/A<>\"'");
  EXPECT_EQ(xml_element(contents[1], "Size"), std::string_view());
  EXPECT_EQ(xml_element(xml, "Key"), "a&amp;b");  // not <KeyCount>
  EXPECT_EQ(xml_element(xml, "Empty"), std::string_view());
  EXPECT_EQ(xml_element(xml, "Open"), std::nullopt);
  EXPECT_EQ(xml_element(xml, "Missing"), std::nullopt);
  EXPECT_EQ(xml_unescape("&bogus; & &#xZZ; &#99999999; &amp"), "&bogus; & &#xZZ; &#99999999; &amp");
  EXPECT_EQ(xml_escape("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&apos;");
  for (std::string_view junk : {"", "<", "<<<>>>", "</Contents>", "<Contents", "<Contents>"}) {
    EXPECT_TRUE(xml_elements(junk, "Contents").empty()) << junk;
  }
}

// Signing --------------------------------------------------------------------

std::string hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 0xf]);
  }
  return out;
}

std::string hmac_sha256(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &size);
  return std::string(reinterpret_cast<const char*>(out), size);
}

std::string between(std::string_view text, std::string_view from, std::string_view to) {
  auto start = text.find(from);
  if (start == std::string_view::npos) return "";
  start += from.size();
  return std::string(text.substr(start, text.find(to, start) - start));
}

// Recomputes the SigV4 signature of a recorded request, following AWS's
// description of the algorithm independently of libcurl's code, and says
// what is wrong with the request's, or "" when nothing is.
std::string sigv4_problem(const RecordedRequest& request, const S3Credentials& credentials,
                          const std::string& region) {
  const std::string authorization = request.header("authorization");
  if (!authorization.starts_with("AWS4-HMAC-SHA256 ")) return "no SigV4 Authorization header";
  const std::string credential = between(authorization, "Credential=", ",");
  const std::string signed_headers = between(authorization, "SignedHeaders=", ",");
  const std::string signature = between(authorization, "Signature=", ",");
  const std::string timestamp = request.header("x-amz-date");
  const std::string date = timestamp.substr(0, 8);
  const std::string scope = date + "/" + region + "/s3/aws4_request";
  if (credential != credentials.access_key_id + "/" + scope) return "credential " + credential;
  if (request.header("x-amz-content-sha256") != sha256_hex(request.body)) {
    return "x-amz-content-sha256 is not the body's";
  }
  // The query must already be canonical: sorted names, AWS-encoded values.
  std::vector<std::string> names;
  for (std::string_view rest = request.query; !rest.empty();) {
    std::string_view item = rest.substr(0, rest.find('&'));
    rest = item.size() == rest.size() ? std::string_view() : rest.substr(item.size() + 1);
    if (item.find('=') == std::string_view::npos)
      return "a parameter without '=': " + request.query;
    names.emplace_back(item.substr(0, item.find('=')));
    for (char c : item) {
      bool allowed = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ||
                     c == '.' || c == '~' || c == '%' || c == '=';
      if (!allowed) return "a query character not encoded: " + request.query;
    }
  }
  if (!std::is_sorted(names.begin(), names.end())) return "query not sorted: " + request.query;

  std::string canonical_headers;
  std::vector<std::string> signed_names;
  for (std::string_view rest = signed_headers; !rest.empty();) {
    std::string_view name = rest.substr(0, rest.find(';'));
    rest = name.size() == rest.size() ? std::string_view() : rest.substr(name.size() + 1);
    signed_names.emplace_back(name);
    if (!request.headers.contains(std::string(name)))
      return "signed header not sent: " + signed_headers;
    canonical_headers += std::string(name) + ":" + request.header(std::string(name)) + "\n";
  }
  for (std::string must : {"host", "x-amz-content-sha256", "x-amz-date"}) {
    if (std::find(signed_names.begin(), signed_names.end(), must) == signed_names.end()) {
      return must + " is not signed";
    }
  }
  for (const auto& [name, value] : request.headers) {
    bool should_be_signed = name.starts_with("x-amz-") || name == "content-md5" ||
                            name == "range" || name == "content-type";
    if (should_be_signed &&
        std::find(signed_names.begin(), signed_names.end(), name) == signed_names.end()) {
      return name + " is sent but not signed";
    }
  }
  const std::string canonical_request =
      request.method + "\n" + request.path + "\n" + request.query + "\n" + canonical_headers +
      "\n" + signed_headers + "\n" + request.header("x-amz-content-sha256");
  const std::string string_to_sign =
      "AWS4-HMAC-SHA256\n" + timestamp + "\n" + scope + "\n" + sha256_hex(canonical_request);
  std::string key = hmac_sha256("AWS4" + credentials.secret_access_key, date);
  key = hmac_sha256(key, region);
  key = hmac_sha256(key, "s3");
  key = hmac_sha256(key, "aws4_request");
  const std::string expected = hex(hmac_sha256(key, string_to_sign));
  if (signature != expected) return "signature " + signature + ", expected " + expected;
  return "";
}

TEST(S3ClientTest, SignsEveryRequestWithSigV4) {
  ScriptedHttpServer server([](const RecordedRequest&) { return ScriptedHttpServer::answer(200); });
  S3Client client(url_of(server, "&region=eu-central-1"), kCredentials);
  std::string body(3 << 20, 'x');  // large enough for curl to send "Expect: 100-continue"
  std::string xml = "<Delete><Object><Key>a</Key></Object></Delete>";
  std::vector<S3Request> requests = {
      {.method = "PUT",
       .target = client.object_path("k/1"),
       .body = body,
       .headers = {"Content-Type: application/octet-stream", "x-amz-meta-tidemark-sha256: ab"}},
      {.method = "GET",
       .target =
           client.bucket_path() + "?" +
           s3_canonical_query(
               {{"list-type", "2"}, {"continuation-token", "1/+= x"}, {"prefix", "pre/fix/"}})},
      {.method = "GET", .target = client.object_path("k/1"), .headers = {"Range: bytes=2-9"}},
      {.method = "POST",
       .target = client.bucket_path() + "?" + s3_canonical_query({{"delete", ""}}),
       .body = xml,
       .headers = {"Content-Type: application/xml", "Content-MD5: " + md5_base64(xml)}},
      {.method = "POST",
       .target = client.object_path("k/1") + "?" + s3_canonical_query({{"uploads", ""}})},
      {.method = "HEAD", .target = client.object_path("k/1")},
      {.method = "DELETE", .target = client.object_path("k/1")},
  };
  for (const S3Request& request : requests) {
    auto answer = client.exchange(request, {.operation = "test", .accepted = {200}});
    ASSERT_TRUE(answer.has_value()) << answer.error().to_string();
  }
  auto recorded = server.requests();
  ASSERT_EQ(recorded.size(), requests.size());
  for (std::size_t i = 0; i < recorded.size(); ++i) {
    SCOPED_TRACE(recorded[i].method + " " + recorded[i].target);
    EXPECT_EQ(recorded[i].method, requests[i].method);
    EXPECT_EQ(recorded[i].target, requests[i].target);
    EXPECT_EQ(sigv4_problem(recorded[i], kCredentials, "eu-central-1"), "");
  }
  EXPECT_EQ(recorded[0].path, "/bucket/pre/fix/k/1");  // path-style
  EXPECT_EQ(recorded[0].body, body);
  EXPECT_EQ(recorded[1].query, "continuation-token=1%2F%2B%3D%20x&list-type=2&prefix=pre%2Ffix%2F");
  EXPECT_EQ(recorded[4].query, "uploads=");
}

TEST(S3ClientTest, SendsTheSessionTokenSigned) {
  ScriptedHttpServer server([](const RecordedRequest&) { return ScriptedHttpServer::answer(200); });
  S3Credentials temporary = kCredentials;
  temporary.session_token = "FwoGZXIvYXdzE//token";
  S3Client client(url_of(server), temporary);
  ASSERT_TRUE(client.exchange({.method = "GET", .target = client.object_path("k")},
                              {.operation = "test", .accepted = {200}}));
  auto recorded = server.requests();
  ASSERT_EQ(recorded.size(), 1u);
  EXPECT_EQ(recorded[0].header("x-amz-security-token"), temporary.session_token);
  EXPECT_EQ(sigv4_problem(recorded[0], temporary, "us-east-1"), "");
}

// Connections and retries ------------------------------------------------------

TEST(S3ClientTest, ReusesConnections) {
  ScriptedHttpServer server([](const RecordedRequest&) { return ScriptedHttpServer::answer(200); });
  S3Client client(url_of(server), kCredentials);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(client.exchange({.method = "GET", .target = client.object_path("k")},
                                {.operation = "test", .accepted = {200}}));
  }
  EXPECT_EQ(server.requests().size(), 20u);
  EXPECT_EQ(server.connections(), 1);
}

TEST(S3ClientTest, BoundsConcurrentConnections) {
  std::atomic<int> in_flight{0};
  std::atomic<int> most{0};
  ScriptedHttpServer server([&](const RecordedRequest&) {
    int now = ++in_flight;
    int seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    --in_flight;
    return ScriptedHttpServer::answer(200);
  });
  S3Client client(url_of(server), kCredentials);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int thread = 0; thread < 24; ++thread) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5; ++i) {
        if (!client.exchange({.method = "GET", .target = client.object_path("k")},
                             {.operation = "test", .accepted = {200}})) {
          ++failures;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LE(most.load(), static_cast<int>(S3Client::kMaxConnections));
  EXPECT_LE(server.connections(), static_cast<int>(S3Client::kMaxConnections));
}

TEST(S3ClientTest, RetriesSlowDownThenSucceeds) {
  std::atomic<int> calls{0};
  ScriptedHttpServer server([&](const RecordedRequest&) {
    if (++calls <= 2) return ScriptedHttpServer::s3_error(503, "SlowDown", "Reduce your rate");
    return ScriptedHttpServer::answer(200, "done");
  });
  S3Client client(url_of(server), kCredentials);
  auto answer =
      client.exchange({.method = "PUT", .target = client.object_path("k"), .body = "bytes"},
                      {.operation = "test", .mutates = true, .accepted = {200}});
  ASSERT_TRUE(answer.has_value()) << answer.error().to_string();
  EXPECT_EQ(answer->body, "done");
  auto recorded = server.requests();
  ASSERT_EQ(recorded.size(), 3u);
  for (const auto& request : recorded) EXPECT_EQ(request.body, "bytes");  // resent whole
}

TEST(S3ClientTest, RetriesTooManyRequestsAndRequestTimeout) {
  std::atomic<int> calls{0};
  ScriptedHttpServer server([&](const RecordedRequest&) {
    switch (++calls) {
      case 1:
        return ScriptedHttpServer::s3_error(429, "TooManyRequests", "Slow down");
      case 2:
        return ScriptedHttpServer::s3_error(400, "RequestTimeout", "Idle too long");
      default:
        return ScriptedHttpServer::answer(200);
    }
  });
  S3Client client(url_of(server), kCredentials);
  EXPECT_TRUE(client.exchange({.method = "GET", .target = client.object_path("k")},
                              {.operation = "test", .accepted = {200}}));
  EXPECT_EQ(calls.load(), 3);
}

TEST(S3ClientTest, RetriesAConnectionClosedWithoutAnAnswer) {
  std::atomic<int> calls{0};
  ScriptedHttpServer server([&](const RecordedRequest&) {
    if (++calls == 1) return std::string(ScriptedHttpServer::kCloseConnection);
    return ScriptedHttpServer::answer(200);
  });
  S3Client client(url_of(server), kCredentials);
  EXPECT_TRUE(client.exchange({.method = "GET", .target = client.object_path("k")},
                              {.operation = "test", .accepted = {200}}));
  EXPECT_GE(calls.load(), 2);
}

TEST(S3ClientTest, GivesUpAfterMaxAttempts) {
  ScriptedHttpServer server([](const RecordedRequest&) {
    return ScriptedHttpServer::s3_error(500, "InternalError", "We encountered an internal error");
  });
  S3Client client(url_of(server, "&max_attempts=4"), kCredentials);
  // A write whose outcome is unknown is Indeterminate ...
  expect_error(
      client.exchange(
          {.method = "PUT", .target = client.object_path("k"), .body = "x"},
          {.operation = "s3 blob: set", .subject = "k", .mutates = true, .accepted = {200}}),
      ErrorKind::kIndeterminate,
      {"s3 blob: set \"k\"", "PUT /bucket/pre/fix/k", "HTTP 500", "InternalError", "internal error",
       "4 attempts"});
  EXPECT_EQ(server.requests().size(), 4u);
  // ... a read that failed is Determinate.
  expect_error(client.exchange({.method = "GET", .target = client.object_path("k")},
                               {.operation = "s3 blob: get", .subject = "k", .accepted = {200}}),
               ErrorKind::kDeterminate, {"HTTP 500", "4 attempts"});
  EXPECT_EQ(server.requests().size(), 8u);
}

TEST(S3ClientTest, UnreachableEndpointIsDeterminate) {
  auto url = parse_s3_url("s3://bucket?endpoint=http://127.0.0.1:1&max_attempts=2");
  ASSERT_TRUE(url.has_value());
  S3Client client(*url, kCredentials);
  // Nothing reached a server, so even a write certainly did not apply.
  expect_error(
      client.exchange(
          {.method = "PUT", .target = client.object_path("k"), .body = "x"},
          {.operation = "s3 blob: set", .subject = "k", .mutates = true, .accepted = {200}}),
      ErrorKind::kDeterminate, {"s3 blob: set \"k\"", "connect", "2 attempts"});
}

TEST(S3ClientTest, StalledServerIsAbandoned) {
  ScriptedHttpServer server(
      [](const RecordedRequest&) { return std::string(ScriptedHttpServer::kNoAnswer); });
  S3Client client(url_of(server, "&stall_timeout=1&max_attempts=2"), kCredentials);
  // The request was sent and never answered: it may have applied.
  expect_error(client.exchange({.method = "PUT", .target = client.object_path("k"), .body = "x"},
                               {.operation = "test", .mutates = true, .accepted = {200}}),
               ErrorKind::kIndeterminate, {"2 attempts"});
  EXPECT_EQ(server.requests().size(), 2u);
}

// Each try of a server that never answers costs stall_timeout; the call
// starts none after call_timeout, whatever max_attempts allows (20 tries of
// 1 s here).
TEST(S3ClientTest, AStalledServerCostsACallAboutItsCallTimeout) {
  ScriptedHttpServer server(
      [](const RecordedRequest&) { return std::string(ScriptedHttpServer::kNoAnswer); });
  S3Client client(url_of(server, "&stall_timeout=1&max_attempts=20&call_timeout=2"), kCredentials);
  const auto started = std::chrono::steady_clock::now();
  expect_error(client.exchange({.method = "GET", .target = client.object_path("k")},
                               {.operation = "test", .accepted = {200}}),
               ErrorKind::kDeterminate, {"call_timeout"});
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_GE(took, std::chrono::seconds(2));
  EXPECT_LT(took, std::chrono::seconds(6));
  EXPECT_LE(server.requests().size(), 4u);
}

// A cancelled client gives up a transfer in progress within about a
// second (libcurl's progress callback), a call that may have applied as
// Indeterminate, and starts nothing more.
TEST(S3ClientTest, ACancelledCallGivesUpWithinASecond) {
  ScriptedHttpServer server(
      [](const RecordedRequest&) { return std::string(ScriptedHttpServer::kNoAnswer); });
  auto cancel = std::make_shared<Cancellation>();
  S3Client client(url_of(server, "&stall_timeout=60&max_attempts=8&call_timeout=600"), kCredentials,
                  cancel);
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    cancel->cancel();
  });
  const auto started = std::chrono::steady_clock::now();
  expect_error(client.exchange({.method = "PUT", .target = client.object_path("k"), .body = "x"},
                               {.operation = "test", .mutates = true, .accepted = {200}}),
               ErrorKind::kIndeterminate, {"PUT /bucket", "cancelled"});
  const auto took = std::chrono::steady_clock::now() - started;
  canceller.join();
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_EQ(server.requests().size(), 1u);
  // Later calls fail at once, without a request.
  expect_error(client.exchange({.method = "GET", .target = client.object_path("k")},
                               {.operation = "test", .accepted = {200}}),
               ErrorKind::kDeterminate, {"cancelled"});
  EXPECT_EQ(server.requests().size(), 1u);
}

TEST(S3ClientTest, RefusalsAreFinal) {
  ScriptedHttpServer server([](const RecordedRequest& request) {
    if (request.path.ends_with("/denied")) {
      return ScriptedHttpServer::s3_error(403, "SignatureDoesNotMatch", "The signature is off");
    }
    return ScriptedHttpServer::s3_error(404, "NoSuchBucket", "The bucket does not exist");
  });
  S3Client client(url_of(server), kCredentials);
  expect_error(
      client.exchange({.method = "PUT", .target = client.object_path("denied"), .body = "x"},
                      {.operation = "test", .mutates = true, .accepted = {200}}),
      ErrorKind::kDeterminate,
      {"HTTP 403", "SignatureDoesNotMatch", "The signature is off", "AWS_SECRET_ACCESS_KEY"});
  EXPECT_EQ(server.requests().size(), 1u);  // not retried
  // A 404 for the bucket is never "no such object".
  expect_error(client.exchange({.method = "GET", .target = client.object_path("k")},
                               {.operation = "test", .accepted = {200, 404}}),
               ErrorKind::kDeterminate, {"HTTP 404", "NoSuchBucket", "\"bucket\" does not exist"});
}

TEST(S3ClientTest, RefusalAfterAnUnknownOutcomeIsIndeterminate) {
  std::atomic<int> calls{0};
  ScriptedHttpServer server([&](const RecordedRequest&) {
    if (++calls == 1) return ScriptedHttpServer::s3_error(500, "InternalError", "Maybe");
    return ScriptedHttpServer::s3_error(409, "OperationAborted", "Conflict");
  });
  S3Client client(url_of(server), kCredentials);
  expect_error(client.exchange({.method = "PUT", .target = client.object_path("k"), .body = "x"},
                               {.operation = "test", .mutates = true, .accepted = {200}}),
               ErrorKind::kIndeterminate, {"HTTP 409"});
}

TEST(S3ClientTest, ChecksAreRetriedThenReported) {
  std::atomic<int> calls{0};
  ScriptedHttpServer server([&](const RecordedRequest&) {
    return ScriptedHttpServer::answer(200, ++calls < 3 ? "bad" : "good");
  });
  S3Client client(url_of(server, "&max_attempts=3"), kCredentials);
  S3Call call{.operation = "test",
              .accepted = {200},
              .check = [](const S3Answer& answer) -> std::optional<Error> {
                if (answer.body == "good") return std::nullopt;
                return corruption("the body is " + answer.body).error();
              }};
  auto answer = client.exchange({.method = "GET", .target = client.object_path("k")}, call);
  ASSERT_TRUE(answer.has_value()) << answer.error().to_string();
  EXPECT_EQ(answer->body, "good");

  calls = -100;  // bad from now on
  expect_error(client.exchange({.method = "GET", .target = client.object_path("k")}, call),
               ErrorKind::kCorruption, {"the body is bad", "3 attempts"});
}

TEST(S3ClientTest, GarbledAnswersAreErrorsNotCrashes) {
  std::atomic<int> calls{0};
  ScriptedHttpServer server([&](const RecordedRequest&) -> std::string {
    switch (++calls % 5) {
      case 0:
        return "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort";  // then closes below
      case 1:
        return "not http at all\r\n\r\n";
      case 2:
        return "HTTP/1.1 500 Scripted\r\nContent-Length: 5\r\n\r\n<Err\x01";
      case 3:
        return ScriptedHttpServer::answer(502, std::string(1 << 20, '<'));  // huge error body
      default:
        return std::string(ScriptedHttpServer::kCloseConnection);
    }
  });
  S3Client client(url_of(server, "&max_attempts=5&stall_timeout=1"), kCredentials);
  auto answer = client.exchange({.method = "GET", .target = client.object_path("k")},
                                {.operation = "test", .accepted = {200}});
  ASSERT_FALSE(answer.has_value());
  EXPECT_EQ(answer.error().kind, ErrorKind::kDeterminate);
  EXPECT_LT(answer.error().message.size(), 2000u) << answer.error().to_string();
}

TEST(S3ClientTest, AnswersLargerThanAskedForAreRefused) {
  ScriptedHttpServer server(
      [](const RecordedRequest&) { return ScriptedHttpServer::answer(200, "0123456789"); });
  S3Client client(url_of(server), kCredentials);
  expect_error(
      client.exchange({.method = "GET", .target = client.object_path("k"), .body_limit = 4},
                      {.operation = "test", .accepted = {200}}),
      ErrorKind::kDeterminate, {"more than the 4 bytes"});
  EXPECT_EQ(server.requests().size(), 1u);  // not retried
}

}  // namespace
}  // namespace tidemark
