// The text of HTTP requests the server decodes itself (Boost.Beast parses
// the request line, headers and chunked framing): percent-encoding and
// query strings. Their input is whatever a client sends: any bytes decode
// to something (a malformed escape is kept as written) or fail to parse as
// a time, never more (fuzz/fuzz_http.cc).
//
// Thread-safety: pure functions.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "tidemark/frontier.h"

namespace tidemark {

// %XX escapes (and '+' for a space) decoded; a malformed escape is kept
// as written.
std::string url_decode(std::string_view text);

// Every byte outside [A-Za-z0-9._~-] as %XX.
std::string url_encode(std::string_view text);

// "a=1&b=%7B%7D" -> {a: "1", b: "{}"}; a name without '=' maps to "", a
// repeated name keeps its last value.
std::map<std::string, std::string> parse_query(std::string_view query);

// A decimal time with nothing else (no sign, no spaces), within u64.
std::optional<Time> parse_time(const std::string& text);

}  // namespace tidemark
