// Session's routes (session.h): the route table (route), the bearer token,
// the strict checks of query parameters and JSON fields, and the routes
// that answer one JSON object (shards, sinks, producers, readers,
// /metrics, /healthz and the console). Appends (appends.cc) and streams
// (streams.cc) are routed here and handled there.
//
// Thread-safety: runs on the session's loop; what blocks (consensus and
// blob calls, the sinks) runs on a worker through blocking().
//
// Memory: a non-append body is read whole, at most
// Server::kSmallBodyBytes (read_small_body); answers are built whole.
#include <algorithm>
#include <filesystem>

#include "server/console.h"
#include "server/session.h"
#include "shard/state.h"
#include "util/json.h"
#include "util/try.h"

namespace tidemark {
namespace {

bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

}  // namespace

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

std::string error_json(std::string_view message) {
  std::string out = "{\"error\":";
  append_json_string(&out, message);
  out += "}";
  return out;
}

void Session::route() {
  auto& request = parser_->get();
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
        !constant_time_equal(std::string_view(it->value().data(), it->value().size()), expected)) {
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
            if (!text) return self->respond_error(text.error());
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
    if (method == http::verb::put) {
      route_ = "update_sink";
      if (rejects_query({})) return;
      return read_small_body([self = shared_from_this()] { self->update_sink(); });
    }
    if (method == http::verb::delete_) {
      route_ = "delete_sink";
      if (rejects_query({})) return;
      return read_small_body([self = shared_from_this()] {
        self->blocking<std::string>(
            [server = self->server_, n = self->name_]() -> Result<std::string> {
              TM_ASSIGN(bool stopped, server->sinks->remove(n));
              std::string out = "{\"deleted\":";
              append_json_string(&out, n);
              out += ",\"stopped\":";
              out += stopped ? "true" : "false";
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
      if (rejects_query({"from", "resume_progress", "snapshot", "as_of", "until", "after_time",
                         "after_key", "after_value"})) {
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
bool Session::rejects_query(std::initializer_list<std::string_view> known) {
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

void Session::method_not_allowed() {
  route_ = "method_not_allowed";
  read_small_body([self = shared_from_this()] {
    self->respond(405, error_json("method not allowed on " + self->path_));
  });
}

void Session::create_shard() {
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
        TM_ASSIGN(auto s, server->shards.open(n));
        TM_ASSIGN(auto info, s->inspect());
        return info.to_json();
      },
      [self = shared_from_this()](Result<std::string> r) {
        if (!r) return self->respond_error(r.error());
        self->respond(201, std::move(*r));
      });
}

void Session::create_sink() {
  auto spec = SinkSpec::parse(small_body_);
  if (!spec) return respond_error(spec.error());
  // The name first: a definition sent again through another server (behind
  // a load balancer) is told who runs it, whatever that server would make
  // of its destination.
  blocking<std::string>(
      [self = shared_from_this(), s = *spec]() mutable -> Result<std::string> {
        TM_TRY(self->server_->sinks->check_name_free(s.name));
        TM_ASSIGN(s.to, self->resolve_file_sink(s.to));
        TM_ASSIGN(SinkUrl url, parse_sink_url(s.to, s.format));
        TM_TRY(self->server_->allowed_destinations.check(url));
        return self->server_->sinks->create(s);
      },
      [self = shared_from_this()](Result<std::string> r) {
        if (!r) return self->respond_error(r.error());
        self->respond(201, std::move(*r));
      });
}

// PUT /v1/sinks/{name}: {"shard", "to", "envelope", "format"} (a "name"
// in the body must be the path's). Checked as a POST's definition, then
// stored as the sink's next revision (SinkManager::update).
void Session::update_sink() {
  auto body = parse_json(small_body_);
  if (!body || !body->is_object()) {
    return respond(400, error_json("expected {\"shard\", \"to\", \"envelope\", \"format\"}"));
  }
  JsonValue::Object members = body->as_object();
  const JsonValue* named = body->find("name");
  if (named == nullptr) {
    members.emplace_back("name", JsonValue::from_string(name_));
  } else if (!named->is_string() || named->as_string() != name_) {
    return respond(400, error_json("the body's \"name\" is not the path's: a sink cannot be "
                                   "renamed (delete it and create another)"));
  }
  auto spec = SinkSpec::parse(JsonValue::from_object(std::move(members)).to_json());
  if (!spec) return respond_error(spec.error());
  blocking<std::string>(
      [self = shared_from_this(), s = *spec]() mutable -> Result<std::string> {
        TM_ASSIGN(s.to, self->resolve_file_sink(s.to));
        TM_ASSIGN(SinkUrl url, parse_sink_url(s.to, s.format));
        TM_TRY(self->server_->allowed_destinations.check(url));
        return self->server_->sinks->update(s);
      },
      [self = shared_from_this()](Result<std::string> r) {
        if (!r) return self->respond_error(r.error());
        self->respond(200, std::move(*r));
      });
}

// A file sink writes only inside the server's file_sink_root. Its path is
// resolved (symlinks, "..") once, here, and the sink is given the
// resolved path, so the check and the writer cannot disagree (a path
// climbing out through a symlinked data directory passed the check and
// was written outside). Other destinations pass unchanged. A refusal
// names no path of the server's.
Result<std::string> Session::resolve_file_sink(const std::string& to) {
  constexpr std::string_view kFile = "file://";
  if (!to.starts_with(kFile)) return to;
  const auto& root = server_->options.file_sink_root;
  if (!root) return invalid_usage("this server has no directory for file sinks");
  std::error_code ec;
  const auto base = std::filesystem::weakly_canonical(*root, ec);
  if (ec)
    return make_error(ErrorKind::kDeterminate, "the server's file sink directory: " + ec.message());
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

void Session::list_shards() {
  blocking<std::string>(
      [server = server_]() -> Result<std::string> {
        TM_ASSIGN(auto names, server->client->list_shards());
        std::string out = "[";
        for (std::size_t i = 0; i < names.size(); ++i) {
          TM_ASSIGN(auto s, server->shards.open(names[i]));
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
void Session::inspect_producer() {
  if (auto valid = validate_producer_id(*producer_); !valid) {
    return respond(400, error_json(valid.error().message));
  }
  blocking<std::string>(
      [server = server_, n = name_, p = *producer_]() -> Result<std::string> {
        TM_ASSIGN(auto s, server->shards.open(n));
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
void Session::delete_shard() {
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
        server->shards.forget(n);
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
void Session::release_reader() {
  if (reader_.empty() || reader_.find('/') != std::string::npos) {
    return respond(400, error_json("a reader id is one path segment (GET /v1/shards/" + name_ +
                                   " lists the readers)"));
  }
  blocking<std::string>(
      [server = server_, n = name_, id = reader_]() -> Result<std::string> {
        TM_ASSIGN(auto s, server->shards.open(n));
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

void Session::inspect_shard() {
  blocking<std::string>(
      [server = server_, n = name_]() -> Result<std::string> {
        TM_ASSIGN(auto s, server->shards.open(n));
        TM_ASSIGN(auto info, s->inspect());
        return info.to_json();
      },
      [self = shared_from_this()](Result<std::string> r) {
        if (!r) return self->respond_error(r.error());
        self->respond(200, std::move(*r));
      });
}

}  // namespace tidemark
