// A blocking HTTP/1.1 client for tests that meet faults: every request has
// a deadline, and a streamed answer (NDJSON) is handed over line by line as
// it arrives, so a test can follow a listen that never ends and notice a
// stream that stalls or breaks. One request per connection (Boost.Beast).
// Header-only; tests only.
//
//   HttpResult r = http_request(port, "POST", "/v1/shards/s/append", body, {}, 10s);
//   if (r.outcome == HttpOutcome::kAnswered && r.status == 200) ...
//
//   HttpResult s = http_stream(port, "/v1/shards/s/listen?from=5", 20s,
//                              [&](std::string_view line) { ...; return true; });
//
// Thread-safety: the functions share nothing; call them from any thread.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <string_view>

namespace tidemark::testing {

enum class HttpOutcome {
  kAnswered,     // a whole answer (for a stream: its whole body) was read
  kRefused,      // no connection (nothing listens, or it was reset at once)
  kTimedOut,     // the deadline (or a stream's idle timeout) passed first
  kBroken,       // the connection failed after it was made
  kStoppedEarly  // http_stream's callback asked to stop
};

inline const char* to_string(HttpOutcome outcome) {
  switch (outcome) {
    case HttpOutcome::kAnswered:
      return "answered";
    case HttpOutcome::kRefused:
      return "refused";
    case HttpOutcome::kTimedOut:
      return "timed out";
    case HttpOutcome::kBroken:
      return "broken";
    case HttpOutcome::kStoppedEarly:
      return "stopped early";
  }
  return "?";
}

struct HttpResult {
  HttpOutcome outcome = HttpOutcome::kRefused;
  unsigned status = 0;  // when the status line was read, even if the body then broke
  std::string body;     // the whole body (http_request), or a non-200 stream's
  std::string error;    // what failed, for messages
};

namespace http_client_detail {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;

inline HttpOutcome failed(const beast::error_code& ec) {
  return ec == beast::error::timeout ? HttpOutcome::kTimedOut : HttpOutcome::kBroken;
}

// Runs the asynchronous operation `start` begins on `ioc` to its end.
template <typename Start>
beast::error_code run(boost::asio::io_context& ioc, Start start) {
  beast::error_code result;
  start([&result](beast::error_code ec, auto&&...) { result = ec; });
  ioc.restart();
  ioc.run();
  return result;
}

inline bool connect(boost::asio::io_context& ioc, beast::tcp_stream& stream, std::uint16_t port,
                    std::chrono::steady_clock::duration timeout, HttpResult& result) {
  stream.expires_after(timeout);
  const tcp::endpoint endpoint(boost::asio::ip::make_address("127.0.0.1"), port);
  beast::error_code ec =
      run(ioc, [&](auto handler) { stream.async_connect(endpoint, std::move(handler)); });
  if (!ec) return true;
  result.outcome = ec == beast::error::timeout ? HttpOutcome::kTimedOut : HttpOutcome::kRefused;
  result.error = "connect: " + ec.message();
  return false;
}

}  // namespace http_client_detail

// One request on a fresh connection; the whole exchange must end within
// `timeout`.
inline HttpResult http_request(
    std::uint16_t port, std::string_view method, const std::string& target,
    const std::string& body = "", const std::map<std::string, std::string>& headers = {},
    std::chrono::steady_clock::duration timeout = std::chrono::seconds(10)) {
  using namespace http_client_detail;
  HttpResult result;
  boost::asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  if (!connect(ioc, stream, port, timeout, result)) return result;
  http::request<http::string_body> request(
      http::string_to_verb(beast::string_view(method.data(), method.size())), target, 11);
  request.set(http::field::host, "127.0.0.1");
  for (const auto& [name, value] : headers) request.set(name, value);
  request.body() = body;
  request.prepare_payload();
  // The deadline set at connect runs on for the whole exchange.
  beast::error_code ec =
      run(ioc, [&](auto handler) { http::async_write(stream, request, std::move(handler)); });
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  if (!ec) {
    ec = run(ioc, [&](auto handler) {
      http::async_read_header(stream, buffer, parser, std::move(handler));
    });
  }
  if (!ec) {
    result.status = parser.get().result_int();
    ec = run(ioc,
             [&](auto handler) { http::async_read(stream, buffer, parser, std::move(handler)); });
  }
  if (ec) {
    result.outcome = failed(ec);
    result.error = ec.message();
    return result;
  }
  result.outcome = HttpOutcome::kAnswered;
  result.body = std::move(parser.get().body());
  return result;
}

// A GET whose answer streams: `on_line` gets each complete line of a 200
// answer as it arrives (without its newline) and returns false to stop.
// Connecting and the header must come within `idle_timeout`, and so must
// each piece of the body after it. A non-200 answer's body is returned
// whole in `body`. A last line without a newline is handed over too.
inline HttpResult http_stream(std::uint16_t port, const std::string& target,
                              std::chrono::steady_clock::duration idle_timeout,
                              const std::function<bool(std::string_view)>& on_line) {
  using namespace http_client_detail;
  HttpResult result;
  boost::asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  if (!connect(ioc, stream, port, idle_timeout, result)) return result;
  http::request<http::empty_body> request(http::verb::get, target, 11);
  request.set(http::field::host, "127.0.0.1");
  beast::error_code ec =
      run(ioc, [&](auto handler) { http::async_write(stream, request, std::move(handler)); });
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  if (!ec) {
    ec = run(ioc, [&](auto handler) {
      http::async_read_header(stream, buffer, parser, std::move(handler));
    });
  }
  if (ec) {
    result.outcome = failed(ec);
    result.error = ec.message();
    return result;
  }
  result.status = parser.get().result_int();
  std::string pending;
  char piece[64 * 1024];
  while (!parser.is_done()) {
    parser.get().body().data = piece;
    parser.get().body().size = sizeof piece;
    stream.expires_after(idle_timeout);
    ec = run(ioc,
             [&](auto handler) { http::async_read(stream, buffer, parser, std::move(handler)); });
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      result.outcome = failed(ec);
      result.error = ec.message();
      return result;
    }
    const std::size_t got = sizeof piece - parser.get().body().size;
    if (result.status != 200) {
      result.body.append(piece, got);
      continue;
    }
    pending.append(piece, got);
    std::size_t at = 0;
    for (std::size_t end; (end = pending.find('\n', at)) != std::string::npos; at = end + 1) {
      if (!on_line(std::string_view(pending).substr(at, end - at))) {
        result.outcome = HttpOutcome::kStoppedEarly;
        return result;
      }
    }
    pending.erase(0, at);
  }
  if (result.status == 200 && !pending.empty() && !on_line(pending)) {
    result.outcome = HttpOutcome::kStoppedEarly;
    return result;
  }
  result.outcome = HttpOutcome::kAnswered;
  return result;
}

}  // namespace tidemark::testing
