// tidemark-fault-proxy: a TCP proxy that puts network faults between a
// process under test and its backends (PostgreSQL, S3), switched at run
// time by the test. A test utility, never installed with the product.
//
//   tidemark-fault-proxy [--seed N] [LISTEN_PORT=]HOST:PORT...
//
// Each HOST:PORT argument is a listener on 127.0.0.1:LISTEN_PORT (0 or
// omitted: a free port) that forwards every connection to HOST:PORT
// (resolved once, at start). Listener ids are 0, 1, ... in argument order.
// Once every port is bound it prints, on stdout, and flushes:
//   control 127.0.0.1:PORT
//   listener 0 127.0.0.1:PORT -> HOST:PORT
//   ...
//   ready
// It serves until SIGTERM or SIGINT (which print the stats on stderr) or
// until its parent exits.
//
// Control: connect to the control port and send commands, one a line. Every
// command is answered by zero or more lines and then one line, "ok" or
// "error MESSAGE"; a connection may send any number of commands. ID is a
// listener id or "all". A mode holds until the next `set` of its listener.
//   set ID pass                 forward everything (the start mode); held
//                               connections (blackhole) resume, nothing lost
//   set ID delay MS [JITTER_MS] every chunk read from either side from now on
//                               is written out MS + uniform[0, JITTER_MS] ms
//                               after it was read, never before the chunk
//                               read before it (order is kept)
//   set ID drop                 close every connection (FIN both ways,
//                               queued bytes discarded); new ones are closed
//                               as soon as accepted
//   set ID reset                the same with RST (SO_LINGER 0, then close)
//   set ID blackhole            forward nothing either way: the proxy stops
//                               reading, so bytes wait in the socket buffers;
//                               new connections are accepted and held without
//                               connecting to the target
//   set ID flaky P [SEED]       reset each new connection with probability P
//                               (0 to 1), forward the others; open ones pass.
//                               Draws come from the listener's generator,
//                               seeded with SEED, or at start with --seed
//                               (default 1) plus the listener id
//   stats [ID]                  one line per listener:
//     listener ID mode=MODE accepted=N open=N dropped=N reset=N
//       upstream_failed=N bytes_up=N bytes_down=N
//                               (MODE as set, commas for spaces: delay,100,20)
//   quit                        "ok", then the proxy closes the connection
// The reply to `set` comes after the mode is applied: after "ok" to drop or
// reset, every connection the listener had is closed.
//
// Counters: accepted (connections accepted), open (open now, held ones
// included), dropped / reset (connections the proxy closed with FIN / RST
// because of drop, reset or flaky, at accept or later), upstream_failed
// (the target refused or failed the connection; the client is then reset),
// bytes_up / bytes_down (bytes written to the target / to the client).
//
// Limits: loopback only, no authentication. One thread runs everything
// (Boost.Asio; nothing polls). A direction holds at most 2 MiB read but not
// yet written, read in chunks of up to 64 KiB: under `delay MS` a
// connection moves at most about 2 MiB per MS each way. A delay applies to
// chunks as they are read, not to the connection's establishment. A held
// (blackholed) connection whose client gave up stays open until the next
// `set`. Because the proxy's kernel answers TCP (acknowledgements,
// keepalive probes), a blackhole is not a cut cable: a client notices it
// only through its own timeouts, never through TCP's.
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/buffers_iterator.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

constexpr std::size_t kChunkBytes = 64 * 1024;
constexpr std::size_t kMaxQueuedBytes = 2 * 1024 * 1024;
constexpr std::size_t kMaxCommandBytes = 4096;
constexpr std::int64_t kMaxDelayMs = 3'600'000;

enum class ModeKind { kPass, kDelay, kDrop, kReset, kBlackhole, kFlaky };

struct Mode {
  ModeKind kind = ModeKind::kPass;
  std::chrono::milliseconds delay{0};
  std::chrono::milliseconds jitter{0};
  double probability = 0;

  // As the `set` command spells it, for stats ("delay,100,20": no spaces).
  std::string describe() const {
    switch (kind) {
      case ModeKind::kPass:
        return "pass";
      case ModeKind::kDelay:
        return "delay," + std::to_string(delay.count()) + "," + std::to_string(jitter.count());
      case ModeKind::kDrop:
        return "drop";
      case ModeKind::kReset:
        return "reset";
      case ModeKind::kBlackhole:
        return "blackhole";
      case ModeKind::kFlaky: {
        std::ostringstream text;
        text << "flaky," << probability;
        return text.str();
      }
    }
    return "?";
  }
};

struct Counters {
  std::uint64_t accepted = 0;
  std::uint64_t open = 0;
  std::uint64_t dropped = 0;
  std::uint64_t reset = 0;
  std::uint64_t upstream_failed = 0;
  std::uint64_t bytes_up = 0;
  std::uint64_t bytes_down = 0;
};

// How a socket is closed: FIN (after discarding unread bytes, which would
// otherwise make the kernel send RST) or RST.
enum class Closing { kGraceful, kReset };

void close_socket(tcp::socket& socket, Closing closing) {
  if (!socket.is_open()) return;
  error_code ignored;
  if (closing == Closing::kReset) {
    socket.set_option(asio::socket_base::linger(true, 0), ignored);
  } else {
    socket.non_blocking(true, ignored);
    char discard[kChunkBytes];
    while (socket.read_some(asio::buffer(discard), ignored) > 0 && !ignored) {
    }
    socket.shutdown(tcp::socket::shutdown_send, ignored);
  }
  socket.close(ignored);
}

class Listener;

// One proxied connection: the client's socket, the target's, and a
// direction of queued chunks each way. Lives in its listener's set until
// closed; pending handlers keep it alive until they have run.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Listener& listener, tcp::socket client);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Starts forwarding, or holds the connection while the mode is blackhole.
  void start();
  // The listener's mode changed to one that forwards (pass, delay, flaky):
  // connect a held connection, and restart reading and writing.
  void resume();
  void close(Closing closing);

 private:
  struct Chunk {
    std::vector<char> bytes;  // empty: the end of the stream
    Clock::time_point due;
  };
  struct Direction {
    Direction(tcp::socket& from, tcp::socket& to, std::uint64_t& written, asio::io_context& io)
        : from(from), to(to), written(written), timer(io) {}
    tcp::socket& from;
    tcp::socket& to;
    std::uint64_t& written;  // the listener's byte counter for this direction
    asio::steady_timer timer;
    std::vector<char> buffer;
    std::deque<Chunk> queue;
    std::size_t queued_bytes = 0;
    Clock::time_point last_due;
    bool reading = false;
    bool writing = false;
    bool waiting = false;  // the timer is armed for the front chunk
    bool read_ended = false;
    bool write_ended = false;
  };

  bool forwarding() const;
  void connect();
  void pump();
  void read(Direction& direction);
  void write(Direction& direction);
  void on_read(Direction& direction, const error_code& error, std::size_t bytes);

  Listener& listener_;
  tcp::socket client_;
  tcp::socket upstream_;
  Direction up_;    // client -> target
  Direction down_;  // target -> client
  bool connecting_ = false;
  bool connected_ = false;
  bool closed_ = false;
};

class Listener {
 public:
  Listener(asio::io_context& io, int id, tcp::acceptor acceptor, tcp::resolver::results_type target,
           std::string target_name, std::uint64_t seed)
      : io_(io),
        id_(id),
        acceptor_(std::move(acceptor)),
        retry_timer_(io),
        target_(std::move(target)),
        target_name_(std::move(target_name)),
        random_(seed) {}
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  void start() { accept(); }

  void set_mode(const Mode& mode, std::optional<std::uint64_t> seed) {
    mode_ = mode;
    if (seed) random_.seed(*seed);
    // Closing a connection removes it from connections_: walk a copy.
    const std::vector<std::shared_ptr<Connection>> current(connections_.begin(),
                                                           connections_.end());
    for (const auto& connection : current) {
      switch (mode.kind) {
        case ModeKind::kDrop:
          ++counters_.dropped;
          connection->close(Closing::kGraceful);
          break;
        case ModeKind::kReset:
          ++counters_.reset;
          connection->close(Closing::kReset);
          break;
        case ModeKind::kBlackhole:
          break;  // every step checks the mode before it reads or writes
        case ModeKind::kPass:
        case ModeKind::kDelay:
        case ModeKind::kFlaky:
          connection->resume();
          break;
      }
    }
  }

  std::string stats_line() const {
    return "listener " + std::to_string(id_) + " mode=" + mode_.describe() +
           " accepted=" + std::to_string(counters_.accepted) +
           " open=" + std::to_string(counters_.open) +
           " dropped=" + std::to_string(counters_.dropped) +
           " reset=" + std::to_string(counters_.reset) +
           " upstream_failed=" + std::to_string(counters_.upstream_failed) +
           " bytes_up=" + std::to_string(counters_.bytes_up) +
           " bytes_down=" + std::to_string(counters_.bytes_down);
  }

  // When a chunk read now is due: after the delay, and never before the
  // chunk read before it in the same direction (`last_due`).
  Clock::time_point due(Clock::time_point last_due) {
    Clock::time_point at = Clock::now();
    if (mode_.kind == ModeKind::kDelay) {
      at += mode_.delay;
      if (mode_.jitter.count() > 0) {
        at += std::chrono::milliseconds(
            std::uniform_int_distribution<std::int64_t>(0, mode_.jitter.count())(random_));
      }
    }
    return std::max(at, last_due);
  }

  void forget(const std::shared_ptr<Connection>& connection) {
    if (connections_.erase(connection) > 0) --counters_.open;
  }

  asio::io_context& io() { return io_; }
  const Mode& mode() const { return mode_; }
  Counters& counters() { return counters_; }
  const tcp::resolver::results_type& target() const { return target_; }
  const std::string& target_name() const { return target_name_; }
  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }

 private:
  void accept() {
    acceptor_.async_accept([this](const error_code& error, tcp::socket client) {
      if (error) {
        // Out of descriptors, say: try again shortly rather than spin.
        std::fprintf(stderr, "tidemark-fault-proxy: listener %d: accept: %s\n", id_,
                     error.message().c_str());
        retry_timer_.expires_after(std::chrono::milliseconds(100));
        retry_timer_.async_wait([this](const error_code&) { accept(); });
        return;
      }
      admit(std::move(client));
      accept();
    });
  }

  void admit(tcp::socket client) {
    ++counters_.accepted;
    bool reset = mode_.kind == ModeKind::kReset;
    if (mode_.kind == ModeKind::kFlaky) {
      reset = std::bernoulli_distribution(mode_.probability)(random_);
    }
    if (reset) {
      ++counters_.reset;
      close_socket(client, Closing::kReset);
      return;
    }
    if (mode_.kind == ModeKind::kDrop) {
      ++counters_.dropped;
      close_socket(client, Closing::kGraceful);
      return;
    }
    auto connection = std::make_shared<Connection>(*this, std::move(client));
    connections_.insert(connection);
    ++counters_.open;
    connection->start();
  }

  asio::io_context& io_;
  const int id_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_timer_;
  const tcp::resolver::results_type target_;
  const std::string target_name_;
  std::mt19937_64 random_;
  Mode mode_;
  Counters counters_;
  std::unordered_set<std::shared_ptr<Connection>> connections_;
};

Connection::Connection(Listener& listener, tcp::socket client)
    : listener_(listener),
      client_(std::move(client)),
      upstream_(listener.io()),
      up_(client_, upstream_, listener.counters().bytes_up, listener.io()),
      down_(upstream_, client_, listener.counters().bytes_down, listener.io()) {}

bool Connection::forwarding() const {
  return listener_.mode().kind != ModeKind::kBlackhole;
}

void Connection::start() {
  error_code ignored;
  client_.set_option(tcp::no_delay(true), ignored);
  if (forwarding()) connect();
}

void Connection::resume() {
  if (closed_) return;
  if (!connected_ && !connecting_) {
    connect();
    return;
  }
  pump();
}

void Connection::connect() {
  connecting_ = true;
  asio::async_connect(upstream_, listener_.target(),
                      [self = shared_from_this()](const error_code& error, const tcp::endpoint&) {
                        self->connecting_ = false;
                        if (self->closed_) return;
                        if (error) {
                          ++self->listener_.counters().upstream_failed;
                          self->close(Closing::kReset);
                          return;
                        }
                        self->connected_ = true;
                        error_code ignored;
                        self->upstream_.set_option(tcp::no_delay(true), ignored);
                        self->pump();
                      });
}

void Connection::pump() {
  for (Direction* direction : {&up_, &down_}) {
    read(*direction);
    write(*direction);
  }
}

void Connection::read(Direction& direction) {
  if (closed_ || !forwarding() || !connected_ || direction.reading || direction.read_ended ||
      direction.queued_bytes >= kMaxQueuedBytes) {
    return;
  }
  direction.reading = true;
  direction.buffer.resize(kChunkBytes);
  direction.from.async_read_some(
      asio::buffer(direction.buffer),
      [self = shared_from_this(), &direction](const error_code& error, std::size_t bytes) {
        self->on_read(direction, error, bytes);
      });
}

void Connection::on_read(Direction& direction, const error_code& error, std::size_t bytes) {
  direction.reading = false;
  if (closed_) return;
  if (error && error != asio::error::eof) {
    close(Closing::kReset);  // the peer reset: pass it on
    return;
  }
  Chunk chunk;
  chunk.due = listener_.due(direction.last_due);
  direction.last_due = chunk.due;
  if (error == asio::error::eof) {
    direction.read_ended = true;
  } else {
    chunk.bytes.assign(direction.buffer.begin(), direction.buffer.begin() + bytes);
    direction.queued_bytes += bytes;
  }
  direction.queue.push_back(std::move(chunk));
  write(direction);
  read(direction);
}

void Connection::write(Direction& direction) {
  if (closed_ || !forwarding() || !connected_ || direction.writing || direction.waiting ||
      direction.queue.empty()) {
    return;
  }
  Chunk& front = direction.queue.front();
  if (front.due > Clock::now()) {
    direction.waiting = true;
    direction.timer.expires_at(front.due);
    direction.timer.async_wait([self = shared_from_this(), &direction](const error_code&) {
      direction.waiting = false;
      self->write(direction);
    });
    return;
  }
  if (front.bytes.empty()) {
    // The end of the stream, in its turn: pass the FIN on.
    direction.queue.pop_front();
    error_code ignored;
    direction.to.shutdown(tcp::socket::shutdown_send, ignored);
    direction.write_ended = true;
    if (up_.write_ended && down_.write_ended) close(Closing::kGraceful);
    return;
  }
  direction.writing = true;
  asio::async_write(
      direction.to, asio::buffer(front.bytes),
      [self = shared_from_this(), &direction](const error_code& error, std::size_t bytes) {
        direction.writing = false;
        if (self->closed_) return;
        if (error) {
          self->close(Closing::kReset);
          return;
        }
        direction.written += bytes;
        direction.queued_bytes -= bytes;
        direction.queue.pop_front();
        self->write(direction);
        self->read(direction);
      });
}

void Connection::close(Closing closing) {
  if (closed_) return;
  closed_ = true;
  close_socket(client_, closing);
  close_socket(upstream_, closing);
  // The queues stay until the last handler has run: a write that was in
  // flight may still name its chunk.
  up_.timer.cancel();
  down_.timer.cancel();
  listener_.forget(shared_from_this());
}

// Parsing ---------------------------------------------------------------

std::vector<std::string_view> words_of(std::string_view line) {
  std::vector<std::string_view> words;
  std::size_t at = 0;
  while (at < line.size()) {
    while (at < line.size() && (line[at] == ' ' || line[at] == '\t' || line[at] == '\r')) ++at;
    std::size_t end = at;
    while (end < line.size() && line[end] != ' ' && line[end] != '\t' && line[end] != '\r') ++end;
    if (end > at) words.push_back(line.substr(at, end - at));
    at = end;
  }
  return words;
}

template <typename Integer>
std::optional<Integer> parse_integer(std::string_view text, Integer low, Integer high) {
  Integer value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < low || value > high) {
    return std::nullopt;
  }
  return value;
}

std::optional<double> parse_probability(std::string_view text) {
  const std::string copy(text);
  char* end = nullptr;
  const double value = std::strtod(copy.c_str(), &end);
  if (copy.empty() || end != copy.c_str() + copy.size() || !(value >= 0 && value <= 1)) {
    return std::nullopt;
  }
  return value;
}

// "MODE ARGS..." of a set command, or an error message.
struct ParsedMode {
  std::optional<Mode> mode;
  std::optional<std::uint64_t> seed;
  std::string error;
};

ParsedMode refused(std::string error) {
  return {std::nullopt, std::nullopt, std::move(error)};
}

ParsedMode parse_mode(const std::vector<std::string_view>& words) {
  ParsedMode parsed;
  const std::string_view name = words.front();
  const std::size_t arguments = words.size() - 1;
  Mode mode;
  if (name == "pass" || name == "drop" || name == "reset" || name == "blackhole") {
    if (arguments != 0) return refused(std::string(name) + " takes nothing");
    mode.kind = name == "pass"    ? ModeKind::kPass
                : name == "drop"  ? ModeKind::kDrop
                : name == "reset" ? ModeKind::kReset
                                  : ModeKind::kBlackhole;
  } else if (name == "delay") {
    const auto delay =
        arguments >= 1 ? parse_integer<std::int64_t>(words[1], 0, kMaxDelayMs) : std::nullopt;
    const auto jitter = arguments == 2 ? parse_integer<std::int64_t>(words[2], 0, kMaxDelayMs)
                                       : std::optional<std::int64_t>(0);
    if (!delay || !jitter || arguments > 2) {
      return refused("usage: delay MS [JITTER_MS] (0 to 3600000)");
    }
    mode.kind = ModeKind::kDelay;
    mode.delay = std::chrono::milliseconds(*delay);
    mode.jitter = std::chrono::milliseconds(*jitter);
  } else if (name == "flaky") {
    const auto probability = arguments >= 1 ? parse_probability(words[1]) : std::nullopt;
    if (!probability || arguments > 2) {
      return refused("usage: flaky P [SEED] (P from 0 to 1)");
    }
    if (arguments == 2) {
      parsed.seed = parse_integer<std::uint64_t>(words[2], 0, UINT64_MAX);
      if (!parsed.seed) return refused("flaky: SEED is not a number");
    }
    mode.kind = ModeKind::kFlaky;
    mode.probability = *probability;
  } else {
    return refused("unknown mode " + std::string(name) +
                   " (pass, delay, drop, reset, blackhole or flaky)");
  }
  parsed.mode = mode;
  return parsed;
}

// Control ---------------------------------------------------------------

class Proxy;

class ControlSession : public std::enable_shared_from_this<ControlSession> {
 public:
  ControlSession(Proxy& proxy, tcp::socket socket)
      : proxy_(proxy), socket_(std::move(socket)), input_(kMaxCommandBytes) {}
  void start() { read(); }

 private:
  void read();
  Proxy& proxy_;
  tcp::socket socket_;
  asio::streambuf input_;
  std::string reply_;
};

class Proxy {
 public:
  Proxy(asio::io_context& io, tcp::acceptor control) : io_(io), control_(std::move(control)) {}

  void add(std::unique_ptr<Listener> listener) { listeners_.push_back(std::move(listener)); }

  void start() {
    for (auto& listener : listeners_) listener->start();
    accept_control();
  }

  std::uint16_t control_port() const { return control_.local_endpoint().port(); }
  const std::vector<std::unique_ptr<Listener>>& listeners() const { return listeners_; }

  // The reply to one command line, each line ending in '\n'; sets `quit`
  // when the session should end after it.
  std::string execute(std::string_view line, bool& quit) {
    const std::vector<std::string_view> words = words_of(line);
    if (words.empty()) return "error empty command\n";
    if (words[0] == "quit" && words.size() == 1) {
      quit = true;
      return "ok\n";
    }
    if (words[0] == "stats" && words.size() <= 2) {
      std::string error;
      const auto chosen = select(words.size() == 2 ? words[1] : "all", error);
      if (!chosen) return "error " + error + "\n";
      std::string reply;
      for (Listener* listener : *chosen) reply += listener->stats_line() + "\n";
      return reply + "ok\n";
    }
    if (words[0] == "set" && words.size() >= 3) {
      std::string error;
      const auto chosen = select(words[1], error);
      if (!chosen) return "error " + error + "\n";
      const ParsedMode parsed = parse_mode({words.begin() + 2, words.end()});
      if (!parsed.mode) return "error " + parsed.error + "\n";
      for (Listener* listener : *chosen) listener->set_mode(*parsed.mode, parsed.seed);
      return "ok\n";
    }
    return "error unknown command (set ID MODE [ARGS], stats [ID], quit): " + std::string(line) +
           "\n";
  }

  void print_stats(std::FILE* out) const {
    for (const auto& listener : listeners_) {
      std::fprintf(out, "tidemark-fault-proxy: %s\n", listener->stats_line().c_str());
    }
  }

 private:
  // The listeners an ID names ("all" or a listener id).
  std::optional<std::vector<Listener*>> select(std::string_view id, std::string& error) const {
    std::vector<Listener*> chosen;
    if (id == "all") {
      for (const auto& listener : listeners_) chosen.push_back(listener.get());
      return chosen;
    }
    const auto index = parse_integer<std::size_t>(id, 0, listeners_.size() - 1);
    if (!index) {
      error = "no listener " + std::string(id) + " (0 to " + std::to_string(listeners_.size() - 1) +
              ", or all)";
      return std::nullopt;
    }
    chosen.push_back(listeners_[*index].get());
    return chosen;
  }

  void accept_control() {
    control_.async_accept([this](const error_code& error, tcp::socket socket) {
      if (error) {
        retry_timer_.expires_after(std::chrono::milliseconds(100));
        retry_timer_.async_wait([this](const error_code&) { accept_control(); });
        return;
      }
      std::make_shared<ControlSession>(*this, std::move(socket))->start();
      accept_control();
    });
  }

  asio::io_context& io_;
  tcp::acceptor control_;
  asio::steady_timer retry_timer_{io_};
  std::vector<std::unique_ptr<Listener>> listeners_;
};

void ControlSession::read() {
  asio::async_read_until(
      socket_, input_, '\n',
      [self = shared_from_this()](const error_code& error, std::size_t bytes) {
        if (error) {
          // End of the session, or a line longer than kMaxCommandBytes.
          if (error == asio::error::not_found) {
            error_code ignored;
            asio::write(self->socket_, asio::buffer(std::string("error line too long\n")), ignored);
          }
          return;
        }
        std::string line(asio::buffers_begin(self->input_.data()),
                         asio::buffers_begin(self->input_.data()) + bytes - 1);
        self->input_.consume(bytes);
        bool quit = false;
        self->reply_ = self->proxy_.execute(line, quit);
        asio::async_write(self->socket_, asio::buffer(self->reply_),
                          [self, quit](const error_code& error, std::size_t) {
                            if (!error && !quit) self->read();
                          });
      });
}

// Start-up --------------------------------------------------------------

int usage() {
  std::fprintf(stderr, "usage: tidemark-fault-proxy [--seed N] [LISTEN_PORT=]HOST:PORT...\n");
  return 2;
}

struct ListenerSpec {
  std::uint16_t listen_port = 0;
  std::string host;
  std::string port;
};

std::optional<ListenerSpec> parse_listener(std::string_view text) {
  ListenerSpec spec;
  if (const auto equals = text.find('='); equals != std::string_view::npos) {
    const auto port = parse_integer<std::uint16_t>(text.substr(0, equals), 0, 65535);
    if (!port) return std::nullopt;
    spec.listen_port = *port;
    text.remove_prefix(equals + 1);
  }
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  std::string_view host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (!parse_integer<std::uint16_t>(text.substr(colon + 1), 1, 65535)) return std::nullopt;
  spec.host = host;
  spec.port = text.substr(colon + 1);
  return spec;
}

tcp::acceptor listen_on(asio::io_context& io, std::uint16_t port) {
  tcp::acceptor acceptor(io);
  const tcp::endpoint endpoint(asio::ip::address_v4::loopback(), port);
  acceptor.open(endpoint.protocol());
  acceptor.set_option(asio::socket_base::reuse_address(true));
  acceptor.bind(endpoint);
  acceptor.listen(asio::socket_base::max_listen_connections);
  return acceptor;
}

// Many held connections may pile up under a long blackhole: take every
// descriptor the hard limit allows.
void raise_descriptor_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const pid_t parent = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) return 0;  // the parent is already gone
  std::signal(SIGPIPE, SIG_IGN);
  raise_descriptor_limit();

  std::uint64_t seed = 1;
  std::vector<ListenerSpec> specs;
  for (int i = 1; i < argc; ++i) {
    const std::string_view argument = argv[i];
    if (argument == "--seed" && i + 1 < argc) {
      const auto parsed = parse_integer<std::uint64_t>(argv[++i], 0, UINT64_MAX);
      if (!parsed) return usage();
      seed = *parsed;
    } else if (auto spec = parse_listener(argument)) {
      specs.push_back(std::move(*spec));
    } else {
      return usage();
    }
  }
  if (specs.empty()) return usage();

  try {
    asio::io_context io(1);
    Proxy proxy(io, listen_on(io, 0));
    tcp::resolver resolver(io);
    for (std::size_t id = 0; id < specs.size(); ++id) {
      const ListenerSpec& spec = specs[id];
      error_code error;
      auto target = resolver.resolve(spec.host, spec.port, error);
      if (error) {
        std::fprintf(stderr, "tidemark-fault-proxy: %s:%s: %s\n", spec.host.c_str(),
                     spec.port.c_str(), error.message().c_str());
        return 1;
      }
      proxy.add(std::make_unique<Listener>(io, static_cast<int>(id),
                                           listen_on(io, spec.listen_port), std::move(target),
                                           spec.host + ":" + spec.port, seed + id));
    }
    asio::signal_set signals(io, SIGTERM, SIGINT);
    signals.async_wait([&](const error_code&, int) {
      proxy.print_stats(stderr);
      io.stop();
    });
    proxy.start();

    std::printf("control 127.0.0.1:%u\n", proxy.control_port());
    for (std::size_t id = 0; id < proxy.listeners().size(); ++id) {
      const Listener& listener = *proxy.listeners()[id];
      std::printf("listener %zu 127.0.0.1:%u -> %s\n", id, listener.port(),
                  listener.target_name().c_str());
    }
    std::printf("ready\n");
    std::fflush(stdout);
    io.run();
  } catch (const std::exception& error) {
    // Only start-up throws (binding a port that is taken, say).
    std::fprintf(stderr, "tidemark-fault-proxy: %s\n", error.what());
    return 1;
  }
  return 0;
}
