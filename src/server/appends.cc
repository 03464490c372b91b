// Session's appends (session.h): POST /v1/shards/{name}/append. The body is
// read in chunks and its record lines parsed as they arrive (split_lines),
// never buffered whole.
//   - Managed with a producer (Tidemark-Producer, Tidemark-Sequence):
//     records are enqueued into the shard's appender as they are parsed;
//     those the shard has committed already are skipped.
//   - Managed without one: all or nothing. The records are parsed into one
//     group (start_atomic reserves room for it first), then enqueued at
//     once.
//   - Explicit (?lower=L&upper=U): records go into one BatchBuilder on a
//     worker (parts upload as they fill) and one compare_and_append
//     commits them.
// The answer waits for the commit (server.h states the contract).
//
// Thread-safety: runs on the session's loop; an explicit append's parsing
// and commit run on a worker (never two at once for one session), and its
// shard's commits are one at a time (SharedWriter::mu).
//
// Memory, all charged to the requests pool: the body's chunk (session.cc);
// a partial line, forced (at most max_record_bytes per connection); an
// all-or-nothing append's records (its reservation, forced past it). The
// appender's queue (the appenders pool) pauses the request when full.
#include <algorithm>

#include "server/http_text.h"
#include "server/session.h"
#include "shard/state.h"
#include "util/json.h"
#include "util/ndjson_rows.h"
#include "util/try.h"

namespace tidemark {
namespace {

// An idempotent producer's managed append names it and numbers its records.
constexpr std::string_view kProducerHeader = "Tidemark-Producer";
constexpr std::string_view kSequenceHeader = "Tidemark-Sequence";
// A partial line longer than this gets room for a whole record at once.
constexpr std::uint64_t kCarryReserveAbove = 1 << 20;
// An all-or-nothing body's records are gathered in a vector that starts
// with room for this many and doubles. Small, because most bodies hold one
// record or a few: 8 records are 576 bytes, a small-bin allocation (1,024
// cost a 72 KiB allocation and free per request, and glibc consolidated
// its free lists at each).
constexpr std::size_t kFirstGroupCapacity = 8;

}  // namespace

void Session::start_append() {
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
  drop_group();
  group_bytes_ = 0;
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
    return blocking<std::shared_ptr<ShardRegistry::SharedWriter>>(
        [server = server_, n = name_] { return server->shards.writer(n); },
        [self = shared_from_this()](Result<std::shared_ptr<ShardRegistry::SharedWriter>> w) {
          if (!w) {
            self->keep_alive_ = false;
            return self->respond_error(w.error());
          }
          self->shared_writer_ = std::move(*w);
          self->builder_.emplace(self->shared_writer_->writer->builder(Frontier::at(self->lower_)));
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
      return respond(
          400, error_json(std::string(kProducerHeader) + " needs " + std::string(kSequenceHeader) +
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
  if (!producer_) appender_ = server_->shards.cached_appender(name_);
  if (appender_) return start_atomic();
  struct Opened {
    std::shared_ptr<Appender> appender;
    std::optional<ProducerLookup> lookup;
  };
  blocking<Opened>(
      [server = server_, n = name_, producer = producer_,
       first = first_sequence_]() -> Result<Opened> {
        Opened out;
        TM_ASSIGN(out.appender, server->shards.appender(n));
        if (producer) {
          TM_ASSIGN(auto s, server->shards.open(n));
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
              &body, "producer " + *self->producer_ + ": the body starts at sequence " +
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
              503,
              error_json("shard " + self->name_ + " keeps " + std::to_string(lookup.max_producers) +
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
void Session::charge_carry(std::uint64_t more) {
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

Session::Step Session::split_lines(const std::function<bool(std::string_view)>& line_fn,
                                   bool finished) {
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
      if (carry_.size() + pending_.size() > *server_->options.max_record_bytes) return Step::kError;
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

void Session::record_too_large() {
  keep_alive_ = false;
  respond(413, error_json("line " + std::to_string(line_ + 1) + ": a record over " +
                          std::to_string(*server_->options.max_record_bytes) + " bytes"));
}

// Reads the next piece of an append's body into pending_, then runs
// `process` (managed or explicit).
void Session::read_body_piece(void (Session::*process)()) {
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
void Session::read_managed() {
  read_body_piece(&Session::process_managed);
}

void Session::process_managed() {
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
void Session::start_atomic() {
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
void Session::process_atomic() {
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
        if (group_.size() == group_.capacity()) {
          // Grown by doubling: while the records move, both arrays exist,
          // and the lease keeps that high-water mark.
          const std::size_t old_capacity = group_.capacity();
          const std::size_t capacity = std::max<std::size_t>(kFirstGroupCapacity, 2 * old_capacity);
          charge_group(group_charge_ + sizeof(AppendRecord) * capacity);
          group_.reserve(capacity);
          group_charge_ += sizeof(AppendRecord) * (capacity - old_capacity);
        }
        group_charge_ += record->key.size() + record->value.size();
        charge_group(group_charge_);
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
    drop_group();
    std::string body = "{\"error\":";
    append_json_string(&body, "line " + std::to_string(failed_line) + ": " + failure->message +
                                  "; nothing was appended");
    body += ",\"line\":" + std::to_string(failed_line) + ",\"appended\":0}";
    return respond(status_of(*failure), std::move(body));
  }
  if (!finished_) return read_managed();
  enqueue_group();
}

void Session::drop_group() {
  std::vector<AppendRecord>().swap(group_);
  group_charge_ = 0;
  group_lease_.release();
}

void Session::charge_group(std::uint64_t bytes) {
  if (bytes <= group_lease_.size()) return;
  const std::uint64_t missing = bytes - group_lease_.size();
  if (group_lease_.pool()) {
    group_lease_.force_grow(missing);
  } else {
    group_lease_ = server_->requests->force_reserve(missing);
  }
}

void Session::atomic_too_large() {
  keep_alive_ = false;
  drop_group();
  respond(413, error_json("a managed append without a producer is committed all at once, so "
                          "its body is at most " +
                          std::to_string(*server_->options.max_record_bytes) +
                          " bytes and must fit the shard's appender queue; nothing was "
                          "appended. Split it, or name a producer (" +
                          std::string(kProducerHeader) + ", " + std::string(kSequenceHeader) +
                          ") to stream any size"));
}

void Session::enqueue_group() {
  release_body();
  count_ = group_.size();
  if (group_.empty()) return finish_managed();
  enqueued_at_ = Clock::now();
  // The only append in flight, on an idle appender: committed by this
  // I/O thread itself as it is enqueued (one commit call; what more it
  // takes goes on on the appenders' pool), which saves a hop to a pool
  // thread and another back (0.12 ms a request at one client on this
  // VM). Not under load: there the I/O threads' time bounds the rate,
  // and a commit of this request alone would take the next requests'
  // batch from them. Only on a loop that serves this connection alone,
  // and never the only loop: the request counts as in flight through its
  // commit, so one loop at most is ever in such a commit, new connections
  // go to another (pick_loop), and however slow the backend, no
  // connection but this one waits for it.
  const bool here = server_->serving_loops > 1 && loop_->connections.load() == 1 &&
                    server_->appends_in_flight.load() == 1;
  sender_->set_commit_here(here);
  if (here) loop_->committing.store(true);
  auto token = sender_->enqueue_group(group_);
  if (here) loop_->committing.store(false);
  if (!token) {
    if (token.error().is(ErrorKind::kFull)) {
      // Offered again once the queue has room (the group is intact).
      return appender_->pool()->when_available([self = shared_from_this()] {
        net::post(self->socket_.get_executor(), [self] { self->enqueue_group(); });
      });
    }
    if (token.error().is(ErrorKind::kTooLarge)) return atomic_too_large();
    drop_group();
    keep_alive_ = false;
    return respond_error(token.error());
  }
  last_token_ = *token;
  drop_group();
  finish_managed();
}

void Session::wait_for_appender() {
  appender_->pool()->when_available([self = shared_from_this()] {
    net::post(self->socket_.get_executor(), [self] { self->process_managed(); });
  });
}

// Once what was enqueued is durable, answers 400/413 for the bad line,
// 503 when the appender refused it. (A producer's request: the lines
// before the bad one are appended.)
void Session::fail_managed(const Error& error, std::uint64_t line) {
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
void Session::append_producer_fields(std::string* body) {
  if (!producer_) return;
  *body += ",\"producer\":";
  append_json_string(body, *producer_);
  *body += ",\"sequence\":" + std::to_string(first_sequence_) +
           ",\"duplicates\":" + std::to_string(skipped_ + (sender_ ? sender_->duplicates() : 0));
}

void Session::finish_managed() {
  release_body();
  if (!last_token_) {
    // Nothing enqueued: an empty body, or records all committed before.
    return blocking<Frontier>(
        [server = server_, n = name_]() -> Result<Frontier> {
          TM_ASSIGN(auto s, server->shards.open(n));
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
    // here, with no hop through the loop's queue.
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
void Session::answer_managed(const Result<Time>& r) {
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
void Session::read_explicit() {
  read_body_piece(&Session::process_explicit);
}

void Session::process_explicit() {
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

void Session::commit_explicit() {
  release_body();
  blocking<std::string>(
      [self = shared_from_this()]() -> Result<std::string> {
        TM_ASSIGN(Batch batch, self->builder_->finish(Frontier::at(self->upper_)));
        self->builder_.reset();
        self->shared_writer_->writer->wait_for_compaction();  // outside the lock
        std::lock_guard lock(self->shared_writer_->mu);
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
                409, "{\"error\":\"upper mismatch\",\"expected\":" + std::to_string(self->lower_) +
                         ",\"current\":" +
                         Frontier::from_optional(r.error().current_upper).to_json() + "}");
          }
          return self->respond_error(r.error());
        }
        self->respond(200, std::move(*r));
      });
}

}  // namespace tidemark
