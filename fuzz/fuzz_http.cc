// Fuzz target: HTTP requests as a client sends them. The input is fed, in
// pieces as a socket would deliver them, to the parser the server uses
// (Boost.Beast's request_parser with a buffer body, the server's header
// limit, an unlimited body read in chunks); once the header is parsed, the
// target's query goes through the server's own decoding (parse_query,
// url_decode, parse_time), and every decoded value is encoded and decoded
// back. Any input must parse or give an error, never a crash or a
// sanitizer report.
#include <algorithm>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>

#include "server/http_text.h"
#include "tidemark/server.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tidemark;
  namespace http = boost::beast::http;
  http::request_parser<http::buffer_body> parser;
  parser.header_limit(Server::kHeaderLimitBytes);
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  char body[512];
  // The first byte picks the size of the pieces the input arrives in.
  const std::size_t piece = size > 0 ? 1 + data[0] % 64 : 1;
  std::size_t at = size > 0 ? 1 : 0;
  boost::beast::error_code ec;
  // As a connection does: each offer holds every byte offered before and
  // not consumed, plus the next piece (the parser's contract after
  // need_more).
  std::size_t offered = at;
  while (at < size && !parser.is_done()) {
    if (parser.is_header_done()) {
      parser.get().body().data = body;
      parser.get().body().size = sizeof body;
    }
    offered = std::min(size, std::max(offered, at) + piece);
    const std::size_t used = parser.put(boost::asio::buffer(data + at, offered - at), ec);
    if (ec == http::error::need_buffer || ec == http::error::need_more) ec = {};
    if (ec) break;
    at += used;
    if (used == 0 && offered == size) break;  // it wants bytes there are not
  }
  if (!parser.is_header_done()) return 0;
  const auto raw_target = parser.get().target();
  const std::string_view target(raw_target.data(), raw_target.size());
  const auto question = target.find('?');
  const std::string_view path = target.substr(0, question);
  (void)url_decode(path);
  if (question == std::string_view::npos) return 0;
  for (const auto& [name, value] : parse_query(target.substr(question + 1))) {
    (void)parse_time(value);
    if (url_decode(url_encode(value)) != value) std::abort();  // encoding round-trips
    (void)name;
  }
  return 0;
}
