// ShardState's keys and the sizes of its batches (state.h).
#include "shard/state.h"

#include <cstdio>

#include "util/ids.h"

namespace tidemark {

std::uint64_t inline_bytes(const ShardState& state) {
  std::uint64_t bytes = 0;
  for (const HollowBatch& batch : state.batches) {
    for (const PartRef& part : batch.parts) bytes += part.is_inline() ? part.size : 0;
  }
  return bytes;
}

std::uint64_t HollowBatch::count() const {
  std::uint64_t n = 0;
  for (const PartRef& p : parts) n += p.count;
  return n;
}

std::uint64_t HollowBatch::bytes() const {
  std::uint64_t n = 0;
  for (const PartRef& p : parts) n += p.size;
  return n;
}

std::uint64_t HollowBatch::payload_bytes() const {
  std::uint64_t n = 0;
  for (const PartRef& p : parts) n += p.bytes;
  return n;
}

std::string shard_consensus_key(std::string_view shard) {
  return "shard/" + std::string(shard);
}
std::string shard_part_prefix(std::string_view shard) {
  return "shard/" + std::string(shard) + "/part/";
}
std::string registry_consensus_key() {
  return "registry";
}

std::string part_key(std::string_view shard, std::string_view writer_id) {
  return shard_part_prefix(shard) + std::string(writer_id) + "_" + random_id();
}

std::string_view part_key_writer(std::string_view key, std::string_view prefix) {
  if (!key.starts_with(prefix)) return {};
  std::string_view rest = key.substr(prefix.size());
  std::size_t underscore = rest.find('_');
  if (underscore == std::string_view::npos || underscore == 0) return {};
  return rest.substr(0, underscore);
}

std::string shard_rollup_prefix(std::string_view shard) {
  return "shard/" + std::string(shard) + "/rollup/";
}

std::string rollup_key(std::string_view shard, SeqNo seqno, std::string_view id) {
  // Zero-padded so keys sort by seqno.
  char digits[21];
  std::snprintf(digits, sizeof(digits), "%020llu", static_cast<unsigned long long>(seqno));
  std::string key = shard_rollup_prefix(shard) + digits;
  if (!id.empty()) key.append("-").append(id);
  return key;
}

std::optional<RollupRef> parse_rollup_key(std::string_view key, std::string_view prefix) {
  if (!key.starts_with(prefix)) return std::nullopt;
  std::string_view rest = key.substr(prefix.size());
  if (rest.size() < 20) return std::nullopt;
  std::string_view digits = rest.substr(0, 20);
  RollupRef out;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    if (out.seqno > (UINT64_MAX - 9) / 10) return std::nullopt;
    out.seqno = out.seqno * 10 + static_cast<SeqNo>(c - '0');
  }
  rest.remove_prefix(20);
  if (!rest.empty()) {
    if (rest.size() < 2 || rest[0] != '-') return std::nullopt;
    out.id = std::string(rest.substr(1));
  }
  return out;
}

Status validate_shard_name(std::string_view name) {
  if (name.empty() || name.size() > 128) {
    return invalid_usage("shard name must be 1 to 128 characters, got " +
                         std::to_string(name.size()));
  }
  for (char c : name) {
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      return invalid_usage("shard name \"" + std::string(name) +
                           "\" has a character outside [A-Za-z0-9._-]");
    }
  }
  if (name == "." || name == "..") return invalid_usage("shard name cannot be \".\" or \"..\"");
  // Blob keys use the name as a path component, and ".tmp-" components are
  // reserved for files being written.
  if (name.starts_with(".tmp-")) return invalid_usage("shard name cannot start with \".tmp-\"");
  return {};
}

}  // namespace tidemark
