// Fuzz target: the records sinks read back from places others can write:
// lease records in consensus, progress records in a Kafka progress topic,
// and committed object and file names in a destination. Any input must
// parse or give an error, never a crash or a sanitizer report.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "sink/committed_name.h"
#include "sink/consensus_lease.h"
#include "sink/kafka_destination.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tidemark;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)LeaseRecord::parse(text);
  (void)KafkaProgressRecord::parse(text);
  (void)parse_committed_name("fuzz", text, ".json");
  (void)parse_committed_name("fuzz", text, ".csv");
  (void)KafkaAddress::parse(text);
  return 0;
}
