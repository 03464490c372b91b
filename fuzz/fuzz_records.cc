// Fuzz target: what clients send as text. Each line of the input goes
// through the NDJSON record parser in both modes (managed and explicit) and
// the JSON parser (request bodies: shard and sink definitions); the whole
// input is also tried as a sink definition (SinkSpec::parse, which POST
// /v1/sinks and stored definitions go through), a size, a sink URL and a
// destination allow-list.
// Any input must parse or give an error, never a crash or a sanitizer
// report.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "sink/destination_url.h"
#include "sink/sink_spec.h"
#include "util/json.h"
#include "util/size.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tidemark;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string_view rest = text;
  while (!rest.empty()) {
    const auto newline = rest.find('\n');
    const std::string_view line = rest.substr(0, newline);
    (void)parse_record_line(line, RecordMode::kManaged);
    (void)parse_record_line(line, RecordMode::kExplicit);
    (void)parse_json(line);
    if (newline == std::string_view::npos) break;
    rest.remove_prefix(newline + 1);
  }
  (void)parse_json(text);
  if (auto spec = SinkSpec::parse(text)) (void)SinkSpec::parse(spec->to_json());
  (void)parse_size(text);
  if (auto url = parse_sink_url(text, SinkFormat::kJson)) (void)destination_identity(*url);
  const auto comma = text.find(';');
  if (comma != std::string_view::npos) {
    if (auto allowed = DestinationAllowList::parse(text.substr(0, comma), text.substr(comma + 1))) {
      if (auto url = parse_sink_url("kafka://a:1,b:2/t", SinkFormat::kJson)) {
        (void)allowed->check(*url);
      }
    }
  }
  return 0;
}
