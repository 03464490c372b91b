// Server::Impl: what a server's connections share (server.h says what the
// server does). Internal to src/server: its files are
//   server.cc          Server::start/stop: the pools, the threads, the sinks
//   session.h, .cc     Session, one connection: reading, pacing, answering,
//                      time limits; the accept loop (Impl::accept)
//   routes.cc          the route table, the token, the strict query checks,
//                      and the routes that answer one JSON object
//   appends.cc         POST .../append: managed and explicit appends
//   streams.cc         GET .../snapshot and .../listen: NDJSON streams
//   shard_registry.h   the open shards, appenders and writers; idle_close
//   metrics.cc         /metrics (Impl::render_metrics)
//   sinks.h            the sinks the server runs (SinkManager)
//
// Memory: the MemoryPool tree of options.memory_limit (server.h, "Memory");
// the registry's open shards (shard_registry.h).
//
// Thread-safety: the atomics and the members that are safe for concurrent
// use (shards, sinks, metrics, the pools) are used from every thread; the
// rest is set in Server::start before the I/O threads start, or used by
// the acceptor's loop alone, or by Server::stop.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

// After <utility>: Boost.Asio 1.74 (awaitable.hpp) uses std::exchange
// without including it.
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "server/metrics.h"
#include "server/shard_registry.h"
#include "server/sinks.h"
#include "sink/destination_url.h"
#include "tidemark/memory_pool.h"
#include "tidemark/retry.h"
#include "tidemark/server.h"
#include "util/periodic.h"

namespace tidemark {

class Session;

// Short names for the server's files.
namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

struct Server::Impl {
  Impl(std::shared_ptr<Client> c, ServerOptions o);

  std::shared_ptr<Client> client;
  ServerOptions options;
  // options.allowed_s3_endpoints and allowed_kafka_brokers, parsed.
  DestinationAllowList allowed_destinations;
  // An event loop of one thread. Each connection stays on the loop it was
  // accepted into, so the thread that answers a request is the one that
  // reads the next: at one client no other thread is woken per request
  // (two I/O threads sharing one io_context woke each other for every
  // request, 0.04-0.07 ms a request on this VM; docs/benchmarks.md).
  struct Loop {
    // Before the context: the sessions its destruction destroys still
    // count themselves out.
    std::atomic<std::size_t> connections{0};  // sessions on this loop
    std::atomic<bool> committing{false};      // its thread commits here (appends.cc)
    net::io_context context{1};
    // Keeps run() going while nothing is pending on a socket: an append
    // waiting for its commit has no asio operation outstanding, and once
    // the acceptor closes (stop) the thread would return with its answer
    // still to be posted. Reset by stop() after the requests in flight.
    net::executor_work_guard<net::io_context::executor_type> work = net::make_work_guard(context);
  };
  // The connections' loops, options.io_threads of them; the first
  // `serving_loops` have a thread (set before the first accept).
  std::vector<std::unique_ptr<Loop>> loops;
  std::size_t serving_loops = 0;
  std::atomic<std::size_t> next_loop{0};
  // The acceptor's own loop and thread: a connection's loop may be held
  // by a commit, accepting never is.
  Loop accept_loop;
  tcp::acceptor acceptor;
  net::thread_pool workers;
  std::vector<std::thread> threads;
  std::shared_ptr<MemoryPool> root, requests, appenders, reads, sink_pool;
  std::unique_ptr<SinkManager> sinks;  // made once the port is bound (claims name it)
  Metrics metrics;
  ShardRegistry shards;

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
  std::optional<Backoff> accept_retry;  // used by the acceptor's loop only
  std::optional<net::steady_timer> accept_timer;
  std::atomic<bool> stopping{false};
  // Listen streams waiting for a change between fills: stop() wakes them,
  // so that they end at once rather than at their fallback timer.
  std::mutex waiting_streams_mu;
  std::map<Session*, std::weak_ptr<Session>> waiting_streams;  // GUARDED_BY(waiting_streams_mu)
  std::mutex stop_mutex;
  std::condition_variable stop_cv;
  bool stopped = false;

  // The /metrics page (metrics.cc).
  std::string render_metrics();

  // Accepts connections until the acceptor closes (session.cc).
  void accept();
  // The loop for a new connection: the serving loops in turn, passing over
  // one whose thread is in a commit while another is free.
  Loop& pick_loop();

  // Runs shards.close_idle(). Last: stopped (destroyed) before what it closes.
  PeriodicTask idle_sweeper;
};

}  // namespace tidemark
