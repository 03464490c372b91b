// `tidemark serve`: the HTTP server on the configured location (DESIGN.md 9).
#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/cli.h"
#include "server/server.h"
#include "util/size.h"

namespace tidemark::cli {
namespace {

constexpr const char* kServeUsage =
    "serve [--listen HOST:PORT] [--memory-limit BYTES] [--token-file FILE]";

}  // namespace

int run_serve(const Globals& globals, const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"--listen", "--memory-limit", "--token-file"}, {});
  if (!args) return usage_error(args.error().message);
  if (!args->positionals().empty()) return usage_error(kServeUsage);
  ServerOptions options;
  if (auto listen = args->get("--listen")) {
    const auto colon = listen->rfind(':');
    if (colon == std::string::npos) return usage_error("--listen takes HOST:PORT");
    options.host = listen->substr(0, colon);
    try {
      std::size_t used = 0;
      const unsigned long port = std::stoul(listen->substr(colon + 1), &used);
      if (used != listen->size() - colon - 1 || port > 65535) throw std::out_of_range("port");
      options.port = static_cast<std::uint16_t>(port);
    } catch (...) {
      return usage_error("--listen takes HOST:PORT, got " + *listen);
    }
  }
  if (auto limit = args->get("--memory-limit")) {
    auto bytes = parse_size(*limit);
    if (!bytes) return usage_error("--memory-limit: " + bytes.error().message);
    options.memory_limit = *bytes;
  }
  if (auto file = args->get("--token-file")) {
    std::ifstream in(*file);
    if (!in) {
      std::fprintf(stderr, "tidemark: cannot read token file %s\n", file->c_str());
      return kExitError;
    }
    std::stringstream text;
    text << in.rdbuf();
    std::string token = text.str();
    while (!token.empty() &&
           (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) {
      token.pop_back();
    }
    if (token.empty()) {
      std::fprintf(stderr, "tidemark: token file %s is empty\n", file->c_str());
      return kExitError;
    }
    options.token = std::move(token);
  }

  // SIGTERM and SIGINT stop the server gracefully: blocked here, waited for.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before any thread starts

  auto client = open_client(globals);
  if (!client) return report(client.error());
  auto server = Server::start(*client, options);
  if (!server) return report(server.error());
  std::fprintf(stderr, "tidemark: serving on http://%s:%u (memory limit %s)%s\n",
               options.host.c_str(), static_cast<unsigned>((*server)->port()),
               format_size(options.memory_limit).c_str(),
               options.token ? ", bearer token required" : "");
  std::fflush(stderr);
  int signal = 0;
  sigwait(&signals, &signal);
  std::fprintf(stderr, "tidemark: signal %d: stopping (finishing commits in flight)\n", signal);
  (*server)->stop();
  std::fprintf(stderr, "tidemark: stopped\n");
  return kExitOk;
}

}  // namespace tidemark::cli
