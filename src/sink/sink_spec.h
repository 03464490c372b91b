// SinkSpec: a sink's definition as the server stores and takes it over
// HTTP: {"name", "shard", "to", "envelope", "format"[, "owner"][, "host"]}.
//
// parse() checks everything a definition holds without touching anything:
// the names (shard-name rules), the destination URL for its format
// (destination_url.h), the envelope and format. Its input comes from
// clients (POST /v1/sinks) and from the blob store (stored definitions),
// so any bytes give a definition or an InvalidUsage error (fuzz_records).
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "sink/destination_url.h"
#include "sink/envelope.h"
#include "tidemark/error.h"

namespace tidemark {

struct SinkSpec {
  std::string name;
  std::string shard;
  std::string to;
  Envelope envelope = Envelope::kUpsert;
  SinkFormat format = SinkFormat::kJson;
  // The server that created it; "" in a definition from before servers
  // shared sinks.
  std::string owner;
  // A file:// sink's machine (its creator's host name): its directory is
  // that machine's disk, so only servers of that host name run it. "" for
  // other destinations, and in older definitions (only `owner` runs those).
  std::string host;
  // How many times it was updated (PUT /v1/sinks/NAME). Not in its JSON:
  // the server keeps it in the definition's key (server/sinks.cc).
  std::uint64_t revision = 0;

  std::string to_json() const;
  // InvalidUsage naming what is wrong (names, URL, envelope, format).
  [[nodiscard]] static Result<SinkSpec> parse(std::string_view json);
};

}  // namespace tidemark
