// Session's streams (session.h): GET .../snapshot and .../listen, written as
// NDJSON with chunked transfer. A worker fills one chunk from the snapshot
// cursor or the listener's poll(), the loop writes it, and only then is
// the next one filled, so a slow reader holds back only its own stream. A
// stream that ends early says so in its last line, with the query that
// resumes it (StreamPosition). While a stream runs, the connection is
// watched for its client leaving (watch_peer).
//
// Thread-safety: the fill runs on a worker, the writes on the session's
// loop, never at once (the next chunk is filled once the last is
// written); a StreamPosition is shared by both, under its mutex.
//
// Memory: one chunk of about Server::kStreamChunkBytes per stream (a row
// larger than that takes a chunk of its own size), charged to the reads
// pool; the decoded blocks of the cursor or listener draw from the same
// pool (ReadMemory).
#include <mutex>
#include <tuple>

#include "server/http_text.h"
#include "server/session.h"
#include "tidemark/read.h"
#include "util/json.h"
#include "util/ndjson_rows.h"
#include "util/try.h"

namespace tidemark {
namespace {

constexpr std::chrono::milliseconds kListenRetry{50};

// Makes room in a stream chunk for a row whose key and value take
// `payload` bytes: exactly, when the row is larger than a chunk, where
// growing by doubling would allocate up to twice a huge value.
void reserve_for_row(std::string* out, std::size_t payload) {
  constexpr std::size_t kRowOverhead = 96;  // the JSON around key and value
  if (payload > Server::kStreamChunkBytes) out->reserve(out->size() + payload + kRowOverhead);
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

// The query a stream's client sends to go on after the rows it has.
std::string resume_query(std::string_view base, std::string_view after_time,
                         std::optional<std::pair<std::string_view, std::string_view>> row) {
  std::string out(base);
  if (!after_time.empty()) out.append("&after_time=").append(after_time);
  if (row) {
    out.append("&after_key=").append(url_encode(row->first));
    out.append("&after_value=").append(url_encode(row->second));
  }
  return out;
}

}  // namespace

// Where a stream stands, for the error line that ends it early: the query
// that resumes it (snapshot: as_of and the last row; listen: from and
// the last update after the last progress). The row's key and value are
// kept as JSON text and URL-encoded only for an error line: encoding
// every chunk's last row cost two to three times a huge row's size in
// memory that no pool saw (65 MiB for a 16 MiB row). A snapshot does not
// copy its rows at all: the chunk that holds the last row sent is kept
// (take_chunk) until a row of the next chunk supersedes it (drop_kept),
// so a huge row is held once, in its chunk.
struct Session::StreamPosition {
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

// Reads after_key/after_value (both or neither): rows up to and
// including that one are skipped.
std::optional<std::pair<std::string, std::string>> Session::after_row(std::string* problem) {
  const bool key = query_.contains("after_key"), value = query_.contains("after_value");
  if (key != value) {
    *problem = "after_key and after_value go together";
    return std::nullopt;
  }
  if (!key) return std::nullopt;
  return std::pair{query_["after_key"], query_["after_value"]};
}

void Session::snapshot() {
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
        TM_ASSIGN(auto s, server->shards.open(n));
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

void Session::listen() {
  // Where the stream starts: after `from`, at the progress value a stream
  // printed last (null included) for `resume_progress`, or with the
  // snapshot at as_of (default: the latest complete time) for
  // snapshot=true.
  std::optional<ListenStart> start;
  bool snapshot = false;
  std::optional<Time> as_of;
  if (query_.contains("snapshot")) {
    if (query_["snapshot"] != "true" && query_["snapshot"] != "false") {
      return respond(400, error_json("snapshot must be true or false"));
    }
    snapshot = query_["snapshot"] == "true";
  }
  if (query_.contains("as_of")) {
    if (!snapshot) return respond(400, error_json("as_of is for a listen with snapshot=true"));
    as_of = parse_time(query_["as_of"]);
    if (!as_of) return respond(400, error_json("as_of must be a time"));
  }
  if (snapshot) {
    if (query_.contains("from") || query_.contains("resume_progress")) {
      return respond(400, error_json("a listen with snapshot=true starts at its snapshot: it "
                                     "takes as_of=T, not from or resume_progress"));
    }
  } else if (query_.contains("from") == query_.contains("resume_progress")) {
    return respond(400, error_json("listen needs one of from=T (times after T), "
                                   "resume_progress=P (times from P on) and snapshot=true "
                                   "(the snapshot, then every change after it)"));
  } else if (query_.contains("from")) {
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
    // A snapshot's rows come at as_of, its changes after: a resumed one
    // checks after_time against the as_of it reads at.
    const bool may_emit = after_time && (snapshot || start->lower().includes(*after_time));
    if (!may_emit) {
      return respond(400, error_json("after_time must be a time the stream may emit"));
    }
  }
  if (after.has_value() != after_time.has_value() && problem.empty()) {
    problem = "after_time, after_key and after_value go together";
  }
  if (!problem.empty()) return respond(400, error_json(problem));
  // The query that started the stream, until a progress line gives a
  // later place to resume from (a snapshot's: its as_of once known).
  std::string base = snapshot                  ? std::string("snapshot=true")
                     : query_.contains("from") ? "from=" + query_["from"]
                                               : "resume_progress=" + query_["resume_progress"];
  struct Opened {
    std::shared_ptr<Listener> listener;
    std::optional<Time> as_of;  // a snapshot's
  };
  blocking<Opened>(
      [server = server_, n = name_, start, snapshot, as_of, until]() -> Result<Opened> {
        TM_ASSIGN(auto s, server->shards.open(n));
        if (snapshot) {
          auto both = s->listen_snapshot(as_of, until, ReadMemory{server->reads});
          if (!both) return std::unexpected(read_failure(std::move(both).error()));
          return Opened{std::shared_ptr<Listener>(std::move(both->listener)), both->as_of};
        }
        auto listener = s->listen(*start, until, ReadMemory{server->reads});
        if (!listener) return std::unexpected(read_failure(std::move(listener).error()));
        return Opened{std::shared_ptr<Listener>(std::move(*listener)), std::nullopt};
      },
      [self = shared_from_this(), base = std::move(base), snapshot, until, after,
       after_time](Result<Opened> opened) mutable {
        if (!opened) return self->respond_error(opened.error());
        if (snapshot) {
          // Resumed at as_of: the same snapshot, then the same changes.
          base = opened->as_of ? "snapshot=true&as_of=" + std::to_string(*opened->as_of)
                               : std::string("resume_progress=0");
          if (after_time && opened->as_of && *after_time < *opened->as_of) {
            return self->respond(400, error_json("after_time must be a time the stream may emit"));
          }
        }
        auto source = opened->listener;
        // Woken by the listener's change subscription (on this loop),
        // the stream fills its next chunk at once.
        self->stream_wakes_ = source->set_wake([weak = std::weak_ptr<Session>(self)] {
          if (auto session = weak.lock()) session->post_wake();
        });
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

// A stream that ends early (an error, or the server shutting down) says
// so in its last line, {"error": ..., "resume": QUERY}: the query string
// that goes on where it stopped, from `position` (see StreamPosition).
void Session::stream(Fill fill, std::shared_ptr<StreamPosition> position) {
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

void Session::post_wake() {
  net::post(socket_.get_executor(), [self = shared_from_this()] { self->wake_stream(); });
}

void Session::wake_stream() {
  stream_woken_ = true;
  if (stream_timer_) stream_timer_->cancel();
}

void Session::next_chunk(Fill fill) {
  stream_woken_ = false;  // a wake from here on is seen by this fill or runs another
  if (stream_waiting_) {
    stream_waiting_ = false;
    std::lock_guard lock(server_->waiting_streams_mu);
    server_->waiting_streams.erase(this);
  }
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
  if (out_lease_.empty()) {
    // Back from idle: the chunk's memory again, waiting for room if need be.
    auto lease = server_->reads->try_reserve(Server::kStreamChunkBytes);
    if (!lease) {
      return server_->reads->when_available([self = shared_from_this(), fill] {
        net::post(self->socket_.get_executor(), [self, fill] { self->next_chunk(fill); });
      });
    }
    out_lease_ = std::move(*lease);
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
          if (self->stream_woken_ || self->peer_gone_) return self->next_chunk(fill);
          // Idle until a wake (or the fallback): no chunk held meanwhile.
          std::string().swap(self->out_data_);
          self->out_lease_.release();
          {
            std::lock_guard lock(self->server_->waiting_streams_mu);
            self->server_->waiting_streams.emplace(self.get(), self);
            self->stream_waiting_ = true;
          }
          if (self->server_->stopping) return self->next_chunk(fill);
          if (!self->stream_timer_) self->stream_timer_.emplace(self->socket_.get_executor());
          self->stream_timer_->expires_after(self->stream_wakes_ ? kListenFallback : kListenRetry);
          return self->stream_timer_->async_wait(
              [self, fill](beast::error_code) { self->next_chunk(fill); });
        }
        self->write_chunk(fill, *more);
      });
}

std::string Session::stream_error_line(std::string_view message) {
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
void Session::write_chunk(Fill fill, bool more) {
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

void Session::end_stream() {
  out_res_->body().data = nullptr;
  out_res_->body().more = false;
  begin_io(server_->options.idle_timeout);
  http::async_write(socket_, *out_sr_, [self = shared_from_this()](beast::error_code, std::size_t) {
    self->end_io();
    self->out_lease_.release();
    self->close();
  });
}

// While a stream runs, notices a client that went away: an idle listen
// writes nothing, so no write would fail. (A stream ends its connection,
// so bytes the client sends are never read; the watch then stops.)
void Session::watch_peer() {
  socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
    if (ec == net::error::operation_aborted) return;
    const Peer peer = ec ? Peer::kGone : self->peek_peer();
    if (peer == Peer::kQuiet) return self->watch_peer();
    if (peer == Peer::kGone) {
      self->peer_gone_ = true;
      self->wake_stream();  // an idle listen ends now, not at its fallback
    }
  });
  // The wait notices only what comes after it starts: a client gone
  // just before is seen here.
  if (peek_peer() == Peer::kGone) peer_gone_ = true;
}

Session::Peer Session::peek_peer() {
  beast::error_code ec;
  char byte;
  const std::size_t n = socket_.receive(net::buffer(&byte, 1), tcp::socket::message_peek, ec);
  if (ec == net::error::would_block) return Peer::kQuiet;
  return ec || n == 0 ? Peer::kGone : Peer::kSent;
}

}  // namespace tidemark
