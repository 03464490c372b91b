// SqliteConsensus: a Consensus in one SQLite database file; the embedded
// default (`sqlite:///abs/path.db`).
//
// Schema (created on open):
//   consensus(shard_key TEXT NOT NULL, seqno INTEGER NOT NULL,
//             data BLOB NOT NULL, PRIMARY KEY(shard_key, seqno)) WITHOUT ROWID
// (the primary key is the only index the queries need).
// Seqnos follow seqno_bounds.h (SQLite integers are signed 64-bit).
//
// Invariants:
//   - the database is in WAL mode with synchronous=FULL, so a commit is
//     durable when compare_and_set or truncate returns;
//   - compare_and_set and truncate (and their _many forms, all requests in
//     one) run in BEGIN IMMEDIATE transactions: the
//     read of the head and the write that depends on it hold SQLite's write
//     lock together, which is what makes compare_and_set linearizable across
//     processes sharing the file.
//
// Errors: waiting longer than the busy timeout (10 s) for another process's
// lock, or any failure before COMMIT, is Determinate; a failed COMMIT is
// Indeterminate.
//
// Thread-safety: safe for concurrent use from many threads (one connection,
// serialized by a mutex), and from several processes each opening the same
// file. Do not carry an instance across fork(): open a new one in the child.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tidemark/location.h"

struct sqlite3;
struct sqlite3_stmt;

namespace tidemark {

class SqliteConsensus : public Consensus {
 public:
  // Opens (creating if missing) the database at `path` and its parent
  // directory.
  [[nodiscard]] static Result<std::unique_ptr<SqliteConsensus>> open(std::string path);

  [[nodiscard]] Result<std::optional<VersionedData>> head(std::string_view key) override;
  // Every key's in one read transaction, and none read again while no
  // other connection has committed (known_heads_ below).
  [[nodiscard]] Result<std::vector<std::optional<SeqNo>>> head_seqnos(
      const std::vector<std::string>& keys) override;
  [[nodiscard]] Result<CasOutcome> compare_and_set(std::string_view key,
                                                   std::optional<SeqNo> expected,
                                                   VersionedData next) override;
  [[nodiscard]] Result<std::vector<VersionedData>> scan(std::string_view key, SeqNo from,
                                                        std::size_t limit) override;
  [[nodiscard]] Result<std::size_t> truncate(std::string_view key, SeqNo seqno) override;
  // Each in one transaction: one commit, one sync.
  [[nodiscard]] std::vector<Result<CasOutcome>> compare_and_set_many(
      const std::vector<CasRequest>& requests) override;
  [[nodiscard]] std::vector<Result<std::size_t>> truncate_many(
      const std::vector<std::pair<std::string, SeqNo>>& truncations) override;

  const std::string& path() const { return path_; }

 private:
  struct ConnectionCloser {
    void operator()(sqlite3* connection) const;
  };
  struct StatementFinalizer {
    void operator()(sqlite3_stmt* statement) const;
  };
  using Connection = std::unique_ptr<sqlite3, ConnectionCloser>;
  using Statement = std::unique_ptr<sqlite3_stmt, StatementFinalizer>;

  // Lets open() use std::make_unique while keeping construction private.
  struct PrivateTag {};

 public:
  SqliteConsensus(PrivateTag, std::string path, Connection connection);

 private:
  [[nodiscard]] Status prepare_statements();

  // Reads the head seqno of `key` inside the current transaction.
  [[nodiscard]] Result<std::optional<SeqNo>> head_seqno(std::string_view key);
  // BEGIN IMMEDIATE (Determinate on failure) and COMMIT (Indeterminate).
  [[nodiscard]] Status begin_write(std::string_view what);
  [[nodiscard]] Status commit_write(std::string_view what);
  // The bodies of compare_and_set and truncate, inside an open write
  // transaction (the caller rolls it back after an error).
  [[nodiscard]] Result<CasOutcome> compare_and_set_in_transaction(std::string_view key,
                                                                  std::optional<SeqNo> expected,
                                                                  const VersionedData& next);
  [[nodiscard]] Result<std::size_t> truncate_in_transaction(std::string_view key, SeqNo seqno);
  // This connection's own commit moved `key`'s head to `seqno` (nullopt:
  // it may or may not have): keeps known_heads_ true.
  void learn_head(std::string_view key, std::optional<SeqNo> seqno);

  // "sqlite consensus <path>: <what>: <sqlite message>".
  std::string describe(std::string_view what, int code) const;

  const std::string path_;

  std::mutex mutex_;
  // Declared before the statements so it is closed after they are finalized.
  Connection connection_;  // guarded by mutex_, as are the statements
  Statement begin_;
  Statement begin_read_;
  Statement select_data_version_;
  Statement commit_;
  Statement rollback_;
  Statement select_head_;
  Statement select_head_seqno_;
  Statement insert_;
  Statement select_range_;
  Statement delete_below_;

  // Head seqnos head_seqnos() has read, kept while PRAGMA data_version
  // says no other connection (another process, or another instance on the
  // same file) has committed, and updated by this connection's own
  // commits: an idle poll of thousands of keys then reads none of them.
  // At most kMaxKnownHeads entries (about 100 bytes each), cleared when
  // full.
  static constexpr std::size_t kMaxKnownHeads = 1 << 16;
  std::map<std::string, std::optional<SeqNo>, std::less<>> known_heads_;  // guarded by mutex_
  std::int64_t data_version_ = -1;                                        // guarded by mutex_
};

}  // namespace tidemark
