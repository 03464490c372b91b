#include "location/sqlite_consensus.h"

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <thread>
#include <utility>

#include "location/posix_io.h"
#include "tidemark/seqno_bounds.h"
#include "util/try.h"

namespace tidemark {

namespace {

// Another process holding the write lock longer than this is reported as a
// Determinate failure rather than waited on forever.
constexpr int kBusyTimeoutMilliseconds = 10'000;

constexpr const char* kCreateTable =
    "CREATE TABLE IF NOT EXISTS consensus("
    "shard_key TEXT NOT NULL, seqno INTEGER NOT NULL, data BLOB NOT NULL, "
    "PRIMARY KEY(shard_key, seqno)) WITHOUT ROWID";

// Resets a cached statement and clears its bindings on scope exit, so the
// next use starts clean and no read transaction is left open.
class StatementUse {
 public:
  explicit StatementUse(sqlite3_stmt* statement) : statement_(statement) {}
  StatementUse(const StatementUse&) = delete;
  StatementUse& operator=(const StatementUse&) = delete;
  ~StatementUse() {
    sqlite3_reset(statement_);
    sqlite3_clear_bindings(statement_);
  }

 private:
  sqlite3_stmt* statement_;
};

// Rolls back the connection's open transaction, if any, on scope exit: after
// an error, after a lost comparison, or after a COMMIT that failed but left
// the transaction open. After a successful COMMIT there is none.
class TransactionGuard {
 public:
  TransactionGuard(sqlite3* connection, sqlite3_stmt* rollback)
      : connection_(connection), rollback_(rollback) {}
  TransactionGuard(const TransactionGuard&) = delete;
  TransactionGuard& operator=(const TransactionGuard&) = delete;
  ~TransactionGuard() {
    if (sqlite3_get_autocommit(connection_) == 0) {
      sqlite3_step(rollback_);
      sqlite3_reset(rollback_);
    }
  }

 private:
  sqlite3* connection_;
  sqlite3_stmt* rollback_;
};

void bind_key(sqlite3_stmt* statement, int index, std::string_view key) {
  // A null pointer would bind SQL NULL; an empty key is the empty string.
  sqlite3_bind_text64(statement, index, key.empty() ? "" : key.data(), key.size(), SQLITE_STATIC,
                      SQLITE_UTF8);
}

void bind_seqno(sqlite3_stmt* statement, int index, SeqNo seqno) {
  // REQUIRES: seqno <= kMaxSeqNo, checked by the callers.
  sqlite3_bind_int64(statement, index, static_cast<sqlite3_int64>(seqno));
}

VersionedData read_version(sqlite3_stmt* statement) {
  VersionedData version;
  version.seqno = static_cast<SeqNo>(sqlite3_column_int64(statement, 0));
  // column_blob before column_bytes, as SQLite documents; a zero-length
  // blob comes back as a null pointer.
  const void* bytes = sqlite3_column_blob(statement, 1);
  int size = sqlite3_column_bytes(statement, 1);
  if (bytes != nullptr && size > 0) {
    version.data.assign(static_cast<const char*>(bytes), static_cast<std::size_t>(size));
  }
  return version;
}

// The directory part of `path`, or "" when it has none.
std::string parent_of(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return "";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Runs one statement to completion while opening; keeps the first column of
// its last row in `first_column` when asked (PRAGMA journal_mode reports the
// mode it ended up in that way).
int execute(sqlite3* connection, const char* sql, std::string* first_column = nullptr) {
  sqlite3_stmt* raw = nullptr;
  int code = sqlite3_prepare_v2(connection, sql, -1, &raw, nullptr);
  std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt*)> statement(raw, &sqlite3_finalize);
  if (code != SQLITE_OK) return code;
  while ((code = sqlite3_step(statement.get())) == SQLITE_ROW) {
    if (first_column != nullptr) {
      const unsigned char* text = sqlite3_column_text(statement.get(), 0);
      if (text != nullptr) *first_column = reinterpret_cast<const char*>(text);
    }
  }
  return code == SQLITE_DONE ? SQLITE_OK : code;
}

}  // namespace

void SqliteConsensus::ConnectionCloser::operator()(sqlite3* connection) const {
  sqlite3_close_v2(connection);
}

void SqliteConsensus::StatementFinalizer::operator()(sqlite3_stmt* statement) const {
  sqlite3_finalize(statement);
}

Result<std::unique_ptr<SqliteConsensus>> SqliteConsensus::open(std::string path) {
  if (path.empty()) return invalid_usage("sqlite consensus: empty database path");
  if (std::string parent = parent_of(path); !parent.empty()) {
    auto created = create_directories(parent);
    if (!created) {
      Error failure = created.error();
      failure.message = "sqlite consensus: " + failure.message;
      return std::unexpected(std::move(failure));
    }
  }
  sqlite3* raw = nullptr;
  // NOMUTEX: this class serializes use of its connection with its own mutex.
  int code =
      sqlite3_open_v2(path.c_str(), &raw,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  Connection connection(raw);  // SQLite may return a handle even on failure
  if (code != SQLITE_OK) {
    return determinate("sqlite consensus " + path +
                       ": open: " + (raw != nullptr ? sqlite3_errmsg(raw) : sqlite3_errstr(code)));
  }
  auto consensus = std::make_unique<SqliteConsensus>(PrivateTag{}, path, std::move(connection));
  sqlite3* db = consensus->connection_.get();
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, kBusyTimeoutMilliseconds);

  // Switching a new database to WAL needs an exclusive lock, and SQLite
  // answers SQLITE_BUSY at once, without the busy handler, while another
  // process opening the same new file holds a lock: retry, within the busy
  // timeout.
  std::string journal_mode;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kBusyTimeoutMilliseconds);
  for (int attempt = 0;; ++attempt) {
    code = execute(db, "PRAGMA journal_mode=WAL", &journal_mode);
    if ((code & 0xff) != SQLITE_BUSY || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(1 << std::min(attempt, 6), 50)));
  }
  if (code != SQLITE_OK) return determinate(consensus->describe("set journal_mode=WAL", code));
  if (journal_mode != "wal") {
    return determinate("sqlite consensus " + path + ": journal_mode is \"" + journal_mode +
                       "\", not \"wal\" (is the file on a file system without shared memory?)");
  }
  code = execute(db, "PRAGMA synchronous=FULL");
  if (code != SQLITE_OK) return determinate(consensus->describe("set synchronous=FULL", code));
  code = execute(db, kCreateTable);
  if (code != SQLITE_OK) return determinate(consensus->describe("create table", code));
  TM_TRY(consensus->prepare_statements());
  return consensus;
}

SqliteConsensus::SqliteConsensus(PrivateTag, std::string path, Connection connection)
    : path_(std::move(path)), connection_(std::move(connection)) {}

std::string SqliteConsensus::describe(std::string_view what, int code) const {
  std::string out = "sqlite consensus " + path_ + ": ";
  out += what;
  out += ": ";
  // The connection's message is only about `code` if it is the latest error.
  out += sqlite3_errcode(connection_.get()) == code ? sqlite3_errmsg(connection_.get())
                                                    : sqlite3_errstr(code);
  return out;
}

Status SqliteConsensus::prepare_statements() {
  struct Wanted {
    Statement* statement;
    const char* sql;
  };
  const Wanted wanted[] = {
      {&begin_, "BEGIN IMMEDIATE"},
      {&begin_read_, "BEGIN DEFERRED"},
      {&select_data_version_, "PRAGMA data_version"},
      {&commit_, "COMMIT"},
      {&rollback_, "ROLLBACK"},
      {&select_head_,
       "SELECT seqno, data FROM consensus WHERE shard_key = ?1 ORDER BY seqno DESC LIMIT 1"},
      {&select_head_seqno_,
       "SELECT seqno FROM consensus WHERE shard_key = ?1 ORDER BY seqno DESC LIMIT 1"},
      {&insert_, "INSERT INTO consensus(shard_key, seqno, data) VALUES (?1, ?2, ?3)"},
      {&select_range_,
       "SELECT seqno, data FROM consensus WHERE shard_key = ?1 AND seqno >= ?2 "
       "ORDER BY seqno LIMIT ?3"},
      {&delete_below_, "DELETE FROM consensus WHERE shard_key = ?1 AND seqno < ?2"},
  };
  for (const Wanted& each : wanted) {
    sqlite3_stmt* raw = nullptr;
    int code = sqlite3_prepare_v3(connection_.get(), each.sql, -1, SQLITE_PREPARE_PERSISTENT, &raw,
                                  nullptr);
    each.statement->reset(raw);
    if (code != SQLITE_OK) return determinate(describe(std::string("prepare ") + each.sql, code));
  }
  return {};
}

Result<std::optional<VersionedData>> SqliteConsensus::head(std::string_view key) {
  std::lock_guard lock(mutex_);
  sqlite3_stmt* statement = select_head_.get();
  StatementUse use(statement);
  bind_key(statement, 1, key);
  int code = sqlite3_step(statement);
  if (code == SQLITE_DONE) return std::nullopt;
  if (code != SQLITE_ROW) return determinate(describe("head", code));
  return read_version(statement);
}

Result<std::vector<std::optional<SeqNo>>> SqliteConsensus::head_seqnos(
    const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  {
    StatementUse use(begin_read_.get());
    int code = sqlite3_step(begin_read_.get());
    if (code != SQLITE_DONE) return determinate(describe("head_seqnos: begin", code));
  }
  TransactionGuard transaction(connection_.get(), rollback_.get());
  {
    // Changes only when another connection commits (this one's own
    // commits keep known_heads_ current themselves).
    sqlite3_stmt* statement = select_data_version_.get();
    StatementUse use(statement);
    int code = sqlite3_step(statement);
    if (code != SQLITE_ROW) return determinate(describe("head_seqnos: data_version", code));
    const std::int64_t version = sqlite3_column_int64(statement, 0);
    if (version != data_version_) {
      known_heads_.clear();
      data_version_ = version;
    }
  }
  std::vector<std::optional<SeqNo>> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) {
    if (auto known = known_heads_.find(key); known != known_heads_.end()) {
      out.push_back(known->second);
      continue;
    }
    TM_ASSIGN(std::optional<SeqNo> seqno, head_seqno(key));
    if (known_heads_.size() >= kMaxKnownHeads) known_heads_.clear();
    known_heads_.emplace(key, seqno);
    out.push_back(seqno);
  }
  StatementUse use(commit_.get());
  if (int code = sqlite3_step(commit_.get()); code != SQLITE_DONE) {
    return determinate(describe("head_seqnos: commit", code));
  }
  return out;
}

Result<std::optional<SeqNo>> SqliteConsensus::head_seqno(std::string_view key) {
  sqlite3_stmt* statement = select_head_seqno_.get();
  StatementUse use(statement);
  bind_key(statement, 1, key);
  int code = sqlite3_step(statement);
  if (code == SQLITE_DONE) return std::nullopt;
  if (code != SQLITE_ROW) return determinate(describe("read head seqno", code));
  return static_cast<SeqNo>(sqlite3_column_int64(statement, 0));
}

Status SqliteConsensus::begin_write(std::string_view what) {
  StatementUse use(begin_.get());
  int code = sqlite3_step(begin_.get());
  if (code != SQLITE_DONE) return determinate(describe(std::string(what) + ": begin", code));
  return {};
}

Status SqliteConsensus::commit_write(std::string_view what) {
  StatementUse use(commit_.get());
  int code = sqlite3_step(commit_.get());
  if (code != SQLITE_DONE) return indeterminate(describe(std::string(what) + ": commit", code));
  return {};
}

Result<CasOutcome> SqliteConsensus::compare_and_set_in_transaction(std::string_view key,
                                                                   std::optional<SeqNo> expected,
                                                                   const VersionedData& next) {
  TM_ASSIGN(std::optional<SeqNo> current, head_seqno(key));
  if (current != expected) return CasOutcome::kExpectationMismatch;
  sqlite3_stmt* statement = insert_.get();
  StatementUse use(statement);
  bind_key(statement, 1, key);
  bind_seqno(statement, 2, next.seqno);
  sqlite3_bind_blob64(statement, 3, next.data.data(), next.data.size(), SQLITE_STATIC);
  int code = sqlite3_step(statement);
  if (code != SQLITE_DONE) return determinate(describe("compare_and_set: insert", code));
  return CasOutcome::kCommitted;
}

void SqliteConsensus::learn_head(std::string_view key, std::optional<SeqNo> seqno) {
  auto known = known_heads_.find(key);
  if (known == known_heads_.end()) return;
  if (seqno) {
    known->second = seqno;
  } else {
    known_heads_.erase(known);  // not known any more
  }
}

Result<CasOutcome> SqliteConsensus::compare_and_set(std::string_view key,
                                                    std::optional<SeqNo> expected,
                                                    VersionedData next) {
  TM_TRY(validate_compare_and_set(expected, next.seqno));
  std::lock_guard lock(mutex_);
  TM_TRY(begin_write("compare_and_set"));
  TransactionGuard transaction(connection_.get(), rollback_.get());
  TM_ASSIGN(CasOutcome outcome, compare_and_set_in_transaction(key, expected, next));
  if (outcome != CasOutcome::kCommitted) return outcome;
  if (auto committed = commit_write("compare_and_set"); !committed) {
    learn_head(key, std::nullopt);
    return std::unexpected(committed.error());
  }
  learn_head(key, next.seqno);
  return CasOutcome::kCommitted;
}

std::vector<Result<CasOutcome>> SqliteConsensus::compare_and_set_many(
    const std::vector<CasRequest>& requests) {
  std::vector<Result<CasOutcome>> out;
  out.reserve(requests.size());
  for (const CasRequest& request : requests) {
    auto valid = validate_compare_and_set(request.expected, request.next.seqno);
    if (valid) {
      out.emplace_back(CasOutcome::kExpectationMismatch);  // replaced below
    } else {
      out.emplace_back(std::unexpected(valid.error()));
    }
  }
  auto fail_all_valid = [&](const Error& error) {
    for (Result<CasOutcome>& result : out) {
      if (result) result = std::unexpected(error);
    }
    return std::move(out);
  };
  std::lock_guard lock(mutex_);
  if (auto begun = begin_write("compare_and_set_many"); !begun)
    return fail_all_valid(begun.error());
  TransactionGuard transaction(connection_.get(), rollback_.get());
  bool any = false;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (!out[i]) continue;
    const CasRequest& request = requests[i];
    auto outcome = compare_and_set_in_transaction(request.key, request.expected, request.next);
    if (!outcome) return fail_all_valid(outcome.error());  // rolled back: none landed
    out[i] = *outcome;
    any = any || *outcome == CasOutcome::kCommitted;
  }
  if (!any) return out;
  auto committed = commit_write("compare_and_set_many");
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (!out[i] || *out[i] != CasOutcome::kCommitted) continue;
    if (committed) {
      learn_head(requests[i].key, requests[i].next.seqno);
    } else {
      learn_head(requests[i].key, std::nullopt);
      out[i] = std::unexpected(committed.error());
    }
  }
  return out;
}

Result<std::vector<VersionedData>> SqliteConsensus::scan(std::string_view key, SeqNo from,
                                                         std::size_t limit) {
  std::vector<VersionedData> out;
  // No stored seqno exceeds kMaxSeqNo, and binding a larger one would wrap.
  if (limit == 0 || from > kMaxSeqNo) return out;
  auto row_limit = static_cast<sqlite3_int64>(
      std::min<std::uint64_t>(limit, std::numeric_limits<sqlite3_int64>::max()));
  std::lock_guard lock(mutex_);
  sqlite3_stmt* statement = select_range_.get();
  StatementUse use(statement);
  bind_key(statement, 1, key);
  bind_seqno(statement, 2, from);
  sqlite3_bind_int64(statement, 3, row_limit);
  int code;
  while ((code = sqlite3_step(statement)) == SQLITE_ROW) out.push_back(read_version(statement));
  if (code != SQLITE_DONE) return determinate(describe("scan", code));
  return out;
}

Result<std::size_t> SqliteConsensus::truncate_in_transaction(std::string_view key, SeqNo seqno) {
  TM_ASSIGN(std::optional<SeqNo> head, head_seqno(key));
  if (!head) {
    return invalid_usage("truncate " + std::string(key) + " to seqno " + std::to_string(seqno) +
                         ": there is no version yet");
  }
  if (seqno > *head) {
    return invalid_usage("truncate " + std::string(key) + " to seqno " + std::to_string(seqno) +
                         ": beyond the head seqno " + std::to_string(*head));
  }
  sqlite3_stmt* statement = delete_below_.get();
  StatementUse use(statement);
  bind_key(statement, 1, key);
  bind_seqno(statement, 2, seqno);
  int code = sqlite3_step(statement);
  if (code != SQLITE_DONE) return determinate(describe("truncate: delete", code));
  return static_cast<std::size_t>(sqlite3_changes64(connection_.get()));
}

Result<std::size_t> SqliteConsensus::truncate(std::string_view key, SeqNo seqno) {
  std::lock_guard lock(mutex_);
  TM_TRY(begin_write("truncate"));
  TransactionGuard transaction(connection_.get(), rollback_.get());
  TM_ASSIGN(std::size_t deleted, truncate_in_transaction(key, seqno));
  TM_TRY(commit_write("truncate"));
  return deleted;
}

std::vector<Result<std::size_t>> SqliteConsensus::truncate_many(
    const std::vector<std::pair<std::string, SeqNo>>& truncations) {
  std::vector<Result<std::size_t>> out;
  out.reserve(truncations.size());
  auto fail_all = [&](const Error& error) {
    out.assign(truncations.size(), std::unexpected(error));
    return std::move(out);
  };
  std::lock_guard lock(mutex_);
  if (auto begun = begin_write("truncate_many"); !begun) return fail_all(begun.error());
  TransactionGuard transaction(connection_.get(), rollback_.get());
  bool any = false;
  for (const auto& [key, seqno] : truncations) {
    auto deleted = truncate_in_transaction(key, seqno);
    // A request's own mistake is its answer; anything else undoes them all.
    if (!deleted && !deleted.error().is(ErrorKind::kInvalidUsage)) {
      return fail_all(deleted.error());
    }
    any = any || (deleted && *deleted > 0);
    out.push_back(std::move(deleted));
  }
  if (!any) return out;
  if (auto committed = commit_write("truncate_many"); !committed) {
    for (Result<std::size_t>& result : out) {
      if (result) result = std::unexpected(committed.error());
    }
  }
  return out;
}

}  // namespace tidemark
