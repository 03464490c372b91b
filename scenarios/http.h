// A blocking HTTP/1.1 client for the scenarios (Boost.Beast): one request
// per connection. An NDJSON answer streams: it is handed over line by line,
// so reading a 20-million-line snapshot holds one line (and one 256 KiB
// read buffer), never the whole body.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>  // before Boost.Asio in http.cc, which needs std::exchange

namespace tidemark::scenarios {

struct Reply {
  unsigned status = 0;  // 0: the connection or the exchange failed (see error)
  std::string body;
  std::string error;
};

// A small request with its whole body.
Reply http(std::uint16_t port, const std::string& method, const std::string& target,
           const std::string& body = "");

// A request that creates something (a shard, a sink), retried as a client
// would while the server answers 503 (a backend failing past its retries)
// or cannot be reached, for up to `attempts` tries 100 ms apart. After a
// retry, `exists` (409: created by an earlier try whose answer was 503)
// counts as `created`.
Reply create_with_retries(std::uint16_t port, const std::string& target, const std::string& body,
                          unsigned created, unsigned exists, int attempts = 100);

// GET an NDJSON stream, calling `line` for each line (without its newline);
// `line` returning false stops early. The reply's body holds nothing of the
// stream (only an error answer's body, before any line).
Reply get_lines(std::uint16_t port, const std::string& target,
                const std::function<bool(std::string_view line)>& line);

}  // namespace tidemark::scenarios
