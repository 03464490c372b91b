// A blocking HTTP/1.1 client for the server's tests: one request on a
// fresh connection (Boost.Beast), the whole answer read (a chunked stream
// to its end). Header-only; tests only.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace tidemark::testing {

struct Reply {
  unsigned status = 0;  // 0: the connection or the exchange failed
  std::string body;
  std::string content_type;
};

inline Reply http_call(std::uint16_t port, boost::beast::http::verb method,
                       const std::string& target, const std::string& body = "",
                       const std::map<std::string, std::string>& headers = {}) {
  namespace beast = boost::beast;
  namespace http = beast::http;
  boost::asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  beast::error_code ec;
  stream.expires_after(std::chrono::seconds(60));
  stream.connect(boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), port),
                 ec);
  if (ec) return {};
  http::request<http::string_body> request(method, target, 11);
  request.set(http::field::host, "127.0.0.1");
  for (const auto& [name, value] : headers) request.set(name, value);
  request.body() = body;
  request.prepare_payload();
  http::write(stream, request, ec);
  if (ec) return {};
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  http::read(stream, buffer, parser, ec);
  if (ec) return {};
  Reply reply;
  reply.status = parser.get().result_int();
  reply.body = parser.get().body();
  reply.content_type = std::string(parser.get()[http::field::content_type]);
  return reply;
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace tidemark::testing
