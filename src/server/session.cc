// Session's connection (session.h): reading a request's header and body from
// the socket, the body's pace and its memory from the requests pool,
// answering, the connection's time limit and closing; and the accept loop
// that starts sessions (Server::Impl::accept).
//
// Thread-safety: a session's methods run on its loop; the chunk cache is
// per thread.
//
// Memory: per connection its header buffer and, while a body is read, one
// chunk of at most Server::kBodyChunkBytes reserved from the requests pool
// (read_piece_now), released once the request is answered (release_body);
// per thread at most kCachedChunks free small chunks (128 KiB).
#include "server/session.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "server/http_text.h"
#include "util/log.h"

namespace tidemark {
namespace {

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

// A request that holds a reservation for its whole body and has waited
// this long for its client's next bytes gives the reservation up (503)
// when other requests wait for the requests pool.
constexpr std::chrono::seconds kEvictIdleHolderAfter{2};
// How long a request that holds part of its body waits for room in the
// requests pool before it is answered 503 and lets go: without a limit,
// bodies each holding some could wait on each other for good.
constexpr std::chrono::seconds kHoldingWait{5};

// One connection over max_connections: told so and closed.
void refuse_connection(LoopSocket socket, std::size_t limit) {
  auto stream = std::make_shared<LoopSocket>(std::move(socket));
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

// Moves an accepted connection's descriptor into `to`: false when it is
// lost on the way (its peer gone, say), closed then.
bool move_connection(tcp::socket& accepted, LoopSocket& to) {
  beast::error_code ec;
  const auto protocol = accepted.local_endpoint(ec).protocol();
  if (ec) return false;
  // On failure `accepted` still holds the descriptor, and closes it.
  const auto handle = accepted.release(ec);
  if (ec) return false;
  to.assign(protocol, handle, ec);
  if (ec) ::close(handle);
  return !ec;
}

}  // namespace

void ChunkDelete::operator()(char* chunk) const {
  if (size == kSmallChunkBytes && cached_chunks.free.size() < kCachedChunks) {
    cached_chunks.free.push_back(chunk);
  } else {
    delete[] chunk;
  }
}

Chunk new_chunk(std::size_t size) {
  if (size == kSmallChunkBytes && !cached_chunks.free.empty()) {
    char* chunk = cached_chunks.free.back();
    cached_chunks.free.pop_back();
    return Chunk(chunk, ChunkDelete{size});
  }
  return Chunk(new char[size], ChunkDelete{size});
}

Session::Session(LoopSocket socket, Server::Impl* server, Server::Impl::Loop* loop)
    : socket_(std::move(socket)), io_timer_(socket_.get_executor()), server_(server), loop_(loop) {
  server_->connections.fetch_add(1);
  loop_->connections.fetch_add(1);
  // Answers are written at once where the socket takes them (respond).
  beast::error_code ignored;
  socket_.non_blocking(true, ignored);
}

Session::~Session() {
  if (stream_waiting_) {
    std::lock_guard lock(server_->waiting_streams_mu);
    server_->waiting_streams.erase(this);
  }
  end_request();
  server_->connections.fetch_sub(1);
  loop_->connections.fetch_sub(1);
}

void Session::start() {
  net::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->read_header(); });
}

void Session::read_header() {
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
void Session::parse_header() {
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
std::size_t Session::parse_buffered(beast::error_code& ec) {
  const std::size_t used = parser_->put(buffer_.data(), ec);
  buffer_.consume(used);
  return used;
}

// Reads the next piece of the body into chunk_, once the requests pool
// has room (backpressure). `done(ec, piece, finished)`.
//
// While the client has sent nothing to read, the connection waits for it
// holding no buffer: a client that sends slowly, or not at all, keeps no
// pool memory (beyond what it has sent: a partial line, or the records
// of an all-or-nothing append; and a whole body's reservation, which
// start_atomic bounds). And it must keep pace: see begin_client_wait.
void Session::read_piece(PieceDone done) {
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
std::uint64_t Session::readable_bytes(std::uint64_t at_least) {
  if (buffer_.size() >= at_least) return buffer_.size();
  beast::error_code ec;
  return buffer_.size() + socket_.available(ec);
}

// Runs `then` once `bytes` can be read without waiting (or the socket
// fails: `then(ec)`), waiting on the client at its pace.
void Session::when_readable(std::uint64_t bytes, std::function<void(beast::error_code)> then) {
  const std::uint64_t before = readable_bytes(bytes);
  if (before >= bytes) return then({});
  // The socket's low-water mark: woken once enough is there (or at the
  // client's end, or by the pace timer), not by each byte that trickles
  // in: readiness alone would wake the wait at once, again and again,
  // while fewer bytes than wanted sit unread.
  set_low_water(bytes - buffer_.size());
  const std::uint64_t wait = begin_client_wait(/*timed=*/true);
  socket_.async_wait(tcp::socket::wait_read,
                     [self = shared_from_this(), bytes, before, then, wait](beast::error_code ec) {
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
bool Session::peer_finished() {
  tcp_info info{};
  socklen_t length = sizeof info;
  if (::getsockopt(socket_.native_handle(), IPPROTO_TCP, TCP_INFO, &info, &length) != 0) {
    return true;
  }
  return info.tcpi_state != TCP_ESTABLISHED;
}

void Session::set_low_water(std::uint64_t bytes) {
  beast::error_code ec;
  socket_.set_option(
      net::socket_base::receive_low_watermark(static_cast<int>(
          std::min<std::uint64_t>(std::max<std::uint64_t>(bytes, 1), Server::kBodyChunkBytes))),
      ec);
}

void Session::read_piece_now(PieceDone done) {
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
void Session::piece_read(beast::error_code ec, std::uint64_t wait, const PieceDone& done) {
  const std::size_t got = chunk_size_ - parser_->get().body().size;
  const std::uint64_t counted = std::min<std::uint64_t>(got, counted_ahead_);
  counted_ahead_ -= counted;
  if (!end_client_wait(wait, got - counted)) return;
  if (ec == http::error::need_buffer) ec = {};
  if (ec) return done(ec, {}, false);
  done({}, std::string_view(chunk_.get(), got), parser_->is_done());
}

void Session::drop_chunk() {
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
std::uint64_t Session::begin_client_wait(bool timed) {
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
void Session::arm_pace_timer(std::uint64_t id, Clock::time_point deadline) {
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
bool Session::end_client_wait(std::uint64_t id, std::uint64_t bytes) {
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
    drop_group();
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
  drop_group();
  respond(408, error_json("the request body came slower than " +
                          std::to_string(server_->options.min_body_rate) +
                          " bytes a second (the server's --min-body-rate); nothing more of it "
                          "is read" +
                          std::string(atomic_ ? ", and nothing of it was appended" : "")));
  return false;
}

std::uint64_t Session::body_quota() const {
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
void Session::reserve_then(std::uint64_t bytes, std::function<void(Lease)> then) {
  if (auto lease = server_->requests->try_reserve(bytes)) return then(std::move(*lease));
  const std::uint64_t id = ++reservation_;
  if (!group_lease_.empty() || !carry_lease_.empty()) {
    if (!hold_timer_) hold_timer_.emplace(socket_.get_executor());
    hold_timer_->expires_after(kHoldingWait);
    hold_timer_->async_wait([self = shared_from_this(), id](beast::error_code ec) {
      if (ec || id != self->reservation_) return;
      ++self->reservation_;  // the grant, when it comes, is dropped
      self->keep_alive_ = false;
      self->drop_group();
      self->respond(503, error_json("the server's memory for requests stayed full for " +
                                    std::to_string(kHoldingWait.count()) +
                                    " s while this request held part of its body; nothing of it "
                                    "was appended: retry"));
    });
  }
  server_->requests->reserve_async(
      bytes, [self = shared_from_this(), then = std::move(then), id](Result<Lease> lease) mutable {
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
void Session::read_small_body(Done then) {
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

// Nothing of the pool is kept between requests: an idle keep-alive
// connection holds none of it.
void Session::release_body() {
  drop_chunk();
  reserved_ = false;
  carry_lease_.release();
  std::string().swap(carry_);
}

void Session::on_header() {
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
  route();
}

// Answers with a whole (non-streamed) body. The response is written as
// one string we format ourselves: Beast's serializer cost more CPU per
// small answer than the rest of an append.
void Session::respond(unsigned status, std::string body, std::string_view content_type) {
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

void Session::respond_error(const Error& error) {
  respond(status_of(error), error_json(error.message));
}

// The request's line in the server's log (util/log.h): a server error at
// warn, a client's mistake at info, the rest at debug. `sent`: the
// answer's body bytes; none for a stream, whose line is written when it
// starts.
//   request PEER METHOD TARGET STATUS DURATION route=R in=BYTES out=BYTES
void Session::log_request(unsigned status, std::optional<std::size_t> sent) {
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
void Session::responded(beast::error_code ec, bool keep) {
  end_request();
  if (!ec && !keep && parser_ && !parser_->is_done()) return linger();
  if (ec || !keep) return close();
  // A pipelined request already read is parsed on a fresh stack: a
  // client sending many at once must not nest one answer in the next.
  if (buffer_.size() > 0) {
    return net::post(socket_.get_executor(), [self = shared_from_this()] { self->read_header(); });
  }
  read_header();
}

void Session::close() {
  end_request();
  release_body();
  beast::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  socket_.cancel(ec);  // the peer watch, if any
}

void Session::linger() {
  release_body();
  beast::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  begin_io(kLingerTime);  // for the whole drain, not each read
  drain(std::make_shared<std::array<char, kLingerBufferBytes>>());
}

void Session::drain(std::shared_ptr<std::array<char, kLingerBufferBytes>> buffer) {
  socket_.async_read_some(net::buffer(*buffer),
                          [self = shared_from_this(), buffer](beast::error_code ec, std::size_t) {
                            if (ec) return self->close();
                            self->drain(buffer);
                          });
}

void Session::begin_request() {
  if (counted_) return;
  counted_ = true;
  server_->in_flight.fetch_add(1);
}

void Session::end_request() {
  if (counted_append_) {
    counted_append_ = false;
    server_->appends_in_flight.fetch_sub(1);
  }
  if (!counted_) return;
  counted_ = false;
  server_->in_flight.fetch_sub(1);
}

// An operation on the socket that waits on the client (reading a header
// or body bytes, writing an answer or a stream's chunk) must end within
// `limit`, or the connection is closed. One timer per connection, armed
// lazily: starting an operation only moves io_deadline_; the timer, when
// it fires, closes the socket if the operation pending is past its
// deadline, and otherwise sleeps until the current one. (Beast's
// basic_stream armed and cancelled a timer per operation: two changes
// to the timer queue and a cancelled handler run through the loop for
// every read and write.) Waits on the client's pace have their own timer
// (begin_client_wait).
void Session::begin_io(Clock::duration limit) {
  io_deadline_ = Clock::now() + limit;
  io_pending_ = true;
  if (!io_timer_armed_ || io_timer_.expiry() > io_deadline_) arm_io_timer();
}

void Session::end_io() {
  io_pending_ = false;
}

// Another operation toward the same deadline.
void Session::continue_io() {
  io_pending_ = true;
  if (!io_timer_armed_) arm_io_timer();
}

void Session::arm_io_timer() {
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

Server::Impl::Loop& Server::Impl::pick_loop() {
  const std::size_t first = next_loop.fetch_add(1) % serving_loops;
  for (std::size_t i = 0; i < serving_loops; ++i) {
    Loop& loop = *loops[(first + i) % serving_loops];
    if (!loop.committing.load()) return loop;
  }
  return *loops[first];
}

void Server::Impl::accept() {
  // Accepted on the acceptor's loop, then moved to the loop picked as the
  // connection arrives (not when the accept began: a loop may have begun
  // a commit since).
  acceptor.async_accept([this](beast::error_code ec, tcp::socket accepted) {
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
    // (Every loop's reactor exists: Server::start made it, so this socket
    // needs no descriptor of its own.)
    Loop& loop = pick_loop();
    LoopSocket socket(loop.context.get_executor());
    if (move_connection(accepted, socket)) {
      const std::size_t limit = options.max_connections;
      if (limit > 0 && connections.load() >= limit) {
        refuse_connection(std::move(socket), limit);
      } else {
        std::make_shared<Session>(std::move(socket), this, &loop)->start();
      }
    }
    accept();
  });
}

}  // namespace tidemark
