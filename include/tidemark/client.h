// Client and Shard: the entry points of the embedded engine.
//
// A Client opens a Location (Blob + Consensus) and manages the shards in
// it. A Shard is a handle to one shard: it inspects the shard, opens
// writers, and starts snapshots and listens. Handles are cheap; every
// process (or thread) may open its own.
//
// Thread-safety: Client and Shard are safe for concurrent use.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tidemark/error.h"
#include "tidemark/frontier.h"
#include "tidemark/location.h"

namespace tidemark {

class WriteHandle;
class SnapshotCursor;
class Listener;
class ReadHandle;
struct ReaderOptions;
struct ShardContext;

struct ClientOptions {
  // The batch builder cuts a part once its buffered updates reach this many
  // bytes; the builder's memory is about this times (1 + uploads in flight).
  std::uint64_t part_target_bytes = 8ull << 20;
  std::size_t max_uploads_in_flight = 2;
  // Uncompressed bytes per block inside a part: a reader's memory per open
  // part is about one block.
  std::size_t block_bytes = 64 << 10;
  int zstd_level = 1;
  // Listen orders each batch's updates by time within this buffer; a batch
  // larger than this is emitted in several passes over time ranges.
  std::uint64_t listen_buffer_bytes = 8ull << 20;
  // How often a listener polls consensus for a new upper.
  std::chrono::milliseconds listen_poll_interval{50};
};

// What `tidemark shard inspect` prints.
struct ShardInfo {
  std::string name;
  Frontier upper;
  Frontier since;
  SeqNo seqno = 0;
  std::uint64_t batches = 0;
  std::uint64_t parts = 0;
  std::uint64_t updates = 0;  // stored updates, before consolidation
  std::uint64_t bytes = 0;    // encoded bytes of all parts

  // {"name", "upper", "since", "seqno", "batches", "parts", "updates", "bytes"}
  std::string to_json() const;
};

class Shard {
 public:
  explicit Shard(std::shared_ptr<ShardContext> context);
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  const std::string& name() const;

  [[nodiscard]] Result<ShardInfo> inspect();
  // The shard's current upper, read from consensus.
  [[nodiscard]] Result<Frontier> upper();

  // Registers a new writer with the shard.
  [[nodiscard]] Result<std::unique_ptr<WriteHandle>> open_writer();

  // A leased reader holding the shard's current since.
  [[nodiscard]] Result<std::unique_ptr<ReadHandle>> open_reader(const ReaderOptions& options);
  // A critical reader: `reader_id` names it across restarts; reopening
  // finds its hold where it was left.
  [[nodiscard]] Result<std::unique_ptr<ReadHandle>> open_critical_reader(
      std::string_view reader_id);

  // Consolidated contents at `as_of`. NotReady when as_of >= upper (not yet
  // final); SinceViolation when as_of < since.
  [[nodiscard]] Result<SnapshotCursor> snapshot(Time as_of);

  // Updates at times > from, in time order, with progress as the upper
  // advances; stops at `until` when given (updates at times < until only).
  [[nodiscard]] Result<std::unique_ptr<Listener>> listen(Time from,
                                                         std::optional<Time> until = std::nullopt);

 private:
  std::shared_ptr<ShardContext> context_;
};

class Client {
 public:
  [[nodiscard]] static Result<std::shared_ptr<Client>> open(Location location,
                                                            ClientOptions options = {});
  // Opens the location named by two URLs (DESIGN.md section 9).
  [[nodiscard]] static Result<std::shared_ptr<Client>> open(std::string_view blob_url,
                                                            std::string_view consensus_url,
                                                            ClientOptions options = {});

  Client(Location location, ClientOptions options);
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // AlreadyExists when a shard of that name exists; InvalidUsage for a name
  // outside [A-Za-z0-9._-]{1,128}.
  [[nodiscard]] Status create_shard(std::string_view name);
  [[nodiscard]] Result<std::vector<std::string>> list_shards();
  // NotFound when there is no such shard.
  [[nodiscard]] Result<std::shared_ptr<Shard>> open_shard(std::string_view name);

  const Location& location() const { return location_; }
  const ClientOptions& options() const { return options_; }

 private:
  Location location_;
  ClientOptions options_;
};

}  // namespace tidemark
