#include "server/server.h"

#include <algorithm>
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

#include "server/metrics.h"
#include "server/sinks.h"
#include "shard/state.h"
#include "tidemark/appender.h"
#include "tidemark/read.h"
#include "tidemark/write.h"
#include "util/json.h"

namespace tidemark {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr std::chrono::seconds kIdleTimeout{60};
constexpr std::chrono::milliseconds kListenRetry{50};
// A connection keeps a body buffer this small between requests.
constexpr std::uint64_t kSmallChunkBytes = 4 << 10;
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
      return 409;
    case ErrorKind::kTooLarge:
      return 413;
    case ErrorKind::kFull:
    case ErrorKind::kClosed:
      return 503;
    default:
      return 500;
  }
}

std::string error_json(std::string_view message) {
  std::string out = "{\"error\":";
  append_json_string(&out, message);
  out += "}";
  return out;
}

// "a=1&b=2" -> {a: 1, b: 2}; values are used as written (numbers only).
std::map<std::string, std::string> parse_query(std::string_view query) {
  std::map<std::string, std::string> out;
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view item = query.substr(0, amp);
    auto eq = item.find('=');
    if (eq == std::string_view::npos) {
      out[std::string(item)] = "";
    } else {
      out[std::string(item.substr(0, eq))] = std::string(item.substr(eq + 1));
    }
    if (amp == std::string_view::npos) break;
    query = query.substr(amp + 1);
  }
  return out;
}

std::optional<Time> parse_time(const std::string& text) {
  Time t = 0;
  if (text.empty()) return std::nullopt;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), t);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return t;
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
    reads = root->child("reads", options.memory_limit / 8);
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

  std::uint16_t bound_port = 0;  // set before the I/O threads start
  // Requests whose header was read and that are not answered yet (a
  // stream counts until it ends). stop() waits for them.
  std::atomic<int> in_flight{0};
  std::atomic<bool> stopping{false};
  std::mutex stop_mutex;
  std::condition_variable stop_cv;
  bool stopped = false;

  // Blocking: opens (once) and caches the shard.
  Result<std::shared_ptr<Shard>> shard(std::string_view name) {
    TM_TRY(validate_shard_name(name));
    {
      std::lock_guard lock(mutex);
      if (auto it = shards.find(name); it != shards.end()) return it->second;
    }
    TM_ASSIGN(auto opened, client->open_shard(name));
    std::lock_guard lock(mutex);
    return shards.try_emplace(std::string(name), std::move(opened)).first->second;
  }

  // Blocking: the shard's appender, drawing from the appenders pool. An
  // appender an error stopped (a backend down past its retries: its
  // pending records failed) is replaced, so the shard takes appends again
  // once the backend is back.
  Result<std::shared_ptr<Appender>> appender(std::string_view name) {
    TM_ASSIGN(auto s, shard(name));
    std::shared_ptr<Appender> stopped;  // closed outside the lock
    std::lock_guard lock(mutex);
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
    std::uint64_t replaced = 0;
    {
      std::lock_guard lock(mutex);
      appender_list.assign(shard_appenders.begin(), shard_appenders.end());
      shard_list.assign(shards.begin(), shards.end());
      replaced = appenders_replaced;
    }
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
    for (const auto& [name, a] : appender_list) {
      const AppenderStats stats = a->stats();
      const std::string label = "shard=\"" + name + "\"";
      append_sample(&out, "tidemark_appender_queue_bytes", label,
                    static_cast<double>(stats.pool.used));
      for (Counter& counter : counters) {
        append_sample(&counter.samples, counter.name, label,
                      static_cast<double>(stats.*counter.field));
      }
    }
    for (const Counter& counter : counters) {
      out.append("# HELP ").append(counter.name).append(" ").append(counter.help).append("\n");
      out.append("# TYPE ").append(counter.name).append(" counter\n");
      out += counter.samples;
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
};

// ---------------------------------------------------------------------------
// One connection: requests one after another.

namespace {

using Strand = net::strand<net::io_context::executor_type>;
using StrandSocket = tcp::socket::rebind_executor<Strand>::other;

class Session : public std::enable_shared_from_this<Session> {
 public:
  // `server` outlives every handler: Server::stop joins the threads that
  // run them, and handlers still queued are destroyed with its io_context.
  // (A shared_ptr here would be a cycle: server -> io_context -> queued
  // handler -> session -> server, and nothing would ever be freed.)
  Session(StrandSocket socket, Server::Impl* server)
      : stream_(std::move(socket)), server_(server) {}
  ~Session() { end_request(); }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_header(); });
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
    stream_.expires_after(kIdleTimeout);
    http::async_read_header(
        stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
          if (ec == http::error::header_limit) {
            self->keep_alive_ = false;
            return self->respond(
                431, error_json("request header over " + std::to_string(Server::kHeaderLimitBytes) +
                                " bytes"));
          }
          if (ec) return self->close();
          self->on_header();
        });
  }

  // Reads the next piece of the body into chunk_, once the requests pool
  // has room (backpressure). `done(ec, piece, finished)`.
  void read_piece(std::function<void(beast::error_code, std::string_view, bool)> done) {
    if (parser_->is_done()) return done({}, {}, true);
    auto go = [self = shared_from_this(), done] {
      auto& body = self->parser_->get().body();
      body.data = self->chunk_.get();
      body.size = self->chunk_size_;
      self->stream_.expires_after(kIdleTimeout);
      http::async_read_some(
          self->stream_, self->buffer_, *self->parser_,
          [self, done](beast::error_code ec, std::size_t) {
            if (ec == http::error::need_buffer) ec = {};
            if (ec) return done(ec, {}, false);
            const std::size_t got = self->chunk_size_ - self->parser_->get().body().size;
            done({}, std::string_view(self->chunk_.get(), got), self->parser_->is_done());
          });
    };
    // A buffer the size of the body, between kSmallChunkBytes and
    // kBodyChunkBytes, not zeroed, kept for the connection's next request
    // when small. Its bytes are reserved first: while the requests pool is
    // full, the connection is not read (waiting in line, first come first
    // served), so the pool never goes past its capacity for buffers.
    std::uint64_t want = Server::kBodyChunkBytes;
    if (auto length = parser_->content_length()) want = std::min(want, *length);
    want = std::max<std::uint64_t>(want, kSmallChunkBytes);
    if (chunk_size_ >= want) return go();
    chunk_.reset();
    chunk_size_ = 0;
    chunk_lease_.release();
    auto install = [self = shared_from_this(), want, go](Lease lease) {
      self->chunk_ = std::make_unique_for_overwrite<char[]>(want);
      self->chunk_size_ = want;
      self->chunk_lease_ = std::move(lease);
      go();
    };
    if (auto lease = server_->requests->try_reserve(want)) return install(std::move(*lease));
    server_->requests->reserve_async(
        want, [self = shared_from_this(), install](Result<Lease> lease) mutable {
          net::post(self->stream_.get_executor(),
                    [self, install, lease = std::make_shared<Result<Lease>>(std::move(lease))] {
                      if (!*lease) return self->respond_error(lease->error());
                      install(std::move(**lease));
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
    auto& request = parser_->get();
    keep_alive_ = request.keep_alive();
    small_body_.clear();
    const std::string_view target(request.target().data(), request.target().size());
    const auto q = target.find('?');
    path_ = std::string(target.substr(0, q));
    query_ = parse_query(q == std::string_view::npos ? std::string_view{} : target.substr(q + 1));
    const http::verb method = request.method();

    if (path_ == "/healthz") {
      route_ = "healthz";
      return read_small_body([self = shared_from_this()] { self->respond(200, "{\"ok\":true}"); });
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
        return read_small_body([self = shared_from_this()] { self->create_sink(); });
      }
      if (method == http::verb::get) {
        route_ = "list_sinks";
        return read_small_body(
            [self = shared_from_this()] { self->respond(200, self->server_->sinks->list_json()); });
      }
      return method_not_allowed();
    }
    if (path_.starts_with(std::string(kSinks) + "/")) {
      name_ = path_.substr(kSinks.size() + 1);
      if (method == http::verb::get) {
        route_ = "sink_status";
        return read_small_body([self = shared_from_this()] {
          auto status = self->server_->sinks->status_json(self->name_);
          if (!status) return self->respond_error(status.error());
          self->respond(200, std::move(*status));
        });
      }
      if (method == http::verb::delete_) {
        route_ = "delete_sink";
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
        return read_small_body([self = shared_from_this()] { self->create_shard(); });
      }
      if (method == http::verb::get) {
        route_ = "list_shards";
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
        return read_small_body([self = shared_from_this()] { self->inspect_shard(); });
      }
      if (action == "append" && method == http::verb::post) {
        route_ = "append";
        return start_append();
      }
      if (action == "snapshot" && method == http::verb::get) {
        route_ = "snapshot";
        return read_small_body([self = shared_from_this()] { self->snapshot(); });
      }
      if (action == "listen" && method == http::verb::get) {
        route_ = "listen";
        return read_small_body([self = shared_from_this()] { self->listen(); });
      }
      if (action.empty() || action == "append" || action == "snapshot" || action == "listen") {
        return method_not_allowed();
      }
    }
    route_ = "not_found";
    read_small_body(
        [self = shared_from_this()] { self->respond(404, error_json("no route " + self->path_)); });
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
      net::post(self->stream_.get_executor(),
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
    if (auto inside = check_file_sink(spec->to); !inside) return respond_error(inside.error());
    blocking<std::string>([server = server_, s = *spec] { return server->sinks->create(s); },
                          [self = shared_from_this()](Result<std::string> r) {
                            if (!r) return self->respond_error(r.error());
                            self->respond(201, std::move(*r));
                          });
  }

  // A file sink writes only inside the server's file_sink_root.
  Status check_file_sink(const std::string& to) {
    constexpr std::string_view kFile = "file://";
    if (!to.starts_with(kFile)) return {};
    const auto& root = server_->options.file_sink_root;
    if (!root) return invalid_usage("this server has no directory for file sinks");
    std::error_code ec;
    const auto base = std::filesystem::weakly_canonical(*root, ec);
    const auto dir = std::filesystem::weakly_canonical(to.substr(kFile.size()), ec);
    if (ec) return invalid_usage("sink destination " + to + ": " + ec.message());
    auto [b, d] = std::mismatch(base.begin(), base.end(), dir.begin(), dir.end());
    if (b != base.end() || d == dir.end()) {
      return invalid_usage("sink destination " + to + ": file sinks write inside " + base.string() +
                           " on this server");
    }
    return {};
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
    max_time_.reset();
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
    // The shard's appender, opened once (by a worker: it blocks).
    {
      std::lock_guard lock(server_->mutex);
      auto it = server_->shard_appenders.find(name_);
      if (it != server_->shard_appenders.end() && !it->second->failure()) appender_ = it->second;
    }
    if (appender_) {
      sender_.emplace(appender_->sender());
      return read_managed();
    }
    blocking<std::shared_ptr<Appender>>(
        [server = server_, n = name_] { return server->appender(n); },
        [self = shared_from_this()](Result<std::shared_ptr<Appender>> a) {
          if (!a) {
            self->keep_alive_ = false;
            return self->respond_error(a.error());
          }
          self->appender_ = std::move(*a);
          self->sender_.emplace(self->appender_->sender());
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

  // Managed: enqueue as the body arrives.
  void read_managed() { read_body_piece(&Session::process_managed); }

  void process_managed() {
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

  void wait_for_appender() {
    appender_->pool()->when_available([self = shared_from_this()] {
      net::post(self->stream_.get_executor(), [self] { self->process_managed(); });
    });
  }

  // Once what was enqueued is durable, answers 400/413 for the bad line,
  // 503 when the appender refused it.
  void fail_managed(const Error& error, std::uint64_t line) {
    keep_alive_ = false;
    auto answer = [self = shared_from_this(), error, line](std::optional<Error> commit_error) {
      std::string body = "{\"error\":";
      std::string message = "line " + std::to_string(line) + ": " + error.message;
      if (commit_error)
        message += "; and committing the lines before it failed: " + commit_error->message;
      append_json_string(&body, message);
      body += ",\"line\":" + std::to_string(line) +
              ",\"appended\":" + std::to_string(commit_error ? 0 : self->count_) + "}";
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
      net::post(self->stream_.get_executor(), [answer, e] { answer(e); });
    });
  }

  void finish_managed() {
    release_body();
    if (!last_token_) {
      return blocking<Frontier>(
          [server = server_, n = name_]() -> Result<Frontier> {
            TM_ASSIGN(auto s, server->shard(n));
            return s->upper();
          },
          [self = shared_from_this()](Result<Frontier> upper) {
            if (!upper) return self->respond_error(upper.error());
            self->respond(200, "{\"time\":null,\"count\":0,\"upper\":" + upper->to_json() + "}");
          });
    }
    const auto started = Clock::now();
    last_token_->on_complete([self = shared_from_this(), started](const Result<Time>& r) {
      self->server_->metrics.commit_latency().observe(
          std::chrono::duration<double>(Clock::now() - started).count());
      net::post(self->stream_.get_executor(), [self, r] {
        if (!r) return self->respond_error(r.error());
        // Committed at *r: the upper is past it.
        self->respond(200, "{\"time\":" + std::to_string(*r) +
                               ",\"count\":" + std::to_string(self->count_) +
                               ",\"upper\":" + std::to_string(*r + 1) + "}");
      });
    });
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

  void release_body() {
    if (chunk_size_ > kSmallChunkBytes) {
      chunk_.reset();
      chunk_size_ = 0;
      chunk_lease_.release();
    }
    carry_lease_.release();
    std::string().swap(carry_);
  }

  // --- reads -----------------------------------------------------------------

  void snapshot() {
    std::optional<Time> as_of;
    if (query_.contains("as_of")) {
      as_of = parse_time(query_["as_of"]);
      if (!as_of) return respond(400, error_json("as_of must be a time"));
    }
    blocking<std::shared_ptr<SnapshotCursor>>(
        [server = server_, n = name_, as_of]() -> Result<std::shared_ptr<SnapshotCursor>> {
          TM_ASSIGN(auto s, server->shard(n));
          Time t = 0;
          if (as_of) {
            t = *as_of;
          } else {
            TM_ASSIGN(Frontier upper, s->upper());
            if (upper.is_closed() || upper.time() == 0) {
              return make_error(ErrorKind::kNotReady, "shard " + n + " has no complete time yet");
            }
            t = upper.time() - 1;
          }
          TM_ASSIGN(SnapshotCursor cursor, s->snapshot(t));
          return std::make_shared<SnapshotCursor>(std::move(cursor));
        },
        [self = shared_from_this()](Result<std::shared_ptr<SnapshotCursor>> cursor) {
          if (!cursor) return self->respond_error(cursor.error());
          auto source = *cursor;
          self->stream([source](std::string* out) -> Result<bool> {
            while (out->size() < Server::kStreamChunkBytes) {
              TM_ASSIGN(auto row, source->next());
              if (!row) return false;
              reserve_for_row(out, row->key.size() + row->value.size());
              out->append("{\"key\":").append(row->key).append(",\"value\":").append(row->value);
              out->append(",\"diff\":");
              append_i64(out, row->diff);
              out->append("}\n");
            }
            return true;
          });
        });
  }

  void listen() {
    auto from = query_.contains("from") ? parse_time(query_["from"]) : std::nullopt;
    if (!from) return respond(400, error_json("listen needs from=T"));
    std::optional<Time> until;
    if (query_.contains("until")) {
      until = parse_time(query_["until"]);
      if (!until) return respond(400, error_json("until must be a time"));
    }
    blocking<std::shared_ptr<Listener>>(
        [server = server_, n = name_, from, until]() -> Result<std::shared_ptr<Listener>> {
          TM_ASSIGN(auto s, server->shard(n));
          TM_ASSIGN(auto listener, s->listen(*from, until));
          return std::shared_ptr<Listener>(std::move(listener));
        },
        [self = shared_from_this()](Result<std::shared_ptr<Listener>> listener) {
          if (!listener) return self->respond_error(listener.error());
          auto source = *listener;
          // Returns with what is ready: a chunk, or nothing yet (an empty
          // `out` and true: try again after kListenRetry).
          self->stream([source](std::string* out) -> Result<bool> {
            while (out->size() < Server::kStreamChunkBytes) {
              TM_ASSIGN(auto event, source->poll());
              if (!event) return !source->done();
              if (event->kind == ListenEvent::Kind::kProgress) {
                out->append("{\"progress\":").append(event->progress.to_json()).append("}\n");
                return true;  // a reader waiting on progress sees it now
              }
              reserve_for_row(out, event->key.size() + event->value.size());
              out->append("{\"key\":")
                  .append(event->key)
                  .append(",\"value\":")
                  .append(event->value);
              out->append(",\"time\":");
              append_u64(out, event->time);
              out->append(",\"diff\":");
              append_i64(out, event->diff);
              out->append("}\n");
            }
            return true;
          });
        });
  }

  // Streams NDJSON: `fill` (on a worker) appends up to a chunk and says
  // whether more may follow; an empty chunk with more to come waits
  // kListenRetry before asking again.
  using Fill = std::function<Result<bool>(std::string*)>;

  void stream(Fill fill) {
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
    stream_.expires_after(kIdleTimeout);
    http::async_write_header(
        stream_, *out_sr_, [self = shared_from_this(), fill](beast::error_code ec, std::size_t) {
          if (ec) return self->close();
          self->out_lease_ = self->server_->reads->force_reserve(Server::kStreamChunkBytes);
          self->watch_peer();
          self->next_chunk(fill);
        });
  }

  void next_chunk(Fill fill) {
    if (peer_gone_) return close();
    if (server_->stopping) {
      // Said in the stream, so a cut snapshot never looks whole.
      out_data_ = error_json("the server is shutting down; the stream ends here") + "\n";
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
            self->out_data_ += error_json(more.error().message) + "\n";
            return false;
          }
          return *more;
        },
        [self = shared_from_this(), fill](Result<bool> more) {
          if (self->out_data_.empty()) {
            if (!*more) return self->end_stream();
            auto timer =
                std::make_shared<net::steady_timer>(self->stream_.get_executor(), kListenRetry);
            return timer->async_wait(
                [self, fill, timer](beast::error_code) { self->next_chunk(fill); });
          }
          self->write_chunk(fill, *more);
        });
  }

  // Writes out_data_ as a chunk; then the next, or the end.
  void write_chunk(Fill fill, bool more) {
    out_res_->body().data = out_data_.data();
    out_res_->body().size = out_data_.size();
    out_res_->body().more = true;
    stream_.expires_after(kIdleTimeout);
    http::async_write(stream_, *out_sr_,
                      [self = shared_from_this(), fill, more](beast::error_code ec, std::size_t) {
                        if (ec == http::error::need_buffer) ec = {};
                        if (ec) return self->close();
                        if (!more) return self->end_stream();
                        self->next_chunk(fill);
                      });
  }

  void end_stream() {
    out_res_->body().data = nullptr;
    out_res_->body().more = false;
    http::async_write(stream_, *out_sr_,
                      [self = shared_from_this()](beast::error_code, std::size_t) {
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
    // A request whose body was not read to its end cannot be followed by
    // another on this connection.
    const bool keep = keep_alive_ && parser_ && parser_->is_done() && !server_->stopping;
    const unsigned version = parser_ ? parser_->get().version() : 11;
    const auto reason = http::obsolete_reason(static_cast<http::status>(status));
    auto text = std::make_shared<std::string>();
    text->reserve(128 + body.size());
    text->append(version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ");
    text->append(std::to_string(status));
    text->push_back(' ');
    text->append(reason.data(), reason.size());
    text->append("\r\nContent-Type: ");
    text->append(content_type);
    text->append("\r\nContent-Length: ");
    text->append(std::to_string(body.size()));
    if (!keep) {
      text->append("\r\nConnection: close");
    } else if (version == 10) {
      text->append("\r\nConnection: keep-alive");
    }
    text->append("\r\n\r\n");
    text->append(body);
    stream_.expires_after(kIdleTimeout);
    net::async_write(stream_, net::buffer(*text),
                     [self = shared_from_this(), text, keep](beast::error_code ec, std::size_t) {
                       self->end_request();
                       if (ec || !keep) return self->close();
                       self->read_header();
                     });
  }

  void close() {
    end_request();
    release_body();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.socket().cancel(ec);  // the peer watch, if any
  }

  void begin_request() {
    if (counted_) return;
    counted_ = true;
    server_->in_flight.fetch_add(1);
  }
  void end_request() {
    if (!counted_) return;
    counted_ = false;
    server_->in_flight.fetch_sub(1);
  }

  // While a stream runs, notices a client that went away: an idle listen
  // writes nothing, so no write would fail. (A stream ends its connection,
  // so bytes the client sends are never read; the watch then stops.)
  void watch_peer() {
    stream_.socket().async_wait(
        tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
          if (ec == net::error::operation_aborted) return;
          auto& socket = self->stream_.socket();
          beast::error_code peek_ec;
          socket.non_blocking(true, peek_ec);
          char byte;
          const std::size_t n = ec || peek_ec ? 0
                                              : socket.receive(net::buffer(&byte, 1),
                                                               tcp::socket::message_peek, peek_ec);
          if (peek_ec == net::error::would_block) return self->watch_peer();
          if (ec || peek_ec || n == 0) self->peer_gone_ = true;
        });
  }

  // A concrete strand, not asio's type-erased executor: copying that one
  // costs an allocation or reference counts on every operation.
  beast::basic_stream<tcp, Strand> stream_;
  Server::Impl* server_;
  beast::flat_buffer buffer_{Server::kHeaderLimitBytes};
  std::optional<Parser> parser_;
  bool keep_alive_ = false;
  bool counted_ = false;    // in server_->in_flight
  bool peer_gone_ = false;  // the client of a stream closed its end
  std::string route_;
  std::string path_;
  std::string name_;
  std::map<std::string, std::string> query_;
  std::string small_body_;

  // Body reading.
  std::unique_ptr<char[]> chunk_;
  std::size_t chunk_size_ = 0;
  Lease chunk_lease_;  // for chunk_, as long as it is allocated
  std::string carry_;
  Lease carry_lease_;
  std::string_view pending_;
  bool finished_ = false;

  // Appends.
  std::uint64_t line_ = 0;
  std::uint64_t count_ = 0;
  std::shared_ptr<Appender> appender_;
  std::optional<AppendSender> sender_;
  std::optional<AppendRecord> stalled_;
  std::optional<CommitToken> last_token_;
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
};

}  // namespace

void Server::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, StrandSocket socket) {
    if (!acceptor.is_open()) return;
    if (!ec) std::make_shared<Session>(std::move(socket), this)->start();
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
  auto impl = std::make_shared<Impl>(std::move(client), std::move(options));
  beast::error_code ec;
  const auto address = net::ip::make_address(impl->options.host, ec);
  if (ec) return invalid_usage("cannot listen on host " + impl->options.host + ": " + ec.message());
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
                 impl->options.sink_owner});
  if (auto resumed = impl->sinks->resume_all(); !resumed) {
    std::fprintf(stderr, "tidemark: warning: resuming the stored sinks: %s\n",
                 resumed.error().message.c_str());
  }
  impl->accept();
  for (unsigned i = 0; i < impl->options.io_threads; ++i) {
    impl->threads.emplace_back([impl] { impl->ioc.run(); });
  }
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
  });
  const auto deadline = Clock::now() + grace;
  // Sinks stop first, each committing what it wrote (its progress).
  impl.sinks->stop_all();
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
