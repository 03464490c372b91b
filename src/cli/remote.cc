// `tidemark --server URL COMMAND ...`: the commands that make sense against
// a running server, sent to it over HTTP (README, "The server"), the way a
// local command would run them on a data directory:
//
//   shard create|list|inspect|release|delete, append, snapshot, listen,
//   sink list|status|delete
//
// Bodies stream both ways in fixed buffers: an append's input goes up as a
// chunked body 64 KiB at a time, and a snapshot's or listen's answer is
// copied to stdout as it arrives, so memory does not grow with the data.
// Exit status as for local commands: 0 ok, 1 an error (the server's
// message on stderr, with its HTTP status), 2 usage, 3 upper mismatch.
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>

#include "cli/cli.h"
#include "server/http_text.h"
#include "util/json.h"
#include "util/try.h"

namespace tidemark::cli {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

constexpr std::size_t kBufferBytes = 64 << 10;

struct ServerAddress {
  std::string host;
  std::string port;
};

Result<ServerAddress> parse_server_url(const std::string& url) {
  constexpr std::string_view kScheme = "http://";
  std::string_view rest = url;
  if (!rest.starts_with(kScheme)) {
    return invalid_usage("--server takes http://HOST:PORT, got \"" + url + "\"");
  }
  rest.remove_prefix(kScheme.size());
  while (rest.ends_with("/")) rest.remove_suffix(1);
  const auto colon = rest.rfind(':');
  if (rest.empty() || rest.find('/') != std::string_view::npos || colon == std::string_view::npos ||
      colon == 0 || colon + 1 == rest.size()) {
    return invalid_usage("--server takes http://HOST:PORT, got \"" + url + "\"");
  }
  std::string host(rest.substr(0, colon));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return ServerAddress{host, std::string(rest.substr(colon + 1))};
}

class Remote {
 public:
  Remote(ServerAddress address, std::optional<std::string> token)
      : address_(std::move(address)), token_(std::move(token)) {}

  // Sends a request (with `body`, or with the chunked contents of `input`
  // when given) and hands the answer's body to `sink` as it arrives.
  // Returns the HTTP status, or an error when the exchange failed.
  Result<unsigned> exchange(http::verb verb, const std::string& target, const std::string& body,
                            std::FILE* input,
                            const std::vector<std::pair<std::string, std::string>>& headers,
                            const std::function<void(std::string_view)>& sink) {
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    tcp::socket socket(ioc);
    beast::error_code ec;
    auto endpoints = resolver.resolve(address_.host, address_.port, ec);
    if (!ec) net::connect(socket, endpoints, ec);
    if (ec) return failure("cannot reach the server: " + ec.message());

    http::request<http::empty_body> request(verb, target, 11);
    request.set(http::field::host, address_.host + ":" + address_.port);
    request.set(http::field::user_agent, "tidemark-cli");
    if (token_) request.set(http::field::authorization, "Bearer " + *token_);
    for (const auto& [name, value] : headers) request.set(name, value);
    std::vector<char> buffer(kBufferBytes);
    if (input != nullptr) {
      request.chunked(true);
      http::request_serializer<http::empty_body> header(request);
      http::write_header(socket, header, ec);
      for (std::size_t n; !ec && (n = std::fread(buffer.data(), 1, buffer.size(), input)) > 0;) {
        net::write(socket, http::make_chunk(net::buffer(buffer.data(), n)), ec);
      }
      if (!ec && std::ferror(input)) return failure("cannot read the input");
      if (!ec) net::write(socket, http::make_chunk_last(), ec);
    } else {
      request.content_length(body.size());
      http::request_serializer<http::empty_body> header(request);
      http::write_header(socket, header, ec);
      if (!ec && !body.empty()) net::write(socket, net::buffer(body), ec);
    }
    // A server that answers before reading the whole body (a 413, a bad
    // line) may reset the rest: its answer is still read below.
    beast::flat_buffer wire;
    http::response_parser<http::buffer_body> parser;
    // No limit (bodies stream through a fixed buffer). Not boost::none:
    // Boost 1.74 compares a length with an empty limit as exceeding it.
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    http::read_header(socket, wire, parser, ec);
    if (ec) return failure("no answer from the server: " + ec.message());
    while (!parser.is_done()) {
      parser.get().body().data = buffer.data();
      parser.get().body().size = buffer.size();
      http::read(socket, wire, parser, ec);
      if (ec == http::error::need_buffer) ec = {};
      if (ec) return failure("the answer was cut: " + ec.message());
      sink(std::string_view(buffer.data(), buffer.size() - parser.get().body().size));
    }
    return parser.get().result_int();
  }

 private:
  static Result<unsigned> failure(const std::string& message) {
    return make_error(ErrorKind::kDeterminate, message);
  }

  ServerAddress address_;
  std::optional<std::string> token_;
};

// A whole (small) answer: its status and body.
struct Answer {
  unsigned status = 0;
  std::string body;
};

Result<Answer> call(Remote& remote, http::verb verb, const std::string& target,
                    const std::string& body = "",
                    const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  Answer answer;
  TM_ASSIGN(answer.status, remote.exchange(verb, target, body, nullptr, headers,
                                           [&](std::string_view part) { answer.body += part; }));
  return answer;
}

// The server's {"error": ...} on stderr, and the exit status it means.
int report_answer(const Answer& answer, bool mismatch_is_3 = false) {
  std::string message = answer.body;
  if (auto json = parse_json(answer.body);
      json && json->find("error") && json->find("error")->is_string()) {
    message = json->find("error")->as_string();
  }
  while (!message.empty() && message.back() == '\n') message.pop_back();
  std::fprintf(stderr, "tidemark: %s (HTTP %u)\n", message.c_str(), answer.status);
  return mismatch_is_3 && answer.status == 409 ? kExitMismatch : kExitError;
}

int print_body(const Result<Answer>& answer, bool mismatch_is_3 = false) {
  if (!answer) return report(answer.error());
  if (answer->status / 100 != 2) return report_answer(*answer, mismatch_is_3);
  std::fwrite(answer->body.data(), 1, answer->body.size(), stdout);
  return kExitOk;
}

// A streamed read (snapshot, listen) copied to stdout as it arrives. A
// stream that ends in an {"error": ...} line (a failure after its first
// line) exits 1.
int stream_to_stdout(Remote& remote, const std::string& target) {
  std::string head;  // the answer's start, for an error answer
  std::string last_line;
  bool line_start = true;
  unsigned status = 0;
  auto got = remote.exchange(http::verb::get, target, "", nullptr, {}, [&](std::string_view part) {
    if (head.size() < 4096) head.append(part.substr(0, 4096 - head.size()));
    std::fwrite(part.data(), 1, part.size(), stdout);
    std::fflush(stdout);  // a listener waiting on progress sees it now
    // Remember the start of the last line (enough to tell an error line).
    for (char c : part) {
      if (line_start) last_line.clear();
      line_start = c == '\n';
      if (!line_start && last_line.size() < 16) last_line.push_back(c);
    }
  });
  if (!got) return report(got.error());
  status = *got;
  if (status / 100 != 2) return kExitError;  // its error body went to stdout: say so too
  if (last_line.starts_with("{\"error\"")) {
    std::fputs("tidemark: the stream ended with an error (its last line)\n", stderr);
    return kExitError;
  }
  return kExitOk;
}

// ", owner X" for a reader or writer that names its owner.
std::string owner_text(const JsonValue& holder) {
  const JsonValue* owner = holder.find("owner");
  return owner && owner->is_string() ? ", owner " + owner->as_string() : std::string();
}

int remote_shard(Remote& remote, const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {}, {"--json", "--force"});
  if (!args) return usage_error(args.error().message);
  const auto& pos = args->positionals();
  const std::string sub = pos.empty() ? "" : pos[0];
  if (args->has("--force") && sub != "delete") return usage_error("--force is for shard delete");
  if (args->has("--json") && sub != "inspect") return usage_error("--json is for shard inspect");
  if (sub == "list" && pos.size() == 1) {
    auto answer = call(remote, http::verb::get, "/v1/shards");
    if (!answer) return report(answer.error());
    if (answer->status != 200) return report_answer(*answer);
    auto json = parse_json(answer->body);
    if (!json || !json->is_array()) return print_body(answer);
    for (const JsonValue& shard : json->as_array()) {
      if (const auto* name = shard.find("name"); name && name->is_string()) {
        std::printf("%s\n", name->as_string().c_str());
      }
    }
    return kExitOk;
  }
  if (sub == "create" && pos.size() == 2) {
    std::string body = "{\"name\":";
    append_json_string(&body, pos[1]);
    body += "}";
    auto answer = call(remote, http::verb::post, "/v1/shards", body);
    if (!answer) return report(answer.error());
    if (answer->status != 201) return report_answer(*answer);
    std::printf("created shard %s\n", pos[1].c_str());
    return kExitOk;
  }
  if (sub == "inspect" && pos.size() == 2) {
    auto answer = call(remote, http::verb::get, "/v1/shards/" + url_encode(pos[1]));
    if (!answer) return report(answer.error());
    if (answer->status != 200) return report_answer(*answer);
    if (args->has("--json")) return print_body(answer);
    auto json = parse_json(answer->body);
    if (!json) return print_body(answer);
    for (const char* field :
         {"name", "upper", "since", "seqno", "batches", "parts", "updates", "bytes"}) {
      const JsonValue* value = json->find(field);
      std::string text = !value               ? "?"
                         : value->is_null()   ? "closed"
                         : value->is_string() ? value->as_string()
                                              : value->to_json();
      std::printf("%-8s %s\n", (std::string(field) + ":").c_str(), text.c_str());
    }
    if (const JsonValue* readers = json->find("readers"); readers && readers->is_array()) {
      for (const JsonValue& r : readers->as_array()) {
        const JsonValue* critical = r.find("critical");
        std::printf(
            "reader:  %s since %s%s%s\n", r.find("id") ? r.find("id")->as_string().c_str() : "?",
            r.find("since") && !r.find("since")->is_null() ? r.find("since")->to_json().c_str()
                                                           : "closed",
            critical && critical->is_bool() && critical->as_bool()
                ? ", critical (held until released)"
                : ", leased",
            owner_text(r).c_str());
      }
    }
    if (const JsonValue* writers = json->find("writers"); writers && writers->is_array()) {
      for (const JsonValue& w : writers->as_array()) {
        std::printf("writer:  %s%s\n", w.find("id") ? w.find("id")->as_string().c_str() : "?",
                    owner_text(w).c_str());
      }
    }
    return kExitOk;
  }
  if (sub == "delete" && pos.size() == 2) {
    auto answer =
        call(remote, http::verb::delete_,
             "/v1/shards/" + url_encode(pos[1]) + (args->has("--force") ? "?force=true" : ""));
    if (!answer) return report(answer.error());
    if (answer->status != 200) return report_answer(*answer);
    auto json = parse_json(answer->body);
    const JsonValue* objects = json ? json->find("objects_deleted") : nullptr;
    const JsonValue* versions = json ? json->find("versions_truncated") : nullptr;
    std::printf("deleted shard %s (%s objects and %s state versions removed)\n", pos[1].c_str(),
                objects ? objects->to_json().c_str() : "?",
                versions ? versions->to_json().c_str() : "?");
    return kExitOk;
  }
  if (sub == "release" && pos.size() == 3) {
    auto answer = call(remote, http::verb::delete_,
                       "/v1/shards/" + url_encode(pos[1]) + "/readers/" + url_encode(pos[2]));
    if (!answer) return report(answer.error());
    if (answer->status != 200) return report_answer(*answer);
    std::printf("released reader %s of shard %s\n", pos[2].c_str(), pos[1].c_str());
    return kExitOk;
  }
  return usage_error(
      "with --server: shard create NAME | shard list | shard inspect NAME [--json] | shard "
      "release NAME READER | shard delete NAME [--force]");
}

int remote_append(Remote& remote, const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"--input", "--lower", "--upper", "--producer"}, {});
  if (!args) return usage_error(args.error().message);
  if (args->positionals().size() != 1) return usage_error("append takes one NAME");
  auto lower = args->frontier("--lower", false);
  if (!lower) return usage_error(lower.error().message);
  auto upper = args->frontier("--upper", false);
  if (!upper) return usage_error(upper.error().message);
  if (lower->has_value() != upper->has_value()) {
    return usage_error("--lower and --upper go together");
  }
  auto producer = args->get("--producer");
  if (producer && *lower) return usage_error("--producer is for managed appends (no --lower)");
  std::string target = "/v1/shards/" + url_encode(args->positionals()[0]) + "/append";
  if (*lower) {
    target +=
        "?lower=" + std::to_string((*lower)->time()) + "&upper=" + std::to_string((*upper)->time());
  }
  std::vector<std::pair<std::string, std::string>> headers;
  if (producer) {
    headers = {{"Tidemark-Producer", *producer}, {"Tidemark-Sequence", "0"}};
  }
  const std::string input = args->get("--input").value_or("-");
  std::FILE* file = input == "-" ? stdin : std::fopen(input.c_str(), "rb");
  if (file == nullptr) {
    return report(make_error(ErrorKind::kInvalidUsage, "cannot open --input " + input).error());
  }
  Answer answer;
  auto status = remote.exchange(http::verb::post, target, "", file, headers,
                                [&](std::string_view part) { answer.body += part; });
  if (file != stdin) std::fclose(file);
  if (!status) return report(status.error());
  answer.status = *status;
  return print_body(answer, true);
}

int remote_read(Remote& remote, const std::string& command, const std::vector<std::string>& argv) {
  const bool listen = command == "listen";
  auto args = Args::parse(
      argv,
      listen ? std::vector<std::string>{"--from", "--resume-progress", "--until", "--as-of"}
             : std::vector<std::string>{"--as-of"},
      listen ? std::vector<std::string>{"--snapshot"} : std::vector<std::string>{});
  if (!args) return usage_error(args.error().message);
  if (args->positionals().size() != 1) return usage_error(command + " takes one NAME");
  std::string target = "/v1/shards/" + url_encode(args->positionals()[0]) + "/" + command;
  std::string query;
  auto add = [&](const std::string& flag, const std::string& param) -> bool {
    auto value = args->get(flag);
    if (!value) return true;
    const bool ok = (*value == "null" && flag == "--resume-progress") ||
                    whole_number(*value, 0, UINT64_MAX).has_value();
    if (ok) query += (query.empty() ? "?" : "&") + param + "=" + *value;
    return ok;
  };
  if (listen) {
    const bool from = args->get("--from").has_value();
    const bool resume = args->get("--resume-progress").has_value();
    if (args->has("--snapshot")) {
      if (from || resume) {
        return usage_error(
            "listen --snapshot starts at its snapshot: it takes --as-of T, not --from or "
            "--resume-progress");
      }
      query += "?snapshot=true";
    } else if (args->get("--as-of")) {
      return usage_error("--as-of is for listen --snapshot");
    } else if (from == resume) {
      return usage_error(
          "listen needs one of --from T (times after T), --resume-progress P (times from P on) "
          "and --snapshot (the snapshot, then every change after it)");
    }
    if (!add("--from", "from") || !add("--resume-progress", "resume_progress") ||
        !add("--as-of", "as_of") || !add("--until", "until")) {
      return usage_error("listen's times are non-negative integers");
    }
  } else if (!add("--as-of", "as_of")) {
    return usage_error("--as-of must be a time (a non-negative integer)");
  }
  return stream_to_stdout(remote, target + query);
}

int remote_sink(Remote& remote, const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"--shard", "--to", "--envelope", "--format"}, {});
  if (!args) return usage_error(args.error().message);
  const auto& pos = args->positionals();
  const std::string sub = pos.empty() ? "" : pos[0];
  if (sub == "update" && pos.size() == 2) {
    // PUT /v1/sinks/NAME: the whole definition but the name.
    const auto shard = args->get("--shard"), to = args->get("--to");
    if (!shard || !to) return usage_error("sink update NAME needs --shard S and --to URL");
    std::string body = "{\"shard\":";
    append_json_string(&body, *shard);
    body += ",\"to\":";
    append_json_string(&body, *to);
    for (const auto& [flag, field] :
         {std::pair{"--envelope", "envelope"}, {"--format", "format"}}) {
      if (auto value = args->get(flag)) {
        body += std::string(",\"") + field + "\":";
        append_json_string(&body, *value);
      }
    }
    return print_body(call(remote, http::verb::put, "/v1/sinks/" + url_encode(pos[1]), body + "}"));
  }
  for (const char* flag : {"--shard", "--to", "--envelope", "--format"}) {
    if (args->get(flag)) return usage_error(std::string(flag) + " is for sink update");
  }
  if (sub == "list" && pos.size() == 1) {
    auto answer = call(remote, http::verb::get, "/v1/sinks");
    return print_body(answer);
  }
  if (sub == "status" && pos.size() == 2) {
    return print_body(call(remote, http::verb::get, "/v1/sinks/" + url_encode(pos[1])));
  }
  if (sub == "delete" && pos.size() == 2) {
    return print_body(call(remote, http::verb::delete_, "/v1/sinks/" + url_encode(pos[1])));
  }
  return usage_error(
      "with --server: sink list | sink status NAME | sink delete NAME | sink update NAME "
      "--shard S --to URL [--envelope upsert|debezium] [--format json|csv]");
}

}  // namespace

int run_remote(const std::string& server_url, const std::optional<std::string>& token_file,
               const std::string& command, const std::vector<std::string>& argv) {
  auto address = parse_server_url(server_url);
  if (!address) return usage_error(address.error().message);
  std::optional<std::string> token;
  if (token_file) {
    std::ifstream in(*token_file);
    std::string text;
    if (!in || !std::getline(in, text) || text.empty()) {
      return report(
          make_error(ErrorKind::kInvalidUsage, "cannot read a token from " + *token_file).error());
    }
    token = text;
  }
  Remote remote(std::move(*address), std::move(token));
  if (command == "shard") return remote_shard(remote, argv);
  if (command == "append") return remote_append(remote, argv);
  if (command == "snapshot" || command == "listen") return remote_read(remote, command, argv);
  if (command == "sink") return remote_sink(remote, argv);
  return usage_error("\"" + command +
                     "\" runs on a data directory, not with --server (which takes shard, append, "
                     "snapshot, listen and sink)");
}

}  // namespace tidemark::cli
