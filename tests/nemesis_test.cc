// The nemesis: three `tidemark serve` processes on one shard through a real
// PostgreSQL (consensus) and a real S3 server (s3rver, blobs), attacked the
// way production attacks them while clients write and read, then checked
// by an independent checker (nemesis_checker.h).
//
// Processes: each server has its own --data directory and a short lease
// (--lease 2000), and reaches PostgreSQL and s3rver through listeners of its
// own on one tidemark-fault-proxy, so a fault can hit one server's path to
// one backend. The servers' client-side timeouts are short
// (call_timeout=5 for PostgreSQL, stall_timeout=5 for S3), so that the
// longer blackholes reach them.
//
// Nemesis (seeded; one action at a time unless TIDEMARK_NEMESIS_ACTORS says
// otherwise, each healed before the next on its resources): SIGKILL a server
// and start it again; SIGSTOP a server for 1.2 to 3 leases, then SIGCONT;
// delay, drop, reset, blackhole or flaky on one server's path to
// PostgreSQL or S3 for a few seconds, then pass; stop PostgreSQL or s3rver
// for a few seconds (TIDEMARK_TEST_*_STOP / _START) and start it again. A
// server that exits on its own is a failure.
//
// Clients, each request to a random running server (a paused one
// included):
//   - idempotent producers (Tidemark-Producer / Tidemark-Sequence), each
//     sending 1-4 records a request with keys of their own, retrying the
//     same request after any timeout, 5xx or broken connection until it
//     gets 200 (409 or another 4xx is a failure);
//   - explicit writers racing on the upper: read it (U), append one record
//     at U with lower=U&upper=U+1: 200 won, 409 lost, anything else unknown;
//   - a writer of managed appends without a producer (all or nothing);
//   - readers: a snapshot at a random earlier time now and then; a listen
//     from the latest time or a little before it until a little ahead,
//     with a snapshot at its start and at some of the frontiers it passes;
//     streams resume with the `resume` query of an error line, or, after a
//     broken connection, from the last progress (listen) or after the last
//     row (snapshot).
//
// After healing everything and letting the servers settle, the history is
// read once (a listen from 0 to the final upper) and checked: every
// acknowledged record once, nothing never sent, each producer's records a
// prefix of what it sent and its sequence where that prefix ends,
// explicit winners alone at their time and never two from one upper,
// losers absent, unknown outcomes at most once, appends without a producer
// all or nothing, every snapshot equal to the history at its time, every
// listen in order and equal to the history (and to the snapshots taken)
// at each progress it reported.
//
// Environment: TIDEMARK_NEMESIS_SECONDS (default 75), TIDEMARK_NEMESIS_SEED
// (default: a fresh one, printed first), TIDEMARK_NEMESIS_ACTORS (default
// 1), TIDEMARK_KEEP_SCRATCH (keep $TMPDIR/tidemark-nemesis-* after a pass).
// Needs scripts/test-services.sh (TIDEMARK_TEST_POSTGRES, _S3 and the
// stop/start commands); it stops backends, so it runs alone.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fault_proxy_process.h"
#include "http_client.h"
#include "nemesis_checker.h"
#include "server_process.h"

namespace {

namespace fs = std::filesystem;
namespace nm = tidemark::testing::nemesis;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using tidemark::testing::authority;
using tidemark::testing::FaultProxyProcess;
using tidemark::testing::http_request;
using tidemark::testing::http_stream;
using tidemark::testing::HttpOutcome;
using tidemark::testing::HttpResult;
using tidemark::testing::postgres_authority;
using tidemark::testing::s3_endpoint_authority;
using tidemark::testing::slurp;
using tidemark::testing::with_authority;

constexpr int kServers = 3;
constexpr int kLeaseMs = 2000;
constexpr int kPostgresCallTimeoutSeconds = 5;
constexpr int kS3StallTimeoutSeconds = 5;
constexpr auto kRequestTimeout = 10s;
constexpr auto kStreamIdleTimeout = 12s;

std::uint64_t env_number(const char* name, std::uint64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  return std::stoull(text);
}

struct Settings {
  std::uint64_t seed = 0;
  std::chrono::seconds duration{75};
  int actors = 1;
  int producers = 3;
  int explicit_writers = 2;
  int group_writers = 1;
  int readers = 2;
  std::set<std::string> actions;  // empty: all

  static Settings from_environment() {
    Settings settings;
    settings.seed =
        env_number("TIDEMARK_NEMESIS_SEED",
                   std::random_device{}() ^
                       static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()));
    settings.duration = std::chrono::seconds(env_number("TIDEMARK_NEMESIS_SECONDS", 75));
    settings.actors = static_cast<int>(env_number("TIDEMARK_NEMESIS_ACTORS", 1));
    if (const char* actions = std::getenv("TIDEMARK_NEMESIS_ACTIONS")) {
      std::string list = actions;
      for (std::size_t at = 0; at <= list.size();) {
        const std::size_t end = std::min(list.find(',', at), list.size());
        if (end > at) settings.actions.insert(list.substr(at, end - at));
        at = end + 1;
      }
    }
    return settings;
  }
};

// A generator of its own for each thread, drawn from the seed and the
// thread's role, so that a seed repeats every choice (not the timings).
class Random {
 public:
  Random(std::uint64_t seed, std::uint64_t role, std::uint64_t index)
      : engine_(seed ^ (role * 0x9e3779b97f4a7c15ull) ^ (index * 0xbf58476d1ce4e5b9ull)) {}
  std::int64_t between(std::int64_t low, std::int64_t high) {  // inclusive
    return std::uniform_int_distribution<std::int64_t>(low, high)(engine_);
  }
  bool chance(double p) { return std::bernoulli_distribution(p)(engine_); }
  std::chrono::milliseconds ms(std::int64_t low, std::int64_t high) {
    return std::chrono::milliseconds(between(low, high));
  }
  std::uint64_t next() { return engine_(); }

 private:
  std::mt19937_64 engine_;
};

// What the clients met, for the report.
struct Counters {
  std::atomic<long> requests{0}, ok{0}, conflicts{0}, unavailable{0}, other_status{0}, timed_out{0},
      refused{0}, broken{0}, retries{0}, duplicates{0}, snapshot_resumes_break{0},
      snapshot_resumes_error{0}, listen_resumes_break{0}, listen_resumes_error{0};

  void count(const HttpResult& result) {
    ++requests;
    switch (result.outcome) {
      case HttpOutcome::kAnswered:
      case HttpOutcome::kStoppedEarly:
        break;
      case HttpOutcome::kRefused:
        ++refused;
        return;
      case HttpOutcome::kTimedOut:
        ++timed_out;
        if (result.status == 0) return;
        break;
      case HttpOutcome::kBroken:
        ++broken;
        if (result.status == 0) return;
        break;
    }
    if (result.status == 200) {
      ++ok;
    } else if (result.status == 409) {
      ++conflicts;
    } else if (result.status == 503) {
      ++unavailable;
    } else {
      ++other_status;
    }
  }
};

std::string seconds_text(Clock::duration d) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", std::chrono::duration<double>(d).count());
  return text;
}

std::string with_parameter(const std::string& url, const std::string& parameter) {
  return url + (url.find('?') == std::string::npos ? "?" : "&") + parameter;
}

class NemesisTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* postgres = std::getenv("TIDEMARK_TEST_POSTGRES");
    const char* s3 = std::getenv("TIDEMARK_TEST_S3");
    for (const char* name :
         {"TIDEMARK_TEST_POSTGRES", "TIDEMARK_TEST_S3", "TIDEMARK_TEST_POSTGRES_STOP",
          "TIDEMARK_TEST_POSTGRES_START", "TIDEMARK_TEST_S3_STOP", "TIDEMARK_TEST_S3_START"}) {
      if (std::getenv(name) == nullptr) {
        GTEST_SKIP() << name << " is not set (scripts/test-services.sh sets it)";
      }
    }
    settings_ = Settings::from_environment();
    for (const std::string& action : settings_.actions) {
      bool known = false;
      for (const ActionKind& kind : kActionKinds) known |= action == kind.name;
      ASSERT_TRUE(known) << "TIDEMARK_NEMESIS_ACTIONS: unknown action " << action;
    }
    std::printf(
        "nemesis: seed %llu (TIDEMARK_NEMESIS_SEED=%llu repeats its choices), %lld s, "
        "%d actor(s); %d producers, %d explicit writers, %d writer(s) without a "
        "producer, %d readers\n",
        static_cast<unsigned long long>(settings_.seed),
        static_cast<unsigned long long>(settings_.seed),
        static_cast<long long>(settings_.duration.count()), settings_.actors, settings_.producers,
        settings_.explicit_writers, settings_.group_writers, settings_.readers);
    std::fflush(stdout);
    const std::string run = std::to_string(getpid()) + "-" +
                            std::to_string(std::chrono::system_clock::now().time_since_epoch() /
                                           std::chrono::milliseconds(1));
    shard_ = "nemesis-" + run;
    scratch_ = fs::temp_directory_path() / ("tidemark-nemesis-" + run);
    fs::create_directories(scratch_);
    postgres_url_ = postgres;
    std::string blob = s3;
    const auto query = blob.find('?');
    blob.insert(query == std::string::npos ? blob.size() : query, "/nemesis-" + run);
    blob_url_ = blob;

    // One proxy; server i's path to PostgreSQL is listener 2i, to S3 2i + 1.
    std::vector<std::string> targets;
    for (int i = 0; i < kServers; ++i) {
      targets.push_back(authority(postgres_url_, postgres_authority(postgres_url_)));
      targets.push_back(authority(blob_url_, s3_endpoint_authority(blob_url_)));
    }
    auto proxy = FaultProxyProcess::start(TIDEMARK_FAULT_PROXY, targets, settings_.seed);
    ASSERT_TRUE(proxy.has_value()) << proxy.error().to_string();
    proxy_ = std::move(*proxy);
  }

  void TearDown() override {
    for (Slot& slot : slots_) {
      if (slot.pid > 0) {
        kill(slot.pid, SIGCONT);
        kill(slot.pid, SIGKILL);
        waitpid(slot.pid, nullptr, 0);
      }
    }
    proxy_.reset();
    if (!scratch_.empty()) {
      if (HasFailure() || std::getenv("TIDEMARK_KEEP_SCRATCH") != nullptr) {
        std::printf("nemesis: logs kept in %s\n", scratch_.c_str());
      } else {
        fs::remove_all(scratch_);
      }
    }
  }

  // --- the servers -------------------------------------------------------------

  struct Slot {
    pid_t pid = -1;
    std::uint16_t port = 0;  // kept across restarts
    int generation = 0;
    bool up = false;
    bool paused = false;
  };

  std::vector<std::string> words_of(int i) const {
    const std::string pg =
        with_authority(postgres_url_, postgres_authority(postgres_url_), proxy_->address(2 * i));
    const std::string s3 =
        with_authority(blob_url_, s3_endpoint_authority(blob_url_), proxy_->address(2 * i + 1));
    return {"--data",
            (scratch_ / ("data-" + std::to_string(i))).string(),
            "--blob",
            with_parameter(s3, "stall_timeout=" + std::to_string(kS3StallTimeoutSeconds)),
            "--consensus",
            with_parameter(pg, "call_timeout=" + std::to_string(kPostgresCallTimeoutSeconds))};
  }

  // Starts server i (on its old port, if it had one) and waits until it
  // serves, trying again for up to 90 s: a backend may be down.
  bool start(int i) {
    const auto give_up = Clock::now() + 90s;
    std::uint16_t port;
    {
      std::lock_guard lock(mu_);
      port = slots_[i].port;
    }
    while (Clock::now() < give_up) {
      int generation;
      {
        std::lock_guard lock(mu_);
        generation = slots_[i].generation++;
      }
      const fs::path err =
          scratch_ / ("serve-" + std::to_string(i) + "-" + std::to_string(generation) + ".err");
      std::vector<std::string> words = words_of(i);
      words.insert(words.end(), {"serve", "--listen", "127.0.0.1:" + std::to_string(port),
                                 "--lease", std::to_string(kLeaseMs)});
      const pid_t pid = tidemark::testing::spawn_tidemark(words, err, "/dev/null",
                                                          tidemark::testing::ProcessGroup::kOwn);
      if (pid <= 0) return false;
      const auto started = Clock::now();
      bool exited = false;
      while (Clock::now() - started < 20s) {
        const std::string text = slurp(err);
        const auto at = text.find("serving on http://127.0.0.1:");
        if (at != std::string::npos) {
          std::lock_guard lock(mu_);
          slots_[i].pid = pid;
          slots_[i].port = static_cast<std::uint16_t>(std::stoul(text.substr(at + 28)));
          slots_[i].up = true;
          slots_[i].paused = false;
          return true;
        }
        if (waitpid(pid, nullptr, WNOHANG) == pid) {
          exited = true;
          break;
        }
        std::this_thread::sleep_for(50ms);
      }
      if (!exited) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
      log("serve-" + std::to_string(i) + " did not start (" + last_line(slurp(err)) +
          "); trying again");
      if (slurp(err).find("ddress already in use") != std::string::npos) port = 0;
      std::this_thread::sleep_for(500ms);
    }
    return false;
  }

  void kill_server(int i) {
    pid_t pid;
    {
      std::lock_guard lock(mu_);
      pid = slots_[i].pid;
      slots_[i].up = false;
      slots_[i].pid = -1;
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }

  void pause_server(int i, bool paused) {
    std::lock_guard lock(mu_);
    slots_[i].paused = paused;
    kill(slots_[i].pid, paused ? SIGSTOP : SIGCONT);
  }

  // The port of a random running server (a paused one included), or 0
  // when none runs.
  std::uint16_t pick(Random& random) {
    std::lock_guard lock(mu_);
    std::vector<std::uint16_t> ports;
    for (const Slot& slot : slots_) {
      if (slot.up) ports.push_back(slot.port);
    }
    if (ports.empty()) return 0;
    return ports[static_cast<std::size_t>(
        random.between(0, static_cast<std::int64_t>(ports.size()) - 1))];
  }

  // Servers that exited although nobody killed them: a failure each; they
  // are started again.
  void restart_servers_that_died() {
    for (int i = 0; i < kServers; ++i) {
      pid_t pid;
      {
        std::lock_guard lock(mu_);
        if (!slots_[i].up) continue;
        pid = slots_[i].pid;
      }
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) != pid) continue;
      {
        std::lock_guard lock(mu_);
        slots_[i].up = false;
        slots_[i].pid = -1;
      }
      violation("serve-" + std::to_string(i) + " (pid " + std::to_string(pid) +
                ") exited by itself: " +
                (WIFEXITED(status) ? "status " + std::to_string(WEXITSTATUS(status))
                                   : "signal " + std::to_string(WTERMSIG(status))));
      if (!start(i)) violation("serve-" + std::to_string(i) + " did not start again");
    }
  }

  static std::string last_line(const std::string& text) {
    std::size_t end = text.find_last_not_of('\n');
    if (end == std::string::npos) return "no output";
    const std::size_t begin = text.rfind('\n', end);
    return text.substr(begin == std::string::npos ? 0 : begin + 1,
                       end + 1 - (begin == std::string::npos ? 0 : begin + 1));
  }

  void log(const std::string& text) {
    std::lock_guard lock(log_mu_);
    std::printf("[%7.1f s] %s\n", std::chrono::duration<double>(Clock::now() - began_).count(),
                text.c_str());
    std::fflush(stdout);
  }

  // One line of the clients' trace (scratch/clients.log): every request
  // and what came of it, for reading a failure.
  void trace(const std::string& text) {
    const double at = std::chrono::duration<double>(Clock::now() - began_).count();
    std::lock_guard lock(log_mu_);
    if (!trace_.is_open()) trace_.open(scratch_ / "clients.log");
    char stamp[32];
    std::snprintf(stamp, sizeof stamp, "%9.3f ", at);
    trace_ << stamp << text << '\n';
  }

  static std::string describe(const HttpResult& r) {
    std::string text = to_string(r.outcome);
    if (r.status != 0) text += " " + std::to_string(r.status);
    if (!r.error.empty()) text += " (" + r.error + ")";
    if (!r.body.empty()) text += " " + r.body.substr(0, 400);
    while (!text.empty() && text.back() == '\n') text.pop_back();
    return text;
  }

  void violation(const std::string& text) {
    log("VIOLATION: " + text);
    std::lock_guard lock(observations_mu_);
    if (online_violations_.size() < 200) online_violations_.push_back(text);
  }

  // --- the nemesis -------------------------------------------------------------

  // What an action holds while it runs: a server (its process and its
  // paths), or a backend.
  enum Resource : int { kPostgres = kServers, kS3 = kServers + 1, kResources };

  bool claim(int resource) {
    std::lock_guard lock(nemesis_mu_);
    if (busy_[resource]) return false;
    busy_[resource] = true;
    return true;
  }
  void release(int resource) {
    std::lock_guard lock(nemesis_mu_);
    busy_[resource] = false;
  }
  void count_action(const std::string& name) {
    std::lock_guard lock(nemesis_mu_);
    ++actions_[name];
  }

  // How long an action lasts (the nemesis ends once the action is undone).
  static void hold(std::chrono::milliseconds d) { std::this_thread::sleep_for(d); }

  // The kinds of action, with their weights (percent).
  struct ActionKind {
    const char* name;
    int weight;
  };
  static constexpr ActionKind kActionKinds[] = {
      {"kill", 15}, {"pause", 15},     {"delay", 12}, {"drop", 8},
      {"reset", 8}, {"blackhole", 15}, {"flaky", 7},  {"restart", 20},
  };

  // A kind of action drawn by weight among those the settings allow.
  std::string draw_action(Random& random) const {
    int total = 0;
    for (const ActionKind& kind : kActionKinds) total += allowed(kind.name) ? kind.weight : 0;
    std::int64_t roll = random.between(0, total - 1);
    for (const ActionKind& kind : kActionKinds) {
      if (!allowed(kind.name)) continue;
      if (roll < kind.weight) return kind.name;
      roll -= kind.weight;
    }
    return "kill";
  }
  bool allowed(std::string_view kind) const {
    return settings_.actions.empty() || settings_.actions.contains(std::string(kind));
  }

  void run_actor(int actor) {
    Random random(settings_.seed, 1, static_cast<std::uint64_t>(actor));
    while (Clock::now() < nemesis_end_) {
      hold(random.ms(500, 3000));
      restart_servers_that_died();
      if (Clock::now() >= nemesis_end_) break;
      const std::string action = draw_action(random);
      const int server = static_cast<int>(random.between(0, kServers - 1));
      const std::string name = "serve-" + std::to_string(server);
      if (action == "kill") {
        if (!claim(server)) continue;
        const auto down = random.ms(200, 2000);
        log("SIGKILL " + name + ", start it again after " + seconds_text(down));
        kill_server(server);
        count_action("kill");
        hold(down);
        if (!start(server)) violation(name + " did not start again");
        release(server);
      } else if (action == "pause") {
        if (!claim(server)) continue;
        const auto paused = random.ms(kLeaseMs * 12 / 10, kLeaseMs * 3);
        log("SIGSTOP " + name + " for " + seconds_text(paused));
        pause_server(server, true);
        count_action("pause");
        hold(paused);
        pause_server(server, false);
        log("SIGCONT " + name);
        release(server);
      } else if (action == "restart") {
        const bool postgres = random.chance(0.5);
        const int resource = postgres ? kPostgres : kS3;
        if (!claim(resource)) continue;
        const auto down = random.ms(500, 3000);
        const char* stop =
            std::getenv(postgres ? "TIDEMARK_TEST_POSTGRES_STOP" : "TIDEMARK_TEST_S3_STOP");
        const char* start_again =
            std::getenv(postgres ? "TIDEMARK_TEST_POSTGRES_START" : "TIDEMARK_TEST_S3_START");
        log(std::string("restart ") + (postgres ? "PostgreSQL" : "s3rver") + ", down for " +
            seconds_text(down));
        if (std::system(stop) != 0) violation(std::string("could not stop: ") + stop);
        count_action(postgres ? "restart postgres" : "restart s3");
        hold(down);
        bool started = false;
        for (int attempt = 0; attempt < 5 && !started; ++attempt) {
          started = std::system(start_again) == 0;
          if (!started) std::this_thread::sleep_for(1s);
        }
        if (!started) violation(std::string("could not start again: ") + start_again);
        release(resource);
      } else {  // a fault on one server's path to one backend
        if (!claim(server)) continue;
        const bool to_postgres = random.chance(0.5);
        const std::size_t listener = static_cast<std::size_t>(2 * server + (to_postgres ? 0 : 1));
        std::string mode = action;
        std::chrono::milliseconds held = random.ms(1000, 6000);
        if (action == "delay") {
          mode += " " + std::to_string(random.between(50, 500)) + " " +
                  std::to_string(random.between(0, 200));
        } else if (action == "blackhole") {
          // Past the servers' client-side timeouts now and then.
          held = random.ms(1000, 8000);
        } else if (action == "flaky") {
          mode += " 0." + std::to_string(random.between(3, 7)) + " " +
                  std::to_string(random.next() % 1000000);
        }
        const std::string path = name + (to_postgres ? " -> postgres" : " -> s3");
        log(path + ": " + mode + " for " + seconds_text(held));
        if (auto set = proxy_->set(listener, mode); !set) violation(set.error().to_string());
        count_action(action + (to_postgres ? " postgres" : " s3"));
        hold(held);
        if (auto set = proxy_->set(listener, "pass"); !set) violation(set.error().to_string());
        log(path + ": pass");
        release(server);
      }
    }
  }

  // Everything back to normal: every path passes, no server paused or down.
  void heal() {
    if (auto set = proxy_->set_all("pass"); !set) violation(set.error().to_string());
    for (int i = 0; i < kServers; ++i) {
      bool down, paused;
      {
        std::lock_guard lock(mu_);
        down = !slots_[i].up;
        paused = slots_[i].paused;
      }
      if (paused) pause_server(i, false);
      if (down && !start(i))
        violation("serve-" + std::to_string(i) + " did not start when healing");
    }
  }

  // --- the clients -------------------------------------------------------------

  std::string shard_path() const { return "/v1/shards/" + shard_; }

  // The shard's upper as a random server says, or nullopt.
  std::optional<nm::Time> read_upper(Random& random) {
    const std::uint16_t port = pick(random);
    if (port == 0) return std::nullopt;
    HttpResult r = http_request(port, "GET", shard_path(), "", {}, 5s);
    counters_.count(r);
    if (r.outcome != HttpOutcome::kAnswered || r.status != 200) return std::nullopt;
    auto upper = nm::integer_field(r.body, "upper");
    if (!upper || *upper < 0) {
      violation("the shard's upper is not a time: " + r.body);
      return std::nullopt;
    }
    return static_cast<nm::Time>(*upper);
  }

  void run_producer(int index) {
    Random random(settings_.seed, 2, static_cast<std::uint64_t>(index));
    const std::string id = "nemesis-producer-" + std::to_string(index);
    const std::string prefix = "p" + std::to_string(index) + "-";
    std::uint64_t next = 0;
    while (!stop_writing_) {
      const int count = static_cast<int>(random.between(1, 4));
      std::string body;
      for (int k = 0; k < count; ++k) {
        const std::string n = std::to_string(next + static_cast<std::uint64_t>(k));
        body += "{\"key\":\"" + prefix + n + "\",\"value\":" + n + "}\n";
      }
      {
        std::lock_guard lock(observations_mu_);
        observations_.producers[index].sent = next + static_cast<std::uint64_t>(count);
      }
      const std::map<std::string, std::string> headers = {
          {"Tidemark-Producer", id}, {"Tidemark-Sequence", std::to_string(next)}};
      bool acked = false;
      while (!acked && Clock::now() < drain_end_.load()) {
        const std::uint16_t port = pick(random);
        if (port == 0) {
          std::this_thread::sleep_for(100ms);
          continue;
        }
        const auto sent_at = Clock::now();
        HttpResult r =
            http_request(port, "POST", shard_path() + "/append", body, headers, kRequestTimeout);
        counters_.count(r);
        trace(id + " " + std::to_string(next) + ".." +
              std::to_string(next + static_cast<std::uint64_t>(count) - 1) +
              " to :" + std::to_string(port) + " sent at " + seconds_text(sent_at - began_) + ": " +
              describe(r));
        if (r.outcome == HttpOutcome::kAnswered && r.status == 200) {
          // "sequence" echoes the body's first number.
          const auto sequence = nm::integer_field(r.body, "sequence");
          const auto duplicates = nm::integer_field(r.body, "duplicates");
          if (sequence != static_cast<std::int64_t>(next) || !duplicates || *duplicates < 0 ||
              *duplicates > count) {
            violation("producer " + id + " sent " + std::to_string(next) + ".." +
                      std::to_string(next + static_cast<std::uint64_t>(count) - 1) +
                      " and was answered " + r.body);
          }
          counters_.duplicates += duplicates.value_or(0);
          acked = true;
          break;
        }
        if (r.outcome == HttpOutcome::kAnswered && r.status < 500) {
          // 409 (expected_sequence): the shard lost what it acknowledged,
          // or never had it; any other 4xx is a bug too. This producer stops.
          violation("producer " + id + " request from " + std::to_string(next) + " answered " +
                    std::to_string(r.status) + ": " + r.body);
          return;
        }
        ++counters_.retries;
        std::this_thread::sleep_for(random.ms(50, 300));
      }
      if (!acked) return;
      next += static_cast<std::uint64_t>(count);
      {
        std::lock_guard lock(observations_mu_);
        observations_.producers[index].acked = next;
      }
      std::this_thread::sleep_for(random.ms(20, 200));
    }
  }

  void run_explicit_writer(int index) {
    Random random(settings_.seed, 3, static_cast<std::uint64_t>(index));
    for (int n = 0; !stop_writing_; ++n) {
      std::this_thread::sleep_for(random.ms(50, 300));
      auto upper = read_upper(random);
      const std::uint16_t port = pick(random);
      if (!upper || port == 0) continue;
      const std::string key = "x" + std::to_string(index) + "-" + std::to_string(n);
      const std::string at = std::to_string(*upper);
      HttpResult r = http_request(
          port, "POST",
          shard_path() + "/append?lower=" + at + "&upper=" + std::to_string(*upper + 1),
          "{\"key\":\"" + key + "\",\"value\":" + std::to_string(n) + ",\"time\":" + at + "}\n", {},
          kRequestTimeout);
      counters_.count(r);
      trace("explicit " + key + " at " + at + " to :" + std::to_string(port) + ": " + describe(r));
      nm::ExplicitAttempt attempt{.key = key, .at = *upper};
      if (r.outcome == HttpOutcome::kAnswered && r.status == 200) {
        attempt.outcome = nm::ExplicitAttempt::Outcome::kWon;
        if (nm::integer_field(r.body, "lower") != static_cast<std::int64_t>(*upper)) {
          violation("explicit append at " + at + " answered " + r.body);
        }
      } else if (r.outcome == HttpOutcome::kAnswered && r.status == 409) {
        attempt.outcome = nm::ExplicitAttempt::Outcome::kLost;
      } else if (r.outcome == HttpOutcome::kAnswered && r.status < 500) {
        violation("explicit append at " + at + " answered " + std::to_string(r.status) + ": " +
                  r.body);
      }
      std::lock_guard lock(observations_mu_);
      observations_.explicits.push_back(std::move(attempt));
    }
  }

  void run_group_writer(int index) {
    Random random(settings_.seed, 4, static_cast<std::uint64_t>(index));
    for (int n = 0; !stop_writing_; ++n) {
      std::this_thread::sleep_for(random.ms(50, 300));
      const std::uint16_t port = pick(random);
      if (port == 0) continue;
      nm::GroupAttempt attempt;
      std::string body;
      for (int k = 0; k < 3; ++k) {
        attempt.keys.push_back("g" + std::to_string(index) + "-" + std::to_string(n) + "-" +
                               std::to_string(k));
        body += "{\"key\":\"" + attempt.keys.back() + "\",\"value\":" + std::to_string(n) + "}\n";
      }
      HttpResult r =
          http_request(port, "POST", shard_path() + "/append", body, {}, kRequestTimeout);
      counters_.count(r);
      trace("group " + attempt.keys.front() + " to :" + std::to_string(port) + ": " + describe(r));
      attempt.acked = r.outcome == HttpOutcome::kAnswered && r.status == 200;
      if (r.outcome == HttpOutcome::kAnswered && r.status != 200 && r.status < 500) {
        violation("append without a producer answered " + std::to_string(r.status) + ": " + r.body);
      }
      std::lock_guard lock(observations_mu_);
      observations_.groups.push_back(std::move(attempt));
    }
  }

  // A whole snapshot at `as_of`, resumed as often as needed, from random
  // servers or from `server` alone, or nullopt when `keep_going` says to
  // stop first.
  template <typename KeepGoing>
  std::optional<nm::SnapshotObservation> take_snapshot(Random& random, nm::Time as_of,
                                                       KeepGoing keep_going,
                                                       std::optional<int> server = std::nullopt) {
    nm::SnapshotFollower follower(as_of);
    std::string query = follower.query();
    while (keep_going()) {
      std::uint16_t port = 0;
      if (server) {
        std::lock_guard lock(mu_);
        port = slots_[*server].port;
      } else {
        port = pick(random);
      }
      if (port == 0) {
        std::this_thread::sleep_for(100ms);
        continue;
      }
      bool error_line = false;
      HttpResult r = http_stream(port, shard_path() + "/snapshot?" + query, kStreamIdleTimeout,
                                 [&](std::string_view line) {
                                   if (follower.feed(line) == nm::LineKind::kError)
                                     error_line = true;
                                   return true;
                                 });
      counters_.count(r);
      if (r.status == 200 && error_line) {
        ++counters_.snapshot_resumes_error;
        query = follower.resume_after_error();
        continue;
      }
      if (r.status == 200 && r.outcome == HttpOutcome::kAnswered) return follower.observation();
      if (r.status == 200) {
        ++counters_.snapshot_resumes_break;
        query = follower.resume_after_break();
        continue;
      }
      if (r.outcome == HttpOutcome::kAnswered && r.status != 503) {
        violation("snapshot?" + query + " answered " + std::to_string(r.status) + ": " + r.body);
        return std::nullopt;
      }
      std::this_thread::sleep_for(random.ms(50, 300));
    }
    return std::nullopt;
  }

  // A listen from `from` until `until`, resumed as often as needed, until
  // its progress reaches `until` or `keep_going` says to stop (then it is
  // cut at its last progress).
  template <typename KeepGoing>
  nm::ListenObservation follow_listen(Random& random, nm::Time from, nm::Time until,
                                      KeepGoing keep_going) {
    nm::ListenFollower follower(from, until);
    std::string query = follower.query();
    while (!follower.done()) {
      if (!keep_going()) {
        follower.cut_at_last_progress();
        break;
      }
      const std::uint16_t port = pick(random);
      if (port == 0) {
        std::this_thread::sleep_for(100ms);
        continue;
      }
      bool error_line = false;
      HttpResult r = http_stream(port, shard_path() + "/listen?" + query, kStreamIdleTimeout,
                                 [&](std::string_view line) {
                                   if (follower.feed(line) == nm::LineKind::kError)
                                     error_line = true;
                                   return keep_going();
                                 });
      counters_.count(r);
      if (follower.done()) break;
      if (r.outcome == HttpOutcome::kStoppedEarly) continue;  // keep_going() ends it above
      if (r.status == 200 && error_line) {
        ++counters_.listen_resumes_error;
        query = follower.resume_after_error();
        continue;
      }
      if (r.status == 200 && r.outcome == HttpOutcome::kAnswered) {
        violation("listen?" + query + " ended before until, without an error line");
        follower.cut_at_last_progress();
        break;
      }
      if (r.status == 200) {
        ++counters_.listen_resumes_break;
        query = follower.resume_after_break();
        continue;
      }
      if (r.outcome == HttpOutcome::kAnswered && r.status != 503) {
        violation("listen?" + query + " answered " + std::to_string(r.status) + ": " + r.body);
        follower.cut_at_last_progress();
        break;
      }
      std::this_thread::sleep_for(random.ms(50, 300));
    }
    return std::move(follower.observation());
  }

  std::size_t record_snapshot(nm::SnapshotObservation snapshot) {
    std::lock_guard lock(observations_mu_);
    observations_.snapshots.push_back(std::move(snapshot));
    return observations_.snapshots.size() - 1;
  }

  void run_reader(int index) {
    Random random(settings_.seed, 5, static_cast<std::uint64_t>(index));
    const auto keep_going = [this] { return !stop_reading_.load(); };
    while (!stop_reading_) {
      std::this_thread::sleep_for(random.ms(100, 500));
      auto upper = read_upper(random);
      if (!upper || *upper < 2) continue;
      // Now and then a snapshot at any earlier time.
      if (random.chance(0.3)) {
        if (auto s = take_snapshot(
                random,
                static_cast<nm::Time>(random.between(0, static_cast<std::int64_t>(*upper) - 1)),
                keep_going)) {
          record_snapshot(std::move(*s));
        }
      }
      // A listen from the latest time or up to 5 s before it, a few
      // seconds ahead, with snapshots where it starts and at some of the
      // frontiers it passes.
      const nm::Time from =
          random.chance(0.5)
              ? *upper - 1
              : *upper - 1 -
                    std::min<nm::Time>(*upper - 1, static_cast<nm::Time>(random.between(0, 5000)));
      const nm::Time until = *upper + static_cast<nm::Time>(random.between(1000, 4000));
      auto at_from = take_snapshot(random, from, keep_going);
      if (!at_from) break;
      nm::ListenObservation listen = follow_listen(random, from, until, keep_going);
      listen.snapshot_at_from = record_snapshot(std::move(*at_from));
      std::vector<nm::Time> frontiers;
      if (!listen.progress.empty()) {
        frontiers.push_back(listen.progress.back().first);
        frontiers.push_back(listen
                                .progress[static_cast<std::size_t>(random.between(
                                    0, static_cast<std::int64_t>(listen.progress.size()) - 1))]
                                .first);
      }
      for (nm::Time progress : frontiers) {
        if (progress == 0) continue;
        if (auto s = take_snapshot(random, progress - 1, keep_going)) {
          listen.snapshots_at_progress.emplace_back(progress, record_snapshot(std::move(*s)));
        }
      }
      std::lock_guard lock(observations_mu_);
      observations_.listens.push_back(std::move(listen));
    }
  }

  Settings settings_;
  std::string shard_, postgres_url_, blob_url_;
  fs::path scratch_;
  std::unique_ptr<FaultProxyProcess> proxy_;
  const Clock::time_point began_ = Clock::now();
  Clock::time_point nemesis_end_;

  std::mutex mu_;
  Slot slots_[kServers];  // guarded by mu_

  std::mutex nemesis_mu_;
  bool busy_[kResources] = {};          // guarded by nemesis_mu_
  std::map<std::string, int> actions_;  // guarded by nemesis_mu_

  std::mutex log_mu_;
  std::ofstream trace_;  // guarded by log_mu_

  std::mutex observations_mu_;
  nm::Observations observations_;               // guarded by observations_mu_
  std::vector<std::string> online_violations_;  // guarded by observations_mu_

  Counters counters_;
  std::atomic<bool> stop_writing_{false}, stop_reading_{false};
  std::atomic<Clock::time_point> drain_end_{Clock::time_point::max()};
};

TEST_F(NemesisTest, ThreeServersOnOneShardUnderANemesis) {
  for (int i = 0; i < kServers; ++i) {
    ASSERT_TRUE(start(i)) << "serve-" << i;
    log("serve-" + std::to_string(i) + " serves on port " + std::to_string(slots_[i].port));
  }
  const std::uint16_t first = slots_[0].port;
  HttpResult created = http_request(first, "POST", "/v1/shards", "{\"name\":\"" + shard_ + "\"}");
  ASSERT_EQ(created.status, 201u) << created.body << created.error;
  // A first record at a managed time, so that the upper is past 0 and a
  // listen from 0 sees every record.
  HttpResult genesis =
      http_request(first, "POST", shard_path() + "/append", "{\"key\":\"genesis\",\"value\":0}\n");
  ASSERT_EQ(genesis.status, 200u) << genesis.body << genesis.error;
  observations_.other_sent.insert("genesis");
  for (int p = 0; p < settings_.producers; ++p) {
    nm::ProducerLog producer;
    producer.id = "nemesis-producer-" + std::to_string(p);
    producer.key_prefix = "p" + std::to_string(p) + "-";
    observations_.producers.push_back(std::move(producer));
  }

  std::vector<std::thread> writers, readers, actors;
  for (int i = 0; i < settings_.producers; ++i)
    writers.emplace_back([this, i] { run_producer(i); });
  for (int i = 0; i < settings_.explicit_writers; ++i) {
    writers.emplace_back([this, i] { run_explicit_writer(i); });
  }
  for (int i = 0; i < settings_.group_writers; ++i)
    writers.emplace_back([this, i] { run_group_writer(i); });
  for (int i = 0; i < settings_.readers; ++i) readers.emplace_back([this, i] { run_reader(i); });

  nemesis_end_ = Clock::now() + settings_.duration;
  for (int a = 0; a < settings_.actors; ++a) actors.emplace_back([this, a] { run_actor(a); });
  for (auto& actor : actors) actor.join();

  // Heal, let the servers settle, let the producers finish the request
  // they were retrying, then stop the clients.
  log("the nemesis is over: healing");
  heal();
  restart_servers_that_died();
  Random settle(settings_.seed, 6, 0);
  for (int i = 0; i < kServers; ++i) {
    const auto give_up = Clock::now() + 120s;
    bool serving = false;
    while (!serving && Clock::now() < give_up) {
      HttpResult r = http_request(slots_[i].port, "GET", shard_path(), "", {}, 5s);
      serving = r.outcome == HttpOutcome::kAnswered && r.status == 200;
      if (!serving) std::this_thread::sleep_for(500ms);
    }
    EXPECT_TRUE(serving) << "serve-" << i << " does not answer after healing";
  }
  std::this_thread::sleep_for(3s);
  drain_end_ = Clock::now() + 60s;
  stop_writing_ = true;
  for (auto& writer : writers) writer.join();
  stop_reading_ = true;
  for (auto& reader : readers) reader.join();
  log("clients stopped");

  // The final upper, once no server moves it any more (a request that timed
  // out may still commit on the server that had it).
  std::optional<nm::Time> final_upper;
  for (int round = 0; round < 20; ++round) {
    std::set<nm::Time> uppers;
    for (int i = 0; i < kServers; ++i) {
      HttpResult r = http_request(slots_[i].port, "GET", shard_path(), "", {}, 10s);
      if (auto upper = nm::integer_field(r.body, "upper"); r.status == 200 && upper)
        uppers.insert(static_cast<nm::Time>(*upper));
    }
    if (uppers.size() == 1 && final_upper == *uppers.begin()) break;
    final_upper = uppers.size() == 1 ? std::optional(*uppers.begin()) : std::nullopt;
    std::this_thread::sleep_for(3s);
  }
  ASSERT_TRUE(final_upper.has_value()) << "the servers do not agree on the upper";

  // The history: a listen from 0 to the final upper.
  const auto read_deadline = Clock::now() + 300s;
  const auto in_time = [&] { return Clock::now() < read_deadline; };
  nm::ListenObservation history = follow_listen(settle, 0, *final_upper, in_time);
  ASSERT_FALSE(history.progress.empty());
  ASSERT_EQ(history.progress.back().first, *final_upper) << "the history was not read to its end";
  for (const std::string& problem : history.problems)
    ADD_FAILURE() << "the history's listen: " << problem;
  // Each server's snapshot at the end.
  for (int i = 0; i < kServers; ++i) {
    auto snapshot = take_snapshot(settle, *final_upper - 1, in_time, i);
    ASSERT_TRUE(snapshot.has_value()) << "no snapshot from serve-" << i;
    record_snapshot(std::move(*snapshot));
  }
  // What each producer's last committed number is, as the shard says.
  for (nm::ProducerLog& producer : observations_.producers) {
    HttpResult r;
    for (int attempt = 0; attempt < 10 && r.status != 200; ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(1s);
      r = http_request(slots_[attempt % kServers].port, "GET",
                       shard_path() + "/producers/" + producer.id);
    }
    ASSERT_EQ(r.status, 200u) << r.body << r.error;
    producer.committed_sequence = nm::integer_field(r.body, "sequence").value_or(-1);
  }

  const nm::History checked(history.updates);
  const nm::Verdict verdict = nm::check_history(observations_, checked);

  // The report.
  std::printf("\nnemesis report (seed %llu, %lld s)\n",
              static_cast<unsigned long long>(settings_.seed),
              static_cast<long long>(settings_.duration.count()));
  std::printf("  actions:");
  for (const auto& [name, count] : actions_) std::printf(" %s %d;", name.c_str(), count);
  std::printf("\n  proxy:");
  for (std::size_t listener = 0; listener < 2 * kServers; ++listener) {
    auto stats = proxy_->stats(listener);
    if (!stats) continue;
    std::printf(" serve-%zu->%s accepted %llu reset %llu dropped %llu;", listener / 2,
                listener % 2 == 0 ? "pg" : "s3", static_cast<unsigned long long>(stats->accepted),
                static_cast<unsigned long long>(stats->reset),
                static_cast<unsigned long long>(stats->dropped));
  }
  std::printf(
      "\n  requests %ld: 200 %ld, 409 %ld, 503 %ld, other %ld, timed out %ld, refused %ld, "
      "broken %ld; producer retries %ld, duplicates reported %ld\n",
      counters_.requests.load(), counters_.ok.load(), counters_.conflicts.load(),
      counters_.unavailable.load(), counters_.other_status.load(), counters_.timed_out.load(),
      counters_.refused.load(), counters_.broken.load(), counters_.retries.load(),
      counters_.duplicates.load());
  std::printf(
      "  resumes: snapshots %ld after an error line, %ld after a break; listens %ld after an "
      "error line, %ld after a break\n",
      counters_.snapshot_resumes_error.load(), counters_.snapshot_resumes_break.load(),
      counters_.listen_resumes_error.load(), counters_.listen_resumes_break.load());
  std::uint64_t producer_acked = 0, producer_sent = 0;
  for (const nm::ProducerLog& p : observations_.producers) {
    producer_acked += p.acked;
    producer_sent += p.sent;
  }
  std::printf(
      "  history: %zu records up to %llu; producers %llu sent, %llu acknowledged, %zu present "
      "(%zu unacknowledged); explicit %zu won, %zu lost, %zu unknown (%zu present); without a "
      "producer %zu acknowledged, %zu unknown (%zu present)\n",
      verdict.records, static_cast<unsigned long long>(*final_upper),
      static_cast<unsigned long long>(producer_sent),
      static_cast<unsigned long long>(producer_acked), verdict.producer_records,
      verdict.producer_unacked_present, verdict.explicit_won, verdict.explicit_lost,
      verdict.explicit_unknown, verdict.explicit_unknown_present, verdict.groups_acked,
      verdict.groups_unknown, verdict.groups_unknown_present);
  std::printf(
      "  checked: %zu snapshots, %zu listens at %zu frontiers, %zu listen/snapshot pairs; %zu "
      "violations, %zu seen online\n",
      verdict.snapshots_checked, verdict.listens_checked, verdict.listen_frontiers_checked,
      verdict.snapshot_pairs_checked, verdict.violations.size(), online_violations_.size());
  std::fflush(stdout);

  for (const std::string& v : online_violations_) ADD_FAILURE() << v;
  for (const std::string& v : verdict.violations) ADD_FAILURE() << v;
  for (const nm::ProducerLog& p : observations_.producers) {
    EXPECT_GT(p.acked, 0u) << p.id << " never got an answer";
  }
  EXPECT_GT(verdict.listen_frontiers_checked, 0u);

  // Each server stops cleanly (SIGTERM), within its grace period.
  for (int i = 0; i < kServers; ++i) kill(slots_[i].pid, SIGTERM);
  for (int i = 0; i < kServers; ++i) {
    int status = 0;
    bool exited = false;
    for (int wait = 0; wait < 300 && !exited; ++wait) {
      exited = waitpid(slots_[i].pid, &status, WNOHANG) == slots_[i].pid;
      if (!exited) std::this_thread::sleep_for(100ms);
    }
    const fs::path err = scratch_ / ("serve-" + std::to_string(i) + "-" +
                                     std::to_string(slots_[i].generation - 1) + ".err");
    EXPECT_TRUE(exited) << "serve-" << i << " did not stop within 30 s of SIGTERM";
    if (!exited) continue;  // TearDown kills it
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "serve-" << i << ": " << last_line(slurp(err));
    slots_[i].pid = -1;
  }
}

}  // namespace
