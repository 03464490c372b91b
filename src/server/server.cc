#include "server/server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "server/console.h"
#include "server/http_text.h"
#include "server/metrics.h"
#include "server/sinks.h"
#include "shard/state.h"
#include "tidemark/appender.h"
#include "tidemark/read.h"
#include "tidemark/write.h"
#include "util/json.h"
#include "util/log.h"
#include "util/ndjson_rows.h"
#include "util/periodic.h"
#include "util/thread.h"

namespace tidemark {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

// An idempotent producer's managed append names it and numbers its records.
constexpr std::string_view kProducerHeader = "Tidemark-Producer";
constexpr std::string_view kSequenceHeader = "Tidemark-Sequence";
constexpr std::chrono::milliseconds kListenRetry{50};
// A body is read through a buffer at least this small.
constexpr std::uint64_t kSmallChunkBytes = 4 << 10;

// Body buffers. Those of kSmallChunkBytes, the one every small request
// takes, go back to a list of the thread that frees them, at most
// kCachedChunks per thread (128 KiB; the server's threads are bounded), and
// are taken from there first: a fresh allocation of that size made glibc
// consolidate its fast bins each request (malloc_consolidate, about 2.5%
// of the server's CPU at 100 clients). The requests pool's lease is taken
// and released as before: the list holds only free buffers.
constexpr std::size_t kCachedChunks = 32;

struct CachedChunks {
  std::vector<char*> free;
  ~CachedChunks() {
    for (char* chunk : free) delete[] chunk;
  }
};
thread_local CachedChunks cached_chunks;

struct ChunkDelete {
  std::size_t size = 0;
  void operator()(char* chunk) const {
    if (size == kSmallChunkBytes && cached_chunks.free.size() < kCachedChunks) {
      cached_chunks.free.push_back(chunk);
    } else {
      delete[] chunk;
    }
  }
};
using Chunk = std::unique_ptr<char[], ChunkDelete>;

Chunk new_chunk(std::size_t size) {
  if (size == kSmallChunkBytes && !cached_chunks.free.empty()) {
    char* chunk = cached_chunks.free.back();
    cached_chunks.free.pop_back();
    return Chunk(chunk, ChunkDelete{size});
  }
  return Chunk(new char[size], ChunkDelete{size});
}
// A request that holds a reservation for its whole body and has waited
// this long for its client's next bytes gives the reservation up (503)
// when other requests wait for the requests pool.
constexpr std::chrono::seconds kEvictIdleHolderAfter{2};
// How long a request that holds part of its body waits for room in the
// requests pool before it is answered 503 and lets go: without a limit,
// bodies each holding some could wait on each other for good.
constexpr std::chrono::seconds kHoldingWait{5};
// A partial line longer than this gets room for a whole record at once.
constexpr std::uint64_t kCarryReserveAbove = 1 << 20;

// Makes room in a stream chunk for a row whose key and value take
// `payload` bytes: exactly, when the row is larger than a chunk, where
// growing by doubling would allocate up to twice a huge value.
void reserve_for_row(std::string* out, std::size_t payload) {
  constexpr std::size_t kRowOverhead = 96;  // the JSON around key and value
  if (payload > Server::kStreamChunkBytes) out->reserve(out->size() + payload + kRowOverhead);
}

unsigned status_of(const Error& error) {
  switch (error.kind) {
    case ErrorKind::kInvalidUsage:
    case ErrorKind::kSinceViolation:
      return 400;
    case ErrorKind::kNotFound:
      return 404;
    case ErrorKind::kAlreadyExists:
    case ErrorKind::kHeld:
    case ErrorKind::kUpperMismatch:
    case ErrorKind::kNotReady:
    case ErrorKind::kSequenceMismatch:
      return 409;
    case ErrorKind::kTooLarge:
      return 413;
    // A backend that failed past the retries (the cause is in the message),
    // or a queue with no room: the client should retry later.
    case ErrorKind::kDeterminate:
    case ErrorKind::kIndeterminate:
    case ErrorKind::kLeaseExpired:
    case ErrorKind::kFull:
    case ErrorKind::kClosed:
      return 503;
    default:
      return 500;
  }
}

// A read of a shard that exists which meets a part or a state that is gone
// fails with NotFound: garbage collection deleted what a reader whose lease
// lapsed (its server paused, or cut off from consensus, past the lease) was
// about to read. That is no "404: no such shard" but a read to try again,
// which reads the shard as it is now: 503.
Error read_failure(Error error) {
  if (error.is(ErrorKind::kNotFound)) {
    error.kind = ErrorKind::kDeterminate;
    error.message += " (gone while this read used it: read again)";
  }
  return error;
}

std::string error_json(std::string_view message) {
  std::string out = "{\"error\":";
  append_json_string(&out, message);
  out += "}";
  return out;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

}  // namespace

// ---------------------------------------------------------------------------
// The server's shared state.

struct Server::Impl {
  Impl(std::shared_ptr<Client> c, ServerOptions o)
      : client(std::move(c)),
        options(std::move(o)),
        ioc(static_cast<int>(options.io_threads)),
        acceptor(net::make_strand(ioc)),
        workers(options.workers) {
    root = MemoryPool::create("server", options.memory_limit);
    requests = root->child("requests", options.memory_limit / 4);
    appenders = root->child("appenders", options.memory_limit / 8 * 3);
    // Room for the largest record the server accepts, read back as a block
    // of its own (with its key and overhead), beside other reads.
    reads = root->child("reads", std::max<std::uint64_t>(options.memory_limit / 8,
                                                         2 * options.max_record_bytes.value_or(0)));
    sink_pool = root->child("sinks", options.memory_limit / 4);
  }

  std::shared_ptr<Client> client;
  ServerOptions options;
  net::io_context ioc;
  // Keeps ioc.run() going while nothing is pending on a socket: an append
  // waiting for its commit has no asio operation outstanding, and once the
  // acceptor closes (stop) the I/O threads would return with its answer
  // still to be posted. Reset by stop() after the requests in flight.
  net::executor_work_guard<net::io_context::executor_type> io_work = net::make_work_guard(ioc);
  tcp::acceptor acceptor;
  net::thread_pool workers;
  std::vector<std::thread> threads;
  std::shared_ptr<MemoryPool> root, requests, appenders, reads, sink_pool;
  std::unique_ptr<SinkManager> sinks;  // made once the port is bound (claims name it)
  Metrics metrics;

  struct SharedWriter {
    std::mutex mutex;  // one explicit append at a time per shard
    std::unique_ptr<WriteHandle> writer;
  };
  std::mutex mutex;  // guards the three maps
  std::map<std::string, std::shared_ptr<Shard>, std::less<>> shards;
  std::map<std::string, std::shared_ptr<Appender>, std::less<>> shard_appenders;
  std::uint64_t appenders_replaced = 0;  // guarded by mutex
  std::map<std::string, std::shared_ptr<SharedWriter>, std::less<>> writers;
  // When a request last took each shard's handle, appender or writer
  // (guarded by mutex); the idle sweeper closes what has not been taken
  // for options.idle_close.
  std::map<std::string, Clock::time_point, std::less<>> last_used;
  std::uint64_t idle_closed = 0;  // guarded by mutex: appenders and writers closed idle

  std::uint16_t bound_port = 0;  // set before the I/O threads start
  // Requests whose header was read and that are not answered yet (a
  // stream counts until it ends). stop() waits for them.
  std::atomic<int> in_flight{0};
  // Append requests read and not answered yet (Session::enqueue_group).
  std::atomic<int> appends_in_flight{0};
  // Sessions alive (open connections); the acceptor refuses past
  // options.max_connections.
  std::atomic<std::size_t> connections{0};
  // After a failed accept (out of file descriptors, say) the acceptor
  // waits before trying again: the error persists while the backlog holds
  // the connection, and retrying at once spun a core. The waits grow from
  // 10 ms to a second (kAcceptRetry), for as long as accepts fail; an
  // accept starts them again.
  static constexpr RetryPolicy kAcceptRetry{std::chrono::milliseconds(10),
                                            std::chrono::milliseconds(1000),
                                            std::numeric_limits<int>::max(),
                                            {}};
  std::optional<Backoff> accept_retry;  // used by the acceptor's strand only
  std::optional<net::steady_timer> accept_timer;
  std::atomic<bool> stopping{false};
  std::mutex stop_mutex;
  std::condition_variable stop_cv;
  bool stopped = false;

  // Marks the shard as used now. REQUIRES: mutex held.
  void touch_locked(std::string_view name) {
    auto it = last_used.find(name);
    if (it == last_used.end()) it = last_used.try_emplace(std::string(name)).first;
    it->second = Clock::now();
  }

  // Blocking: opens (once) and caches the shard. A cached handle that
  // found its shard deleted (here or by another process) is dropped, with
  // its appender and writer, and the name opened anew: it may have been
  // created again.
  Result<std::shared_ptr<Shard>> shard(std::string_view name) {
    TM_TRY(validate_shard_name(name));
    {
      std::lock_guard lock(mutex);
      if (auto it = shards.find(name); it != shards.end()) {
        if (!it->second->deleted()) {
          touch_locked(name);
          return it->second;
        }
      }
    }
    forget(name);
    TM_ASSIGN(auto opened, client->open_shard(name));
    std::lock_guard lock(mutex);
    touch_locked(name);
    return shards.try_emplace(std::string(name), std::move(opened)).first->second;
  }

  // Drops this server's handle, appender and writer of the shard (after a
  // delete). Requests holding them finish with them (and fail: the shard
  // is gone); the next request opens the shard anew.
  void forget(std::string_view name) {
    std::shared_ptr<Appender> appender_closing;
    std::shared_ptr<SharedWriter> writer_closing;
    std::shared_ptr<Shard> shard_closing;
    {
      std::lock_guard lock(mutex);
      if (auto it = shard_appenders.find(name); it != shard_appenders.end()) {
        appender_closing = std::move(it->second);
        shard_appenders.erase(it);
      }
      if (auto it = writers.find(name); it != writers.end()) {
        writer_closing = std::move(it->second);
        writers.erase(it);
      }
      if (auto it = shards.find(name); it != shards.end()) {
        shard_closing = std::move(it->second);
        shards.erase(it);
      }
    }
    // Outside the lock, as close_idle does.
    if (appender_closing) appender_closing->close();
  }

  // Closes the appenders, writers and shard handles that no request holds
  // and none has taken for options.idle_close. Only what the maps alone
  // hold (use_count 1 under the mutex, which every taker holds to take
  // one) can go: a request in progress keeps its own.
  void close_idle() {
    std::vector<std::shared_ptr<Appender>> appenders_closing;
    std::vector<std::shared_ptr<SharedWriter>> writers_closing;
    std::vector<std::shared_ptr<Shard>> shards_closing;
    {
      std::lock_guard lock(mutex);
      const auto cutoff = Clock::now() - options.idle_close;
      auto idle = [&](const std::string& name) {
        auto it = last_used.find(name);
        return it == last_used.end() || it->second < cutoff;
      };
      for (auto it = shard_appenders.begin(); it != shard_appenders.end();) {
        if (it->second.use_count() == 1 && idle(it->first) &&
            it->second->stats().queued_records == 0) {
          appenders_closing.push_back(std::move(it->second));
          it = shard_appenders.erase(it);
        } else {
          ++it;
        }
      }
      for (auto it = writers.begin(); it != writers.end();) {
        if (it->second.use_count() == 1 && idle(it->first)) {
          writers_closing.push_back(std::move(it->second));
          it = writers.erase(it);
        } else {
          ++it;
        }
      }
      // A shard whose appender or writer is still open is in use (the
      // appender holds it): use_count says so.
      for (auto it = shards.begin(); it != shards.end();) {
        if (it->second.use_count() == 1 && idle(it->first) &&
            !shard_appenders.contains(it->first) && !writers.contains(it->first)) {
          shards_closing.push_back(std::move(it->second));
          last_used.erase(it->first);
          it = shards.erase(it);
        } else {
          ++it;
        }
      }
      idle_closed += appenders_closing.size() + writers_closing.size();
    }
    // Outside the lock: closing joins an appender's threads and
    // unregisters writers (a consensus write each).
    for (auto& a : appenders_closing) a->close();
  }

  // Blocking: the shard's appender, drawing from the appenders pool. An
  // appender an error stopped (a backend down past its retries: its
  // pending records failed) is replaced, so the shard takes appends again
  // once the backend is back.
  Result<std::shared_ptr<Appender>> appender(std::string_view name) {
    TM_ASSIGN(auto s, shard(name));
    std::shared_ptr<Appender> stopped;  // closed outside the lock
    std::lock_guard lock(mutex);
    touch_locked(name);
    if (auto it = shard_appenders.find(name); it != shard_appenders.end()) {
      if (!it->second->failure()) return it->second;
      stopped = std::move(it->second);
      shard_appenders.erase(it);
      ++appenders_replaced;
    }
    AppenderOptions appender_options = options.appender;
    appender_options.parent_pool = appenders;
    appender_options.queue_bytes = appenders->capacity();
    appender_options.queue_records = options.appender_queue_records;
    TM_ASSIGN(auto opened, Appender::open(s, appender_options));
    return shard_appenders.try_emplace(std::string(name), std::move(opened)).first->second;
  }

  // Blocking: the shard's writer for explicit appends.
  Result<std::shared_ptr<SharedWriter>> writer(std::string_view name) {
    TM_ASSIGN(auto s, shard(name));
    std::lock_guard lock(mutex);
    touch_locked(name);
    if (auto it = writers.find(name); it != writers.end()) return it->second;
    auto shared = std::make_shared<SharedWriter>();
    TM_ASSIGN(shared->writer, s->open_writer());
    return writers.try_emplace(std::string(name), std::move(shared)).first->second;
  }

  std::string render_metrics() {
    std::string out;
    const std::pair<const char*, const MemoryPool*> pools[] = {{"server", root.get()},
                                                               {"requests", requests.get()},
                                                               {"appenders", appenders.get()},
                                                               {"reads", reads.get()},
                                                               {"sinks", sink_pool.get()}};
    const std::tuple<const char*, const char*, std::uint64_t (*)(const MemoryPool&)> gauges[] = {
        {"tidemark_pool_used_bytes", "Bytes held in the server's memory pools.",
         [](const MemoryPool& p) { return p.used(); }},
        {"tidemark_pool_capacity_bytes", "Capacity of the server's memory pools.",
         [](const MemoryPool& p) { return p.capacity(); }},
        {"tidemark_pool_peak_bytes", "The most bytes a pool has held.",
         [](const MemoryPool& p) { return p.stats().peak_used; }}};
    for (const auto& [metric, help, read] : gauges) {
      out.append("# HELP ").append(metric).append(" ").append(help).append("\n");
      out.append("# TYPE ").append(metric).append(" gauge\n");
      for (const auto& [name, pool] : pools) {
        append_sample(&out, metric, std::string("pool=\"") + name + "\"",
                      static_cast<double>(read(*pool)));
      }
    }
    out.append(
        "# HELP tidemark_http_requests_in_flight Requests read and not yet answered (open "
        "streams included).\n# TYPE tidemark_http_requests_in_flight gauge\n");
    append_sample(&out, "tidemark_http_requests_in_flight", "", in_flight.load());
    std::vector<std::pair<std::string, std::shared_ptr<Appender>>> appender_list;
    std::vector<std::pair<std::string, std::shared_ptr<Shard>>> shard_list;
    std::uint64_t replaced = 0, closed_idle = 0, open_writers = 0;
    {
      std::lock_guard lock(mutex);
      appender_list.assign(shard_appenders.begin(), shard_appenders.end());
      shard_list.assign(shards.begin(), shards.end());
      replaced = appenders_replaced;
      closed_idle = idle_closed;
      open_writers = writers.size();
    }
    out.append(
        "# HELP tidemark_open_shards Shards this server has open (idle ones are closed).\n"
        "# TYPE tidemark_open_shards gauge\n");
    append_sample(&out, "tidemark_open_shards", "", static_cast<double>(shard_list.size()));
    out.append(
        "# HELP tidemark_open_appenders Shards with an open appender (managed appends).\n"
        "# TYPE tidemark_open_appenders gauge\n");
    append_sample(&out, "tidemark_open_appenders", "", static_cast<double>(appender_list.size()));
    out.append(
        "# HELP tidemark_open_writers Shards with an open writer (explicit appends).\n"
        "# TYPE tidemark_open_writers gauge\n");
    append_sample(&out, "tidemark_open_writers", "", static_cast<double>(open_writers));
    out.append(
        "# HELP tidemark_idle_closed_total Appenders and writers closed after idle_close "
        "without a request.\n# TYPE tidemark_idle_closed_total counter\n");
    append_sample(&out, "tidemark_idle_closed_total", "", static_cast<double>(closed_idle));
    out.append(
        "# HELP tidemark_appenders_replaced_total Appenders an error stopped (a backend down "
        "past their retries) and a later append replaced.\n# TYPE "
        "tidemark_appenders_replaced_total counter\n");
    append_sample(&out, "tidemark_appenders_replaced_total", "", static_cast<double>(replaced));
    out.append("# HELP tidemark_appender_queue_bytes Bytes queued in a shard's appender.\n");
    out.append("# TYPE tidemark_appender_queue_bytes gauge\n");
    // The appenders' counters, one family each (name, help, field).
    struct Counter {
      const char* name;
      const char* help;
      std::uint64_t AppenderStats::*field;
      std::string samples;
    };
    Counter counters[] = {
        {"tidemark_appender_batches_committed_total",
         "Batches committed; divided by commits: batches per commit.",
         &AppenderStats::batches_committed,
         {}},
        {"tidemark_appender_commits_total",
         "compare_and_append calls that succeeded.",
         &AppenderStats::commits,
         {}},
        {"tidemark_appender_records_committed_total",
         "Records made durable.",
         &AppenderStats::records_committed,
         {}},
        {"tidemark_appender_mismatches_total",
         "compare_and_append calls that lost to another writer (another process).",
         &AppenderStats::mismatches,
         {}},
        {"tidemark_appender_retimed_batches_total",
         "Batches rebuilt at a later time after a lost compare_and_append.",
         &AppenderStats::retimed_batches,
         {}},
    };
    // The appenders' latencies, a summary each: the median and 99th
    // percentile of the last 10 to 20 s (absent when it had no commit),
    // and the sum and count since the appender opened.
    struct Latency {
      std::string name;
      const char* help;
      AppenderLatency AppenderStats::*field;
      std::string samples;
    };
    Latency latencies[] = {
        {"tidemark_appender_commit_latency_seconds",
         "From a record's enqueue to its commit being durable: what a producer waits.",
         &AppenderStats::commit_latency,
         {}},
        {"tidemark_appender_commit_call_seconds",
         "A commit's compare_and_append call alone.",
         &AppenderStats::commit_call,
         {}},
    };
    for (const auto& [name, a] : appender_list) {
      const AppenderStats stats = a->stats();
      const std::string label = "shard=\"" + name + "\"";
      append_sample(&out, "tidemark_appender_queue_bytes", label,
                    static_cast<double>(stats.pool.used));
      for (Counter& counter : counters) {
        append_sample(&counter.samples, counter.name, label,
                      static_cast<double>(stats.*counter.field));
      }
      for (Latency& latency : latencies) {
        const AppenderLatency& figures = stats.*latency.field;
        if (figures.recent > 0) {
          append_sample(&latency.samples, latency.name, label + ",quantile=\"0.5\"",
                        static_cast<double>(figures.p50_micros) / 1e6);
          append_sample(&latency.samples, latency.name, label + ",quantile=\"0.99\"",
                        static_cast<double>(figures.p99_micros) / 1e6);
        }
        append_sample(&latency.samples, latency.name + "_sum", label,
                      static_cast<double>(figures.sum_micros) / 1e6);
        append_sample(&latency.samples, latency.name + "_count", label,
                      static_cast<double>(figures.count));
      }
    }
    for (const Counter& counter : counters) {
      out.append("# HELP ").append(counter.name).append(" ").append(counter.help).append("\n");
      out.append("# TYPE ").append(counter.name).append(" counter\n");
      out += counter.samples;
    }
    for (const Latency& latency : latencies) {
      out.append("# HELP ").append(latency.name).append(" ").append(latency.help).append("\n");
      out.append("# TYPE ").append(latency.name).append(" summary\n");
      out += latency.samples;
    }
    out.append("# HELP tidemark_shard_upper A shard's upper (absent when closed).\n");
    out.append("# TYPE tidemark_shard_upper gauge\n");
    for (const auto& [name, s] : shard_list) {
      auto upper = s->upper();
      if (upper && !upper->is_closed()) {
        append_sample(&out, "tidemark_shard_upper", "shard=\"" + name + "\"",
                      static_cast<double>(upper->time()));
      }
    }
    sinks->render_metrics(&out);
    metrics.render(&out);
    return out;
  }

  void accept();

  // Runs close_idle(). Last: stopped (destroyed) before what it closes.
  PeriodicTask idle_sweeper;
};

// ---------------------------------------------------------------------------
// One connection: requests one after another.

namespace {

using Strand = net::strand<net::io_context::executor_type>;
using StrandSocket = tcp::socket::rebind_executor<Strand>::other;
using StrandTimer = net::basic_waitable_timer<Clock, net::wait_traits<Clock>, Strand>;

class Session : public std::enable_shared_from_this<Session> {
 public:
  // `server` outlives every handler: Server::stop joins the threads that
  // run them, and handlers still queued are destroyed with its io_context.
  // (A shared_ptr here would be a cycle: server -> io_context -> queued
  // handler -> session -> server, and nothing would ever be freed.)
  Session(StrandSocket socket, Server::Impl* server)
      : socket_(std::move(socket)), io_timer_(socket_.get_executor()), server_(server) {
    server_->connections.fetch_add(1);
    // Answers are written at once where the socket takes them (respond).
    beast::error_code ignored;
    socket_.non_blocking(true, ignored);
  }
  ~Session() {
    end_request();
    server_->connections.fetch_sub(1);
  }

  void start() {
    net::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->read_header(); });
  }

 private:
  using Parser = http::request_parser<http::buffer_body>;
  using Done = std::function<void()>;

  // --- reading -------------------------------------------------------------

  void read_header() {
    if (server_->stopping) return close();
    parser_.emplace();
    parser_->header_limit(Server::kHeaderLimitBytes);
    // Appends stream bodies of any size; the others are checked as read.
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    route_ = "unknown";
    // The whole header must come within the limit, however it trickles.
    begin_io(server_->options.idle_timeout);
    parse_header();
  }

  // Parses the header from buffer_, reading more from the socket until it
  // is whole. (A read, which asio tries at once, not a wait for
  // readability first: a wait only notices bytes that come after it
  // starts, so a request sent just before it would go unnoticed.)
  void parse_header() {
    beast::error_code ec;
    while (buffer_.size() > 0 && !parser_->is_header_done()) {
      if (parse_buffered(ec) == 0 || ec) break;  // need_more: read on
    }
    if (ec == http::error::header_limit) {
      keep_alive_ = false;
      return respond(431, error_json("request header over " +
                                     std::to_string(Server::kHeaderLimitBytes) + " bytes"));
    }
    if (ec && ec != http::error::need_more) return close();
    if (parser_->is_header_done()) {
      end_io();
      return on_header();
    }
    // The buffer is never full here: the header limit is met first.
    const std::size_t room = beast::read_size(buffer_, 65536);
    if (room == 0) return close();
    continue_io();
    socket_.async_read_some(
        buffer_.prepare(room), [self = shared_from_this()](beast::error_code ec, std::size_t n) {
          self->end_io();
          if (ec) return self->close();  // the client left (between requests, or mid-header)
          self->buffer_.commit(n);
          self->parse_header();
        });
  }

  // Feeds the parser what buffer_ holds; returns the bytes it took.
  std::size_t parse_buffered(beast::error_code& ec) {
    const std::size_t used = parser_->put(buffer_.data(), ec);
    buffer_.consume(used);
    return used;
  }

  using PieceDone = std::function<void(beast::error_code, std::string_view, bool)>;

  // Reads the next piece of the body into chunk_, once the requests pool
  // has room (backpressure). `done(ec, piece, finished)`.
  //
  // While the client has sent nothing to read, the connection waits for it
  // holding no buffer: a client that sends slowly, or not at all, keeps no
  // pool memory (beyond what it has sent: a partial line, or the records
  // of an all-or-nothing append; and a whole body's reservation, which
  // start_atomic bounds). And it must keep pace: see begin_client_wait.
  void read_piece(PieceDone done) {
    if (parser_->is_done()) return done({}, {}, true);
    if (readable_bytes(1) == 0) {
      if (!reserved_) drop_chunk();
      return when_readable(1, [self = shared_from_this(), done](beast::error_code ec) {
        if (ec) return done(ec, {}, false);
        self->read_piece_now(done);
      });
    }
    read_piece_now(done);
  }

  // Bytes that can be read now without waiting: left over from the header's
  // read, or on the socket. When the leftover alone has `at_least` (a small
  // request's body came with its header), the socket is not asked: FIONREAD,
  // an ioctl, was about 2.5% of the server's CPU at 100 clients when asked
  // twice per request.
  std::uint64_t readable_bytes(std::uint64_t at_least = UINT64_MAX) {
    if (buffer_.size() >= at_least) return buffer_.size();
    beast::error_code ec;
    return buffer_.size() + socket_.available(ec);
  }

  // Runs `then` once `bytes` can be read without waiting (or the socket
  // fails: `then(ec)`), waiting on the client at its pace.
  void when_readable(std::uint64_t bytes, std::function<void(beast::error_code)> then) {
    const std::uint64_t before = readable_bytes(bytes);
    if (before >= bytes) return then({});
    // The socket's low-water mark: woken once enough is there (or at the
    // client's end, or by the pace timer), not by each byte that trickles
    // in: readiness alone would wake the wait at once, again and again,
    // while fewer bytes than wanted sit unread.
    set_low_water(bytes - buffer_.size());
    const std::uint64_t wait = begin_client_wait(/*timed=*/true);
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this(), bytes, before, then,
                                                wait](beast::error_code ec) {
      self->set_low_water(1);
      const std::uint64_t now = self->readable_bytes();
      const std::uint64_t came = now > before ? now - before : 0;
      self->counted_ahead_ += came;  // counted now, not again when read
      if (!self->end_client_wait(wait, came)) return;
      // Cancelled by the pace timer with the window's bytes there: wait on.
      if (ec == net::error::operation_aborted && self->socket_.is_open()) {
        return self->when_readable(bytes, then);
      }
      if (ec) return then(ec);
      if (now >= bytes) return then({});
      // Readable with fewer bytes than the mark: the client has finished
      // sending (the body will never be whole), or the wake was early.
      if (self->peer_finished()) return then(net::error::eof);
      self->when_readable(bytes, then);
    });
    // A wait notices only bytes that come after it starts (asio tries a
    // read at once, never a wait), so bytes that came since the look above
    // would wait for the pace timer: look again, and end the wait if they
    // are there (its handler, aborted, looks once more).
    if (readable_bytes(bytes) >= bytes) {
      beast::error_code ignored;
      socket_.cancel(ignored);
    }
  }

  // The client has closed its sending side (or the connection is gone).
  bool peer_finished() {
    tcp_info info{};
    socklen_t length = sizeof info;
    if (::getsockopt(socket_.native_handle(), IPPROTO_TCP, TCP_INFO, &info, &length) != 0) {
      return true;
    }
    return info.tcpi_state != TCP_ESTABLISHED;
  }

  void set_low_water(std::uint64_t bytes) {
    beast::error_code ec;
    socket_.set_option(
        net::socket_base::receive_low_watermark(static_cast<int>(
            std::min<std::uint64_t>(std::max<std::uint64_t>(bytes, 1), Server::kBodyChunkBytes))),
        ec);
  }

  void read_piece_now(PieceDone done) {
    auto go = [self = shared_from_this(), done] {
      auto& body = self->parser_->get().body();
      body.data = self->chunk_.get();
      body.size = self->chunk_size_;
      const std::uint64_t wait = self->begin_client_wait(/*timed=*/false);
      if (self->buffer_.size() > 0) {
        // Bytes that came with an earlier read (a small body comes with
        // its header) are parsed here: no read operation, and no
        // completion queued to run later.
        beast::error_code ec;
        const std::size_t used = self->parse_buffered(ec);
        if (ec != http::error::need_more && (ec || used > 0)) {
          return self->piece_read(ec, wait, done);
        }
      }
      self->begin_io(self->server_->options.idle_timeout);
      // Bytes are there to read (read_piece waited for them): timed by the
      // connection's idle limit only, which saves a timer per read.
      http::async_read_some(self->socket_, self->buffer_, *self->parser_,
                            [self, done, wait](beast::error_code ec, std::size_t) {
                              self->end_io();
                              self->piece_read(ec, wait, done);
                            });
    };
    // A buffer the size of the body, between kSmallChunkBytes and
    // kBodyChunkBytes, not zeroed. Its bytes are reserved first: while the
    // requests pool is full, the connection is not read (waiting in line,
    // first come first served), so the pool never goes past its capacity
    // for buffers.
    std::uint64_t want = Server::kBodyChunkBytes;
    if (auto length = parser_->content_length()) want = std::min(want, *length);
    want = std::max<std::uint64_t>(want, kSmallChunkBytes);
    if (chunk_size_ >= want) return go();
    drop_chunk();
    reserve_then(want, [self = shared_from_this(), want, go](Lease lease) {
      self->chunk_ = new_chunk(want);
      self->chunk_size_ = want;
      self->chunk_lease_ = std::move(lease);
      go();
    });
  }

  // A read into chunk_ for wait `wait` ended: `done` with the piece.
  void piece_read(beast::error_code ec, std::uint64_t wait, const PieceDone& done) {
    const std::size_t got = chunk_size_ - parser_->get().body().size;
    const std::uint64_t counted = std::min<std::uint64_t>(got, counted_ahead_);
    counted_ahead_ -= counted;
    if (!end_client_wait(wait, got - counted)) return;
    if (ec == http::error::need_buffer) ec = {};
    if (ec) return done(ec, {}, false);
    done({}, std::string_view(chunk_.get(), got), parser_->is_done());
  }

  void drop_chunk() {
    chunk_.reset();
    chunk_size_ = 0;
    chunk_lease_.release();
  }

  // The body's pace (ServerOptions::min_body_rate): the time spent waiting
  // for the client is counted in windows of body_rate_window, and each
  // window must bring min_body_rate bytes a second; a request that falls
  // behind is answered 408 and its connection closed. Time the server makes
  // the client wait (for room in a pool or an appender queue) does not
  // count. Without a minimum rate, a wait ends after options.idle_timeout. Only a
  // `timed` wait (one for bytes not yet there) arms the pace timer; every
  // wait counts toward the window. Returns the wait's id for
  // end_client_wait.
  std::uint64_t begin_client_wait(bool timed) {
    const auto& options = server_->options;
    const std::uint64_t id = ++client_wait_;
    waiting_on_client_ = true;
    client_wait_started_ = Clock::now();
    Clock::duration deadline = options.idle_timeout;
    if (options.min_body_rate > 0) {
      if (window_bytes_ >= body_quota()) {  // the window is met: a new one
        window_waited_ = {};
        window_bytes_ = 0;
      }
      deadline = options.body_rate_window - window_waited_;
    }
    if (timed) arm_pace_timer(id, Clock::now() + deadline);
    return id;
  }

  // Fires at `deadline` (the wait expired: 408, or a plain close without a
  // minimum rate), or earlier, every kEvictIdleHolderAfter, for a request
  // that holds a whole body's reservation: once others wait for the
  // requests pool it gives the reservation up (503).
  void arm_pace_timer(std::uint64_t id, Clock::time_point deadline) {
    if (!pace_timer_) pace_timer_.emplace(socket_.get_executor());
    const Clock::time_point at =
        reserved_ ? std::min(deadline, Clock::now() + kEvictIdleHolderAfter) : deadline;
    pace_timer_->expires_at(at);
    pace_armed_ = true;
    pace_timer_->async_wait([self = shared_from_this(), id, deadline](beast::error_code ec) {
      if (ec || id != self->client_wait_ || !self->waiting_on_client_) return;
      if (Clock::now() < deadline) {
        if (self->server_->requests->waiting_reservations() == 0) {
          return self->arm_pace_timer(id, deadline);
        }
        self->evicted_ = true;
      }
      self->wait_expired_ = true;
      beast::error_code ignored;
      self->socket_.cancel(ignored);
    });
  }

  // Ends wait `id`, which brought `bytes` of body. False when the client
  // was too slow (then answered here) or the wait timed out (closed).
  bool end_client_wait(std::uint64_t id, std::uint64_t bytes) {
    if (id == client_wait_) {
      waiting_on_client_ = false;
      window_waited_ += Clock::now() - client_wait_started_;
      window_bytes_ += bytes;
      if (pace_armed_) {
        pace_armed_ = false;
        pace_timer_->cancel();
      }
    }
    if (!wait_expired_) return true;
    wait_expired_ = false;
    if (evicted_) {
      evicted_ = false;
      keep_alive_ = false;
      group_.clear();
      group_lease_.release();
      respond(503, error_json("this request's body paused for " +
                              std::to_string(kEvictIdleHolderAfter.count()) +
                              " s while holding memory other requests waited for; nothing of it "
                              "was appended: retry, sending the body without pauses"));
      return false;
    }
    if (server_->options.min_body_rate == 0) {
      close();
      return false;
    }
    // Bytes that came just as the window ended count for it.
    if (window_bytes_ >= body_quota()) return true;
    keep_alive_ = false;
    group_.clear();
    group_lease_.release();
    respond(408, error_json("the request body came slower than " +
                            std::to_string(server_->options.min_body_rate) +
                            " bytes a second (the server's --min-body-rate); nothing more of it "
                            "is read" +
                            std::string(atomic_ ? ", and nothing of it was appended" : "")));
    return false;
  }

  std::uint64_t body_quota() const {
    const auto& options = server_->options;
    return options.min_body_rate *
           static_cast<std::uint64_t>(
               std::chrono::duration_cast<std::chrono::milliseconds>(options.body_rate_window)
                   .count()) /
           1000;
  }

  // Runs `then` on this connection with a lease of `bytes` from the
  // requests pool: at once when there is room, else once its turn comes
  // (first come, first served). A reservation that can never be granted
  // answers the request with the error. A request that holds part of its
  // body (records of an all-or-nothing append, a partial line) waits at
  // most kHoldingWait, then is answered 503 and lets go: requests that
  // each hold some and wait for more cannot wait on each other for good.
  void reserve_then(std::uint64_t bytes, std::function<void(Lease)> then) {
    if (auto lease = server_->requests->try_reserve(bytes)) return then(std::move(*lease));
    const std::uint64_t id = ++reservation_;
    if (!group_lease_.empty() || !carry_lease_.empty()) {
      if (!hold_timer_) hold_timer_.emplace(socket_.get_executor());
      hold_timer_->expires_after(kHoldingWait);
      hold_timer_->async_wait([self = shared_from_this(), id](beast::error_code ec) {
        if (ec || id != self->reservation_) return;
        ++self->reservation_;  // the grant, when it comes, is dropped
        self->keep_alive_ = false;
        self->group_.clear();
        self->group_lease_.release();
        self->respond(503, error_json("the server's memory for requests stayed full for " +
                                      std::to_string(kHoldingWait.count()) +
                                      " s while this request held part of its body; nothing of it "
                                      "was appended: retry"));
      });
    }
    server_->requests->reserve_async(bytes, [self = shared_from_this(), then = std::move(then),
                                             id](Result<Lease> lease) mutable {
      net::post(self->socket_.get_executor(),
                [self, then, id, lease = std::make_shared<Result<Lease>>(std::move(lease))] {
                  if (id != self->reservation_) return;  // gave up: dropped
                  ++self->reservation_;
                  if (self->hold_timer_) self->hold_timer_->cancel();
                  if (!*lease) return self->respond_error(lease->error());
                  then(std::move(**lease));
                });
    });
  }

  // Reads a whole small body (at most kSmallBodyBytes) into small_body_.
  void read_small_body(Done then) {
    read_piece([self = shared_from_this(), then](beast::error_code ec, std::string_view piece,
                                                 bool finished) {
      if (ec) return self->close();
      self->small_body_.append(piece);
      if (self->small_body_.size() > Server::kSmallBodyBytes) {
        self->keep_alive_ = false;
        return self->respond(413, error_json("request body over " +
                                             std::to_string(Server::kSmallBodyBytes) + " bytes"));
      }
      if (finished) return then();
      self->read_small_body(then);
    });
  }

  // --- routing ---------------------------------------------------------------

  void on_header() {
    begin_request();
    request_started_ = Clock::now();
    atomic_ = false;
    reserved_ = false;
    counted_ahead_ = 0;
    window_waited_ = {};
    window_bytes_ = 0;
    auto& request = parser_->get();
    keep_alive_ = request.keep_alive();
    small_body_.clear();
    const std::string_view target(request.target().data(), request.target().size());
    const auto q = target.find('?');
    path_ = std::string(target.substr(0, q));
    query_ = parse_query(q == std::string_view::npos ? std::string_view{} : target.substr(q + 1));
    const http::verb method = request.method();

    // A body in a transfer coding other than chunked has no length this
    // server can find: answered 400 and the connection closed (RFC 9112
    // 6.3), never read as an empty body.
    if (request.find(http::field::transfer_encoding) != request.end() && !parser_->chunked()) {
      route_ = "bad_request";
      keep_alive_ = false;
      return respond(400, error_json("unsupported Transfer-Encoding \"" +
                                     std::string(request[http::field::transfer_encoding]) +
                                     "\": only chunked is accepted"));
    }
    if (path_ == "/healthz") {
      route_ = "healthz";
      if (rejects_query({})) return;
      return read_small_body([self = shared_from_this()] { self->respond(200, "{\"ok\":true}"); });
    }
    if (path_ == "/" && method == http::verb::get) {
      // The console: a page with no data (its script reads the routes
      // below, with the token), so it needs no token itself.
      route_ = "console";
      if (rejects_query({})) return;
      return read_small_body([self = shared_from_this()] {
        self->respond(200, std::string(console_page()), "text/html; charset=utf-8");
      });
    }
    if (server_->options.token) {
      auto it = request.find(http::field::authorization);
      const std::string expected = "Bearer " + *server_->options.token;
      if (it == request.end() ||
          !constant_time_equal(std::string_view(it->value().data(), it->value().size()),
                               expected)) {
        route_ = "unauthorized";
        keep_alive_ = false;
        return respond(401, error_json("missing or wrong bearer token"));
      }
    }
    if (path_ == "/metrics" && method == http::verb::get) {
      route_ = "metrics";
      if (rejects_query({})) return;
      return read_small_body([self = shared_from_this()] {
        self->blocking<std::string>(
            [server = self->server_]() -> Result<std::string> { return server->render_metrics(); },
            [self](Result<std::string> text) {
              self->respond(200, std::move(*text), "text/plain; version=0.0.4");
            });
      });
    }
    constexpr std::string_view kSinks = "/v1/sinks";
    if (path_ == kSinks) {
      if (method == http::verb::post) {
        route_ = "create_sink";
        if (rejects_query({})) return;
        return read_small_body([self = shared_from_this()] { self->create_sink(); });
      }
      if (method == http::verb::get) {
        route_ = "list_sinks";
        if (rejects_query({})) return;
        return read_small_body([self = shared_from_this()] {
          self->blocking<std::string>(
              [server = self->server_]() -> Result<std::string> {
                return server->sinks->list_json();
              },
              [self](Result<std::string> r) {
                if (!r) return self->respond_error(r.error());
                self->respond(200, std::move(*r));
              });
        });
      }
      return method_not_allowed();
    }
    if (path_.starts_with(std::string(kSinks) + "/")) {
      name_ = path_.substr(kSinks.size() + 1);
      if (method == http::verb::get) {
        route_ = "sink_status";
        if (rejects_query({})) return;
        return read_small_body([self = shared_from_this()] {
          self->blocking<std::string>(
              [server = self->server_, n = self->name_]() -> Result<std::string> {
                return server->sinks->status_json(n);
              },
              [self](Result<std::string> r) {
                if (!r) return self->respond_error(r.error());
                self->respond(200, std::move(*r));
              });
        });
      }
      if (method == http::verb::delete_) {
        route_ = "delete_sink";
        if (rejects_query({})) return;
        return read_small_body([self = shared_from_this()] {
          self->blocking<std::string>(
              [server = self->server_, n = self->name_]() -> Result<std::string> {
                TM_TRY(server->sinks->remove(n));
                std::string out = "{\"deleted\":";
                append_json_string(&out, n);
                return out + "}";
              },
              [self](Result<std::string> r) {
                if (!r) return self->respond_error(r.error());
                self->respond(200, std::move(*r));
              });
        });
      }
      return method_not_allowed();
    }
    constexpr std::string_view kShards = "/v1/shards";
    if (path_ == kShards) {
      if (method == http::verb::post) {
        route_ = "create_shard";
        if (rejects_query({})) return;
        return read_small_body([self = shared_from_this()] { self->create_shard(); });
      }
      if (method == http::verb::get) {
        route_ = "list_shards";
        if (rejects_query({})) return;
        return read_small_body([self = shared_from_this()] { self->list_shards(); });
      }
      return method_not_allowed();
    }
    if (path_.starts_with(std::string(kShards) + "/")) {
      std::string_view rest = std::string_view(path_).substr(kShards.size() + 1);
      const auto slash = rest.find('/');
      name_ = std::string(rest.substr(0, slash));
      const std::string_view action =
          slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
      if (auto valid = validate_shard_name(name_); !valid) {
        route_ = "bad_name";
        return read_small_body([self = shared_from_this(), message = valid.error().message] {
          self->respond(400, error_json(message));
        });
      }
      if (action.empty() && method == http::verb::get) {
        route_ = "inspect_shard";
        if (rejects_query({})) return;
        return read_small_body([self = shared_from_this()] { self->inspect_shard(); });
      }
      if (action.empty() && method == http::verb::delete_) {
        route_ = "delete_shard";
        if (rejects_query({"force"})) return;
        return read_small_body([self = shared_from_this()] { self->delete_shard(); });
      }
      if (action == "append" && method == http::verb::post) {
        route_ = "append";
        if (rejects_query({"lower", "upper"})) return;
        return start_append();
      }
      if (action == "snapshot" && method == http::verb::get) {
        route_ = "snapshot";
        if (rejects_query({"as_of", "after_key", "after_value"})) return;
        return read_small_body([self = shared_from_this()] { self->snapshot(); });
      }
      if (action == "listen" && method == http::verb::get) {
        route_ = "listen";
        if (rejects_query(
                {"from", "resume_progress", "until", "after_time", "after_key", "after_value"})) {
          return;
        }
        return read_small_body([self = shared_from_this()] { self->listen(); });
      }
      if (action.starts_with("producers/") && method == http::verb::get) {
        route_ = "producer";
        producer_ = std::string(action.substr(std::string_view("producers/").size()));
        if (rejects_query({})) return;
        return read_small_body([self = shared_from_this()] { self->inspect_producer(); });
      }
      if (action.starts_with("readers/") && method == http::verb::delete_) {
        route_ = "release_reader";
        reader_ = std::string(action.substr(std::string_view("readers/").size()));
        if (rejects_query({})) return;
        return read_small_body([self = shared_from_this()] { self->release_reader(); });
      }
      if (action.empty() || action == "append" || action == "snapshot" || action == "listen" ||
          action.starts_with("readers/")) {
        return method_not_allowed();
      }
    }
    route_ = "not_found";
    read_small_body(
        [self = shared_from_this()] { self->respond(404, error_json("no route " + self->path_)); });
  }

  // Answers 400 naming the first query parameter the route does not take,
  // and returns true: a typo (snapshot?asof=0) must not read as no
  // parameter at all. The body is not read; the connection closes after
  // the answer.
  bool rejects_query(std::initializer_list<std::string_view> known) {
    for (const auto& entry : query_) {
      const std::string& name = entry.first;
      if (std::find(known.begin(), known.end(), name) != known.end()) continue;
      std::string takes;
      for (std::string_view k : known) {
        if (!takes.empty()) takes += ", ";
        takes += k;
      }
      keep_alive_ = false;
      respond(400, error_json("unknown query parameter \"" + name + "\" (" +
                              (takes.empty() ? std::string("this route takes none")
                                             : "this route takes " + takes) +
                              ")"));
      return true;
    }
    return false;
  }

  void method_not_allowed() {
    route_ = "method_not_allowed";
    read_small_body([self = shared_from_this()] {
      self->respond(405, error_json("method not allowed on " + self->path_));
    });
  }

  // Runs `work` on the worker pool and `then` with its result back on this
  // connection.
  template <typename T>
  void blocking(std::function<Result<T>()> work, std::function<void(Result<T>)> then) {
    net::post(server_->workers, [self = shared_from_this(), work = std::move(work),
                                 then = std::move(then)]() mutable {
      auto result = std::make_shared<Result<T>>(work());
      net::post(self->socket_.get_executor(),
                [self, result, then = std::move(then)] { then(std::move(*result)); });
    });
  }

  void respond_error(const Error& error) { respond(status_of(error), error_json(error.message)); }

  // --- shards ----------------------------------------------------------------

  void create_shard() {
    auto json = parse_json(small_body_);
    const JsonValue* name = json ? json->find("name") : nullptr;
    if (!json || name == nullptr || !name->is_string()) {
      return respond(400, error_json("expected {\"name\": S}"));
    }
    for (const auto& [field, value] : json->as_object()) {
      if (field != "name") {
        return respond(400, error_json("unknown field \"" + field + "\" (a shard takes name)"));
      }
    }
    blocking<std::string>(
        [server = server_, n = name->as_string()]() -> Result<std::string> {
          TM_TRY(server->client->create_shard(n));
          TM_ASSIGN(auto s, server->shard(n));
          TM_ASSIGN(auto info, s->inspect());
          return info.to_json();
        },
        [self = shared_from_this()](Result<std::string> r) {
          if (!r) return self->respond_error(r.error());
          self->respond(201, std::move(*r));
        });
  }

  void create_sink() {
    auto spec = SinkSpec::parse(small_body_);
    if (!spec) return respond_error(spec.error());
    auto to = resolve_file_sink(spec->to);
    if (!to) return respond_error(to.error());
    spec->to = std::move(*to);
    auto url = parse_sink_url(spec->to, spec->format);
    if (!url) return respond_error(url.error());
    if (auto allowed = server_->options.allowed_destinations.check(*url); !allowed) {
      return respond_error(allowed.error());
    }
    blocking<std::string>([server = server_, s = *spec] { return server->sinks->create(s); },
                          [self = shared_from_this()](Result<std::string> r) {
                            if (!r) return self->respond_error(r.error());
                            self->respond(201, std::move(*r));
                          });
  }

  // A file sink writes only inside the server's file_sink_root. Its path is
  // resolved (symlinks, "..") once, here, and the sink is given the
  // resolved path, so the check and the writer cannot disagree (a path
  // climbing out through a symlinked data directory passed the check and
  // was written outside). Other destinations pass unchanged. A refusal
  // names no path of the server's.
  Result<std::string> resolve_file_sink(const std::string& to) {
    constexpr std::string_view kFile = "file://";
    if (!to.starts_with(kFile)) return to;
    const auto& root = server_->options.file_sink_root;
    if (!root) return invalid_usage("this server has no directory for file sinks");
    std::error_code ec;
    const auto base = std::filesystem::weakly_canonical(*root, ec);
    if (ec)
      return make_error(ErrorKind::kDeterminate,
                        "the server's file sink directory: " + ec.message());
    const auto dir = std::filesystem::weakly_canonical(to.substr(kFile.size()), ec);
    if (ec) return invalid_usage("sink destination " + to + ": " + ec.message());
    auto [b, d] = std::mismatch(base.begin(), base.end(), dir.begin(), dir.end());
    if (b != base.end() || d == dir.end()) {
      return invalid_usage("sink destination " + to +
                           ": file sinks write inside the sinks/ directory of this server's "
                           "data directory");
    }
    return std::string(kFile) + dir.string();
  }

  void list_shards() {
    blocking<std::string>(
        [server = server_]() -> Result<std::string> {
          TM_ASSIGN(auto names, server->client->list_shards());
          std::string out = "[";
          for (std::size_t i = 0; i < names.size(); ++i) {
            TM_ASSIGN(auto s, server->shard(names[i]));
            TM_ASSIGN(auto info, s->inspect());
            if (i > 0) out += ",";
            out += info.to_json();
          }
          return out + "]";
        },
        [self = shared_from_this()](Result<std::string> r) {
          if (!r) return self->respond_error(r.error());
          self->respond(200, std::move(*r));
        });
  }

  // {"producer", "sequence" (the last committed; null when unknown),
  // "time", "expires_ms"}: what a producer's next request starts after.
  void inspect_producer() {
    if (auto valid = validate_producer_id(*producer_); !valid) {
      return respond(400, error_json(valid.error().message));
    }
    blocking<std::string>(
        [server = server_, n = name_, p = *producer_]() -> Result<std::string> {
          TM_ASSIGN(auto s, server->shard(n));
          TM_ASSIGN(ProducerLookup lookup, s->lookup_producer(p, true));
          std::string out = "{\"producer\":";
          append_json_string(&out, p);
          if (lookup.producer) {
            out += ",\"sequence\":" + std::to_string(lookup.producer->sequence) +
                   ",\"time\":" + std::to_string(lookup.producer->time) +
                   ",\"expires_ms\":" + std::to_string(lookup.producer->expires_ms);
          } else {
            out += ",\"sequence\":null,\"time\":null,\"expires_ms\":null";
          }
          return out + "}";
        },
        [self = shared_from_this()](Result<std::string> r) {
          if (!r) return self->respond_error(r.error());
          self->respond(200, std::move(*r));
        });
  }

  // Deletes the shard and its data (Client::delete_shard); ?force=true
  // drops sinks' holds too.
  void delete_shard() {
    bool force = false;
    if (query_.contains("force")) {
      const std::string& value = query_["force"];
      if (value != "true" && value != "false") {
        return respond(400, error_json("force is true or false, got \"" + value + "\""));
      }
      force = value == "true";
    }
    blocking<std::string>(
        [server = server_, n = name_, force]() -> Result<std::string> {
          auto deleted = server->client->delete_shard(n, force);
          // Whatever the outcome, this server's handles on the shard may
          // be stale now: the next request opens it anew.
          server->forget(n);
          if (!deleted) return std::unexpected(deleted.error());
          std::string out = "{\"deleted\":";
          append_json_string(&out, n);
          return out + ",\"objects_deleted\":" + std::to_string(deleted->objects_deleted) +
                 ",\"versions_truncated\":" + std::to_string(deleted->versions_truncated) + "}";
        },
        [self = shared_from_this()](Result<std::string> r) {
          if (!r) return self->respond_error(r.error());
          self->respond(200, std::move(*r));
        });
  }

  // Drops a reader's hold on the since (Shard::release_reader).
  void release_reader() {
    if (reader_.empty() || reader_.find('/') != std::string::npos) {
      return respond(400, error_json("a reader id is one path segment (GET /v1/shards/" + name_ +
                                     " lists the readers)"));
    }
    blocking<std::string>(
        [server = server_, n = name_, id = reader_]() -> Result<std::string> {
          TM_ASSIGN(auto s, server->shard(n));
          TM_TRY(s->release_reader(id));
          std::string out = "{\"released\":";
          append_json_string(&out, id);
          return out + "}";
        },
        [self = shared_from_this()](Result<std::string> r) {
          if (!r) return self->respond_error(r.error());
          self->respond(200, std::move(*r));
        });
  }

  void inspect_shard() {
    blocking<std::string>(
        [server = server_, n = name_]() -> Result<std::string> {
          TM_ASSIGN(auto s, server->shard(n));
          TM_ASSIGN(auto info, s->inspect());
          return info.to_json();
        },
        [self = shared_from_this()](Result<std::string> r) {
          if (!r) return self->respond_error(r.error());
          self->respond(200, std::move(*r));
        });
  }

  // --- appends ---------------------------------------------------------------

  void start_append() {
    counted_append_ = true;
    server_->appends_in_flight.fetch_add(1);
    // A keep-alive connection's previous request may have named another shard.
    appender_.reset();
    sender_.reset();
    stalled_.reset();
    shared_writer_.reset();
    builder_.reset();
    line_ = 0;
    count_ = 0;
    carry_.clear();
    last_token_.reset();
    enqueued_at_.reset();
    max_time_.reset();
    producer_.reset();
    first_sequence_ = 0;
    skip_ = 0;
    skipped_ = 0;
    producer_time_.reset();
    group_.clear();
    group_bytes_ = 0;
    group_charge_ = 0;
    group_lease_.release();
    const bool has_lower = query_.contains("lower"), has_upper = query_.contains("upper");
    if (has_lower != has_upper) {
      keep_alive_ = false;
      return respond(400, error_json("lower and upper go together"));
    }
    if (has_lower) {
      auto lower = parse_time(query_["lower"]), upper = parse_time(query_["upper"]);
      if (!lower || !upper || *upper < *lower) {
        keep_alive_ = false;
        return respond(400, error_json("lower and upper must be times with lower <= upper"));
      }
      lower_ = *lower;
      upper_ = *upper;
      return blocking<std::shared_ptr<Server::Impl::SharedWriter>>(
          [server = server_, n = name_] { return server->writer(n); },
          [self = shared_from_this()](Result<std::shared_ptr<Server::Impl::SharedWriter>> w) {
            if (!w) {
              self->keep_alive_ = false;
              return self->respond_error(w.error());
            }
            self->shared_writer_ = std::move(*w);
            self->builder_.emplace(
                self->shared_writer_->writer->builder(Frontier::at(self->lower_)));
            self->read_explicit();
          });
    }
    // A managed append names an idempotent producer, or is all or nothing.
    auto& request = parser_->get();
    const auto producer =
        request.find(beast::string_view(kProducerHeader.data(), kProducerHeader.size()));
    const auto sequence =
        request.find(beast::string_view(kSequenceHeader.data(), kSequenceHeader.size()));
    if (producer != request.end()) {
      const std::string id(producer->value().data(), producer->value().size());
      if (auto valid = validate_producer_id(id); !valid) {
        keep_alive_ = false;
        return respond(400, error_json(valid.error().message));
      }
      std::optional<Time> first;
      if (sequence != request.end()) {
        first = parse_time(std::string(sequence->value().data(), sequence->value().size()));
      }
      if (!first) {
        keep_alive_ = false;
        return respond(400, error_json(std::string(kProducerHeader) + " needs " +
                                       std::string(kSequenceHeader) +
                                       ": the sequence number of the body's first record"));
      }
      producer_ = id;
      first_sequence_ = *first;
    } else if (sequence != request.end()) {
      keep_alive_ = false;
      return respond(
          400, error_json(std::string(kSequenceHeader) + " needs " + std::string(kProducerHeader)));
    }
    // The shard's appender, opened once (by a worker: it blocks), and where
    // the producer stands.
    if (!producer_) {
      std::lock_guard lock(server_->mutex);
      auto it = server_->shard_appenders.find(name_);
      if (it != server_->shard_appenders.end() && !it->second->failure()) {
        appender_ = it->second;
        server_->touch_locked(name_);
      }
    }
    if (appender_) return start_atomic();
    struct Opened {
      std::shared_ptr<Appender> appender;
      std::optional<ProducerLookup> lookup;
    };
    blocking<Opened>(
        [server = server_, n = name_, producer = producer_,
         first = first_sequence_]() -> Result<Opened> {
          Opened out;
          TM_ASSIGN(out.appender, server->appender(n));
          if (producer) {
            TM_ASSIGN(auto s, server->shard(n));
            // The last state this process saw, unless that would refuse
            // the request: then the shard's own.
            TM_ASSIGN(ProducerLookup lookup, s->lookup_producer(*producer, false));
            const std::uint64_t expected = lookup.producer ? lookup.producer->sequence + 1 : 0;
            if (first > expected || (!lookup.producer && lookup.max_producers > 0 &&
                                     lookup.producers >= lookup.max_producers)) {
              TM_ASSIGN(lookup, s->lookup_producer(*producer, true));
            }
            out.lookup = lookup;
          }
          return out;
        },
        [self = shared_from_this()](Result<Opened> opened) {
          if (!opened) {
            self->keep_alive_ = false;
            return self->respond_error(opened.error());
          }
          self->appender_ = std::move(opened->appender);
          if (!self->producer_) return self->start_atomic();
          const ProducerLookup& lookup = *opened->lookup;
          const std::uint64_t expected = lookup.producer ? lookup.producer->sequence + 1 : 0;
          if (self->first_sequence_ > expected) {
            self->keep_alive_ = false;
            std::string body = "{\"error\":";
            append_json_string(
                &body,
                "producer " + *self->producer_ + ": the body starts at sequence " +
                    std::to_string(self->first_sequence_) + " but shard " + self->name_ +
                    (lookup.producer
                         ? " has committed up to " + std::to_string(lookup.producer->sequence)
                         : " does not know it (new, or expired): it starts at 0") +
                    "; send from sequence " + std::to_string(expected));
            body += ",\"producer\":";
            append_json_string(&body, *self->producer_);
            body += ",\"expected_sequence\":" + std::to_string(expected) + "}";
            return self->respond(409, std::move(body));
          }
          if (!lookup.producer && lookup.max_producers > 0 &&
              lookup.producers >= lookup.max_producers) {
            self->keep_alive_ = false;
            return self->respond(
                503, error_json("shard " + self->name_ + " keeps " +
                                std::to_string(lookup.max_producers) +
                                " producers already (its most); a new one can start once one "
                                "expires"));
          }
          // Records before `expected` are committed already: skipped.
          self->skip_ = expected - self->first_sequence_;
          if (lookup.producer) self->producer_time_ = lookup.producer->time;
          auto sender = self->appender_->sender(*self->producer_, expected);
          if (!sender) {
            self->keep_alive_ = false;
            return self->respond_error(sender.error());
          }
          self->sender_.emplace(std::move(*sender));
          self->read_managed();
        });
  }

  // Splits pending_ into lines (carry_ holds a partial one), calling
  // `line_fn` for each complete line; stops early when it returns false.
  // Returns false if a line is over the limit (after answering 413).
  enum class Step : std::uint8_t { kMore, kStop, kError };

  // Makes carry_lease_ cover carry_ plus `more` bytes. A partial line is
  // charged without waiting (force): a connection waiting for room while
  // holding its chunk could wait on others that wait for chunks, a
  // deadlock. The overdraft is at most one partial line (max_record_bytes)
  // per connection reading a body.
  // A partial line past kCarryReserveAbove gets room for the largest line
  // at once: growing by doubling would copy it and leave up to twice its
  // size allocated. Its pages are only touched as the line arrives (an
  // allocation this large is usually its own mapping), so RSS follows the
  // line.
  void charge_carry(std::uint64_t more) {
    const std::uint64_t need = carry_.size() + more;
    if (need > kCarryReserveAbove && carry_.capacity() < need) {
      carry_.reserve(std::max<std::uint64_t>(need, *server_->options.max_record_bytes));
    }
    if (carry_lease_.size() >= need) return;
    const std::uint64_t missing = need - carry_lease_.size();
    if (carry_lease_.pool()) {
      carry_lease_.force_grow(missing);
    } else {
      carry_lease_ = server_->requests->force_reserve(missing);
    }
  }

  Step split_lines(const std::function<bool(std::string_view)>& line_fn, bool finished) {
    for (;;) {
      if (pending_.empty()) {
        if (!finished || carry_.empty()) return Step::kMore;
        std::string line = std::move(carry_);
        carry_.clear();
        ++line_;
        if (!line_fn(line)) return Step::kStop;
        return Step::kMore;
      }
      const auto nl = pending_.find('\n');
      if (nl == std::string_view::npos) {
        if (carry_.size() + pending_.size() > *server_->options.max_record_bytes)
          return Step::kError;
        charge_carry(pending_.size());
        carry_.append(pending_);
        pending_ = {};
        continue;
      }
      std::string_view line = pending_.substr(0, nl);
      if (!carry_.empty()) {
        if (carry_.size() + line.size() > *server_->options.max_record_bytes) return Step::kError;
        charge_carry(line.size());
      }
      ++line_;
      pending_.remove_prefix(nl + 1);
      bool go_on;
      if (!carry_.empty()) {
        carry_.append(line);
        std::string whole = std::move(carry_);
        carry_.clear();
        carry_lease_.release();
        go_on = line_fn(whole);
      } else {
        if (line.size() > *server_->options.max_record_bytes) return Step::kError;
        go_on = line_fn(line);
      }
      if (!go_on) return Step::kStop;
    }
  }

  void record_too_large() {
    keep_alive_ = false;
    respond(413, error_json("line " + std::to_string(line_ + 1) + ": a record over " +
                            std::to_string(*server_->options.max_record_bytes) + " bytes"));
  }

  // Reads the next piece of an append's body into pending_, then runs
  // `process` (managed or explicit).
  void read_body_piece(void (Session::*process)()) {
    read_piece([self = shared_from_this(), process](beast::error_code ec, std::string_view piece,
                                                    bool finished) {
      if (ec) return self->close();
      self->pending_ = piece;
      self->finished_ = finished;
      ((*self).*process)();
    });
  }

  // Managed: with a producer, records are enqueued as the body arrives
  // (a prefix may commit before the body ends; the producer's next request
  // learns how much). Without one, the whole body is read and checked
  // first, then enqueued as one group: all of it commits, or none.
  void read_managed() { read_body_piece(&Session::process_managed); }

  void process_managed() {
    if (!producer_) return process_atomic();
    if (stalled_) {
      // A record the appender had no room for: offer it again.
      auto token = sender_->enqueue_with_token(&*stalled_);
      if (!token) {
        if (token.error().is(ErrorKind::kFull)) return wait_for_appender();
        return fail_managed(token.error(), line_);
      }
      last_token_ = *token;
      ++count_;
      stalled_.reset();
    }
    std::optional<Error> failure;
    std::uint64_t failed_line = 0;
    const Step step = split_lines(
        [&](std::string_view text) {
          if (is_blank_line(text)) return true;
          auto record = parse_record_line(text, RecordMode::kManaged);
          if (!record) {
            failure = record.error();
            failed_line = line_;
            return false;
          }
          if (skipped_ < skip_) {
            // Committed by an earlier request of this producer.
            ++skipped_;
            ++count_;
            return true;
          }
          AppendRecord r{std::move(record->key), std::move(record->value), record->diff};
          auto token = sender_->enqueue_with_token(&r);
          if (!token) {
            if (token.error().is(ErrorKind::kFull)) {
              stalled_ = std::move(r);
              return false;
            }
            failure = token.error();
            failed_line = line_;
            return false;
          }
          last_token_ = *token;
          ++count_;
          return true;
        },
        finished_);
    if (step == Step::kError) return record_too_large();
    if (failure) return fail_managed(*failure, failed_line);
    if (stalled_) return wait_for_appender();
    if (!finished_) return read_managed();
    finish_managed();
  }

  // Without a producer, a body with a Content-Length reserves what its
  // records will take once parsed (twice its length: the JSON around each
  // key and value goes, a record's header comes; beyond that the charge is
  // forced) and the chunk it is read through, in one reservation that waits
  // its turn in the requests pool holding nothing: no deadlock. It gets in
  // line only once a chunk of the body has come, and while it holds the
  // reservation it must keep sending: paused for kEvictIdleHolderAfter
  // while others wait, it lets go (503). A body whose parsed records would
  // need more than the whole pool (a record near max_record_bytes, which
  // may be a quarter of the memory limit, as large as the pool) reserves
  // all of it, so it waits until it is alone, and forces the rest as it is
  // parsed: at most its length and a chunk beyond the pool, one such body
  // at a time. A chunked body's records are charged as they are parsed
  // (forced: up to twice max_record_bytes per such connection beyond the
  // pool).
  void start_atomic() {
    atomic_ = true;
    sender_.emplace(appender_->sender());
    const auto length = parser_->content_length();
    if (!length) return read_managed();
    if (*length > *server_->options.max_record_bytes) return atomic_too_large();
    const std::uint64_t chunk =
        std::clamp<std::uint64_t>(*length, kSmallChunkBytes, Server::kBodyChunkBytes);
    const std::uint64_t want = std::min(2 * *length + chunk, server_->requests->capacity());
    // In line for the reservation only once a chunk's worth of the body (or
    // all of a shorter one) has come: a client that declares a body and
    // trickles it never gets there (the pace cuts it first).
    drop_chunk();
    when_readable(std::min<std::uint64_t>(*length, Server::kBodyChunkBytes),
                  [self = shared_from_this(), chunk, want](beast::error_code ec) {
                    if (ec) return self->close();
                    self->reserve_then(want, [self, chunk](Lease lease) {
                      self->chunk_lease_ = lease.split(chunk);
                      self->chunk_ = new_chunk(chunk);
                      self->chunk_size_ = chunk;
                      self->group_lease_ = std::move(lease);
                      self->reserved_ = true;
                      self->read_managed();
                    });
                  });
  }

  // Without a producer: every line parsed into group_ (charged to the
  // requests pool) before anything is enqueued.
  void process_atomic() {
    std::optional<Error> failure;
    std::uint64_t failed_line = 0;
    bool too_large = false;
    const Step step = split_lines(
        [&](std::string_view text) {
          if (is_blank_line(text)) return true;
          group_bytes_ += text.size() + 1;
          if (group_bytes_ > *server_->options.max_record_bytes) {
            too_large = true;
            return false;
          }
          auto record = parse_record_line(text, RecordMode::kManaged);
          if (!record) {
            failure = record.error();
            failed_line = line_;
            return false;
          }
          group_charge_ += record->key.size() + record->value.size() + sizeof(AppendRecord);
          if (group_charge_ > group_lease_.size()) {
            const std::uint64_t missing = group_charge_ - group_lease_.size();
            if (group_lease_.pool()) {
              group_lease_.force_grow(missing);
            } else {
              group_lease_ = server_->requests->force_reserve(missing);
            }
          }
          group_.push_back(
              AppendRecord{std::move(record->key), std::move(record->value), record->diff});
          return true;
        },
        finished_);
    if (step == Step::kError) return record_too_large();
    if (too_large) return atomic_too_large();
    if (failure) {
      // Nothing was enqueued: nothing of the body is appended.
      keep_alive_ = false;
      group_.clear();
      group_lease_.release();
      std::string body = "{\"error\":";
      append_json_string(&body, "line " + std::to_string(failed_line) + ": " + failure->message +
                                    "; nothing was appended");
      body += ",\"line\":" + std::to_string(failed_line) + ",\"appended\":0}";
      return respond(status_of(*failure), std::move(body));
    }
    if (!finished_) return read_managed();
    enqueue_group();
  }

  void atomic_too_large() {
    keep_alive_ = false;
    group_.clear();
    group_lease_.release();
    respond(413, error_json("a managed append without a producer is committed all at once, so "
                            "its body is at most " +
                            std::to_string(*server_->options.max_record_bytes) +
                            " bytes and must fit the shard's appender queue; nothing was "
                            "appended. Split it, or name a producer (" +
                            std::string(kProducerHeader) + ", " + std::string(kSequenceHeader) +
                            ") to stream any size"));
  }

  void enqueue_group() {
    release_body();
    count_ = group_.size();
    if (group_.empty()) return finish_managed();
    enqueued_at_ = Clock::now();
    // The only append in flight, on an idle appender: committed by this
    // I/O thread itself as it is enqueued (one commit call; what more it
    // takes goes on on the appenders' pool), which saves a hop to a pool
    // thread and another back. Not under load: there the I/O threads'
    // time bounds the rate, and a commit of this request alone would take
    // the next requests' batch from them. The request counts as in flight
    // through its commit, so one I/O thread at most is ever in such a
    // commit, and never the only one: however slow the backend, another is
    // free to serve.
    sender_->set_commit_here(server_->threads.size() > 1 && server_->appends_in_flight.load() == 1);
    auto token = sender_->enqueue_group(group_);
    if (!token) {
      if (token.error().is(ErrorKind::kFull)) {
        // Offered again once the queue has room (the group is intact).
        return appender_->pool()->when_available([self = shared_from_this()] {
          net::post(self->socket_.get_executor(), [self] { self->enqueue_group(); });
        });
      }
      if (token.error().is(ErrorKind::kTooLarge)) return atomic_too_large();
      group_.clear();
      group_lease_.release();
      keep_alive_ = false;
      return respond_error(token.error());
    }
    last_token_ = *token;
    group_.clear();
    group_lease_.release();
    finish_managed();
  }

  void wait_for_appender() {
    appender_->pool()->when_available([self = shared_from_this()] {
      net::post(self->socket_.get_executor(), [self] { self->process_managed(); });
    });
  }

  // Once what was enqueued is durable, answers 400/413 for the bad line,
  // 503 when the appender refused it. (A producer's request: the lines
  // before the bad one are appended.)
  void fail_managed(const Error& error, std::uint64_t line) {
    keep_alive_ = false;
    auto answer = [self = shared_from_this(), error, line](std::optional<Error> commit_error) {
      std::string body = "{\"error\":";
      std::string message = "line " + std::to_string(line) + ": " + error.message;
      if (commit_error)
        message += "; and committing the lines before it failed: " + commit_error->message;
      append_json_string(&body, message);
      body += ",\"line\":" + std::to_string(line) +
              ",\"appended\":" + std::to_string(commit_error ? 0 : self->count_);
      self->append_producer_fields(&body);
      body += "}";
      // A bad line is 400 (413 when too large); an appender that stopped
      // (a backend down past its retries, or shutdown) is not the
      // client's fault: 503, like any other Closed.
      const unsigned status = status_of(error);
      self->respond(status, std::move(body));
    };
    if (!last_token_) return answer(std::nullopt);
    last_token_->on_complete([self = shared_from_this(), answer](const Result<Time>& r) {
      std::optional<Error> e;
      if (!r) e = r.error();
      net::post(self->socket_.get_executor(), [answer, e] { answer(e); });
    });
  }

  // ,"producer":P,"sequence":S,"duplicates":D for a producer's request.
  void append_producer_fields(std::string* body) {
    if (!producer_) return;
    *body += ",\"producer\":";
    append_json_string(body, *producer_);
    *body += ",\"sequence\":" + std::to_string(first_sequence_) +
             ",\"duplicates\":" + std::to_string(skipped_ + (sender_ ? sender_->duplicates() : 0));
  }

  void finish_managed() {
    release_body();
    if (!last_token_) {
      // Nothing enqueued: an empty body, or records all committed before.
      return blocking<Frontier>(
          [server = server_, n = name_]() -> Result<Frontier> {
            TM_ASSIGN(auto s, server->shard(n));
            return s->upper();
          },
          [self = shared_from_this()](Result<Frontier> upper) {
            if (!upper) return self->respond_error(upper.error());
            std::string body = "{\"time\":";
            body += self->producer_time_ && self->count_ > 0 ? std::to_string(*self->producer_time_)
                                                             : "null";
            body += ",\"count\":" + std::to_string(self->count_) + ",\"upper\":" + upper->to_json();
            self->append_producer_fields(&body);
            self->respond(200, body + "}");
          });
    }
    const auto started = enqueued_at_.value_or(Clock::now());
    if (auto outcome = last_token_->poll()) {
      // Committed by this thread as it enqueued (enqueue_group): answered
      // here, with no hop through the strand's queue.
      server_->metrics.commit_latency().observe(
          std::chrono::duration<double>(Clock::now() - started).count());
      return answer_managed(*outcome);
    }
    last_token_->on_complete([self = shared_from_this(), started](const Result<Time>& r) {
      self->server_->metrics.commit_latency().observe(
          std::chrono::duration<double>(Clock::now() - started).count());
      net::post(self->socket_.get_executor(), [self, r] { self->answer_managed(r); });
    });
  }

  // Answers a managed append whose records' commit came out as `r`.
  void answer_managed(const Result<Time>& r) {
    if (!r) {
      std::string body = "{\"error\":";
      append_json_string(&body, r.error().message);
      append_producer_fields(&body);
      return respond(status_of(r.error()), body + "}");
    }
    // Committed at *r: the upper is past it.
    std::string body = "{\"time\":" + std::to_string(*r) + ",\"count\":" + std::to_string(count_) +
                       ",\"upper\":" + std::to_string(*r + 1);
    append_producer_fields(&body);
    respond(200, body + "}");
  }

  // Explicit: parse and add each piece on a worker (adds may upload parts).
  void read_explicit() { read_body_piece(&Session::process_explicit); }

  void process_explicit() {
    auto self = shared_from_this();
    {
      self->blocking<Step>(
          [self]() -> Result<Step> {
            std::optional<Error> failure;
            const Step step = self->split_lines(
                [&](std::string_view text) {
                  if (is_blank_line(text)) return true;
                  auto record = parse_record_line(text, RecordMode::kExplicit);
                  if (!record) {
                    failure = record.error();
                    return false;
                  }
                  const Time t = *record->time;
                  if (t < self->lower_ || t >= self->upper_) {
                    failure = Error{ErrorKind::kInvalidUsage,
                                    "time " + std::to_string(t) + " is outside [lower, upper) = [" +
                                        std::to_string(self->lower_) + ", " +
                                        std::to_string(self->upper_) + ")",
                                    std::nullopt, std::nullopt};
                    return false;
                  }
                  if (auto added = self->builder_->add(record->key, record->value, t, record->diff);
                      !added) {
                    failure = added.error();
                    return false;
                  }
                  self->max_time_ = std::max(self->max_time_.value_or(0), t);
                  ++self->count_;
                  return true;
                },
                self->finished_);
            if (failure) return std::unexpected(*failure);
            return step;
          },
          [self](Result<Step> step) {
            if (!step) {
              self->keep_alive_ = false;
              self->builder_.reset();
              std::string body = "{\"error\":";
              append_json_string(&body, "line " + std::to_string(self->line_) + ": " +
                                            step.error().message + "; nothing was appended");
              body += ",\"line\":" + std::to_string(self->line_) + "}";
              return self->respond(step.error().kind == ErrorKind::kTooLarge ? 413 : 400,
                                   std::move(body));
            }
            if (*step == Step::kError) return self->record_too_large();
            if (!self->finished_) return self->read_explicit();
            self->commit_explicit();
          });
    }
  }

  void commit_explicit() {
    release_body();
    blocking<std::string>(
        [self = shared_from_this()]() -> Result<std::string> {
          TM_ASSIGN(Batch batch, self->builder_->finish(Frontier::at(self->upper_)));
          self->builder_.reset();
          self->shared_writer_->writer->wait_for_compaction();  // outside the lock
          std::lock_guard lock(self->shared_writer_->mutex);
          TM_TRY(self->shared_writer_->writer->compare_and_append(
              std::span(&batch, 1), Frontier::at(self->lower_), Frontier::at(self->upper_)));
          std::string out = "{\"time\":";
          out += self->max_time_ ? std::to_string(*self->max_time_) : "null";
          out += ",\"count\":" + std::to_string(self->count_) +
                 ",\"lower\":" + std::to_string(self->lower_) +
                 ",\"upper\":" + std::to_string(self->upper_) + "}";
          return out;
        },
        [self = shared_from_this()](Result<std::string> r) {
          if (!r) {
            if (r.error().is(ErrorKind::kUpperMismatch)) {
              return self->respond(
                  409,
                  "{\"error\":\"upper mismatch\",\"expected\":" + std::to_string(self->lower_) +
                      ",\"current\":" + Frontier::from_optional(r.error().current_upper).to_json() +
                      "}");
            }
            return self->respond_error(r.error());
          }
          self->respond(200, std::move(*r));
        });
  }

  // Nothing of the pool is kept between requests: an idle keep-alive
  // connection holds none of it.
  void release_body() {
    drop_chunk();
    reserved_ = false;
    carry_lease_.release();
    std::string().swap(carry_);
  }

  // --- reads -----------------------------------------------------------------

  // Where a stream stands, for the error line that ends it early: the query
  // that resumes it (snapshot: as_of and the last row; listen: from and
  // the last update after the last progress). The row's key and value are
  // kept as JSON text and URL-encoded only for an error line: encoding
  // every chunk's last row cost two to three times a huge row's size in
  // memory that no pool saw (65 MiB for a 16 MiB row). A snapshot does not
  // copy its rows at all: the chunk that holds the last row sent is kept
  // (take_chunk) until a row of the next chunk supersedes it (drop_kept),
  // so a huge row is held once, in its chunk.
  struct StreamPosition {
    std::mutex mu;
    // All guarded by mu.
    std::string base;        // as_of=T, or from=T / resume_progress=P [&until=T]
    std::string after_time;  // a listen's row's time, or empty

    // The row is a copy of this text (a listen's, a request's after_*).
    void set_row(std::string_view key, std::string_view value) {
      if (text_.capacity() > Server::kStreamChunkBytes &&
          key.size() + value.size() < text_.capacity() / 2) {
        std::string().swap(text_);  // a huge row's buffer is not kept for small ones
      }
      text_.assign(key).append(value);
      row_ = Row{0, key.size(), key.size(), value.size()};
      in_chunk_ = false;
    }
    void clear_row() { row_.reset(); }
    // The row is at these offsets of the chunk being sent.
    void set_row_in_chunk(std::size_t key_at, std::size_t key_size, std::size_t value_at,
                          std::size_t value_size) {
      row_ = Row{key_at, key_size, value_at, value_size};
      in_chunk_ = true;
    }
    // Before the chunk's buffer is reused: keeps it if the row is in it.
    void take_chunk(std::string* chunk) {
      if (!row_ || !in_chunk_) return;
      std::swap(text_, *chunk);
      in_chunk_ = false;
    }
    // A row of the next chunk is about to supersede the kept one.
    void drop_kept() {
      if (row_ && !in_chunk_ && text_.capacity() > Server::kStreamChunkBytes) {
        std::string().swap(text_);
        row_.reset();
      }
    }
    // `chunk`: the chunk being sent (where a row set_row_in_chunk is).
    std::string query(std::string_view chunk) const {
      if (!row_) return resume_query(base, after_time, std::nullopt);
      const std::string_view text = in_chunk_ ? chunk : std::string_view(text_);
      return resume_query(base, after_time,
                          std::pair(text.substr(row_->key_at, row_->key_size),
                                    text.substr(row_->value_at, row_->value_size)));
    }

   private:
    struct Row {
      std::size_t key_at, key_size, value_at, value_size;
    };
    std::optional<Row> row_;
    bool in_chunk_ = false;
    std::string text_;
  };

  // The query a stream's client sends to go on after the rows it has.
  static std::string resume_query(
      std::string_view base, std::string_view after_time,
      std::optional<std::pair<std::string_view, std::string_view>> row) {
    std::string out(base);
    if (!after_time.empty()) out.append("&after_time=").append(after_time);
    if (row) {
      out.append("&after_key=").append(url_encode(row->first));
      out.append("&after_value=").append(url_encode(row->second));
    }
    return out;
  }

  // Reads after_key/after_value (both or neither): rows up to and
  // including that one are skipped.
  std::optional<std::pair<std::string, std::string>> after_row(std::string* problem) {
    const bool key = query_.contains("after_key"), value = query_.contains("after_value");
    if (key != value) {
      *problem = "after_key and after_value go together";
      return std::nullopt;
    }
    if (!key) return std::nullopt;
    return std::pair{query_["after_key"], query_["after_value"]};
  }

  void snapshot() {
    std::optional<Time> as_of;
    if (query_.contains("as_of")) {
      as_of = parse_time(query_["as_of"]);
      if (!as_of) return respond(400, error_json("as_of must be a time"));
    }
    std::string problem;
    auto after = after_row(&problem);
    if (!problem.empty()) return respond(400, error_json(problem));
    blocking<std::shared_ptr<SnapshotCursor>>(
        [server = server_, n = name_, as_of]() -> Result<std::shared_ptr<SnapshotCursor>> {
          TM_ASSIGN(auto s, server->shard(n));
          Time t = 0;
          if (as_of) {
            t = *as_of;
          } else {
            auto upper = s->upper();
            if (!upper) return std::unexpected(read_failure(std::move(upper).error()));
            // As the command line reads: every time once the upper is closed.
            const std::optional<Time> latest = latest_complete_time(*upper);
            if (!latest) {
              return make_error(ErrorKind::kNotReady, "shard " + n + " has no complete time yet");
            }
            t = *latest;
          }
          // Its decoded blocks draw from the reads pool.
          auto cursor = s->snapshot(t, ReadMemory{server->reads});
          if (!cursor) return std::unexpected(read_failure(std::move(cursor).error()));
          return std::make_shared<SnapshotCursor>(std::move(*cursor));
        },
        [self = shared_from_this(), after](Result<std::shared_ptr<SnapshotCursor>> cursor) {
          if (!cursor) return self->respond_error(cursor.error());
          auto source = *cursor;
          auto position = std::make_shared<StreamPosition>();
          position->base = "as_of=" + std::to_string(source->as_of());
          if (after) position->set_row(after->first, after->second);
          // Rows up to `after` were sent to an earlier request.
          auto skip = std::make_shared<std::optional<std::pair<std::string, std::string>>>(after);
          self->stream(
              [source, position, skip](std::string* out) -> Result<bool> {
                std::optional<std::pair<std::size_t, std::size_t>> key_at, value_at;
                auto remember = [&] {
                  if (!key_at) return;
                  std::lock_guard lock(position->mu);
                  position->set_row_in_chunk(key_at->first, key_at->second, value_at->first,
                                             value_at->second);
                };
                while (out->size() < Server::kStreamChunkBytes) {
                  auto row = source->next();
                  if (!row) {
                    remember();
                    return std::unexpected(row.error());
                  }
                  if (!*row) {
                    remember();
                    return false;
                  }
                  if (*skip) {
                    const auto& [k, v] = **skip;
                    if (std::tie((*row)->key, (*row)->value) <=
                        std::tie(std::as_const(k), std::as_const(v))) {
                      continue;
                    }
                    skip->reset();
                  }
                  if (!key_at) {
                    // This row supersedes the last chunk's, kept until now.
                    std::lock_guard lock(position->mu);
                    position->drop_kept();
                  }
                  reserve_for_row(out, (*row)->key.size() + (*row)->value.size());
                  const RowOffsets at =
                      append_snapshot_row(out, (*row)->key, (*row)->value, (*row)->diff);
                  key_at = std::pair{at.key_at, (*row)->key.size()};
                  value_at = std::pair{at.value_at, (*row)->value.size()};
                }
                remember();
                return true;
              },
              position);
        });
  }

  void listen() {
    // Where the stream starts: after `from`, or at the progress value a
    // stream printed last (null included) for `resume_progress`.
    std::optional<ListenStart> start;
    if (query_.contains("from") == query_.contains("resume_progress")) {
      return respond(400, error_json("listen needs one of from=T (times after T) and "
                                     "resume_progress=P (times from P on)"));
    }
    if (query_.contains("from")) {
      auto from = parse_time(query_["from"]);
      if (!from) return respond(400, error_json("from must be a time"));
      start = ListenStart::after(*from);
    } else if (query_["resume_progress"] == "null") {
      start = ListenStart::at_progress(Frontier::closed());
    } else {
      auto progress = parse_time(query_["resume_progress"]);
      if (!progress) return respond(400, error_json("resume_progress must be a time or null"));
      start = ListenStart::at_progress(Frontier::at(*progress));
    }
    std::optional<Time> until;
    if (query_.contains("until")) {
      until = parse_time(query_["until"]);
      if (!until) return respond(400, error_json("until must be a time"));
    }
    std::string problem;
    auto after = after_row(&problem);
    std::optional<Time> after_time;
    if (query_.contains("after_time")) {
      after_time = parse_time(query_["after_time"]);
      if (!after_time || !start->lower().includes(*after_time)) {
        return respond(400, error_json("after_time must be a time the stream may emit"));
      }
    }
    if (after.has_value() != after_time.has_value() && problem.empty()) {
      problem = "after_time, after_key and after_value go together";
    }
    if (!problem.empty()) return respond(400, error_json(problem));
    // The query that started the stream, until a progress line gives a
    // later place to resume from.
    std::string base = query_.contains("from") ? "from=" + query_["from"]
                                               : "resume_progress=" + query_["resume_progress"];
    blocking<std::shared_ptr<Listener>>(
        [server = server_, n = name_, start = *start,
         until]() -> Result<std::shared_ptr<Listener>> {
          TM_ASSIGN(auto s, server->shard(n));
          auto listener = s->listen(start, until, ReadMemory{server->reads});
          if (!listener) return std::unexpected(read_failure(std::move(listener).error()));
          return std::shared_ptr<Listener>(std::move(*listener));
        },
        [self = shared_from_this(), base = std::move(base), until, after,
         after_time](Result<std::shared_ptr<Listener>> listener) {
          if (!listener) return self->respond_error(listener.error());
          auto source = *listener;
          // The query that resumes the stream: at the last progress, after
          // the last update since it.
          struct Cursor {
            std::string start;  // from=T or resume_progress=P
            std::optional<Time> until;
            std::optional<Time> after_time;
            std::optional<std::pair<std::string, std::string>> after;
            std::string base() const {
              std::string q = start;
              if (until) q += "&until=" + std::to_string(*until);
              return q;
            }
          };
          auto cursor = std::make_shared<Cursor>(Cursor{base, until, after_time, after});
          auto position = std::make_shared<StreamPosition>();
          auto publish = [cursor, position] {
            std::lock_guard lock(position->mu);
            position->base = cursor->base();
            if (cursor->after_time && cursor->after) {
              position->after_time = std::to_string(*cursor->after_time);
              position->set_row(cursor->after->first, cursor->after->second);
            } else {
              position->after_time.clear();
              position->clear_row();
            }
          };
          publish();
          // Updates up to (after_time, after_key, after_value) were sent to
          // an earlier request.
          auto skip = std::make_shared<std::optional<std::tuple<Time, std::string, std::string>>>();
          if (after_time) *skip = std::tuple{*after_time, after->first, after->second};
          // Returns with what is ready: a chunk, or nothing yet (an empty
          // `out` and true: try again after kListenRetry).
          self->stream(
              [source, cursor, publish, skip](std::string* out) -> Result<bool> {
                bool moved = false;
                auto finish = [&](auto result) {
                  if (moved) publish();
                  return result;
                };
                while (out->size() < Server::kStreamChunkBytes) {
                  auto event = source->poll();
                  if (!event) return finish(Result<bool>(std::unexpected(event.error())));
                  if (!*event) return finish(Result<bool>(!source->done()));
                  if ((*event)->kind == ListenEvent::Kind::kProgress) {
                    const Frontier progress = (*event)->progress;
                    append_progress_row(out, progress);
                    // Progress lines only move forward: resume here.
                    cursor->start = "resume_progress=" + progress.to_json();
                    cursor->after_time.reset();
                    cursor->after.reset();
                    skip->reset();
                    moved = true;
                    return finish(Result<bool>(true));  // a reader waiting on progress sees it now
                  }
                  const ListenEvent& e = **event;
                  if (*skip) {
                    const auto& [t, k, v] = **skip;
                    if (std::tie(e.time, e.key, e.value) <=
                        std::tie(t, std::as_const(k), std::as_const(v))) {
                      continue;
                    }
                    skip->reset();
                  }
                  reserve_for_row(out, e.key.size() + e.value.size());
                  append_listen_row(out, e.key, e.value, e.time, e.diff);
                  cursor->after_time = e.time;
                  cursor->after = std::pair{std::string(e.key), std::string(e.value)};
                  moved = true;
                }
                return finish(Result<bool>(true));
              },
              position);
        });
  }

  // Streams NDJSON: `fill` (on a worker) appends up to a chunk and says
  // whether more may follow; an empty chunk with more to come waits
  // kListenRetry before asking again.
  using Fill = std::function<Result<bool>(std::string*)>;

  // A stream that ends early (an error, or the server shutting down) says
  // so in its last line, {"error": ..., "resume": QUERY}: the query string
  // that goes on where it stopped, from `position` (see StreamPosition).
  void stream(Fill fill, std::shared_ptr<StreamPosition> position) {
    position_ = std::move(position);
    out_res_.emplace();
    out_res_->result(http::status::ok);
    out_res_->version(parser_->get().version());
    out_res_->set(http::field::content_type, "application/x-ndjson");
    out_res_->keep_alive(false);  // a stream ends the connection
    keep_alive_ = false;
    out_res_->chunked(true);
    out_res_->body().data = nullptr;
    out_res_->body().more = true;
    out_sr_.emplace(*out_res_);
    server_->metrics.count_request(route_, 200);
    log_request(200, std::nullopt);
    begin_io(server_->options.idle_timeout);
    http::async_write_header(
        socket_, *out_sr_, [self = shared_from_this(), fill](beast::error_code ec, std::size_t) {
          self->end_io();
          if (ec) return self->close();
          self->out_lease_ = self->server_->reads->force_reserve(Server::kStreamChunkBytes);
          self->watch_peer();
          self->next_chunk(fill);
        });
  }

  void next_chunk(Fill fill) {
    if (position_) {
      std::lock_guard lock(position_->mu);
      position_->take_chunk(&out_data_);
    }
    if (peer_gone_) return close();
    if (server_->stopping) {
      // Said in the stream, so a cut snapshot never looks whole.
      out_data_ = stream_error_line("the server is shutting down; the stream ends here");
      return write_chunk(fill, false);
    }
    blocking<bool>(
        [self = shared_from_this(), fill]() -> Result<bool> {
          self->out_data_.clear();
          // After a huge row, back to the usual chunk's worth of buffer.
          if (self->out_data_.capacity() > 2 * Server::kStreamChunkBytes) {
            std::string().swap(self->out_data_);
          }
          auto more = fill(&self->out_data_);
          if (!more) {
            self->out_data_ += self->stream_error_line(more.error().message);
            return false;
          }
          return *more;
        },
        [self = shared_from_this(), fill](Result<bool> more) {
          if (self->out_data_.empty()) {
            if (!*more) return self->end_stream();
            auto timer =
                std::make_shared<net::steady_timer>(self->socket_.get_executor(), kListenRetry);
            return timer->async_wait(
                [self, fill, timer](beast::error_code) { self->next_chunk(fill); });
          }
          self->write_chunk(fill, *more);
        });
  }

  std::string stream_error_line(std::string_view message) {
    std::string line = "{\"error\":";
    append_json_string(&line, message);
    if (position_) {
      std::lock_guard lock(position_->mu);
      line += ",\"resume\":";
      append_json_string(&line, position_->query(out_data_));
    }
    return line + "}\n";
  }

  // Writes out_data_ as a chunk; then the next, or the end.
  void write_chunk(Fill fill, bool more) {
    out_res_->body().data = out_data_.data();
    out_res_->body().size = out_data_.size();
    out_res_->body().more = true;
    begin_io(server_->options.idle_timeout);
    http::async_write(socket_, *out_sr_,
                      [self = shared_from_this(), fill, more](beast::error_code ec, std::size_t) {
                        self->end_io();
                        if (ec == http::error::need_buffer) ec = {};
                        if (ec) return self->close();
                        if (!more) return self->end_stream();
                        self->next_chunk(fill);
                      });
  }

  void end_stream() {
    out_res_->body().data = nullptr;
    out_res_->body().more = false;
    begin_io(server_->options.idle_timeout);
    http::async_write(socket_, *out_sr_,
                      [self = shared_from_this()](beast::error_code, std::size_t) {
                        self->end_io();
                        self->out_lease_.release();
                        self->close();
                      });
  }

  // --- answering -------------------------------------------------------------

  // Answers with a whole (non-streamed) body. The response is written as
  // one string we format ourselves: Beast's serializer cost more CPU per
  // small answer than the rest of an append.
  void respond(unsigned status, std::string body,
               std::string_view content_type = "application/json") {
    server_->metrics.count_request(route_, status);
    release_body();
    if (body.empty() || body.back() != '\n') body += '\n';
    log_request(status, body.size());
    // A request whose body was not read to its end cannot be followed by
    // another on this connection.
    const bool keep = keep_alive_ && parser_ && parser_->is_done() && !server_->stopping;
    const unsigned version = parser_ ? parser_->get().version() : 11;
    const auto reason = http::obsolete_reason(static_cast<http::status>(status));
    std::string text;
    text.reserve(128 + body.size());
    text.append(version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ");
    text.append(std::to_string(status));
    text.push_back(' ');
    text.append(reason.data(), reason.size());
    text.append("\r\nContent-Type: ");
    text.append(content_type);
    text.append("\r\nContent-Length: ");
    text.append(std::to_string(body.size()));
    if (!keep) {
      text.append("\r\nConnection: close");
    } else if (version == 10) {
      text.append("\r\nConnection: keep-alive");
    }
    text.append("\r\n\r\n");
    text.append(body);
    // Written at once where the socket takes it all (a small answer, a
    // client that reads): no write operation, no completion to run later.
    beast::error_code ec;
    const std::size_t sent = socket_.write_some(net::buffer(text), ec);
    if (ec != net::error::would_block && (ec || sent == text.size())) return responded(ec, keep);
    if (ec) ec = {};
    auto rest = std::make_shared<std::string>(std::move(text));
    rest->erase(0, sent);
    begin_io(server_->options.idle_timeout);
    net::async_write(socket_, net::buffer(*rest),
                     [self = shared_from_this(), rest, keep](beast::error_code ec, std::size_t) {
                       self->end_io();
                       self->responded(ec, keep);
                     });
  }

  // The request's line in the server's log (util/log.h): a server error at
  // warn, a client's mistake at info, the rest at debug. `sent`: the
  // answer's body bytes; none for a stream, whose line is written when it
  // starts.
  //   request PEER METHOD TARGET STATUS DURATION route=R in=BYTES out=BYTES
  void log_request(unsigned status, std::optional<std::size_t> sent) {
    const LogLevel level =
        status >= 500 ? LogLevel::kWarn : (status >= 400 ? LogLevel::kInfo : LogLevel::kDebug);
    if (!log_enabled(level)) return;
    std::string line = "request ";
    beast::error_code ec;
    const auto peer = socket_.remote_endpoint(ec);
    line += ec ? std::string("-") : peer.address().to_string() + ":" + std::to_string(peer.port());
    if (parser_) {
      const auto& request = parser_->get();
      line += ' ';
      line += std::string_view(request.method_string().data(), request.method_string().size());
      line += ' ';
      // At most 256 bytes of the target: a resume query can carry a row.
      std::string_view target(request.target().data(), request.target().size());
      if (target.size() > 256) {
        line.append(target.substr(0, 253)).append("...");
      } else {
        line.append(target);
      }
    }
    line += ' ' + std::to_string(status);
    const auto micros =
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - request_started_);
    char took[32];
    std::snprintf(took, sizeof took, " %.1fms", static_cast<double>(micros.count()) / 1000.0);
    line += took;
    line += " route=" + route_;
    if (parser_ && parser_->is_header_done() && parser_->content_length()) {
      line += " in=" + std::to_string(*parser_->content_length());
    }
    line += sent ? " out=" + std::to_string(*sent) : std::string(" out=stream");
    log_line(level, line);
  }

  // The answer is written (or writing it failed: `ec`).
  void responded(beast::error_code ec, bool keep) {
    end_request();
    if (!ec && !keep && parser_ && !parser_->is_done()) return linger();
    if (ec || !keep) return close();
    // A pipelined request already read is parsed on a fresh stack: a
    // client sending many at once must not nest one answer in the next.
    if (buffer_.size() > 0) {
      return net::post(socket_.get_executor(),
                       [self = shared_from_this()] { self->read_header(); });
    }
    read_header();
  }

  void close() {
    end_request();
    release_body();
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    socket_.cancel(ec);  // the peer watch, if any
  }

  // After answering a request whose body was not read (a 413 for a body
  // too large, say): closing at once would reset the connection while the
  // client is still sending, and it might never read the answer. So the
  // sending half closes, and what still arrives is read and dropped, for
  // at most kLingerTime, into a buffer of kLingerBufferBytes.
  static constexpr std::chrono::seconds kLingerTime{2};
  static constexpr std::size_t kLingerBufferBytes = 4096;
  void linger() {
    release_body();
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    begin_io(kLingerTime);  // for the whole drain, not each read
    drain(std::make_shared<std::array<char, kLingerBufferBytes>>());
  }
  void drain(std::shared_ptr<std::array<char, kLingerBufferBytes>> buffer) {
    socket_.async_read_some(net::buffer(*buffer),
                            [self = shared_from_this(), buffer](beast::error_code ec, std::size_t) {
                              if (ec) return self->close();
                              self->drain(buffer);
                            });
  }

  void begin_request() {
    if (counted_) return;
    counted_ = true;
    server_->in_flight.fetch_add(1);
  }
  void end_request() {
    if (counted_append_) {
      counted_append_ = false;
      server_->appends_in_flight.fetch_sub(1);
    }
    if (!counted_) return;
    counted_ = false;
    server_->in_flight.fetch_sub(1);
  }

  // While a stream runs, notices a client that went away: an idle listen
  // writes nothing, so no write would fail. (A stream ends its connection,
  // so bytes the client sends are never read; the watch then stops.)
  void watch_peer() {
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      if (ec == net::error::operation_aborted) return;
      const Peer peer = ec ? Peer::kGone : self->peek_peer();
      if (peer == Peer::kQuiet) return self->watch_peer();
      if (peer == Peer::kGone) self->peer_gone_ = true;
    });
    // The wait notices only what comes after it starts: a client gone
    // just before is seen here.
    if (peek_peer() == Peer::kGone) peer_gone_ = true;
  }

  // What the client's side shows without waiting (the socket is
  // non-blocking): nothing yet, bytes it sent, or its end.
  enum class Peer : std::uint8_t { kQuiet, kSent, kGone };
  Peer peek_peer() {
    beast::error_code ec;
    char byte;
    const std::size_t n = socket_.receive(net::buffer(&byte, 1), tcp::socket::message_peek, ec);
    if (ec == net::error::would_block) return Peer::kQuiet;
    return ec || n == 0 ? Peer::kGone : Peer::kSent;
  }

  // --- the connection's time limit ------------------------------------------

  // An operation on the socket that waits on the client (reading a header
  // or body bytes, writing an answer or a stream's chunk) must end within
  // `limit`, or the connection is closed. One timer per connection, armed
  // lazily: starting an operation only moves io_deadline_; the timer, when
  // it fires, closes the socket if the operation pending is past its
  // deadline, and otherwise sleeps until the current one. (Beast's
  // basic_stream armed and cancelled a timer per operation: two changes
  // to the timer queue and a cancelled handler run through the strand for
  // every read and write.) Waits on the client's pace have their own timer
  // (begin_client_wait).
  void begin_io(Clock::duration limit) {
    io_deadline_ = Clock::now() + limit;
    io_pending_ = true;
    if (!io_timer_armed_ || io_timer_.expiry() > io_deadline_) arm_io_timer();
  }
  void end_io() { io_pending_ = false; }
  // Another operation toward the same deadline.
  void continue_io() {
    io_pending_ = true;
    if (!io_timer_armed_) arm_io_timer();
  }

  void arm_io_timer() {
    io_timer_armed_ = true;
    io_timer_.expires_at(io_deadline_);  // a wait pending ends, aborted
    // A weak reference: an idle connection's timer must not keep it.
    io_timer_.async_wait([weak = weak_from_this(), armed = ++io_timer_arms_](beast::error_code) {
      auto self = weak.lock();
      if (!self || armed != self->io_timer_arms_) return;  // gone, or armed again since
      self->io_timer_armed_ = false;
      if (!self->io_pending_) return;  // the next operation arms it
      if (Clock::now() < self->io_deadline_) return self->arm_io_timer();
      beast::error_code ignored;
      self->socket_.close(ignored);  // the operation ends, aborted
    });
  }

  // A concrete strand, not asio's type-erased executor: copying that one
  // costs an allocation or reference counts on every operation.
  StrandSocket socket_;
  StrandTimer io_timer_;
  bool io_timer_armed_ = false;
  bool io_pending_ = false;
  std::uint64_t io_timer_arms_ = 0;
  Clock::time_point io_deadline_;
  Server::Impl* server_;
  beast::flat_buffer buffer_{Server::kHeaderLimitBytes};
  std::optional<Parser> parser_;
  bool keep_alive_ = false;
  bool counted_ = false;         // in server_->in_flight
  bool counted_append_ = false;  // in server_->appends_in_flight
  bool peer_gone_ = false;       // the client of a stream closed its end
  std::string route_;
  std::string path_;
  std::string name_;
  std::map<std::string, std::string> query_;
  std::string small_body_;

  // Body reading.
  Chunk chunk_;
  std::size_t chunk_size_ = 0;
  Lease chunk_lease_;  // for chunk_, as long as it is allocated
  std::string carry_;
  Lease carry_lease_;
  std::string_view pending_;
  bool finished_ = false;
  // The body's pace (begin_client_wait).
  std::optional<net::steady_timer> pace_timer_;
  bool pace_armed_ = false;
  std::uint64_t client_wait_ = 0;  // the id of the last wait on the client
  bool waiting_on_client_ = false;
  bool wait_expired_ = false;
  Clock::time_point client_wait_started_;
  Clock::duration window_waited_{};
  std::uint64_t window_bytes_ = 0;
  std::uint64_t counted_ahead_ = 0;  // counted while waiting, not yet read
  // A reservation in line (reserve_then): its id, and the limit on the wait
  // of a request that holds part of its body.
  std::uint64_t reservation_ = 0;
  std::optional<net::steady_timer> hold_timer_;

  // Appends.
  std::uint64_t line_ = 0;
  std::uint64_t count_ = 0;
  std::shared_ptr<Appender> appender_;
  std::optional<AppendSender> sender_;
  std::optional<AppendRecord> stalled_;
  std::optional<CommitToken> last_token_;
  // When a body without a producer was enqueued (its commit may happen in
  // the enqueue: start_atomic).
  std::optional<Clock::time_point> enqueued_at_;
  // A producer's request: its id, the body's first sequence number, how
  // many leading records the shard had committed already (skipped, not
  // enqueued) and when the last of them was committed.
  std::optional<std::string> producer_;
  std::string reader_;  // DELETE /v1/shards/{name}/readers/{id}: the id
  Clock::time_point request_started_ = Clock::now();  // when its header was read
  std::uint64_t first_sequence_ = 0;
  std::uint64_t skip_ = 0;
  std::uint64_t skipped_ = 0;
  std::optional<Time> producer_time_;
  // Without a producer (atomic_): the body's records, enqueued once all
  // are read.
  bool atomic_ = false;
  bool reserved_ = false;  // group_lease_ is the reservation of its whole body
  bool evicted_ = false;   // gave the reservation up (arm_pace_timer)
  std::vector<AppendRecord> group_;
  std::uint64_t group_bytes_ = 0;   // of its lines
  std::uint64_t group_charge_ = 0;  // of its records, held by group_lease_
  Lease group_lease_;
  std::shared_ptr<Server::Impl::SharedWriter> shared_writer_;
  std::optional<BatchBuilder> builder_;
  Time lower_ = 0;
  Time upper_ = 0;
  std::optional<Time> max_time_;

  // Streams.
  std::optional<http::response<http::buffer_body>> out_res_;
  std::optional<http::response_serializer<http::buffer_body>> out_sr_;
  std::string out_data_;
  Lease out_lease_;
  std::shared_ptr<StreamPosition> position_;
};

}  // namespace

// One connection over max_connections: told so and closed.
void refuse_connection(StrandSocket socket, std::size_t limit) {
  auto stream = std::make_shared<StrandSocket>(std::move(socket));
  const std::string body = "{\"error\":\"the server has " + std::to_string(limit) +
                           " connections open, its limit: try again later\"}\n";
  auto answer = std::make_shared<std::string>(
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
      "Retry-After: 1\r\nConnection: close\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body);
  net::async_write(*stream, net::buffer(*answer), [stream, answer](beast::error_code, std::size_t) {
    beast::error_code ignored;
    stream->shutdown(tcp::socket::shutdown_both, ignored);
    stream->close(ignored);
  });
}

void Server::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, StrandSocket socket) {
    if (!acceptor.is_open()) return;
    if (ec) {
      const bool first = !accept_retry;
      if (first) accept_retry.emplace(kAcceptRetry);
      const std::chrono::milliseconds wait = accept_retry->next_wait().value_or(kAcceptRetry.max);
      if (first) {
        std::fprintf(stderr, "tidemark: accepting a connection failed (%s); retrying in %lld ms\n",
                     ec.message().c_str(), static_cast<long long>(wait.count()));
      }
      if (!accept_timer) accept_timer.emplace(acceptor.get_executor());
      accept_timer->expires_after(wait);
      accept_timer->async_wait([this](beast::error_code waited) {
        if (!waited && acceptor.is_open()) accept();
      });
      return;
    }
    accept_retry.reset();
    const std::size_t limit = options.max_connections;
    if (limit > 0 && connections.load() >= limit) {
      refuse_connection(std::move(socket), limit);
    } else {
      std::make_shared<Session>(std::move(socket), this)->start();
    }
    accept();
  });
}

// ---------------------------------------------------------------------------

Server::Server(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  stop();
  wait();
}

Result<std::unique_ptr<Server>> Server::start(std::shared_ptr<Client> client,
                                              ServerOptions options) {
  if (options.memory_limit < (1u << 20)) return invalid_usage("--memory-limit must be >= 1MiB");
  if (options.io_threads == 0 || options.workers == 0) return invalid_usage("threads must be >= 1");
  if (!options.max_record_bytes) {
    options.max_record_bytes = std::min<std::uint64_t>(32ull << 20, options.memory_limit / 8);
  } else if (*options.max_record_bytes == 0 ||
             *options.max_record_bytes > options.memory_limit / 4) {
    return invalid_usage("--max-record-bytes must be between 1 and a quarter of --memory-limit (" +
                         std::to_string(options.memory_limit / 4) + ")");
  }
  std::shared_ptr<Impl> impl;
  try {  // the worker pool starts its threads here
    impl = std::make_shared<Impl>(std::move(client), std::move(options));
  } catch (const std::system_error& error) {
    return std::unexpected(thread_start_error("the server's workers", error));
  }
  beast::error_code ec;
  auto address = net::ip::make_address(impl->options.host, ec);
  if (ec) {
    // A host name (localhost, the machine's name): its first IPv4 address,
    // else its first address, as a client resolving it would most likely
    // try first.
    net::io_context resolving;
    tcp::resolver resolver(resolving);
    const auto found = resolver.resolve(impl->options.host, "", ec);
    if (ec || found.empty()) {
      return invalid_usage("cannot listen on host " + impl->options.host + ": " +
                           (ec ? ec.message() : "it has no address"));
    }
    address = found.begin()->endpoint().address();
    for (const auto& entry : found) {
      if (entry.endpoint().address().is_v4()) {
        address = entry.endpoint().address();
        break;
      }
    }
  }
  const tcp::endpoint endpoint(address, impl->options.port);
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return determinate("cannot listen on " + impl->options.host + ":" +
                       std::to_string(impl->options.port) + ": " + ec.message());
  }
  impl->bound_port = impl->acceptor.local_endpoint(ec).port();
  impl->sinks = std::make_unique<SinkManager>(
      impl->client, impl->sink_pool,
      SinkRunner{"tidemark serve on " + impl->options.host + ":" + std::to_string(impl->bound_port),
                 impl->options.sink_owner},
      impl->options.allowed_destinations, impl->options.idle_close);
  if (auto resumed = impl->sinks->resume_all(); !resumed) {
    std::fprintf(stderr, "tidemark: warning: resuming the stored sinks: %s\n",
                 resumed.error().message.c_str());
  }
  // The I/O threads before the first accept, so that a server with none
  // leaves no handler behind. Fewer than asked for still serve.
  for (unsigned i = 0; i < impl->options.io_threads; ++i) {
    auto thread = start_thread("the server's connections", [impl] { impl->ioc.run(); });
    if (!thread) {
      if (impl->threads.empty()) return std::unexpected(thread.error());
      std::fprintf(stderr, "tidemark: warning: %s; serving with %zu I/O threads\n",
                   thread.error().message.c_str(), impl->threads.size());
      break;
    }
    impl->threads.push_back(std::move(*thread));
  }
  if (impl->options.idle_close.count() > 0) {
    const auto every = std::max(impl->options.idle_close / 4, std::chrono::milliseconds(50));
    if (auto started = impl->idle_sweeper.start(every,
                                                [raw = impl.get()] {
                                                  raw->close_idle();
                                                  return true;
                                                });
        !started) {
      std::fprintf(stderr, "tidemark: warning: %s; idle shards stay open\n",
                   started.error().message.c_str());
    }
  }
  impl->accept();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

std::uint16_t Server::port() const {
  return impl_->bound_port;
}

void Server::stop(std::chrono::milliseconds grace) {
  Impl& impl = *impl_;
  if (impl.stopping.exchange(true)) return;
  // The acceptor lives on its own strand: close it there.
  net::post(impl.acceptor.get_executor(), [&impl] {
    beast::error_code ec;
    impl.acceptor.close(ec);
    if (impl.accept_timer) impl.accept_timer->cancel();
  });
  const auto deadline = Clock::now() + grace;
  impl.idle_sweeper.stop();
  // Sinks stop first, each committing what it wrote (its progress).
  impl.sinks->stop_all(grace);
  // Requests in flight are answered: managed appends once durable, streams
  // end with an error line. Idle keep-alive connections are closed by
  // ioc.stop() below (no request of theirs was read).
  while (impl.in_flight.load() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (int left = impl.in_flight.load(); left > 0) {
    std::fprintf(stderr, "tidemark: %d requests still in flight after the grace period: cut\n",
                 left);
  }
  std::vector<std::shared_ptr<Appender>> appenders;
  {
    std::lock_guard lock(impl.mutex);
    for (auto& [name, a] : impl.shard_appenders) appenders.push_back(a);
  }
  for (auto& a : appenders) {
    (void)a->flush();
    if (Clock::now() > deadline) break;
  }
  for (auto& a : appenders) a->close();
  impl.io_work.reset();
  impl.ioc.stop();
  for (auto& t : impl.threads) t.join();
  impl.workers.join();
  {
    std::lock_guard lock(impl.stop_mutex);
    impl.stopped = true;
  }
  impl.stop_cv.notify_all();
}

void Server::wait() {
  std::unique_lock lock(impl_->stop_mutex);
  impl_->stop_cv.wait(lock, [&] { return impl_->stopped; });
}

}  // namespace tidemark
