// tidemark-peers: small durable writes, Tidemark against the systems users
// would pick instead, measured by one client loop in one run.
//
// Every system gets the same work: `clients` threads, each writing one
// ~100-byte record per request and waiting for its acknowledgement before
// the next, for `seconds` after a one-second warm-up. Rounds interleave
// the systems (each round starts with the next one), so a machine that gets
// busier during the run moves every system alike. Each system is set up so
// that its acknowledgement follows an fsync of the record:
//
//   tidemark-http      `tidemark serve` (embedded default), one managed
//                      append per POST, keep-alive connections
//   tidemark-embedded  the library's Appender in this process, one record
//                      per CommitToken
//   postgres           INSERT per transaction (fsync=on,
//                      synchronous_commit=on, checked)
//   redis              XADD with appendonly yes, appendfsync always
//                      (checked)
//   rocksdb            Put with WriteOptions::sync in this process
//   sqlite             INSERT in WAL mode with synchronous=FULL (checked),
//                      a connection per client
//
// --check-syncs also proves it: each system writes kSyncCheckWrites records
// from one client while strace counts the fsync family of calls in every
// process that serves it; fewer syncs than acknowledged writes fails the run.
//
// Output: a line per measurement on stdout, and with --markdown FILE a
// table per concurrency (median and range over the rounds), with --svg
// FILE a bar chart of the medians, and with --json FILE every measurement,
// each system's durability, the command, the commit (--commit TEXT) and
// the date, for scripts/plots.py.
//
// Memory: per client thread a fixed latency histogram (kBuckets counters);
// the systems' own. The process's allocator is the tidemark binary's
// (jemalloc, where the build links it), so RocksDB and SQLite in this
// process run on it too.
#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <rocksdb/db.h>
#include <signal.h>
#include <spawn.h>
#include <sqlite3.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tidemark/appender.h"
#include "tidemark/client.h"
#include "util/jemalloc_conf.h"
#include "util/json.h"
#include "util/process_identity.h"

#ifdef TIDEMARK_JEMALLOC
// As the tidemark binary (src/cli/main.cc): jemalloc with its settings,
// for the Appender and the in-process peers alike.
extern "C" {
const char* malloc_conf = tidemark::kJemallocConf;
}
#endif

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kRecordBytes = 100;  // key + value
constexpr int kSyncCheckWrites = 200;

// A failure that ends the run, with what failed.
struct Failure {
  std::string message;
};

[[noreturn]] void fail(const std::string& message) {
  throw Failure{message};
}

// ---- Latency histogram: log buckets of 1%, from 1 ns to about 100 s.

constexpr int kBuckets = 2600;

struct Histogram {
  std::vector<std::uint32_t> counts = std::vector<std::uint32_t>(kBuckets);
  std::uint64_t total = 0;

  void add(std::chrono::nanoseconds latency) {
    const double ns = std::max<double>(1.0, static_cast<double>(latency.count()));
    const int bucket = std::min(kBuckets - 1, static_cast<int>(std::log(ns) * 100.0));
    ++counts[bucket];
    ++total;
  }
  void merge(const Histogram& other) {
    for (int i = 0; i < kBuckets; ++i) counts[i] += other.counts[i];
    total += other.total;
  }
  // Milliseconds at fraction p (the bucket's middle).
  double percentile_ms(double p) const {
    if (total == 0) return 0;
    const auto want = static_cast<std::uint64_t>(std::ceil(p * static_cast<double>(total)));
    std::uint64_t seen = 0;
    for (int i = 0; i < kBuckets; ++i) {
      seen += counts[i];
      if (seen >= std::max<std::uint64_t>(want, 1)) return std::exp((i + 0.5) / 100.0) / 1e6;
    }
    return std::exp(kBuckets / 100.0) / 1e6;
  }
};

// ---- The record every system writes: a unique key, a value to 100 bytes.

struct Record {
  std::string key;
  std::string value;
};

// What the values hold: one repeated character (the tables' default), or
// letters and digits drawn at random (--values random), which compress
// about as well as text does, not to almost nothing.
bool g_random_values = false;

Record make_record(int client, std::uint64_t seq) {
  Record r;
  r.key = "c" + std::to_string(client) + "-" + std::to_string(seq);
  const std::size_t length = kRecordBytes - r.key.size();
  if (!g_random_values) {
    r.value.assign(length, 'v');
    return r;
  }
  static constexpr std::string_view kAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  // splitmix64 of (client, seq): the same records in every run.
  std::uint64_t x = (static_cast<std::uint64_t>(client) << 48) ^ seq;
  r.value.resize(length);
  for (char& c : r.value) {
    x += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    c = kAlphabet[(z ^ (z >> 31)) % kAlphabet.size()];
  }
  return r;
}

// ---- Systems

// One client's connection: writes a record and returns once it is
// acknowledged (durable).
class Writer {
 public:
  virtual ~Writer() = default;
  virtual void write(const Record& record) = 0;
};

class System {
 public:
  virtual ~System() = default;
  virtual std::string name() const = 0;
  // Reads back the settings that make an acknowledgement follow an fsync;
  // fails if they are not so. Returns them, for the report.
  virtual std::string check_durability() = 0;
  virtual std::unique_ptr<Writer> connect() = 0;
  // The processes whose syncs cover this system's writes (0: this one).
  virtual std::vector<pid_t> sync_pids() = 0;
};

// --- tidemark serve over HTTP/1.1 (keep-alive; one managed append each).

class HttpWriter final : public Writer {
 public:
  HttpWriter(const std::string& host, int port, std::string path) : path_(std::move(path)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) fail("socket: " + std::string(std::strerror(errno)));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      fail("connect to tidemark: " + std::string(std::strerror(errno)));
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~HttpWriter() override { ::close(fd_); }

  void write(const Record& record) override {
    const std::string body =
        "{\"key\":\"" + record.key + "\",\"value\":\"" + record.value + "\"}\n";
    request_ = "POST " + path_ +
               " HTTP/1.1\r\nHost: tidemark\r\nContent-Type: application/x-ndjson\r\n" +
               "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    for (std::size_t sent = 0; sent < request_.size();) {
      const ssize_t n = ::send(fd_, request_.data() + sent, request_.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) fail("send to tidemark: " + std::string(std::strerror(errno)));
      sent += static_cast<std::size_t>(n);
    }
    // The answer: headers, then Content-Length bytes.
    std::size_t header_end;
    while ((header_end = buffer_.find("\r\n\r\n")) == std::string::npos) read_more();
    const std::string_view head(buffer_.data(), header_end);
    if (!head.starts_with("HTTP/1.1 200")) {
      fail("tidemark answered: " + std::string(head.substr(0, head.find("\r\n"))));
    }
    const auto at = head.find("\r\nContent-Length: ");
    if (at == std::string_view::npos) fail("tidemark's answer has no Content-Length");
    const std::size_t length =
        std::stoul(std::string(head.substr(at + 18, head.find("\r\n", at + 2) - at - 18)));
    while (buffer_.size() < header_end + 4 + length) read_more();
    buffer_.erase(0, header_end + 4 + length);
  }

 private:
  void read_more() {
    char chunk[4096];
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n <= 0) fail("tidemark closed the connection");
    buffer_.append(chunk, static_cast<std::size_t>(n));
  }

  int fd_ = -1;
  std::string path_;
  std::string request_;
  std::string buffer_;
};

class TidemarkHttp final : public System {
 public:
  TidemarkHttp(std::string host, int port, pid_t pid, std::string durability)
      : host_(std::move(host)), port_(port), pid_(pid), durability_(std::move(durability)) {}
  std::string name() const override { return "tidemark-http"; }
  std::string check_durability() override {
    if (!durability_.empty()) return durability_;
    return "tidemark serve, embedded default (a small append's part travels inline in its "
           "SQLite commit, synced before the answer; a larger one syncs its part file and "
           "directory first)";
  }
  std::unique_ptr<Writer> connect() override {
    return std::make_unique<HttpWriter>(host_, port_, "/v1/shards/peers/append");
  }
  std::vector<pid_t> sync_pids() override { return {pid_}; }

 private:
  std::string host_;
  int port_;
  pid_t pid_;
  std::string durability_;  // what serves it, when not the embedded default
};

// --- Tidemark's Appender in this process.

// Commits here (AppendSender::set_commit_here) while it is the only
// writer, as tidemark serve does for a lone append: an idle appender's
// batch is then built and committed on the producer's own thread, with no
// hop to the pool and back. With more writers it never does (the server
// does not either: under load, committing one record alone on the
// producer's thread takes the next commit's batch apart).
class EmbeddedWriter final : public Writer {
 public:
  EmbeddedWriter(tidemark::AppendSender sender, std::shared_ptr<std::atomic<int>> writers)
      : sender_(std::move(sender)), writers_(std::move(writers)) {
    writers_->fetch_add(1);
  }
  ~EmbeddedWriter() override { writers_->fetch_sub(1); }
  void write(const Record& record) override {
    sender_.set_commit_here(writers_->load(std::memory_order_relaxed) == 1);
    for (;;) {
      auto token = sender_.enqueue_with_token(tidemark::AppendRecord{record.key, record.value, 1});
      if (!token) {
        if (token.error().is(tidemark::ErrorKind::kFull)) {
          sender_.wait_for_capacity();
          continue;
        }
        fail("tidemark append: " + token.error().message);
      }
      auto time = token->wait();
      if (!time) fail("tidemark commit: " + time.error().message);
      return;
    }
  }

 private:
  tidemark::AppendSender sender_;
  std::shared_ptr<std::atomic<int>> writers_;  // EmbeddedWriters open
};

class TidemarkEmbedded final : public System {
 public:
  explicit TidemarkEmbedded(const fs::path& dir) {
    fs::create_directories(dir);
    auto blob = tidemark::open_blob("file://" + (dir / "blob").string());
    if (!blob) fail("tidemark blob: " + blob.error().message);
    auto consensus = tidemark::open_consensus("sqlite://" + (dir / "consensus.db").string());
    if (!consensus) fail("tidemark consensus: " + consensus.error().message);
    auto client = tidemark::Client::open(tidemark::Location{*blob, *consensus});
    if (!client) fail("tidemark client: " + client.error().message);
    client_ = *client;
    if (auto created = client_->create_shard("peers"); !created) {
      fail("tidemark shard: " + created.error().message);
    }
    auto shard = client_->open_shard("peers");
    if (!shard) fail("tidemark shard: " + shard.error().message);
    auto appender = tidemark::Appender::open(*shard);
    if (!appender) fail("tidemark appender: " + appender.error().message);
    appender_ = *appender;
  }
  ~TidemarkEmbedded() override {
    if (appender_) appender_->close();
  }
  std::string name() const override { return "tidemark-embedded"; }
  std::string check_durability() override {
    return "Appender, embedded default (as tidemark serve; a lone writer commits on its own "
           "thread, AppendSender::set_commit_here)";
  }
  std::unique_ptr<Writer> connect() override {
    return std::make_unique<EmbeddedWriter>(appender_->sender(), writers_);
  }
  std::vector<pid_t> sync_pids() override { return {0}; }

 private:
  std::shared_ptr<tidemark::Client> client_;
  std::shared_ptr<tidemark::Appender> appender_;
  std::shared_ptr<std::atomic<int>> writers_ = std::make_shared<std::atomic<int>>(0);
};

// --- PostgreSQL: INSERT per transaction.

std::string pg_value(PGconn* conn, const char* sql) {
  PGresult* result = PQexec(conn, sql);
  if (PQresultStatus(result) != PGRES_TUPLES_OK) {
    std::string error = PQerrorMessage(conn);
    PQclear(result);
    fail(std::string("postgres: ") + sql + ": " + error);
  }
  std::string value = PQntuples(result) > 0 ? PQgetvalue(result, 0, 0) : "";
  PQclear(result);
  return value;
}

void pg_exec(PGconn* conn, const char* sql) {
  PGresult* result = PQexec(conn, sql);
  const auto status = PQresultStatus(result);
  PQclear(result);
  if (status != PGRES_COMMAND_OK)
    fail(std::string("postgres: ") + sql + ": " + PQerrorMessage(conn));
}

PGconn* pg_connect(const std::string& conninfo) {
  PGconn* conn = PQconnectdb(conninfo.c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string error = PQerrorMessage(conn);
    PQfinish(conn);
    fail("postgres: " + error);
  }
  return conn;
}

class PostgresWriter final : public Writer {
 public:
  explicit PostgresWriter(const std::string& conninfo) : conn_(pg_connect(conninfo)) {
    PGresult* prepared =
        PQprepare(conn_, "put", "INSERT INTO peers (k, v) VALUES ($1, $2)", 2, nullptr);
    const auto status = PQresultStatus(prepared);
    PQclear(prepared);
    if (status != PGRES_COMMAND_OK) fail(std::string("postgres prepare: ") + PQerrorMessage(conn_));
  }
  ~PostgresWriter() override { PQfinish(conn_); }
  void write(const Record& record) override {
    const char* values[2] = {record.key.c_str(), record.value.c_str()};
    PGresult* result = PQexecPrepared(conn_, "put", 2, values, nullptr, nullptr, 0);
    const auto status = PQresultStatus(result);
    PQclear(result);
    if (status != PGRES_COMMAND_OK) fail(std::string("postgres insert: ") + PQerrorMessage(conn_));
  }

 private:
  PGconn* conn_;
};

class Postgres final : public System {
 public:
  explicit Postgres(std::string conninfo) : conninfo_(std::move(conninfo)) {
    PGconn* conn = pg_connect(conninfo_);
    pg_exec(conn, "DROP TABLE IF EXISTS peers");
    pg_exec(conn, "CREATE TABLE peers (k text NOT NULL, v text NOT NULL)");
    PQfinish(conn);
  }
  std::string name() const override { return "postgres"; }
  std::string check_durability() override {
    PGconn* conn = pg_connect(conninfo_);
    const std::string fsync = pg_value(conn, "SHOW fsync");
    const std::string commit = pg_value(conn, "SHOW synchronous_commit");
    const std::string method = pg_value(conn, "SHOW wal_sync_method");
    const std::string version = pg_value(conn, "SHOW server_version");
    PQfinish(conn);
    if (fsync != "on" || commit != "on") {
      fail("postgres is not durable per commit: fsync=" + fsync + " synchronous_commit=" + commit);
    }
    return "PostgreSQL " + version + ", fsync=on, synchronous_commit=on, wal_sync_method=" + method;
  }
  std::unique_ptr<Writer> connect() override { return std::make_unique<PostgresWriter>(conninfo_); }
  std::vector<pid_t> sync_pids() override {
    // Every server process: a backend flushes the WAL at its commit unless
    // the WAL writer got there first.
    PGconn* conn = pg_connect(conninfo_);
    PGresult* result =
        PQexec(conn, "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()");
    std::vector<pid_t> pids;
    for (int i = 0; i < PQntuples(result); ++i) pids.push_back(std::atoi(PQgetvalue(result, i, 0)));
    PQclear(result);
    PQfinish(conn);
    return pids;
  }

 private:
  std::string conninfo_;
};

// --- Redis: XADD under appendfsync always.

redisContext* redis_connect(const std::string& host, int port) {
  redisContext* c = redisConnect(host.c_str(), port);
  if (c == nullptr || c->err) {
    std::string error = c ? c->errstr : "out of memory";
    if (c) redisFree(c);
    fail("redis: " + error);
  }
  return c;
}

std::string redis_string(redisContext* c, const char* command) {
  auto* reply = static_cast<redisReply*>(redisCommand(c, command));
  if (reply == nullptr) fail(std::string("redis: ") + command + ": " + c->errstr);
  std::string out;
  if (reply->type == REDIS_REPLY_STRING || reply->type == REDIS_REPLY_STATUS) {
    out.assign(reply->str, reply->len);
  } else if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2) {
    out.assign(reply->element[1]->str, reply->element[1]->len);  // CONFIG GET: name, value
  }
  freeReplyObject(reply);
  return out;
}

class RedisWriter final : public Writer {
 public:
  RedisWriter(const std::string& host, int port) : c_(redis_connect(host, port)) {}
  ~RedisWriter() override { redisFree(c_); }
  void write(const Record& record) override {
    auto* reply = static_cast<redisReply*>(redisCommand(c_, "XADD peers * k %b v %b",
                                                        record.key.data(), record.key.size(),
                                                        record.value.data(), record.value.size()));
    if (reply == nullptr) fail(std::string("redis XADD: ") + c_->errstr);
    const bool error = reply->type == REDIS_REPLY_ERROR;
    std::string message = error ? std::string(reply->str, reply->len) : "";
    freeReplyObject(reply);
    if (error) fail("redis XADD: " + message);
  }

 private:
  redisContext* c_;
};

class Redis final : public System {
 public:
  Redis(std::string host, int port) : host_(std::move(host)), port_(port) {
    redisContext* c = redis_connect(host_, port_);
    redis_string(c, "DEL peers");
    redisFree(c);
  }
  std::string name() const override { return "redis"; }
  std::string check_durability() override {
    redisContext* c = redis_connect(host_, port_);
    const std::string aof = redis_string(c, "CONFIG GET appendonly");
    const std::string fsync = redis_string(c, "CONFIG GET appendfsync");
    std::string info = redis_string(c, "INFO server");
    redisFree(c);
    if (aof != "yes" || fsync != "always") {
      fail("redis is not durable per command: appendonly=" + aof + " appendfsync=" + fsync);
    }
    std::string version = "?";
    if (auto at = info.find("redis_version:"); at != std::string::npos) {
      version = info.substr(at + 14, info.find('\r', at) - at - 14);
    }
    return "Redis " + version + ", appendonly yes, appendfsync always";
  }
  std::unique_ptr<Writer> connect() override { return std::make_unique<RedisWriter>(host_, port_); }
  std::vector<pid_t> sync_pids() override {
    redisContext* c = redis_connect(host_, port_);
    std::string info = redis_string(c, "INFO server");
    redisFree(c);
    auto at = info.find("process_id:");
    if (at == std::string::npos) fail("redis: no process_id in INFO");
    return {static_cast<pid_t>(std::stol(info.substr(at + 11)))};
  }

 private:
  std::string host_;
  int port_;
};

// --- RocksDB: Put with sync in this process.

class RocksWriter final : public Writer {
 public:
  explicit RocksWriter(rocksdb::DB* db) : db_(db) { options_.sync = true; }
  void write(const Record& record) override {
    auto status = db_->Put(options_, record.key, record.value);
    if (!status.ok()) fail("rocksdb: " + status.ToString());
  }

 private:
  rocksdb::DB* db_;
  rocksdb::WriteOptions options_;
};

class Rocks final : public System {
 public:
  explicit Rocks(const fs::path& dir) {
    rocksdb::Options options;
    options.create_if_missing = true;
    rocksdb::DB* db = nullptr;
    auto status = rocksdb::DB::Open(options, dir.string(), &db);
    if (!status.ok()) fail("rocksdb: " + status.ToString());
    db_.reset(db);
  }
  std::string name() const override { return "rocksdb"; }
  std::string check_durability() override {
    return "RocksDB " + std::to_string(ROCKSDB_MAJOR) + "." + std::to_string(ROCKSDB_MINOR) +
           ", WriteOptions::sync (the WAL synced before Put returns)";
  }
  std::unique_ptr<Writer> connect() override { return std::make_unique<RocksWriter>(db_.get()); }
  std::vector<pid_t> sync_pids() override { return {0}; }

 private:
  std::unique_ptr<rocksdb::DB> db_;
};

// --- SQLite: WAL, synchronous=FULL, a connection per client.

sqlite3* sqlite_open(const fs::path& file) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(file.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    std::string error = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    fail("sqlite: " + error);
  }
  sqlite3_busy_timeout(db, 60'000);
  for (const char* pragma : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL"}) {
    if (sqlite3_exec(db, pragma, nullptr, nullptr, nullptr) != SQLITE_OK) {
      fail(std::string("sqlite: ") + pragma + ": " + sqlite3_errmsg(db));
    }
  }
  return db;
}

std::string sqlite_value(sqlite3* db, const char* sql) {
  sqlite3_stmt* stmt = nullptr;
  std::string out;
  if (sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr) == SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW) {
    out = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
  }
  sqlite3_finalize(stmt);
  return out;
}

class SqliteWriter final : public Writer {
 public:
  explicit SqliteWriter(const fs::path& file) : db_(sqlite_open(file)) {
    if (sqlite3_prepare_v2(db_, "INSERT INTO peers (k, v) VALUES (?, ?)", -1, &insert_, nullptr) !=
        SQLITE_OK) {
      fail(std::string("sqlite prepare: ") + sqlite3_errmsg(db_));
    }
  }
  ~SqliteWriter() override {
    sqlite3_finalize(insert_);
    sqlite3_close(db_);
  }
  void write(const Record& record) override {
    sqlite3_bind_text(insert_, 1, record.key.data(), static_cast<int>(record.key.size()),
                      SQLITE_STATIC);
    sqlite3_bind_text(insert_, 2, record.value.data(), static_cast<int>(record.value.size()),
                      SQLITE_STATIC);
    const int rc = sqlite3_step(insert_);
    sqlite3_reset(insert_);
    if (rc != SQLITE_DONE) fail(std::string("sqlite insert: ") + sqlite3_errmsg(db_));
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* insert_ = nullptr;
};

class Sqlite final : public System {
 public:
  explicit Sqlite(const fs::path& dir) : file_(dir / "peers.db") {
    fs::create_directories(dir);
    sqlite3* db = sqlite_open(file_);
    if (sqlite3_exec(db, "CREATE TABLE IF NOT EXISTS peers (k TEXT NOT NULL, v TEXT NOT NULL)",
                     nullptr, nullptr, nullptr) != SQLITE_OK) {
      fail(std::string("sqlite: ") + sqlite3_errmsg(db));
    }
    sqlite3_close(db);
  }
  std::string name() const override { return "sqlite"; }
  std::string check_durability() override {
    sqlite3* db = sqlite_open(file_);
    const std::string mode = sqlite_value(db, "PRAGMA journal_mode");
    const std::string sync = sqlite_value(db, "PRAGMA synchronous");
    sqlite3_close(db);
    if (mode != "wal" || sync != "2") {
      fail("sqlite is not durable per commit: journal_mode=" + mode + " synchronous=" + sync);
    }
    return std::string("SQLite ") + sqlite3_libversion() + ", journal_mode=WAL, synchronous=FULL";
  }
  std::unique_ptr<Writer> connect() override { return std::make_unique<SqliteWriter>(file_); }
  std::vector<pid_t> sync_pids() override { return {0}; }

 private:
  fs::path file_;
};

// ---- Measuring

struct Measurement {
  std::string system;
  int clients = 0;
  int round = 0;
  double records_per_second = 0;
  double p50_ms = 0;
  double p99_ms = 0;
};

// `clients` threads write for warm-up + `seconds`; only acknowledgements
// inside the measured window count.
Measurement measure(System& system, int clients, double seconds, int round) {
  std::vector<std::unique_ptr<Writer>> writers;
  writers.reserve(clients);
  for (int i = 0; i < clients; ++i) writers.push_back(system.connect());
  std::vector<Histogram> histograms(clients);
  std::vector<std::uint64_t> counted(clients, 0);
  std::atomic<bool> failed{false};
  std::string first_failure;
  std::mutex failure_mutex;
  Clock::time_point start, window_start, window_end;
  std::barrier ready(clients + 1);
  std::vector<std::thread> threads;
  threads.reserve(clients);
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      ready.arrive_and_wait();
      try {
        for (std::uint64_t seq = 0; !failed.load(std::memory_order_relaxed); ++seq) {
          const Record record = make_record(c, (static_cast<std::uint64_t>(round) << 40) | seq);
          const auto sent = Clock::now();
          if (sent >= window_end) break;
          writers[c]->write(record);
          const auto acked = Clock::now();
          if (sent >= window_start && acked < window_end) {
            histograms[c].add(acked - sent);
            ++counted[c];
          }
        }
      } catch (const Failure& f) {
        std::lock_guard lock(failure_mutex);
        if (!failed.exchange(true)) first_failure = f.message;
      }
    });
  }
  start = Clock::now();
  window_start = start + std::chrono::seconds(1);
  window_end = window_start +
               std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  ready.arrive_and_wait();
  for (auto& t : threads) t.join();
  writers.clear();
  if (failed) fail(system.name() + " at " + std::to_string(clients) + " clients: " + first_failure);
  Histogram all;
  std::uint64_t total = 0;
  for (int c = 0; c < clients; ++c) {
    all.merge(histograms[c]);
    total += counted[c];
  }
  Measurement m;
  m.system = system.name();
  m.clients = clients;
  m.round = round;
  m.records_per_second = static_cast<double>(total) / seconds;
  m.p50_ms = all.percentile_ms(0.50);
  m.p99_ms = all.percentile_ms(0.99);
  return m;
}

// Counts the fsync family of calls in `pids` (0: this process) while one
// client writes kSyncCheckWrites records. Returns syncs per write.
double syncs_per_write(System& system, const fs::path& scratch) {
  auto writer = system.connect();  // first: its server process is among the pids
  std::vector<pid_t> pids = system.sync_pids();
  for (pid_t& p : pids) {
    if (p == 0) p = ::getpid();
  }
  // strace attaches to this process too: allow it whatever Yama says.
  ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  const fs::path out = scratch / ("strace-" + system.name() + ".txt");
  std::vector<std::string> args{
      "strace", "-f",         "-qq", "-c",
      "-o",     out.string(), "-e",  "trace=fsync,fdatasync,sync_file_range,syncfs,msync"};
  for (pid_t p : pids) args.insert(args.end(), {"-p", std::to_string(p)});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t strace = 0;
  if (posix_spawnp(&strace, "strace", nullptr, nullptr, argv.data(), environ) != 0) {
    fail("cannot start strace (scripts/install-deps.sh peers)");
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // attached
  for (int i = 0; i < kSyncCheckWrites; ++i) writer->write(make_record(-1, i));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::kill(strace, SIGINT);
  int status = 0;
  ::waitpid(strace, &status, 0);
  writer.reset();
  std::ifstream in(out);
  std::string line;
  std::uint64_t syncs = 0;
  // strace -c: "% time  seconds  usecs/call  calls  errors syscall".
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::vector<std::string> words;
    for (std::string w; fields >> w;) words.push_back(w);
    if (words.size() < 5 || words.back() == "syscall" || words.back() == "total") continue;
    const std::string& name = words.back();
    if (name.find("sync") == std::string::npos) continue;
    syncs += std::stoull(words[3]);
  }
  return static_cast<double>(syncs) / kSyncCheckWrites;
}

// ---- Reporting

struct Summary {
  double median = 0, low = 0, high = 0;
};

Summary summarize(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  Summary s;
  if (values.empty()) return s;
  s.low = values.front();
  s.high = values.back();
  s.median = values[values.size() / 2];
  return s;
}

std::string fixed(double v, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, v);
  return text;
}

std::string thousands(double v) {
  if (v >= 10'000) return fixed(v / 1000, 1) + " k";
  if (v >= 1'000) return fixed(v / 1000, 2) + " k";
  return fixed(v, 0);
}

std::string range(const Summary& s, const std::function<std::string(double)>& f) {
  return f(s.low) == f(s.high) ? f(s.median) : f(s.low) + "-" + f(s.high);
}

void write_markdown(const fs::path& file, const std::vector<Measurement>& all,
                    const std::vector<std::string>& systems, const std::vector<int>& clients,
                    const std::map<std::string, std::string>& durability,
                    const std::map<std::string, double>& syncs, const std::string& command) {
  std::ofstream out(file);
  out << "Command: `" << command << "`\n\n";
  out << "Values: "
      << (g_random_values ? "letters and digits drawn at random (about 5 bits per byte)"
                          : "one repeated character (they compress to almost nothing)")
      << ".\n\n";
  for (int c : clients) {
    out << "**" << c << (c == 1 ? " client" : " clients") << "**\n\n";
    out << "| system | records/s (median) | range over rounds | p50 ms | p99 ms | vs "
           "tidemark-http |\n|---|---|---|---|---|---|\n";
    double ours = 0;
    std::map<std::string, Summary> rate;
    std::map<std::string, Summary> p50, p99;
    for (const auto& s : systems) {
      std::vector<double> r, a, b;
      for (const auto& m : all) {
        if (m.system == s && m.clients == c) {
          r.push_back(m.records_per_second);
          a.push_back(m.p50_ms);
          b.push_back(m.p99_ms);
        }
      }
      if (r.empty()) continue;
      rate[s] = summarize(r);
      p50[s] = summarize(a);
      p99[s] = summarize(b);
      if (s == "tidemark-http") ours = rate[s].median;
    }
    for (const auto& s : systems) {
      if (!rate.contains(s)) continue;
      auto ms = [](double v) { return fixed(v, v < 1 ? 3 : 2); };
      out << "| " << s << " | " << thousands(rate[s].median) << " | " << range(rate[s], thousands)
          << " | " << range(p50[s], ms) << " | " << range(p99[s], ms) << " | "
          << (ours > 0 ? fixed(rate[s].median / ours, 2) + "x" : "-") << " |\n";
    }
    out << "\n";
  }
  out << "Durability, read back from each system before the run:\n\n";
  for (const auto& [s, how] : durability) {
    out << "- " << s << ": " << how;
    if (auto it = syncs.find(s); it != syncs.end()) {
      out << "; " << fixed(it->second, 2)
          << " syncs per acknowledged write at one client (every sync of the serving processes, "
             "background work included, over the writes)";
    }
    out << "\n";
  }
}

// Bars of the median records/s, one group per concurrency, log scale.
void write_svg(const fs::path& file, const std::vector<Measurement>& all,
               const std::vector<std::string>& systems, const std::vector<int>& clients) {
  const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"};
  const int bar = 22, gap = 40, left = 70, top = 30, height = 260;
  const int width = left + static_cast<int>(clients.size() * (systems.size() * bar + gap)) + 160;
  double most = 1;
  std::map<std::pair<std::string, int>, double> median;
  for (const auto& s : systems) {
    for (int c : clients) {
      std::vector<double> r;
      for (const auto& m : all) {
        if (m.system == s && m.clients == c) r.push_back(m.records_per_second);
      }
      if (r.empty()) continue;
      median[{s, c}] = summarize(r).median;
      most = std::max(most, median[{s, c}]);
    }
  }
  const double top_log = std::ceil(std::log10(most));
  auto y_of = [&](double v) {
    const double l = std::clamp(std::log10(std::max(v, 1.0)) / top_log, 0.0, 1.0);
    return top + height - static_cast<int>(l * height);
  };
  std::ofstream out(file);
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\""
      << top + height + 60 << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << left << "\" y=\"18\" font-size=\"13\">Durable writes, records/s "
      << "(median of rounds, log scale)</text>\n";
  for (int d = 0; d <= static_cast<int>(top_log); ++d) {
    const int y = y_of(std::pow(10.0, d));
    out << "<line x1=\"" << left << "\" x2=\"" << width - 160 << "\" y1=\"" << y << "\" y2=\"" << y
        << "\" stroke=\"#ddd\"/><text x=\"" << left - 6 << "\" y=\"" << y + 4
        << "\" text-anchor=\"end\">"
        << (d >= 3 ? std::to_string(static_cast<int>(std::pow(10.0, d - 3))) + "k"
                   : std::to_string(static_cast<int>(std::pow(10.0, d))))
        << "</text>\n";
  }
  int x = left + gap / 2;
  for (int c : clients) {
    const int group_x = x;
    for (std::size_t i = 0; i < systems.size(); ++i) {
      auto it = median.find({systems[i], c});
      if (it != median.end()) {
        const int y = y_of(it->second);
        out << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << bar - 4 << "\" height=\""
            << top + height - y << "\" fill=\"" << colors[i % 6] << "\"/>\n";
      }
      x += bar;
    }
    out << "<text x=\"" << (group_x + x) / 2 << "\" y=\"" << top + height + 18
        << "\" text-anchor=\"middle\">" << c << (c == 1 ? " client" : " clients") << "</text>\n";
    x += gap;
  }
  for (std::size_t i = 0; i < systems.size(); ++i) {
    const int y = top + 10 + static_cast<int>(i) * 18;
    out << "<rect x=\"" << width - 150 << "\" y=\"" << y << "\" width=\"12\" height=\"12\" fill=\""
        << colors[i % 6] << "\"/><text x=\"" << width - 132 << "\" y=\"" << y + 10 << "\">"
        << systems[i] << "</text>\n";
  }
  out << "</svg>\n";
}

// Every measurement and each system's durability, with what produced
// them: the input of scripts/plots.py (docs/data/peers.json).
void write_json(const fs::path& file, const std::vector<Measurement>& all,
                const std::vector<std::string>& systems, const std::vector<int>& clients,
                const std::map<std::string, std::string>& durability,
                const std::map<std::string, double>& syncs, const std::string& command,
                const std::string& commit, double seconds, int rounds) {
  using tidemark::append_json_string;
  auto number = [](double v, int digits) { return fixed(v, digits); };
  std::string out = "{\n  \"command\": ";
  append_json_string(&out, command);
  out += ",\n  \"commit\": ";
  if (commit.empty()) {
    out += "null";
  } else {
    append_json_string(&out, commit);
  }
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  out += ",\n  \"date\": ";
  append_json_string(&out, tidemark::format_utc(static_cast<std::uint64_t>(now.count())));
  out += ",\n  \"values\": ";
  append_json_string(&out, g_random_values ? "random" : "repeated");
  out += ",\n  \"seconds\": " + number(seconds, 3) + ",\n  \"rounds\": " + std::to_string(rounds);
  out += ",\n  \"clients\": [";
  for (std::size_t i = 0; i < clients.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(clients[i]);
  }
  out += "],\n  \"systems\": [";
  for (std::size_t i = 0; i < systems.size(); ++i) {
    if (i) out += ", ";
    append_json_string(&out, systems[i]);
  }
  out += "],\n  \"durability\": [";
  bool first = true;
  for (const auto& [s, how] : durability) {
    out += first ? "\n    {\"system\": " : ",\n    {\"system\": ";
    first = false;
    append_json_string(&out, s);
    out += ", \"settings\": ";
    append_json_string(&out, how);
    out += ", \"syncs_per_write\": ";
    const auto it = syncs.find(s);
    out += it == syncs.end() ? "null" : number(it->second, 2);
    out += "}";
  }
  out += "\n  ],\n  \"rows\": [";
  first = true;
  for (const auto& m : all) {
    out += first ? "\n    {\"system\": " : ",\n    {\"system\": ";
    first = false;
    append_json_string(&out, m.system);
    out += ", \"clients\": " + std::to_string(m.clients) +
           ", \"round\": " + std::to_string(m.round) +
           ", \"records_per_s\": " + number(m.records_per_second, 0) +
           ", \"p50_ms\": " + number(m.p50_ms, 3) + ", \"p99_ms\": " + number(m.p99_ms, 3) + "}";
  }
  out += "\n  ]\n}\n";
  std::ofstream stream(file);
  stream << out;
  stream.flush();
  if (!stream) fail("cannot write " + file.string());
}

// ---- Command line

constexpr const char* kUsage =
    "usage: tidemark-peers --dir SCRATCH [--systems a,b,...] [--clients 1,100,1000]\n"
    "       [--seconds S] [--rounds N] [--tidemark HOST:PORT --tidemark-pid PID]\n"
    "       [--tidemark-durability TEXT (how that server makes a write durable)]\n"
    "       [--postgres CONNINFO] [--redis HOST:PORT] [--check-syncs]\n"
    "       [--markdown FILE] [--svg FILE] [--json FILE] [--command TEXT] [--commit TEXT]\n"
    "       [--values repeated|random]\n"
    "systems: tidemark-http tidemark-embedded postgres redis rocksdb sqlite\n";

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

std::pair<std::string, int> host_port(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos) fail("HOST:PORT expected, got " + text);
  return {text.substr(0, colon), std::stoi(text.substr(colon + 1))};
}

int run(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  bool check_syncs = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--check-syncs") {
      check_syncs = true;
    } else if (a.starts_with("--") && i + 1 < argc) {
      flags[a] = argv[++i];
    } else {
      std::fputs(kUsage, stderr);
      return 2;
    }
  }
  for (const auto& [flag, value] : flags) {
    static const std::vector<std::string> known{
        "--dir",      "--systems",      "--clients",  "--seconds", "--rounds",
        "--tidemark", "--tidemark-pid", "--postgres", "--redis",   "--markdown",
        "--svg",      "--json",         "--command",  "--commit",  "--tidemark-durability",
        "--values"};
    if (std::find(known.begin(), known.end(), flag) == known.end()) {
      std::fprintf(stderr, "unknown option %s\n%s", flag.c_str(), kUsage);
      return 2;
    }
  }
  if (!flags.contains("--dir")) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  if (flags.contains("--values")) {
    if (flags["--values"] != "repeated" && flags["--values"] != "random") {
      std::fprintf(stderr, "--values is repeated or random, not %s\n%s", flags["--values"].c_str(),
                   kUsage);
      return 2;
    }
    g_random_values = flags["--values"] == "random";
  }
  // What produced the figures, for the reports: the wrapper's own command
  // line when it gives one (bench/peers/run.sh), else this one.
  std::string command = flags["--command"];
  if (command.empty()) {
    command = "tidemark-peers";
    for (int i = 1; i < argc; ++i) {
      if (std::string_view(argv[i]) == "--commit") {
        ++i;  // what ran, not how to run it again
      } else {
        command += std::string(" ") + argv[i];
      }
    }
  }
  const fs::path scratch = flags["--dir"];
  const auto names = split(flags.contains("--systems")
                               ? flags["--systems"]
                               : "tidemark-http,tidemark-embedded,postgres,redis,rocksdb,sqlite");
  std::vector<int> clients;
  for (const auto& c : split(flags.contains("--clients") ? flags["--clients"] : "1,100,1000")) {
    clients.push_back(std::stoi(c));
  }
  const double seconds = flags.contains("--seconds") ? std::stod(flags["--seconds"]) : 10;
  const int rounds = flags.contains("--rounds") ? std::stoi(flags["--rounds"]) : 3;

  std::vector<std::unique_ptr<System>> systems;
  for (const auto& n : names) {
    if (n == "tidemark-http") {
      if (!flags.contains("--tidemark")) fail("tidemark-http needs --tidemark HOST:PORT");
      auto [host, port] = host_port(flags["--tidemark"]);
      const pid_t pid = flags.contains("--tidemark-pid") ? std::stoi(flags["--tidemark-pid"]) : 0;
      if (check_syncs && pid == 0) fail("--check-syncs needs --tidemark-pid");
      systems.push_back(
          std::make_unique<TidemarkHttp>(host, port, pid, flags["--tidemark-durability"]));
    } else if (n == "tidemark-embedded") {
      systems.push_back(std::make_unique<TidemarkEmbedded>(scratch / "tidemark-embedded"));
    } else if (n == "postgres") {
      if (!flags.contains("--postgres")) fail("postgres needs --postgres CONNINFO");
      systems.push_back(std::make_unique<Postgres>(flags["--postgres"]));
    } else if (n == "redis") {
      if (!flags.contains("--redis")) fail("redis needs --redis HOST:PORT");
      auto [host, port] = host_port(flags["--redis"]);
      systems.push_back(std::make_unique<Redis>(host, port));
    } else if (n == "rocksdb") {
      systems.push_back(std::make_unique<Rocks>(scratch / "rocksdb"));
    } else if (n == "sqlite") {
      systems.push_back(std::make_unique<Sqlite>(scratch / "sqlite"));
    } else {
      std::fprintf(stderr, "unknown system %s\n%s", n.c_str(), kUsage);
      return 2;
    }
  }

  std::map<std::string, std::string> durability;
  std::map<std::string, double> syncs;
  for (auto& s : systems) {
    durability[s->name()] = s->check_durability();
    std::fprintf(stderr, "%s: %s\n", s->name().c_str(), durability[s->name()].c_str());
    if (check_syncs) {
      const double per_write = syncs_per_write(*s, scratch);
      syncs[s->name()] = per_write;
      std::fprintf(stderr, "%s: %.2f syncs per acknowledged write at one client\n",
                   s->name().c_str(), per_write);
      if (per_write < 1.0) {
        fail(s->name() + " acknowledged writes without a sync each (" + fixed(per_write, 2) +
             " syncs per write): its durability is not equal to the others'");
      }
    }
  }

  std::vector<Measurement> all;
  std::printf("system\tclients\tround\trecords_per_s\tp50_ms\tp99_ms\n");
  for (int c : clients) {
    for (int r = 0; r < rounds; ++r) {
      for (std::size_t k = 0; k < systems.size(); ++k) {
        System& s = *systems[(k + static_cast<std::size_t>(r)) % systems.size()];
        Measurement m = measure(s, c, seconds, r);
        std::printf("%s\t%d\t%d\t%.0f\t%.3f\t%.3f\n", m.system.c_str(), c, r, m.records_per_second,
                    m.p50_ms, m.p99_ms);
        std::fflush(stdout);
        all.push_back(m);
      }
    }
  }
  std::vector<std::string> order;
  for (auto& s : systems) order.push_back(s->name());
  if (flags.contains("--markdown")) {
    write_markdown(flags["--markdown"], all, order, clients, durability, syncs, command);
  }
  if (flags.contains("--svg")) write_svg(flags["--svg"], all, order, clients);
  if (flags.contains("--json")) {
    write_json(flags["--json"], all, order, clients, durability, syncs, command, flags["--commit"],
               seconds, rounds);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Failure& f) {
    std::fprintf(stderr, "tidemark-peers: %s\n", f.message.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tidemark-peers: %s\n", e.what());
    return 1;
  }
}
