// Server: the HTTP contract (README, "The server") over Boost.Beast.
//
// Asynchronous: a few I/O threads run every connection (no thread per
// connection); work that blocks (consensus, blob, part uploads, reads) runs
// on a small worker pool and posts its result back to the connection.
//
// Routes: /healthz; /metrics (Prometheus text); POST/GET /v1/shards;
// GET /v1/shards/{name}; POST /v1/shards/{name}/append[?lower=L&upper=U];
// GET /v1/shards/{name}/snapshot?as_of=T; GET /v1/shards/{name}/listen?from=T[&until=T].
// Errors are JSON {"error": message} with the status of the contract.
//
// Appends stream: the body is read in kBodyChunkBytes pieces and each
// record is parsed as it arrives, never buffering the body whole.
//   - Managed (no lower/upper): records are enqueued into the shard's
//     background appender as they arrive; the answer comes once the last
//     one is durable: 200 {"time", "count", "upper"}, where time is the
//     last record's commit time (a request's records may span batches:
//     each is committed at a time <= it) and upper is time + 1. A malformed line
//     gets 400 {"error", "line", "appended"}: the records before it were
//     enqueued and are durable when the 400 is sent (`appended` of them).
//   - Explicit (?lower=L&upper=U): records go into one batch as they
//     arrive (parts uploaded on the way) and one compare_and_append
//     commits them: all or nothing. 200 {"time", "count", "lower", "upper"};
//     409 {"error": "upper mismatch", "expected", "current"}; 400 with the
//     line: nothing appended.
//   A record line longer than max_record_bytes gets 413.
// Reads stream NDJSON with chunked transfer, one chunk of at most
// kStreamChunkBytes at a time: a slow reader holds back only its own
// stream. An error after the 200 header is a last line {"error": ...}.
//
// Memory: one MemoryPool tree of memory_limit bytes:
//   requests   1/4: body chunks and partial record lines being read. A
//              connection reads a body only once its chunk's bytes are
//              reserved (first come first served; the others wait: their
//              sockets are not read). A record line split across chunks is
//              charged without waiting (waiting while holding a chunk could
//              deadlock), so the overdraft is at most one partial line per
//              connection.
//   appenders  3/8: the shards' appender queues (records until durable);
//              a full queue pauses the request until commits free room
//   reads      1/8: snapshot and listen chunks (one per stream)
//   sinks      1/4: the server's sinks (a Kafka producer's queue)
//
// Security: binds 127.0.0.1 unless told otherwise; with a token every
// route but /healthz needs "Authorization: Bearer <token>"; headers are
// limited to kHeaderLimitBytes and non-append bodies to kSmallBodyBytes;
// shard names are validated; the only path a request names is a file
// sink's directory, which must lie inside file_sink_root.
//
// Thread-safety: start/stop/wait from one thread; everything else is
// internal.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "tidemark/appender.h"
#include "tidemark/client.h"

namespace tidemark {

struct ServerOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 6875;  // 0: any free port (see Server::port)
  std::uint64_t memory_limit = 256ull << 20;
  std::optional<std::string> token;  // bearer token; none: no auth
  // The longest record line an append takes (413 above it). Unset:
  // min(32 MiB, memory_limit / 8). Set: at most memory_limit / 4, so one
  // record always fits the requests and appenders pools.
  std::optional<std::uint64_t> max_record_bytes;
  // Event loops of one thread each; a connection stays on the loop it was
  // accepted into (the acceptor has a thread of its own besides).
  unsigned io_threads = 2;
  unsigned workers = 4;
  // Open connections at most; one more is answered 503 and closed at once
  // (each holds a file descriptor and, while it sends a body, a chunk of
  // the requests pool). 0: no limit.
  std::size_t max_connections = 1000;
  // A request body must arrive at this pace: every `body_rate_window` spent
  // waiting for the client must bring min_body_rate bytes a second, or the
  // request is answered 408 and its connection closed. 0: no minimum (a
  // body then waits at most 60 s for its next bytes). A connection waiting
  // for its client's bytes holds no buffer from the requests pool.
  std::uint64_t min_body_rate = 1024;
  std::chrono::milliseconds body_rate_window{10'000};
  // A read or write that waits on the client (the next request's header,
  // body bytes that are on their way, an answer or a stream's chunk the
  // client does not take) closes the connection after this long. Time the
  // server spends (a commit, a stream with nothing to send) never counts.
  std::chrono::milliseconds idle_timeout{60'000};
  // A shard's appender, explicit-append writer and open shard handle that
  // no request has used for this long (and that hold no record) are
  // closed, so idle shards cost no threads, no lease heartbeats and no
  // cached state; the next request opens them again. A sink whose shard
  // has not changed for this long closes its destination the same way (a
  // Kafka producer's threads and queue), and opens it on the next change.
  // 0: never.
  std::chrono::milliseconds idle_close{30'000};
  // A sink's snapshot is committed in parts of about this many bytes (or
  // one every 60 s): Kafka transactions, or file or S3 parts that a
  // restarted or taken-over sink goes on after (SinkOptions).
  std::uint64_t sink_snapshot_part_bytes = 64ull << 20;
  // Where file:// sinks may write: a sink's directory must be inside it
  // (after resolving "..", symlinks of existing parts). Unset: file sinks
  // are refused.
  std::optional<std::string> file_sink_root;
  // The S3 endpoints and Kafka brokers that sinks created over HTTP may
  // reach; anything else is refused with 400 before a connection is made.
  // Comma-separated: "http[s]://host[:port]" for S3, "host[:port]" for
  // Kafka; hosts compare case-insensitively, as spelled (a name and its
  // address are two entries), and an entry without a port allows every
  // port of its host. A Kafka URL is allowed when every bootstrap broker it
  // names is. Empty: none. A malformed entry fails start() with
  // InvalidUsage. A stored sink whose destination the lists do not allow
  // is not run here: it shows "waiting", saying why, and another server
  // that allows it takes it.
  std::string allowed_s3_endpoints;
  std::string allowed_kafka_brokers;
  // This server's id among servers sharing one blob store, written into the
  // sinks it creates and into its sink leases: on start it takes back at
  // once the sinks its previous life held, and any server takes a sink
  // whose lease is free or lapsed (server/sinks.h). A file:// sink stored
  // without a host name stays with the server that created it. `tidemark
  // serve` keeps its id in <data>/server-id.
  std::string sink_owner;
  // The shards' appenders: batch limits, linger, batched appends, retries.
  // The server sets parent_pool and queue_bytes (its appenders pool).
  AppenderOptions appender;
  // Benchmarks only: bound the appenders' queues by record count instead of
  // bytes (AppenderOptions::queue_records), to compare against.
  std::optional<std::size_t> appender_queue_records;
};

class Server {
 public:
  static constexpr std::size_t kHeaderLimitBytes = 16 << 10;
  static constexpr std::size_t kSmallBodyBytes = 64 << 10;
  static constexpr std::size_t kBodyChunkBytes = 64 << 10;
  static constexpr std::size_t kStreamChunkBytes = 64 << 10;

  // Binds and starts serving. InvalidUsage for bad options; Determinate if
  // the address cannot be bound.
  [[nodiscard]] static Result<std::unique_ptr<Server>> start(std::shared_ptr<Client> client,
                                                             ServerOptions options);
  ~Server();  // stop()

  std::uint16_t port() const;
  // Graceful: stop accepting, let requests in flight finish (up to
  // `grace`), close the appenders (their queued records commit), stop.
  void stop(std::chrono::milliseconds grace = std::chrono::seconds(10));
  // Blocks until stop() has finished.
  void wait();

  struct Impl;

 private:
  explicit Server(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace tidemark
