#include "scenarios/http.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <limits>

namespace tidemark::scenarios {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;

// Any single read or write that takes longer than this fails the exchange.
constexpr auto kIoTimeout = std::chrono::seconds(300);

http::verb verb_of(const std::string& method) {
  return http::string_to_verb(method);
}

bool connect(beast::tcp_stream& stream, std::uint16_t port, Reply& reply) {
  beast::error_code ec;
  stream.expires_after(kIoTimeout);
  stream.connect(net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
  if (ec) reply.error = "connect: " + ec.message();
  return !ec;
}

void read_reply(beast::tcp_stream& stream, Reply& reply) {
  beast::error_code ec;
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  stream.expires_after(kIoTimeout);
  http::read(stream, buffer, parser, ec);
  if (ec) {
    reply.error = "read: " + ec.message();
    return;
  }
  reply.status = parser.get().result_int();
  reply.body = std::move(parser.get().body());
}

}  // namespace

Reply http(std::uint16_t port, const std::string& method, const std::string& target,
           const std::string& body) {
  Reply reply;
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  if (!connect(stream, port, reply)) return reply;
  http::request<http::string_body> request(verb_of(method), target, 11);
  request.set(http::field::host, "127.0.0.1");
  request.body() = body;
  request.prepare_payload();
  beast::error_code ec;
  http::write(stream, request, ec);
  if (ec) {
    reply.error = "write: " + ec.message();
    return reply;
  }
  read_reply(stream, reply);
  return reply;
}

Reply get_lines(std::uint16_t port, const std::string& target,
                const std::function<bool(std::string_view line)>& line) {
  Reply reply;
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  if (!connect(stream, port, reply)) return reply;
  http::request<http::empty_body> request(http::verb::get, target, 11);
  request.set(http::field::host, "127.0.0.1");
  beast::error_code ec;
  http::write(stream, request, ec);
  if (ec) {
    reply.error = "write: " + ec.message();
    return reply;
  }
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  stream.expires_after(kIoTimeout);
  http::read_header(stream, buffer, parser, ec);
  if (ec) {
    reply.error = "read header: " + ec.message();
    return reply;
  }
  reply.status = parser.get().result_int();
  std::string chunk(256 << 10, '\0');
  std::string partial;  // a line split across reads
  bool keep_going = true;
  while (!parser.is_done() && keep_going) {
    parser.get().body().data = chunk.data();
    parser.get().body().size = chunk.size();
    stream.expires_after(kIoTimeout);
    http::read(stream, buffer, parser, ec);
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      reply.error = "read body: " + ec.message();
      return reply;
    }
    const std::size_t got = chunk.size() - parser.get().body().size;
    std::string_view data(chunk.data(), got);
    if (reply.status != 200) {
      reply.body.append(data);
      continue;
    }
    while (keep_going && !data.empty()) {
      const auto newline = data.find('\n');
      if (newline == std::string_view::npos) {
        partial.append(data);
        break;
      }
      if (partial.empty()) {
        keep_going = line(data.substr(0, newline));
      } else {
        partial.append(data.substr(0, newline));
        keep_going = line(partial);
        partial.clear();
      }
      data.remove_prefix(newline + 1);
    }
  }
  if (keep_going && !partial.empty() && reply.status == 200) line(partial);
  return reply;
}

Reply create_with_retries(std::uint16_t port, const std::string& target, const std::string& body,
                          unsigned created, unsigned exists, int attempts) {
  Reply reply;
  for (int attempt = 1; attempt <= attempts; ++attempt) {
    reply = scenarios::http(port, "POST", target, body);
    if (attempt > 1 && reply.status == exists) reply.status = created;
    if (reply.status != 503 && reply.status != 0) return reply;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return reply;
}

}  // namespace tidemark::scenarios
