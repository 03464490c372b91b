// PostgresConsensus: a Consensus in a PostgreSQL database, for many
// processes sharing shards (`postgres://user:password@host:port/db`, or
// `postgresql://`). The URL is handed to libpq as a connection URI, so
// libpq parameters pass through (`?options=-csearch_path%3Dtidemark`,
// `connect_timeout=10`, `sslmode=require`), except `call_timeout`, which is
// ours (below) and removed before libpq sees the URL. Unless the URL says
// otherwise, connecting gives up after 5 s and TCP keepalives notice a
// vanished server within about a minute.
//
// Client-side timeout: `call_timeout=SECONDS` (1 to 3600, default 30) bounds
// every call: waiting for a pooled connection, setting a new one up and the
// statement itself must end within that long of the call's start
// (connecting is bounded by libpq's `connect_timeout` as well). Neither TCP
// nor PostgreSQL notices a peer that accepts bytes and never answers (a
// stalled server, a proxy or firewall that holds the connection): its
// kernel acknowledges the statement and answers keepalives. A call that
// runs out of time closes its connection.
//
// Schema (created at open when missing, in the first schema of the
// search_path, under a transaction-scoped advisory lock so that processes
// opening at once do not race on the catalog):
//   tidemark_consensus_heads(key TEXT PRIMARY KEY, seqno BIGINT NOT NULL)
//   tidemark_consensus(key TEXT, seqno BIGINT, data BYTEA NOT NULL,
//                      PRIMARY KEY(key, seqno))
// (keys use the "C" collation: byte order, whatever the database locale).
// Seqnos follow seqno_bounds.h (BIGINT is signed 64-bit).
//
// Invariants:
//   - a key's head row holds the largest seqno among its versions, and that
//     version is never deleted: truncate deletes only below a seqno no
//     greater than the head's;
//   - compare_and_set is one statement in its own transaction, one round
//     trip: it moves the head row from `expected` to `next` (or creates it
//     when `expected` is nullopt) and inserts the version only if the row
//     moved. Racing calls queue on the head row's lock; under READ
//     COMMITTED, which every connection sets, the loser re-reads the moved
//     row, matches nothing and inserts nothing. That makes it linearizable
//     across processes;
//   - each connection raises synchronous_commit to `on` if the server has it
//     `off`, so a commit is durable when compare_and_set or truncate returns.
//
// Errors: failing to connect, and any failed head or scan, is Determinate.
// A compare_and_set or truncate that the server answers with an ERROR on a
// live connection rolled back: Determinate. Any other failure once it was
// sent (a lost connection, a FATAL such as a terminated backend, the call
// timeout) is Indeterminate: it may have committed; a call that timed out
// before its statement was sent is Determinate. A malformed URL (or
// call_timeout) is InvalidUsage.
// Messages name the call and key and carry libpq's message, with the
// password (and sslpassword) replaced by "***". The server applies no
// statement timeout of its own unless the URL sets one
// (`options=-cstatement_timeout%3D10s`); call_timeout is the client's.
//
// Change hints (subscribe_change_hints): a compare_and_set that commits
// also sends NOTIFY on channel kHintChannel in its own transaction (so it
// is delivered only if it committed), with "SEQNO KEY" as the payload, or
// an empty payload for a key too long for NOTIFY's 8000-byte limit
// (delivered as a kAll hint). The first subscriber starts one thread with
// one more connection of its own that LISTENs on the channel; every later
// subscriber shares it. The thread waits on the connection's socket and a
// wakeup pipe (poll), drains the notifications, coalesces them per key
// (at most kMaxPendingHints keys at once; beyond that one kAll) and calls
// the subscribers. A lost connection is reported as kLost and opened
// again, with Backoff, then reported as kAll: notifications sent while it
// was down are lost, so subscribers read every key again. The channel is
// one per database: processes using other schemas of the same database
// send hints of their own keys too, which reach every listener (spurious
// hints, harmless). Hints cost every committing transaction NOTIFY's
// database-wide lock at commit.
//
// Bounds: at most kMaxConnections connections per instance, opened on
// demand and kept open while healthy; each prepares its statements once, so
// a pooler in between must keep sessions (PgBouncer's session mode). A
// broken connection (server restart, terminated backend) is closed when
// noticed, at the latest when it is next taken from the pool, and the next
// call opens a fresh one.
//
// Thread-safety: safe for concurrent use from many threads (each call holds
// one connection of the pool; calls beyond kMaxConnections wait for one to
// be returned) and from many processes sharing one database. Hint
// subscribers are called on the hint thread, one call at a time. The
// destructor stops the hint thread, waiting at most for a connection
// attempt in progress (libpq's connect_timeout). Do not carry
// an instance across fork(): open a new one in the child.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tidemark/location.h"

struct pg_conn;
struct pg_result;

namespace tidemark {

class PostgresConsensus : public Consensus {
 public:
  static constexpr std::size_t kMaxConnections = 8;
  static constexpr std::chrono::seconds kDefaultCallTimeout{30};
  static constexpr const char* kHintChannel = "tidemark_consensus";
  static constexpr std::size_t kMaxPendingHints = 1024;

  // Connects once (so a wrong URL or an unreachable server fails here, as
  // Determinate), creates the tables if missing and keeps the connection in
  // the pool.
  [[nodiscard]] static Result<std::unique_ptr<PostgresConsensus>> open(std::string url);

  [[nodiscard]] Result<std::optional<VersionedData>> head(std::string_view key) override;
  [[nodiscard]] Result<CasOutcome> compare_and_set(std::string_view key,
                                                   std::optional<SeqNo> expected,
                                                   VersionedData next) override;
  [[nodiscard]] Result<std::vector<VersionedData>> scan(std::string_view key, SeqNo from,
                                                        std::size_t limit) override;
  [[nodiscard]] Result<std::size_t> truncate(std::string_view key, SeqNo seqno) override;
  [[nodiscard]] std::optional<std::uint64_t> subscribe_change_hints(
      std::function<void(const ChangeHint&)> on_hint) override;
  void unsubscribe_change_hints(std::uint64_t id) override;

  // The URL with its password replaced by "***", as messages show it.
  const std::string& redacted_url() const { return redacted_url_; }
  std::chrono::milliseconds call_timeout() const { return call_timeout_; }

 private:
  struct ConnectionCloser {
    void operator()(pg_conn* connection) const;
  };
  struct ResultClearer {
    void operator()(pg_result* result) const;
  };
  using Connection = std::unique_ptr<pg_conn, ConnectionCloser>;
  using QueryResult = std::unique_ptr<pg_result, ResultClearer>;

  // A connection taken from the pool for one call; returned (or closed, if
  // broken) when the lease ends.
  class Lease;

  // One bound parameter, always in binary format.
  struct Parameter {
    // REQUIRES: `bytes` outlives the statement it is bound to, and is
    // shorter than 2 GiB.
    static Parameter of(std::string_view bytes);
    const char* bytes;
    int length;
  };
  enum class Effect : bool { kRead, kWrite };

  using Deadline = std::chrono::steady_clock::time_point;

  // Lets open() use std::make_unique while keeping construction private.
  struct PrivateTag {};

 public:
  PostgresConsensus(PrivateTag, std::string url, std::string redacted_url,
                    std::vector<std::string> secrets, std::chrono::milliseconds call_timeout);
  ~PostgresConsensus() override;

 private:
  // A new connection, in non-blocking mode, with its session set up and
  // statements prepared by `deadline`; `create_tables` also creates the
  // schema first.
  [[nodiscard]] Result<Connection> connect(bool create_tables, Deadline deadline);

  // A healthy idle connection, or a new one when there is none and fewer
  // than kMaxConnections exist; otherwise waits for one to be returned, at
  // most until `deadline` (then Determinate).
  [[nodiscard]] Result<Lease> lease(Deadline deadline);
  // Back to the pool, or closed when `broken` or not reusable.
  void give_back(Connection connection, bool broken);

  // Runs the prepared statement `name`, returning its result when it
  // succeeded by `deadline` and otherwise an error classified by `effect`
  // (see Errors above). A statement that timed out closes the connection.
  [[nodiscard]] Result<QueryResult> execute(Lease& lease, const char* name,
                                            std::span<const Parameter> parameters, Effect effect,
                                            std::string_view call, std::string_view key,
                                            Deadline deadline);

  Deadline deadline() const { return std::chrono::steady_clock::now() + call_timeout_; }
  // "the call timeout (30 s)", for messages.
  std::string call_timeout_text() const;

  // Sends what libpq still holds of the command just sent on `connection`
  // (non-blocking) and waits for its results: the first that failed, or
  // else the last (null if there was none). nullopt when `deadline` passed
  // first.
  [[nodiscard]] static std::optional<QueryResult> await_results(pg_conn* connection,
                                                                Deadline deadline);

  // "postgres consensus <redacted url>: <what>: <detail>", with every
  // secret in `detail` replaced; the second names the call and its key.
  std::string describe(std::string_view what, std::string_view detail) const;
  std::string describe(std::string_view call, std::string_view key, std::string_view detail) const;

  // The hint thread's body: LISTEN, deliver, reconnect, until stopped.
  void run_hints();
  // A connection that LISTENs on kHintChannel, or the error.
  [[nodiscard]] Result<Connection> connect_listener();
  // Calls every hint subscriber (`all`: also those already greeted) with
  // `hint`; only those not yet greeted when `greet_only`.
  void deliver(const ChangeHint& hint, bool greet_only = false);
  // Waits up to `timeout` (forever when negative) for the wakeup pipe, or
  // the socket `fd` (when >= 0) to be readable; drains the pipe. False
  // once the object is being destroyed.
  bool wait_for_hints(int fd, int timeout_ms);

  [[nodiscard]] Result<VersionedData> read_version(const pg_result* result, int row,
                                                   std::string_view key) const;

  const std::string url_;
  const std::string redacted_url_;
  const std::vector<std::string> secrets_;  // the password as written and as decoded
  const std::chrono::milliseconds call_timeout_;

  std::mutex mutex_;
  // Notified when a connection is returned to the pool or closed.
  std::condition_variable connection_released_;
  std::vector<Connection> idle_;      // guarded by mutex_
  std::size_t open_connections_ = 0;  // idle, leased or being opened; guarded by mutex_

  // Change hints.
  struct HintSubscriber {
    std::shared_ptr<std::function<void(const ChangeHint&)>> on_hint;
    bool greeted = false;  // has had the kAll of the current connection
  };
  std::mutex hints_mutex_;
  std::map<std::uint64_t, HintSubscriber> hint_subscribers_;  // guarded by hints_mutex_
  std::uint64_t next_hint_id_ = 1;                            // guarded by hints_mutex_
  bool hints_connected_ = false;                              // guarded by hints_mutex_
  bool hints_stopping_ = false;                               // guarded by hints_mutex_
  std::mutex hint_delivery_;                                  // held while calling subscribers
  int hint_wakeup_[2] = {-1, -1};                             // a pipe: read end, write end
  std::thread hint_thread_;                                   // started by the first subscriber
};

}  // namespace tidemark
