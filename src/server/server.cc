// Server (server.h): start and stop. start() checks the options, makes the
// memory pools (Impl's constructor), binds, resumes the stored sinks and
// starts the I/O threads, the idle sweeper and the accept loop
// (session.cc); stop() winds them down in the order server.h describes.
//
// Thread-safety: start/stop/wait from one thread (server.h).
#include <algorithm>
#include <cstdio>
#include <system_error>

#include "server/server_impl.h"
#include "server/session.h"
#include "util/process_identity.h"
#include "util/thread.h"

namespace tidemark {
namespace {

// The options every shard's appender opens with (the registry adds its pool).
AppenderOptions appender_options(const ServerOptions& options) {
  AppenderOptions out = options.appender;
  out.queue_records = options.appender_queue_records;
  return out;
}

std::vector<std::unique_ptr<Server::Impl::Loop>> make_loops(unsigned count) {
  std::vector<std::unique_ptr<Server::Impl::Loop>> loops;
  for (unsigned i = 0; i < count; ++i) loops.push_back(std::make_unique<Server::Impl::Loop>());
  return loops;
}

// Ends every loop's run() and joins the threads (each runs one loop).
void stop_loops(Server::Impl& impl) {
  for (auto& loop : impl.loops) loop->work.reset();
  impl.accept_loop.work.reset();
  for (auto& loop : impl.loops) loop->context.stop();
  impl.accept_loop.context.stop();
  for (auto& t : impl.threads) t.join();
  impl.threads.clear();
}

}  // namespace

Server::Impl::Impl(std::shared_ptr<Client> c, ServerOptions o)
    : client(std::move(c)),
      options(std::move(o)),
      loops(make_loops(options.io_threads)),
      acceptor(accept_loop.context.get_executor()),
      workers(options.workers),
      root(MemoryPool::create("server", options.memory_limit)),
      requests(root->child("requests", options.memory_limit / 4)),
      appenders(root->child("appenders", options.memory_limit / 8 * 3)),
      // Room for the largest record the server accepts, read back as a
      // block of its own (with its key and overhead), beside other reads.
      reads(
          root->child("reads", std::max<std::uint64_t>(options.memory_limit / 8,
                                                       2 * options.max_record_bytes.value_or(0)))),
      sink_pool(root->child("sinks", options.memory_limit / 4)),
      shards(client, appender_options(options), appenders, options.idle_close) {}

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
  auto allowed =
      DestinationAllowList::parse(options.allowed_s3_endpoints, options.allowed_kafka_brokers);
  if (!allowed) return std::unexpected(allowed.error());
  std::shared_ptr<Impl> impl;
  try {  // the worker pool starts its threads here
    impl = std::make_shared<Impl>(std::move(client), std::move(options));
  } catch (const std::system_error& error) {
    return std::unexpected(thread_start_error("the server's workers", error));
  }
  impl->allowed_destinations = std::move(*allowed);
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
  // Where its sinks run, as every server shows it: a wildcard address
  // says nothing to a reader elsewhere, so the machine's name stands in.
  std::string where = impl->options.host;
  if (where.empty() || where == "0.0.0.0" || where == "::" || where == "[::]") {
    where = this_process().host;
  }
  impl->sinks = std::make_unique<SinkManager>(
      impl->client, impl->sink_pool,
      SinkRunner{"tidemark serve on " + where + ":" + std::to_string(impl->bound_port),
                 impl->options.sink_owner},
      impl->allowed_destinations, impl->options.idle_close, SinkManager::default_threads(),
      impl->options.sink_snapshot_part_bytes);
  if (auto resumed = impl->sinks->resume_all(); !resumed) {
    std::fprintf(stderr, "tidemark: warning: resuming the stored sinks: %s\n",
                 resumed.error().message.c_str());
  }
  // Each loop's reactor (an epoll descriptor and an eventfd) now: asio
  // makes it with the loop's first socket, and a connection accepted when
  // descriptors have run out would otherwise throw on a thread that
  // cannot catch it.
  for (auto& loop : impl->loops) {
    try {
      LoopSocket first(loop->context.get_executor());
    } catch (const boost::system::system_error& error) {
      return determinate(std::string("cannot start the server's event loops: ") + error.what());
    }
  }
  // The I/O threads before the first accept, so that a server with none
  // leaves no handler behind. Fewer than asked for still serve.
  for (auto& loop : impl->loops) {
    auto thread =
        start_thread("the server's connections", [impl, raw = loop.get()] { raw->context.run(); });
    if (!thread) {
      if (impl->threads.empty()) return std::unexpected(thread.error());
      std::fprintf(stderr, "tidemark: warning: %s; serving with %zu I/O threads\n",
                   thread.error().message.c_str(), impl->threads.size());
      break;
    }
    impl->threads.push_back(std::move(*thread));
  }
  impl->serving_loops = impl->threads.size();
  auto accepting =
      start_thread("the server's acceptor", [impl] { impl->accept_loop.context.run(); });
  if (!accepting) {
    stop_loops(*impl);
    return std::unexpected(accepting.error());
  }
  impl->threads.push_back(std::move(*accepting));
  if (impl->options.idle_close.count() > 0) {
    const auto every = std::max(impl->options.idle_close / 4, std::chrono::milliseconds(50));
    if (auto started = impl->idle_sweeper.start(every,
                                                [raw = impl.get()] {
                                                  raw->shards.close_idle();
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
  // The acceptor lives on its own loop: close it there.
  net::post(impl.acceptor.get_executor(), [&impl] {
    beast::error_code ec;
    impl.acceptor.close(ec);
    if (impl.accept_timer) impl.accept_timer->cancel();
  });
  const auto deadline = Clock::now() + grace;
  impl.idle_sweeper.stop();
  {
    // Listen streams waiting for a change end now, with their error line.
    std::lock_guard lock(impl.waiting_streams_mu);
    for (auto& [raw, weak] : impl.waiting_streams) {
      if (auto session = weak.lock()) session->post_wake();
    }
  }
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
  const auto appenders = impl.shards.contents().appenders;
  for (const auto& [name, a] : appenders) {
    (void)a->flush();
    if (Clock::now() > deadline) break;
  }
  for (const auto& [name, a] : appenders) a->close();
  stop_loops(impl);
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
