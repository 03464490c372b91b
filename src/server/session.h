// Session: one client connection, its requests one after another (a
// pipelined request waits for the answer before it). Its methods live in
// the file of their seam:
//   session.cc   the connection: headers and bodies read from the socket,
//                the body's pace and the requests pool, answers, time
//                limits, closing; the accept loop
//   routes.cc    the route table and the routes that answer one object
//   appends.cc   POST .../append, managed and explicit
//   streams.cc   snapshot and listen, streamed as NDJSON chunks
//
// Thread-safety: a session runs on its connection's loop (one thread);
// work that blocks runs on the server's workers (blocking()) and posts its
// result back to the loop, which starts nothing else on the session meanwhile
// (an explicit append's lines are parsed there, a stream's chunk filled).
// A handler holds the session (shared_from_this) for as long as it is
// queued, so a session ends when its last one does.
//
// Memory: the connection's header buffer (Server::kHeaderLimitBytes); while
// a request body is read, one chunk of at most Server::kBodyChunkBytes and
// a partial record line, both from the requests pool, plus an
// all-or-nothing append's records (also charged there); while a stream
// runs, one chunk of about Server::kStreamChunkBytes from the reads pool.
// Nothing of a pool is kept between requests.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/server_impl.h"
#include "tidemark/appender.h"
#include "tidemark/memory_pool.h"
#include "tidemark/write.h"

namespace tidemark {

// A connection's executor: its loop's io_context, which one thread runs
// (Server::Impl::Loop), so a session's handlers never run at once. That
// is what a strand would guarantee; a strand also took a lock and queued
// every operation (without it, 5-15% less server CPU per record at 100
// and 1,000 clients: docs/benchmarks.md, "Eleventh step").
using LoopExecutor = net::io_context::executor_type;
using LoopSocket = tcp::socket::rebind_executor<LoopExecutor>::other;
using LoopTimer = net::basic_waitable_timer<Clock, net::wait_traits<Clock>, LoopExecutor>;

// A body is read through a buffer at least this small.
inline constexpr std::uint64_t kSmallChunkBytes = 4 << 10;

// A body buffer (new_chunk). Those of kSmallChunkBytes go back to a list
// of the thread that frees them (session.cc).
struct ChunkDelete {
  std::size_t size = 0;
  void operator()(char* chunk) const;
};
using Chunk = std::unique_ptr<char[], ChunkDelete>;
Chunk new_chunk(std::size_t size);

// The status of the contract for an error (routes.cc).
unsigned status_of(const Error& error);
// {"error": message}
std::string error_json(std::string_view message);

class Session : public std::enable_shared_from_this<Session> {
 public:
  // `server` outlives every handler: Server::stop joins the threads that
  // run them, and handlers still queued are destroyed with its io_context.
  // (A shared_ptr here would be a cycle: server -> io_context -> queued
  // handler -> session -> server, and nothing would ever be freed.)
  // REQUIRES: `socket` runs on `loop`, which outlives the session.
  Session(LoopSocket socket, Server::Impl* server, Server::Impl::Loop* loop);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Reads the first request.
  void start();
  // From any thread: wakes a listen stream waiting for a change (below).
  void post_wake();

 private:
  using Parser = http::request_parser<http::buffer_body>;
  using Done = std::function<void()>;
  using PieceDone = std::function<void(beast::error_code, std::string_view, bool)>;

  // --- session.cc: reading -------------------------------------------------
  void read_header();
  void parse_header();
  std::size_t parse_buffered(beast::error_code& ec);
  void read_piece(PieceDone done);
  std::uint64_t readable_bytes(std::uint64_t at_least = UINT64_MAX);
  void when_readable(std::uint64_t bytes, std::function<void(beast::error_code)> then);
  bool peer_finished();
  void set_low_water(std::uint64_t bytes);
  void read_piece_now(PieceDone done);
  void piece_read(beast::error_code ec, std::uint64_t wait, const PieceDone& done);
  void drop_chunk();
  std::uint64_t begin_client_wait(bool timed);
  void arm_pace_timer(std::uint64_t id, Clock::time_point deadline);
  bool end_client_wait(std::uint64_t id, std::uint64_t bytes);
  std::uint64_t body_quota() const;
  void reserve_then(std::uint64_t bytes, std::function<void(Lease)> then);
  void read_small_body(Done then);
  void release_body();
  // A request's header is read: its state reset, then route().
  void on_header();

  // --- session.cc: answering -----------------------------------------------
  void respond(unsigned status, std::string body,
               std::string_view content_type = "application/json");
  void respond_error(const Error& error);
  void log_request(unsigned status, std::optional<std::size_t> sent);
  void responded(beast::error_code ec, bool keep);
  void close();
  static constexpr std::chrono::seconds kLingerTime{2};
  static constexpr std::size_t kLingerBufferBytes = 4096;
  void linger();
  void drain(std::shared_ptr<std::array<char, kLingerBufferBytes>> buffer);
  void begin_request();
  void end_request();

  // --- session.cc: the connection's time limit -----------------------------
  void begin_io(Clock::duration limit);
  void end_io();
  void continue_io();
  void arm_io_timer();

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

  // --- routes.cc -----------------------------------------------------------
  // Dispatches the request whose header on_header read.
  void route();
  bool rejects_query(std::initializer_list<std::string_view> known);
  void method_not_allowed();
  void create_shard();
  void create_sink();
  void update_sink();
  Result<std::string> resolve_file_sink(const std::string& to);
  void list_shards();
  void inspect_producer();
  void delete_shard();
  void release_reader();
  void inspect_shard();

  // --- appends.cc ----------------------------------------------------------
  void start_append();
  void charge_carry(std::uint64_t more);
  // Splits pending_ into lines (carry_ holds a partial one), calling
  // `line_fn` for each complete line; stops early (kStop) when it returns
  // false. kError: a line is over max_record_bytes (the caller answers 413).
  enum class Step : std::uint8_t { kMore, kStop, kError };
  Step split_lines(const std::function<bool(std::string_view)>& line_fn, bool finished);
  void record_too_large();
  void read_body_piece(void (Session::*process)());
  void read_managed();
  void process_managed();
  void start_atomic();
  // Frees group_'s memory (its capacity too) and returns its charge.
  void drop_group();
  // Makes group_lease_ hold at least `bytes`, forcing what is missing.
  void charge_group(std::uint64_t bytes);
  void process_atomic();
  void atomic_too_large();
  void enqueue_group();
  void wait_for_appender();
  void fail_managed(const Error& error, std::uint64_t line);
  void append_producer_fields(std::string* body);
  void finish_managed();
  void answer_managed(const Result<Time>& r);
  void read_explicit();
  void process_explicit();
  void commit_explicit();

  // --- streams.cc ----------------------------------------------------------
  struct StreamPosition;
  // Fills a chunk (streams.cc).
  using Fill = std::function<Result<bool>(std::string*)>;
  std::optional<std::pair<std::string, std::string>> after_row(std::string* problem);
  void snapshot();
  void listen();
  void stream(Fill fill, std::shared_ptr<StreamPosition> position);
  void next_chunk(Fill fill);
  std::string stream_error_line(std::string_view message);
  void write_chunk(Fill fill, bool more);
  void end_stream();
  void watch_peer();
  // A listen stream's listener may have something new: fill the next
  // chunk now rather than at the fallback timer (on the loop).
  void wake_stream();
  enum class Peer : std::uint8_t { kQuiet, kSent, kGone };
  Peer peek_peer();

  // --- the connection ------------------------------------------------------
  // A concrete executor, not asio's type-erased one: copying that one
  // costs an allocation or reference counts on every operation.
  LoopSocket socket_;
  LoopTimer io_timer_;
  bool io_timer_armed_ = false;
  bool io_pending_ = false;
  std::uint64_t io_timer_arms_ = 0;
  Clock::time_point io_deadline_;
  Server::Impl* server_;
  Server::Impl::Loop* loop_;  // the loop the connection runs on
  beast::flat_buffer buffer_{Server::kHeaderLimitBytes};
  std::optional<Parser> parser_;
  bool keep_alive_ = false;
  bool counted_ = false;         // in server_->in_flight
  bool counted_append_ = false;  // in server_->appends_in_flight
  bool peer_gone_ = false;       // the client of a stream closed its end
  // A listen stream between fills: woken by its listener's change
  // subscription (stream_wakes_), else looked at again by stream_timer_
  // every kListenFallback (every 50 ms without wakes).
  bool stream_wakes_ = false;
  bool stream_woken_ = false;
  std::optional<LoopTimer> stream_timer_;
  bool stream_waiting_ = false;  // registered in server_->waiting_streams

  // --- the request ---------------------------------------------------------
  std::string route_;
  std::string path_;
  std::string name_;
  std::map<std::string, std::string> query_;
  std::string small_body_;
  std::string reader_;  // DELETE /v1/shards/{name}/readers/{id}: the id
  Clock::time_point request_started_ = Clock::now();  // when its header was read

  // --- body reading --------------------------------------------------------
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

  // --- appends -------------------------------------------------------------
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
  // enqueued) and when the last of them was committed. (GET
  // .../producers/{id} keeps its id in producer_ too.)
  std::optional<std::string> producer_;
  std::uint64_t first_sequence_ = 0;
  std::uint64_t skip_ = 0;
  std::uint64_t skipped_ = 0;
  std::optional<Time> producer_time_;
  // Without a producer (atomic_): the body's records, enqueued once all
  // are read.
  bool atomic_ = false;
  bool reserved_ = false;  // group_lease_ is the reservation of its whole body
  bool evicted_ = false;   // gave the reservation up (arm_pace_timer)
  // Its capacity is charged, not just its size (grown by doubling, it may
  // hold twice what it uses), and dropped with it (drop_group()).
  std::vector<AppendRecord> group_;
  std::uint64_t group_bytes_ = 0;   // of its lines
  std::uint64_t group_charge_ = 0;  // of group_ and its strings, held by group_lease_
  Lease group_lease_;
  // Explicit (?lower=L&upper=U): one batch, committed once the body is read.
  std::shared_ptr<ShardRegistry::SharedWriter> shared_writer_;
  std::optional<BatchBuilder> builder_;
  Time lower_ = 0;
  Time upper_ = 0;
  std::optional<Time> max_time_;

  // --- streams -------------------------------------------------------------
  std::optional<http::response<http::buffer_body>> out_res_;
  std::optional<http::response_serializer<http::buffer_body>> out_sr_;
  std::string out_data_;
  Lease out_lease_;
  std::shared_ptr<StreamPosition> position_;
};

}  // namespace tidemark
