#include "postgres/postgres_consensus.h"

#include <fcntl.h>
#include <libpq-fe.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdint>
#include <utility>

#include "tidemark/retry.h"
#include "tidemark/seqno_bounds.h"
#include "util/number.h"
#include "util/thread.h"
#include "util/try.h"

namespace tidemark {

namespace {

constexpr std::string_view kPostgresScheme = "postgres://";
constexpr std::string_view kPostgresqlScheme = "postgresql://";

// Connection defaults that a URL parameter of the same name overrides: they
// come before the URL in PQconnectdbParams's arrays, and libpq lets later
// entries win.
constexpr const char* kDefaultKeywords[] = {
    "connect_timeout",  "keepalives_idle",           "keepalives_interval",
    "keepalives_count", "fallback_application_name",
};
constexpr const char* kDefaultValues[] = {"5", "30", "10", "3", "tidemark"};

// A bytea value is at most 1 GiB in PostgreSQL; anything larger would be
// refused by the server, and would not fit libpq's int lengths much beyond.
constexpr std::size_t kMaxFieldBytes = (std::size_t{1} << 30) - 1;

// Fixed OIDs of the built-in types the statements bind (pg_type.dat).
constexpr Oid kByteaOid = 17;
constexpr Oid kInt8Oid = 20;
constexpr Oid kTextOid = 25;

// READ COMMITTED is what makes a losing compare_and_set re-check its WHERE
// against the winner's row instead of failing to serialize; a commit with
// synchronous_commit=off could be lost after it was acknowledged.
constexpr const char* kSessionSetup =
    "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED; "
    "SELECT set_config('synchronous_commit', 'on', false) "
    "WHERE current_setting('synchronous_commit') = 'off'";

// Concurrent CREATE TABLE IF NOT EXISTS of one name can still fail on
// pg_type's unique index, so creators queue on an advisory lock (the key is
// "tidemark" in ASCII) that the COMMIT releases.
constexpr const char* kCreateTables =
    "BEGIN; "
    "SELECT pg_advisory_xact_lock(8388346167743836779); "
    "CREATE TABLE IF NOT EXISTS tidemark_consensus_heads ("
    "key TEXT COLLATE \"C\" PRIMARY KEY, seqno BIGINT NOT NULL); "
    "CREATE TABLE IF NOT EXISTS tidemark_consensus ("
    "key TEXT COLLATE \"C\" NOT NULL, seqno BIGINT NOT NULL, data BYTEA NOT NULL, "
    "PRIMARY KEY (key, seqno)); "
    "COMMIT";

constexpr const char* kHead = "tidemark_head";
constexpr const char* kMoveHead = "tidemark_move_head";
constexpr const char* kCreateHead = "tidemark_create_head";
constexpr const char* kScan = "tidemark_scan";
constexpr const char* kTruncate = "tidemark_truncate";

// The hint's payload: "SEQNO KEY", or "" for a key that would take it past
// NOTIFY's limit (payloads shorter than 8000 bytes; a seqno takes at most
// 20 bytes with its space), which a listener reads as "any key changed".
#define TM_HINT_PAYLOAD(seqno) \
  "CASE WHEN octet_length(key) < 7900 THEN " seqno "::text || ' ' || key ELSE '' END"

struct StatementText {
  const char* name;
  const char* sql;
  int parameter_count;
  std::array<Oid, 4> parameter_types;
};

constexpr StatementText kStatements[] = {
    {kHead,
     "SELECT v.seqno, v.data FROM tidemark_consensus_heads h "
     "JOIN tidemark_consensus v ON v.key = h.key AND v.seqno = h.seqno WHERE h.key = $1",
     1,
     {kTextOid}},
    // $1 key, $2 expected, $3 next, $4 data. Inserts one row iff the head
    // moved, and then notifies the hint channel (delivered on commit):
    // returns one row iff it committed.
    {kMoveHead,
     "WITH moved AS (UPDATE tidemark_consensus_heads SET seqno = $3 "
     "WHERE key = $1 AND seqno = $2 RETURNING key), "
     "inserted AS (INSERT INTO tidemark_consensus (key, seqno, data) "
     "SELECT key, $3, $4 FROM moved RETURNING key) "
     "SELECT pg_notify('tidemark_consensus', " TM_HINT_PAYLOAD("$3") ") FROM inserted",
     4,
     {kTextOid, kInt8Oid, kInt8Oid, kByteaOid}},
    // $1 key, $2 next, $3 data. Inserts one row iff the head was created,
    // and notifies as above.
    {kCreateHead,
     "WITH created AS (INSERT INTO tidemark_consensus_heads (key, seqno) VALUES ($1, $2) "
     "ON CONFLICT DO NOTHING RETURNING key), "
     "inserted AS (INSERT INTO tidemark_consensus (key, seqno, data) "
     "SELECT key, $2, $3 FROM created RETURNING key) "
     "SELECT pg_notify('tidemark_consensus', " TM_HINT_PAYLOAD("$2") ") FROM inserted",
     3,
     {kTextOid, kInt8Oid, kByteaOid}},
    // $1 key, $2 from, $3 limit.
    {kScan,
     "SELECT seqno, data FROM tidemark_consensus WHERE key = $1 AND seqno >= $2 "
     "ORDER BY seqno LIMIT $3",
     3,
     {kTextOid, kInt8Oid, kInt8Oid}},
    // $1 key, $2 seqno. Returns the head seqno (NULL when there is none) and
    // how many versions it deleted: none unless $2 <= the head. Versions
    // below a head never change again, so the head read in this statement's
    // snapshot is a safe bound even while compare_and_set moves it on.
    {kTruncate,
     "WITH head AS (SELECT seqno FROM tidemark_consensus_heads WHERE key = $1), "
     "deleted AS (DELETE FROM tidemark_consensus "
     "WHERE key = $1 AND seqno < $2 AND $2 <= (SELECT seqno FROM head) RETURNING 1) "
     "SELECT (SELECT seqno FROM head), (SELECT count(*) FROM deleted)",
     2,
     {kTextOid, kInt8Oid}},
};

// A hint that names no key.
ChangeHint hint_of(ChangeHint::Kind kind) {
  ChangeHint hint;
  hint.kind = kind;
  return hint;
}

// Connections ignore server notices ("relation already exists, skipping")
// rather than let libpq print them to stderr.
void ignore_notice(void*, const PGresult*) {}

// REQUIRES: value <= kMaxSeqNo (or another value that fits BIGINT).
std::array<char, 8> encode_int8(std::uint64_t value) {
  std::array<char, 8> bytes;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<char>(value >> (56 - 8 * i));
  }
  return bytes;
}

// A binary BIGINT field, or nullopt when it is NULL or not 8 bytes.
std::optional<std::int64_t> decode_int8(const PGresult* result, int row, int column) {
  if (PQgetisnull(result, row, column) || PQgetlength(result, row, column) != 8) {
    return std::nullopt;
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(PQgetvalue(result, row, column));
  std::uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = value << 8 | bytes[i];
  return static_cast<std::int64_t>(value);
}

// libpq's messages end in a newline, put each report (the error, its
// CONTEXT, a lost connection) on a line, and continue a sentence on a
// tab-indented line; a message here is one line, reports split by "; ".
std::string one_line(std::string_view message) {
  std::string out;
  for (std::size_t i = 0; i < message.size(); ++i) {
    if (message[i] != '\n') {
      out += message[i];
    } else if (i + 1 < message.size() && message[i + 1] == '\t') {
      out += ' ';
      ++i;
    } else if (i + 1 < message.size()) {
      out += "; ";
    }
  }
  return out;
}

std::string replace_secrets(std::string text, const std::vector<std::string>& secrets) {
  for (const std::string& secret : secrets) {
    for (auto at = text.find(secret); at != std::string::npos; at = text.find(secret, at + 3)) {
      text.replace(at, secret.size(), "***");
    }
  }
  return text;
}

// libpq's `password`, and `sslpassword` (of the client key).
bool is_password_keyword(std::string_view keyword) {
  return keyword.ends_with("password");
}

// `url` with the password of its user info and the value of any password
// parameter replaced by "***"; the replaced strings, as written, go to
// `secrets`.
std::string redact_url(std::string_view url, std::vector<std::string>& secrets) {
  struct Span {
    std::size_t begin;
    std::size_t end;
  };
  std::vector<Span> passwords;
  std::size_t authority_begin = url.find("://");
  authority_begin = authority_begin == std::string_view::npos ? 0 : authority_begin + 3;
  std::size_t authority_end = std::min(url.find_first_of("/?", authority_begin), url.size());
  std::string_view authority = url.substr(authority_begin, authority_end - authority_begin);
  if (auto at = authority.rfind('@'); at != std::string_view::npos) {
    if (auto colon = authority.find(':'); colon < at) {
      passwords.push_back({authority_begin + colon + 1, authority_begin + at});
    }
  }
  if (auto query = url.find('?', authority_end); query != std::string_view::npos) {
    for (std::size_t begin = query + 1; begin < url.size();) {
      std::size_t end = std::min(url.find('&', begin), url.size());
      std::string_view parameter = url.substr(begin, end - begin);
      if (auto equals = parameter.find('=');
          equals != std::string_view::npos && is_password_keyword(parameter.substr(0, equals))) {
        passwords.push_back({begin + equals + 1, end});
      }
      begin = end + 1;
    }
  }
  std::string out(url);
  // Back to front, so earlier spans keep their offsets.
  for (auto it = passwords.rbegin(); it != passwords.rend(); ++it) {
    if (it->end == it->begin) continue;
    secrets.emplace_back(url.substr(it->begin, it->end - it->begin));
    out.replace(it->begin, it->end - it->begin, "***");
  }
  return out;
}

// Removes the parameter `call_timeout`, Tidemark's own, from the query of
// `url` (libpq refuses parameters it does not know) and returns its value,
// nullopt when absent; InvalidUsage when it is not 1 to 3600 seconds.
Result<std::optional<std::chrono::seconds>> take_call_timeout(std::string& url,
                                                              const std::string& redacted) {
  const std::size_t query = url.find('?');
  if (query == std::string::npos) return std::nullopt;
  std::optional<std::chrono::seconds> timeout;
  std::string kept;
  for (std::size_t begin = query + 1; begin <= url.size();) {
    const std::size_t end = std::min(url.find('&', begin), url.size());
    const std::string_view parameter = std::string_view(url).substr(begin, end - begin);
    constexpr std::string_view kName = "call_timeout=";
    if (parameter.starts_with(kName)) {
      const std::string_view text = parameter.substr(kName.size());
      const auto seconds = parse_decimal(text, 1, 3600);
      if (!seconds) {
        return invalid_usage("postgres consensus " + redacted +
                             ": call_timeout must be 1 to 3600 seconds");
      }
      timeout = std::chrono::seconds(*seconds);
    } else if (!parameter.empty()) {
      kept.append(kept.empty() ? "" : "&").append(parameter);
    }
    begin = end + 1;
  }
  url.resize(query);
  if (!kept.empty()) url.append("?").append(kept);
  return timeout;
}

// Waits until `connection`'s socket is readable (or, with `writable`,
// writable too) or `deadline` passes: false on the deadline. A failed poll
// returns true, for libpq to find the failure.
bool wait_for_socket(PGconn* connection, bool writable,
                     std::chrono::steady_clock::time_point deadline) {
  const int fd = PQsocket(connection);
  if (fd < 0) return true;
  while (true) {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd socket{
        .fd = fd, .events = static_cast<short>(POLLIN | (writable ? POLLOUT : 0)), .revents = 0};
    const int ready =
        ::poll(&socket, 1, static_cast<int>(std::min<std::int64_t>(left.count(), INT_MAX)));
    if (ready > 0 || (ready < 0 && errno != EINTR)) return true;
  }
}

bool succeeded(const PGresult* result) {
  const ExecStatusType status = PQresultStatus(result);
  return status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK;
}

// Whether an idle connection can take a statement: libpq thinks it is up,
// no transaction is open, and the server has sent nothing since the last
// result. An idle backend sends nothing unless it is going away (the FATAL
// of a shutdown or pg_terminate_backend, or end of file), so readable data
// means the connection is dead even though libpq has not looked yet.
bool is_ready_for_use(PGconn* connection) {
  if (PQstatus(connection) != CONNECTION_OK) return false;
  if (PQtransactionStatus(connection) != PQTRANS_IDLE) return false;
  pollfd socket{.fd = PQsocket(connection), .events = POLLIN, .revents = 0};
  if (socket.fd < 0) return false;
  return ::poll(&socket, 1, 0) == 0;
}

// Whether a failed statement certainly did not apply: the server reported
// an ordinary ERROR (which rolls back its transaction) and the connection
// survived. A FATAL, a lost connection, or a failure libpq made up itself
// leaves the outcome unknown.
bool certainly_rolled_back(const PGresult* result, const PGconn* connection) {
  if (result == nullptr || PQstatus(connection) != CONNECTION_OK) return false;
  const char* severity = PQresultErrorField(result, PG_DIAG_SEVERITY_NONLOCALIZED);
  const char* sqlstate = PQresultErrorField(result, PG_DIAG_SQLSTATE);
  return severity != nullptr && sqlstate != nullptr && std::string_view(severity) == "ERROR";
}

// What went wrong, from libpq. Since PostgreSQL 14 the connection's message
// gathers every report since the statement was sent (a FATAL and then the
// lost connection), where the result holds only the last; the result's is
// the fallback.
std::string failure_message(const PGresult* result, const PGconn* connection) {
  std::string_view message = connection != nullptr ? PQerrorMessage(connection) : "";
  if (message.empty() && result != nullptr) message = PQresultErrorMessage(result);
  if (message.empty()) message = "unknown libpq failure (out of memory?)";
  return one_line(message);
}

}  // namespace

// Lease ---------------------------------------------------------------------

class PostgresConsensus::Lease {
 public:
  Lease(PostgresConsensus& owner, Connection connection)
      : owner_(&owner), connection_(std::move(connection)) {}
  Lease(Lease&& other) noexcept = default;
  Lease& operator=(Lease&&) = delete;
  ~Lease() {
    if (connection_) owner_->give_back(std::move(connection_), broken_);
  }

  PGconn* get() const { return connection_.get(); }
  // Closes the connection at the end of the lease instead of pooling it.
  void discard() { broken_ = true; }

 private:
  PostgresConsensus* owner_;
  Connection connection_;  // null once moved from
  bool broken_ = false;
};

// PostgresConsensus ---------------------------------------------------------

void PostgresConsensus::ConnectionCloser::operator()(pg_conn* connection) const {
  PQfinish(connection);
}

void PostgresConsensus::ResultClearer::operator()(pg_result* result) const {
  PQclear(result);
}

PostgresConsensus::Parameter PostgresConsensus::Parameter::of(std::string_view bytes) {
  // A null pointer would bind SQL NULL; empty bytes are an empty value.
  return Parameter{bytes.empty() ? "" : bytes.data(), static_cast<int>(bytes.size())};
}

Result<std::unique_ptr<PostgresConsensus>> PostgresConsensus::open(std::string url) {
  if (!url.starts_with(kPostgresScheme) && !url.starts_with(kPostgresqlScheme)) {
    return invalid_usage(
        "postgres consensus: the URL must start with postgres:// or postgresql://");
  }
  std::vector<std::string> secrets;
  std::string redacted = redact_url(url, secrets);
  TM_ASSIGN(std::optional<std::chrono::seconds> call_timeout, take_call_timeout(url, redacted));

  // libpq parses the URL again when connecting; parsing it now tells a
  // malformed URL (InvalidUsage) from an unreachable server, and yields the
  // password as libpq decodes it, to keep out of messages too.
  char* parse_error = nullptr;
  PQconninfoOption* options = PQconninfoParse(url.c_str(), &parse_error);
  if (options == nullptr) {
    std::string message = parse_error != nullptr ? parse_error : "out of memory";
    PQfreemem(parse_error);
    return invalid_usage("postgres consensus " + redacted +
                         ": malformed URL: " + replace_secrets(one_line(message), secrets));
  }
  for (const PQconninfoOption* option = options; option->keyword != nullptr; ++option) {
    if (is_password_keyword(option->keyword) && option->val != nullptr && *option->val != '\0') {
      secrets.emplace_back(option->val);
    }
  }
  PQconninfoFree(options);

  auto consensus = std::make_unique<PostgresConsensus>(PrivateTag{}, std::move(url),
                                                       std::move(redacted), std::move(secrets),
                                                       call_timeout.value_or(kDefaultCallTimeout));
  TM_ASSIGN(Connection first, consensus->connect(/*create_tables=*/true, consensus->deadline()));
  {
    std::lock_guard lock(consensus->mutex_);
    consensus->idle_.push_back(std::move(first));
    consensus->open_connections_ = 1;
  }
  return consensus;
}

PostgresConsensus::PostgresConsensus(PrivateTag, std::string url, std::string redacted_url,
                                     std::vector<std::string> secrets,
                                     std::chrono::milliseconds call_timeout)
    : url_(std::move(url)),
      redacted_url_(std::move(redacted_url)),
      secrets_(std::move(secrets)),
      call_timeout_(call_timeout) {}

PostgresConsensus::~PostgresConsensus() {
  {
    std::lock_guard lock(hints_mutex_);
    hints_stopping_ = true;
  }
  if (hint_wakeup_[1] >= 0) {
    const char byte = 0;
    [[maybe_unused]] ssize_t written = ::write(hint_wakeup_[1], &byte, 1);
  }
  if (hint_thread_.joinable()) hint_thread_.join();
  for (int fd : hint_wakeup_) {
    if (fd >= 0) ::close(fd);
  }
}

std::optional<std::uint64_t> PostgresConsensus::subscribe_change_hints(
    std::function<void(const ChangeHint&)> on_hint) {
  std::lock_guard lock(hints_mutex_);
  if (hints_stopping_) return std::nullopt;
  if (hint_wakeup_[0] < 0 && ::pipe2(hint_wakeup_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return std::nullopt;  // no hints: the caller polls
  }
  const std::uint64_t id = next_hint_id_++;
  hint_subscribers_.emplace(
      id,
      HintSubscriber{std::make_shared<std::function<void(const ChangeHint&)>>(std::move(on_hint)),
                     /*greeted=*/false});
  if (!hint_thread_.joinable()) {
    auto thread = start_thread("postgres change hints", [this] { run_hints(); });
    if (!thread) {
      hint_subscribers_.erase(id);
      return std::nullopt;
    }
    hint_thread_ = std::move(*thread);
  } else if (hints_connected_) {
    // The thread greets it with the current connection's kAll.
    const char byte = 0;
    [[maybe_unused]] ssize_t written = ::write(hint_wakeup_[1], &byte, 1);
  }
  return id;
}

void PostgresConsensus::unsubscribe_change_hints(std::uint64_t id) {
  {
    std::lock_guard lock(hints_mutex_);
    hint_subscribers_.erase(id);
  }
  // A delivery in progress on the hint thread holds hint_delivery_; unless
  // this is that thread, wait for it to end.
  std::thread::id hint_thread;
  {
    std::lock_guard lock(hints_mutex_);
    hint_thread = hint_thread_.get_id();
  }
  if (std::this_thread::get_id() != hint_thread) {
    std::lock_guard delivering(hint_delivery_);
  }
}

void PostgresConsensus::deliver(const ChangeHint& hint, bool greet_only) {
  std::lock_guard delivering(hint_delivery_);
  std::vector<std::shared_ptr<std::function<void(const ChangeHint&)>>> targets;
  {
    std::lock_guard lock(hints_mutex_);
    targets.reserve(hint_subscribers_.size());
    for (auto& [id, subscriber] : hint_subscribers_) {
      if (greet_only && subscriber.greeted) continue;
      if (greet_only) subscriber.greeted = true;
      targets.push_back(subscriber.on_hint);
    }
  }
  for (const auto& target : targets) (*target)(hint);
}

bool PostgresConsensus::wait_for_hints(int fd, int timeout_ms) {
  std::array<pollfd, 2> fds{};
  fds[0] = {hint_wakeup_[0], POLLIN, 0};
  fds[1] = {fd, POLLIN, 0};
  const int n = ::poll(fds.data(), fd >= 0 ? 2 : 1, timeout_ms);
  if (n > 0 && fds[0].revents != 0) {
    std::array<char, 64> drain;
    while (::read(hint_wakeup_[0], drain.data(), drain.size()) > 0) {
    }
  }
  std::lock_guard lock(hints_mutex_);
  return !hints_stopping_;
}

Result<PostgresConsensus::Connection> PostgresConsensus::connect_listener() {
  const Deadline deadline = this->deadline();
  TM_ASSIGN(Connection connection, connect(/*create_tables=*/false, deadline));
  PGconn* raw = connection.get();
  const std::string listen = std::string("LISTEN ") + kHintChannel;
  if (PQsendQuery(raw, listen.c_str()) == 0) {
    return determinate(describe("listen", failure_message(nullptr, raw)));
  }
  std::optional<QueryResult> result = await_results(raw, deadline);
  if (!result) return determinate(describe("listen", "no answer within " + call_timeout_text()));
  if (*result == nullptr || PQresultStatus(result->get()) != PGRES_COMMAND_OK) {
    return determinate(describe("listen", failure_message(result->get(), raw)));
  }
  return connection;
}

void PostgresConsensus::run_hints() {
  // Reconnects without end while the object lives; a Backoff that runs out
  // starts over.
  const RetryPolicy policy{.initial = std::chrono::milliseconds(100),
                           .max = std::chrono::milliseconds(5000),
                           .max_attempts = INT_MAX};
  std::optional<Backoff> backoff;
  while (true) {
    auto connection = connect_listener();
    if (!connection) {
      if (!backoff) backoff.emplace(policy);
      std::optional<std::chrono::milliseconds> wait = backoff->next_wait();
      if (!wait) {
        backoff.emplace(policy);
        wait = backoff->next_wait();
      }
      if (!wait_for_hints(-1, static_cast<int>(wait.value_or(policy.max).count()))) return;
      continue;
    }
    backoff.reset();
    {
      std::lock_guard lock(hints_mutex_);
      if (hints_stopping_) return;
      hints_connected_ = true;
      for (auto& [id, subscriber] : hint_subscribers_) subscriber.greeted = false;
    }
    // Whatever changed before LISTEN took effect gave no hint here.
    deliver(hint_of(ChangeHint::Kind::kAll), /*greet_only=*/true);

    PGconn* raw = connection->get();
    bool lost = false;
    while (!lost) {
      if (!wait_for_hints(PQsocket(raw), -1)) return;
      deliver(hint_of(ChangeHint::Kind::kAll), /*greet_only=*/true);  // new subscribers
      if (PQconsumeInput(raw) == 0 || PQstatus(raw) != CONNECTION_OK) lost = true;
      // Coalesced per key (the newest seqno), bounded: past
      // kMaxPendingHints keys, one kAll instead.
      std::map<std::string, std::optional<SeqNo>> pending;
      bool all = false;
      while (PGnotify* notify = PQnotifies(raw)) {
        std::string_view payload = notify->extra != nullptr ? notify->extra : "";
        const std::size_t space = payload.find(' ');
        SeqNo seqno = 0;
        const bool parsed = space != std::string_view::npos && space > 0 &&
                            std::from_chars(payload.data(), payload.data() + space, seqno).ptr ==
                                payload.data() + space;
        if (!parsed) {
          all = true;
        } else if (!all) {
          auto [it, added] = pending.try_emplace(std::string(payload.substr(space + 1)), seqno);
          if (!added && it->second < seqno) it->second = seqno;
          if (pending.size() > kMaxPendingHints) all = true;
        }
        PQfreemem(notify);
      }
      if (all) {
        deliver(hint_of(ChangeHint::Kind::kAll));
      } else {
        for (auto& [key, seqno] : pending) {
          deliver({.kind = ChangeHint::Kind::kKey, .key = key, .seqno = seqno});
        }
      }
    }
    {
      std::lock_guard lock(hints_mutex_);
      hints_connected_ = false;
    }
    deliver(hint_of(ChangeHint::Kind::kLost));
    connection->reset();
    // Not at once: a server that cut the connection may be going down.
    backoff.emplace(policy);
    if (!wait_for_hints(-1, static_cast<int>(backoff->next_wait().value_or(policy.max).count()))) {
      return;
    }
  }
}

std::string PostgresConsensus::describe(std::string_view what, std::string_view detail) const {
  std::string out = "postgres consensus " + redacted_url_ + ": ";
  out += what;
  out += ": ";
  out += replace_secrets(std::string(detail), secrets_);
  return out;
}

std::string PostgresConsensus::describe(std::string_view call, std::string_view key,
                                        std::string_view detail) const {
  std::string what(call);
  what += " \"";
  what += key;
  what += "\"";
  return describe(what, detail);
}

std::string PostgresConsensus::call_timeout_text() const {
  const auto seconds = std::chrono::duration<double>(call_timeout_).count();
  std::string text = std::to_string(seconds);
  text.erase(text.find_last_not_of('0') + 1);
  if (text.ends_with('.')) text.pop_back();
  return "the call timeout (" + text + " s)";
}

std::optional<PostgresConsensus::QueryResult> PostgresConsensus::await_results(PGconn* connection,
                                                                               Deadline deadline) {
  // In non-blocking mode libpq keeps what the socket did not take; a
  // readable socket must be drained for the server to go on reading.
  while (PQflush(connection) == 1) {
    if (!wait_for_socket(connection, /*writable=*/true, deadline)) return std::nullopt;
    if (!PQconsumeInput(connection)) break;
  }
  QueryResult chosen;
  while (true) {
    // PQisBusy is false once the connection is lost, so PQgetResult never
    // blocks here.
    while (PQisBusy(connection)) {
      if (!wait_for_socket(connection, /*writable=*/false, deadline)) return std::nullopt;
      if (!PQconsumeInput(connection)) break;
    }
    QueryResult next(PQgetResult(connection));
    if (!next) break;
    if (!chosen || succeeded(chosen.get())) chosen = std::move(next);
  }
  return chosen;
}

Result<PostgresConsensus::Connection> PostgresConsensus::connect(bool create_tables,
                                                                 Deadline deadline) {
  constexpr std::size_t kDefaults = std::size(kDefaultKeywords);
  std::array<const char*, kDefaults + 2> keywords{};
  std::array<const char*, kDefaults + 2> values{};
  std::copy(std::begin(kDefaultKeywords), std::end(kDefaultKeywords), keywords.begin());
  std::copy(std::begin(kDefaultValues), std::end(kDefaultValues), values.begin());
  // expand_dbname = 1: the "dbname" value is the whole URL, expanded into
  // its parameters, which override the defaults before it. Connecting
  // blocks, bounded by connect_timeout.
  keywords[kDefaults] = "dbname";
  values[kDefaults] = url_.c_str();
  Connection connection(PQconnectdbParams(keywords.data(), values.data(), 1));
  if (connection == nullptr) return determinate(describe("connect", "out of memory"));
  PGconn* raw = connection.get();
  if (PQstatus(raw) != CONNECTION_OK) {
    return determinate(describe("connect", failure_message(nullptr, raw)));
  }
  PQsetNoticeReceiver(raw, &ignore_notice, nullptr);
  // Every statement from here on is sent without blocking and waited for
  // with a deadline (await_results).
  if (PQsetnonblocking(raw, 1) != 0) {
    return determinate(describe("connect", "non-blocking mode: " + failure_message(nullptr, raw)));
  }

  // Runs one step of the set-up; none changes data, so every failure is
  // Determinate.
  const auto step = [&](const std::string& what, int sent, ExecStatusType expected) -> Status {
    if (sent == 0)
      return determinate(describe("connect", what + ": " + failure_message(nullptr, raw)));
    std::optional<QueryResult> result = await_results(raw, deadline);
    if (!result) {
      return determinate(describe("connect", what + ": no answer within " + call_timeout_text()));
    }
    if (*result == nullptr || PQresultStatus(result->get()) != expected) {
      return determinate(describe("connect", what + ": " + failure_message(result->get(), raw)));
    }
    return {};
  };
  TM_TRY(step("set up the session", PQsendQuery(raw, kSessionSetup), PGRES_TUPLES_OK));
  if (create_tables) {
    TM_TRY(step("create the tables", PQsendQuery(raw, kCreateTables), PGRES_COMMAND_OK));
  }
  for (const StatementText& statement : kStatements) {
    TM_TRY(step(std::string("prepare ") + statement.name,
                PQsendPrepare(raw, statement.name, statement.sql, statement.parameter_count,
                              statement.parameter_types.data()),
                PGRES_COMMAND_OK));
  }
  return connection;
}

Result<PostgresConsensus::Lease> PostgresConsensus::lease(Deadline deadline) {
  std::vector<Connection> dead;  // closed after the lock is released
  std::unique_lock lock(mutex_);
  while (true) {
    while (!idle_.empty()) {
      // The most recently returned first: it is the least likely to have
      // been dropped by a firewall or pooler while idle.
      Connection connection = std::move(idle_.back());
      idle_.pop_back();
      if (is_ready_for_use(connection.get())) return Lease(*this, std::move(connection));
      dead.push_back(std::move(connection));
      --open_connections_;
      // Room for a new connection, which a waiting thread may use too.
      connection_released_.notify_one();
    }
    if (open_connections_ < kMaxConnections) break;
    if (connection_released_.wait_until(lock, deadline) == std::cv_status::timeout &&
        idle_.empty() && open_connections_ >= kMaxConnections) {
      return determinate(describe(
          "wait for a connection",
          "all " + std::to_string(kMaxConnections) + " stayed busy for " + call_timeout_text()));
    }
  }
  ++open_connections_;
  lock.unlock();

  auto connection = connect(/*create_tables=*/false, deadline);
  if (!connection) {
    {
      std::lock_guard relock(mutex_);
      --open_connections_;
    }
    connection_released_.notify_one();
    return std::unexpected(std::move(connection).error());
  }
  return Lease(*this, std::move(*connection));
}

void PostgresConsensus::give_back(Connection connection, bool broken) {
  // A connection that failed mid-statement is CONNECTION_BAD, or may be
  // inside a transaction it cannot finish: close it, and let the next call
  // open a fresh one.
  bool reusable = !broken && PQstatus(connection.get()) == CONNECTION_OK &&
                  PQtransactionStatus(connection.get()) == PQTRANS_IDLE;
  {
    std::lock_guard lock(mutex_);
    if (reusable) {
      idle_.push_back(std::move(connection));
    } else {
      --open_connections_;
    }
  }
  connection_released_.notify_one();
  // An unusable connection is closed here, outside the lock.
}

Result<PostgresConsensus::QueryResult> PostgresConsensus::execute(
    Lease& lease, const char* name, std::span<const Parameter> parameters, Effect effect,
    std::string_view call, std::string_view key, Deadline deadline) {
  constexpr std::size_t kMaxParameters = 4;
  std::array<const char*, kMaxParameters> values{};
  std::array<int, kMaxParameters> lengths{};
  std::array<int, kMaxParameters> formats{};
  for (std::size_t i = 0; i < parameters.size() && i < kMaxParameters; ++i) {
    values[i] = parameters[i].bytes;
    lengths[i] = parameters[i].length;
    formats[i] = 1;  // binary
  }
  PGconn* connection = lease.get();
  if (std::chrono::steady_clock::now() >= deadline) {
    // Waiting for the connection took the whole call timeout: nothing sent.
    return determinate(describe(call, key, "not sent: " + call_timeout_text() + " ran out first"));
  }
  QueryResult result;
  if (PQsendQueryPrepared(connection, name, static_cast<int>(parameters.size()), values.data(),
                          lengths.data(), formats.data(), /*resultFormat=*/1) != 0) {
    std::optional<QueryResult> answered = await_results(connection, deadline);
    if (!answered) {
      // The server may be executing it, or may never have seen it; either
      // way the connection is mid-statement and of no further use.
      lease.discard();
      std::string message =
          describe(call, key, "no answer within " + call_timeout_text() + "; connection closed");
      if (effect == Effect::kWrite) {
        return indeterminate(std::move(message) + " (the outcome is unknown: it may have applied)");
      }
      return determinate(std::move(message));
    }
    result = std::move(*answered);
  }
  if (result && succeeded(result.get())) return result;

  std::string message = describe(call, key, failure_message(result.get(), connection));
  if (effect == Effect::kWrite && !certainly_rolled_back(result.get(), connection)) {
    return indeterminate(std::move(message) + " (the outcome is unknown: it may have applied)");
  }
  return determinate(std::move(message));
}

Result<VersionedData> PostgresConsensus::read_version(const pg_result* result, int row,
                                                      std::string_view key) const {
  std::optional<std::int64_t> seqno = decode_int8(result, row, 0);
  if (!seqno || *seqno < 0 || PQgetisnull(result, row, 1)) {
    return corruption(describe("read", key, "a stored version has a malformed seqno or no data"));
  }
  VersionedData version;
  version.seqno = static_cast<SeqNo>(*seqno);
  version.data.assign(PQgetvalue(result, row, 1),
                      static_cast<std::size_t>(PQgetlength(result, row, 1)));
  return version;
}

Result<std::optional<VersionedData>> PostgresConsensus::head(std::string_view key) {
  if (key.size() > kMaxFieldBytes) return std::nullopt;  // could never have been stored
  const Parameter parameters[] = {Parameter::of(key)};
  const Deadline deadline = this->deadline();
  TM_ASSIGN(Lease lease, this->lease(deadline));
  TM_ASSIGN(QueryResult result,
            execute(lease, kHead, parameters, Effect::kRead, "head", key, deadline));
  if (PQntuples(result.get()) == 0) return std::nullopt;
  TM_ASSIGN(VersionedData version, read_version(result.get(), 0, key));
  return version;
}

Result<CasOutcome> PostgresConsensus::compare_and_set(std::string_view key,
                                                      std::optional<SeqNo> expected,
                                                      VersionedData next) {
  TM_TRY(validate_compare_and_set(expected, next.seqno));
  if (key.size() > kMaxFieldBytes || next.data.size() > kMaxFieldBytes) {
    return invalid_usage(
        "postgres consensus: compare_and_set: a key or value is larger than "
        "PostgreSQL's 1 GiB field limit");
  }
  const std::array<char, 8> next_seqno = encode_int8(next.seqno);
  const std::array<char, 8> expected_seqno = encode_int8(expected.value_or(0));
  const Deadline deadline = this->deadline();
  TM_ASSIGN(Lease lease, this->lease(deadline));
  QueryResult result;
  if (expected) {
    const Parameter parameters[] = {
        Parameter::of(key),
        Parameter::of({expected_seqno.data(), expected_seqno.size()}),
        Parameter::of({next_seqno.data(), next_seqno.size()}),
        Parameter::of(next.data),
    };
    TM_ASSIGN(result, execute(lease, kMoveHead, parameters, Effect::kWrite, "compare_and_set", key,
                              deadline));
  } else {
    const Parameter parameters[] = {
        Parameter::of(key),
        Parameter::of({next_seqno.data(), next_seqno.size()}),
        Parameter::of(next.data),
    };
    TM_ASSIGN(result, execute(lease, kCreateHead, parameters, Effect::kWrite, "compare_and_set",
                              key, deadline));
  }
  // One row (the notification's) iff the version was inserted.
  const int inserted = PQntuples(result.get());
  if (PQresultStatus(result.get()) == PGRES_TUPLES_OK && inserted == 1) {
    return CasOutcome::kCommitted;
  }
  if (PQresultStatus(result.get()) == PGRES_TUPLES_OK && inserted == 0) {
    return CasOutcome::kExpectationMismatch;
  }
  return indeterminate(
      describe("compare_and_set", key, "unexpected row count " + std::to_string(inserted)));
}

Result<std::vector<VersionedData>> PostgresConsensus::scan(std::string_view key, SeqNo from,
                                                           std::size_t limit) {
  std::vector<VersionedData> out;
  // No stored seqno exceeds kMaxSeqNo, and a larger bound would not fit BIGINT.
  if (limit == 0 || from > kMaxSeqNo || key.size() > kMaxFieldBytes) return out;
  const std::array<char, 8> from_seqno = encode_int8(from);
  const std::array<char, 8> row_limit = encode_int8(std::min<std::uint64_t>(limit, kMaxSeqNo));
  const Parameter parameters[] = {
      Parameter::of(key),
      Parameter::of({from_seqno.data(), from_seqno.size()}),
      Parameter::of({row_limit.data(), row_limit.size()}),
  };
  const Deadline deadline = this->deadline();
  TM_ASSIGN(Lease lease, this->lease(deadline));
  TM_ASSIGN(QueryResult result,
            execute(lease, kScan, parameters, Effect::kRead, "scan", key, deadline));
  int rows = PQntuples(result.get());
  out.reserve(static_cast<std::size_t>(rows));
  for (int row = 0; row < rows; ++row) {
    TM_ASSIGN(VersionedData version, read_version(result.get(), row, key));
    out.push_back(std::move(version));
  }
  return out;
}

Result<std::size_t> PostgresConsensus::truncate(std::string_view key, SeqNo seqno) {
  if (seqno > kMaxSeqNo) {
    return invalid_usage("truncate \"" + std::string(key) + "\" to seqno " + std::to_string(seqno) +
                         ": beyond any head (seqnos end at " + std::to_string(kMaxSeqNo) + ")");
  }
  if (key.size() > kMaxFieldBytes) {
    return invalid_usage("truncate: the key is larger than PostgreSQL's 1 GiB field limit");
  }
  const std::array<char, 8> bound = encode_int8(seqno);
  const Parameter parameters[] = {Parameter::of(key), Parameter::of({bound.data(), bound.size()})};
  const Deadline deadline = this->deadline();
  TM_ASSIGN(Lease lease, this->lease(deadline));
  TM_ASSIGN(QueryResult result,
            execute(lease, kTruncate, parameters, Effect::kWrite, "truncate", key, deadline));
  std::optional<std::int64_t> deleted;
  if (PQntuples(result.get()) == 1) deleted = decode_int8(result.get(), 0, 1);
  if (!deleted || *deleted < 0) {
    // The statement ran, so versions may have been deleted.
    return indeterminate(describe("truncate", key, "malformed result"));
  }
  std::optional<std::int64_t> head = decode_int8(result.get(), 0, 0);
  if (!head) {
    return invalid_usage("truncate \"" + std::string(key) + "\" to seqno " + std::to_string(seqno) +
                         ": there is no version yet");
  }
  if (seqno > static_cast<SeqNo>(*head)) {
    return invalid_usage("truncate \"" + std::string(key) + "\" to seqno " + std::to_string(seqno) +
                         ": beyond the head seqno " + std::to_string(*head));
  }
  return static_cast<std::size_t>(*deleted);
}

}  // namespace tidemark
