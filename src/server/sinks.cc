#include "server/sinks.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <set>
#include <thread>
#include <tuple>

#include "crypto/digest.h"
#include "server/metrics.h"
#include "shard/state.h"
#include "sink/destination_url.h"
#include "sink/sink_status.h"
#include "tidemark/read.h"
#include "tidemark/retry.h"
#include "tidemark/sink.h"
#include "util/cancel.h"
#include "util/clock.h"
#include "util/json.h"
#include "util/log.h"
#include "util/process_identity.h"
#include "util/try.h"

namespace tidemark {
namespace {

constexpr std::string_view kSpecPrefix = "server/sinks/";

// How often an idle sink reads its shard's upper itself: a fallback, as
// its subscription wakes it on every change.
constexpr std::chrono::milliseconds kIdlePollFallback{30'000};

// A definition's key: "server/sinks/<name>" as created (revision 0),
// "server/sink-revisions/<name>/<revision>" once updated (a blob key cannot
// hold a separator that a name cannot, so updates have their own prefix;
// one listing of kDefinitionsPrefix reads both). A key never changes once
// written, so a listing tells every server of an update, and a definition
// read once per key may be kept.
constexpr std::string_view kRevisionPrefix = "server/sink-revisions/";
constexpr std::string_view kDefinitionsPrefix = "server/sink";

std::string spec_key(const std::string& name, std::uint64_t revision = 0) {
  if (revision == 0) return std::string(kSpecPrefix) + name;
  return std::string(kRevisionPrefix) + name + "/" + std::to_string(revision);
}

struct SpecKey {
  std::string name;
  std::uint64_t revision = 0;
};

// The name and revision of a listed key; nullopt for another shape.
std::optional<SpecKey> parse_spec_key(std::string_view key) {
  if (key.starts_with(kSpecPrefix)) {
    key.remove_prefix(kSpecPrefix.size());
    if (key.empty() || key.find('/') != std::string_view::npos) return std::nullopt;
    return SpecKey{std::string(key), 0};
  }
  if (!key.starts_with(kRevisionPrefix)) return std::nullopt;
  key.remove_prefix(kRevisionPrefix.size());
  const auto slash = key.find('/');
  if (slash == 0 || slash == std::string_view::npos) return std::nullopt;
  const std::string_view digits = key.substr(slash + 1);
  if (digits.empty() || digits.size() > 19 || digits[0] == '0' ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return SpecKey{std::string(key.substr(0, slash)), std::stoull(std::string(digits))};
}

// Of listed keys: each name's latest key, and the keys those supersede (an
// update writes the next revision, then removes the one before; a crash in
// between leaves it, and a later look removes it).
struct LatestKeys {
  std::map<std::string, SpecKey> latest;  // by name
  std::vector<std::string> superseded;
};

LatestKeys latest_keys(const std::vector<std::string>& keys) {
  LatestKeys out;
  for (const std::string& key : keys) {
    auto parsed = parse_spec_key(key);
    if (!parsed) continue;
    auto [it, inserted] = out.latest.try_emplace(parsed->name, *parsed);
    if (inserted) continue;
    if (parsed->revision > it->second.revision) {
      out.superseded.push_back(spec_key(it->second.name, it->second.revision));
      it->second = *parsed;
    } else {
      out.superseded.push_back(key);
    }
  }
  return out;
}

// Every stored revision's key of `name` (two listings: other names may
// start with it, and are left out).
Result<std::vector<std::string>> keys_of(Blob& blob, const std::string& name) {
  std::vector<std::string> keys;
  for (const std::string& prefix : {spec_key(name), std::string(kRevisionPrefix) + name + "/"}) {
    TM_TRY(blob.list(prefix, [&](std::string_view key, std::uint64_t) {
      if (auto parsed = parse_spec_key(key); parsed && parsed->name == name) keys.emplace_back(key);
    }));
  }
  return keys;
}

void append_optional_string(std::string* out, const std::optional<std::string>& text) {
  if (text) {
    append_json_string(out, *text);
  } else {
    out->append("null");
  }
}

// One sink's answer: its definition, then "status", "frontier", "upper",
// "lag" (upper - frontier), "error", "runner" (who runs it: "tidemark serve
// on HOST:PORT"), "runner_server" (its server id) and "reported_at" (when
// the answer is the runner's report read from the shared backends: when
// it wrote it; null when this server runs the sink and answers live).
std::string sink_json(const SinkSpec& spec, const std::string& status,
                      const std::optional<Frontier>& frontier, const std::optional<Frontier>& upper,
                      const std::optional<std::string>& error,
                      const std::optional<std::string>& runner,
                      const std::optional<std::string>& runner_server,
                      std::optional<std::uint64_t> reported_at_ms) {
  std::string out = spec.to_json();
  out.pop_back();
  out += ",\"revision\":" + std::to_string(spec.revision);
  out += ",\"status\":";
  append_json_string(&out, status);
  out += ",\"frontier\":";
  out += frontier ? frontier->to_json() : "null";
  out += ",\"upper\":";
  out += upper ? upper->to_json() : "null";
  out += ",\"lag\":";
  if (upper && frontier && !upper->is_closed() && !frontier->is_closed()) {
    out += std::to_string(upper->time() > frontier->time() ? upper->time() - frontier->time() : 0);
  } else if (upper && frontier && frontier->is_closed()) {
    out += "0";
  } else {
    out += "null";
  }
  out += ",\"error\":";
  append_optional_string(&out, error);
  out += ",\"runner\":";
  append_optional_string(&out, runner && !runner->empty() ? runner : std::nullopt);
  out += ",\"runner_server\":";
  append_optional_string(&out,
                         runner_server && !runner_server->empty() ? runner_server : std::nullopt);
  out += ",\"reported_at\":";
  if (reported_at_ms) {
    append_json_string(&out, format_utc(*reported_at_ms));
  } else {
    out += "null";
  }
  return out + "}";
}

}  // namespace

struct SinkManager::Task {
  SinkSpec spec;
  std::atomic<bool> stop{false};
  // Set once another runner holds the sink (it took the lease over after
  // this server stopped renewing it): the task ends without a report (the
  // new runner's stands) and the next reconcile drops it.
  std::atomic<bool> moved{false};
  // Raised once the sink must stop now: its destination's calls give up.
  const std::shared_ptr<Cancellation> cancel = std::make_shared<Cancellation>();
  mutable std::mutex mutex;
  std::condition_variable wake;
  bool finished = false;            // guarded by mutex: its last step has returned
  std::optional<Timers::Id> timer;  // guarded by mutex; none once finished
  std::string status = "starting";
  std::optional<Frontier> frontier;
  std::optional<std::string> error;
  std::optional<std::string> logged_failure;  // the last failure logged
  std::shared_ptr<Shard> shard;
  // Held from the sink's start (or its first run, when resumed) until it
  // stops; used by its steps only once started.
  std::shared_ptr<SinkClaim> claim;
  DestinationAllowList allowed;
  std::chrono::milliseconds idle_close{0};
  std::uint64_t snapshot_part_bytes = SinkOptions{}.snapshot_part_bytes;
  // What every server sharing the location shows of it (sink_status.h).
  std::shared_ptr<SinkStatusPublisher> publisher;
  // Used by its steps only (one at a time): the run in progress, if any,
  // and its subscription to the shard's changes, which wakes the sink.
  std::unique_ptr<SinkDestination> destination;
  std::unique_ptr<SinkRun> run;
  Subscription changes;
  // Set while the run is closed for being idle (see park()): everything
  // below `parked_at` is committed, and the subscription still wakes it.
  // Written by its steps; read by the metrics too.
  std::atomic<bool> parked{false};
  Frontier parked_at;
  // What a change wakes: the timers' task (null once the run is dropped,
  // so that no wake reaches timers that may be gone).
  struct Waker {
    std::mutex mutex;
    Timers* timers = nullptr;
    Timers::Id id = 0;
    void wake() {
      std::lock_guard lock(mutex);
      if (timers) timers->wake(id);
    }
  };
  const std::shared_ptr<Waker> waker = std::make_shared<Waker>();

  void set(std::string s, std::optional<std::string> e = std::nullopt) {
    {
      std::lock_guard lock(mutex);
      log_change(s, e);
      status = s;
      error = e;
    }
    if (publisher) (void)publisher->set_status(std::move(s), std::move(e));
  }

  // The server's log line for a change of status (util/log.h): running,
  // done and stopped at info, a failure at warn (once per distinct error:
  // a sink retrying the same failure does not fill the log).
  // REQUIRES: mutex held.
  void log_change(const std::string& next, const std::optional<std::string>& next_error) {
    if (next == "starting" || (next == status && next_error == error)) return;
    if (next == "failed") {
      if (logged_failure == next_error) return;
      logged_failure = next_error;
    } else {
      logged_failure.reset();
    }
    std::string line = "sink " + spec.name + " of shard " + spec.shard + ": " + next;
    if (next == "running" && frontier) line += " from frontier " + frontier->to_string();
    if (next_error) line += ": " + *next_error;
    log_line(next == "failed" ? LogLevel::kWarn : LogLevel::kInfo, line);
  }

  // What the destination is retrying by itself (a broker it cannot reach):
  // shown as the error while the sink starts or runs, until the next
  // commit (or the run's end) replaces it.
  // Called from the destination's threads: published by the next flush.
  void note_trouble(const std::string& what) {
    std::lock_guard lock(mutex);
    if (status == "starting" || status == "running") {
      error = what + " (retrying)";
      if (publisher) publisher->stage_status(status, error);
    }
  }

  // The shard this sink reads, once a run has opened it.
  std::shared_ptr<Shard> opened_shard() const {
    std::lock_guard lock(mutex);
    return shard;
  }

  // `upper`: the shard's, when known; the lag is upper - frontier.
  std::string to_json(std::optional<Frontier> upper, const SinkRunner& runner) const {
    std::lock_guard lock(mutex);
    return sink_json(spec, status, frontier, upper, error, runner.label, runner.owner,
                     std::nullopt);
  }

  void mark_finished() {
    {
      std::lock_guard lock(mutex);
      finished = true;
      timer.reset();
    }
    wake.notify_all();
  }

  // Stops the sink: asks it to (it commits what it has written) and waits
  // up to `deadline`, then cancels its destination's calls (join() then
  // waits about a second at most).
  // Only a running sink has output to commit: one still starting (opening
  // its destination) or failed is cancelled at once.
  void stop_by(Timers& timers, std::chrono::steady_clock::time_point deadline) {
    stop = true;
    std::unique_lock lock(mutex);
    if (timer) timers.wake(*timer);  // a waiting sink steps at once, and ends
    if (status == "running") wake.wait_until(lock, deadline, [&] { return finished; });
    lock.unlock();
    cancel->cancel();
  }

  void join() {
    std::unique_lock lock(mutex);
    wake.wait(lock, [&] { return finished; });
  }

  // One step of the sink, on a pool thread: starts a run if none is in
  // progress, then steps it. Returns when to step again, or nullopt once
  // the sink has ended (stopped, or done: the shard closed). A failure
  // drops the run (what it wrote since its last commit is not committed)
  // and starts a new one after kRetryInterval.
  std::optional<std::chrono::milliseconds> step(const std::shared_ptr<Client>& client,
                                                const std::shared_ptr<MemoryPool>& pool,
                                                const SinkRunner& runner, Timers& timers) {
    if (stop) return end();
    if (!run) {
      if (parked) {
        // Woken by a change or the fallback poll: reopened only when the
        // shard has something past what is committed. A failure to read
        // the upper is left to the run's reads, which retry and report.
        auto upper = shard->upper();
        if (upper && *upper <= parked_at) {
          return std::chrono::duration_cast<std::chrono::milliseconds>(kIdlePollFallback);
        }
      } else {
        set("starting");
      }
      if (auto started = start_run(client, pool, runner, timers); !started) {
        return failed(started.error());
      }
      parked = false;
      set("running");
    }
    auto next = run->step();
    if (!next) return failed(next.error());
    if (!*next) {
      drop_run();
      claim.reset();
      set("done");
      return std::nullopt;
    }
    if (stop) return std::chrono::milliseconds(0);  // the next step ends it
    if (auto since = run->idle_since(); since && idle_close.count() > 0) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(
          *since + idle_close - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        park();
        return std::chrono::duration_cast<std::chrono::milliseconds>(kIdlePollFallback);
      }
      return std::min(**next, left);
    }
    return **next;
  }

  // Closes an idle run's destination (a Kafka producer's threads and
  // queue, an S3 part's buffer go back) and keeps what wakes it: the claim,
  // the critical reader's hold (durable) and the subscription. Everything
  // written is committed, so the next run resumes exactly where this one
  // ended.
  void park() {
    parked_at = run->progress().frontier;
    parked = true;
    run.reset();
    destination.reset();
  }

  std::optional<std::chrono::milliseconds> failed(const Error& error) {
    drop_run();
    if (stop) return end();
    if (error.is(ErrorKind::kHeld)) return moved_away(error);
    set("failed", error.message);
    return std::chrono::duration_cast<std::chrono::milliseconds>(kRetryInterval);
  }

  // Another runner holds the sink now (or its directory): this server lets
  // go of what it still holds (a destination lease, a directory lock) and
  // ends the task, publishing nothing: the sink's report is the new
  // runner's.
  std::optional<std::chrono::milliseconds> moved_away(const Error& error) {
    claim.reset();
    moved = true;
    {
      std::lock_guard lock(mutex);
      status = "moved";
      this->error = error.message;
    }
    log_line(LogLevel::kInfo, "sink " + spec.name + " of shard " + spec.shard + ": " +
                                  error.message + "; no longer run here");
    return std::nullopt;
  }

  // A stopped sink commits what it has written, unless it was cancelled
  // (deleted, or past the shutdown grace).
  std::optional<std::chrono::milliseconds> end() {
    if (run && !cancel->cancelled()) (void)run->finish();
    drop_run();
    claim.reset();  // released: a restarted server takes it back at once
    set("stopped");
    return std::nullopt;
  }

  void drop_run() {
    {
      std::lock_guard lock(waker->mutex);
      waker->timers = nullptr;
    }
    changes.reset();
    parked = false;
    run.reset();
    destination.reset();
  }

  Status start_run(const std::shared_ptr<Client>& client, const std::shared_ptr<MemoryPool>& pool,
                   const SinkRunner& runner, Timers& timers) {
    TM_ASSIGN(auto opened, client->open_shard(spec.shard));
    {
      std::lock_guard lock(mutex);
      shard = opened;
    }
    // Before the run's first read of the upper: every change after it wakes
    // this sink's task at once (or within the Client's change poll when
    // another process made it), so its own polls are only a fallback.
    if (!parked) {
      {
        std::lock_guard lock(mutex);
        std::lock_guard wake_lock(waker->mutex);
        waker->timers = &timers;
        waker->id = timer.value_or(0);
      }
      TM_ASSIGN(changes, opened->subscribe([waker = waker] { waker->wake(); }));
    }
    TM_ASSIGN(SinkUrl url, parse_sink_url(spec.to, spec.format));
    // Checked on every run, so a stored sink whose destination the server
    // no longer allows fails (and says why) instead of reaching it.
    TM_TRY(allowed.check(url));
    // A claim taken over (after its leases went unrenewed) is claimed
    // again, or this run fails naming the new holder. One that only could
    // not be checked is kept: its leases renew once the Consensus is back.
    if (claim) {
      if (auto held = claim->check(); !held) {
        if (!held.error().is(ErrorKind::kHeld)) return std::unexpected(held.error());
        claim.reset();
      }
    }
    if (!claim) {
      TM_ASSIGN(claim, SinkClaim::acquire(client->location().consensus, spec.shard, spec.name, url,
                                          runner));
    }
    // A destination whose buffer the sinks' pool cannot hold now fails
    // this run (retried every kRetryInterval) rather than hold a thread.
    TM_ASSIGN(destination,
              open_sink_destination(url, spec.envelope, spec.format, spec.shard, spec.name, pool,
                                    claim, cancel, kPoolWait,
                                    [this](const std::string& what) { note_trouble(what); }));
    {
      std::lock_guard lock(mutex);
      frontier = destination->progress();
    }
    if (publisher && frontier) publisher->set_frontier(*frontier);
    SinkOptions options;
    options.sink_name = spec.name;
    options.idle_poll_interval = kIdlePollFallback;
    options.snapshot_part_bytes = snapshot_part_bytes;
    options.read_memory = ReadMemory{pool};  // its reads' blocks, beside its buffers
    options.stop = [this] { return stop.load(); };
    options.on_progress = [this](const SinkProgress& p) {
      {
        std::lock_guard lock(mutex);
        // A commit went through: what the destination was retrying is over.
        if (frontier && *frontier < p.frontier && status == "running" && error) {
          error.reset();
          if (publisher) publisher->stage_status(status, std::nullopt);
        }
        frontier = p.frontier;
      }
      if (publisher) publisher->set_frontier(p.frontier);
    };
    TM_ASSIGN(run, SinkRun::open(*opened, *destination, std::move(options)));
    return {};
  }
};

std::size_t SinkManager::default_threads() {
  return std::max<std::size_t>(8, 4 * std::max(1u, std::thread::hardware_concurrency()));
}

SinkManager::SinkManager(std::shared_ptr<Client> client, std::shared_ptr<MemoryPool> pool,
                         SinkRunner runner, DestinationAllowList allowed,
                         std::chrono::milliseconds idle_close, std::size_t threads,
                         std::uint64_t snapshot_part_bytes)
    : client_(std::move(client)),
      pool_(std::move(pool)),
      runner_(std::move(runner)),
      allowed_(std::move(allowed)),
      idle_close_(idle_close),
      snapshot_part_bytes_(snapshot_part_bytes),
      self_(this_process()),
      threads_("sinks", threads),
      timers_(&threads_) {
  // Without its timer a server still runs and answers for its own sinks; it
  // only notices deletions made through other servers at its next start.
  (void)timers_.schedule(kReconcileEvery, [this]() -> std::optional<std::chrono::milliseconds> {
    if (stopping_) return std::nullopt;
    reconcile();
    return std::chrono::duration_cast<std::chrono::milliseconds>(kReconcileEvery);
  });
}

SinkManager::~SinkManager() {
  stop_all();
}

Status SinkManager::start(const SinkSpec& spec, std::shared_ptr<SinkClaim> claim) {
  auto task = std::make_shared<Task>();
  task->spec = spec;
  task->publisher = std::make_shared<SinkStatusPublisher>(client_->location().consensus, spec.name,
                                                          runner_.label, runner_.owner);
  task->claim = std::move(claim);
  task->allowed = allowed_;
  task->idle_close = idle_close_;
  task->snapshot_part_bytes = snapshot_part_bytes_;
  // The lock orders the timer's id before its first step can end it.
  std::unique_lock task_lock(task->mutex);
  auto timer =
      timers_.schedule(std::chrono::milliseconds(0),
                       [task, client = client_, pool = pool_, runner = runner_, timers = &timers_] {
                         auto next = task->step(client, pool, runner, *timers);
                         if (!next) task->mark_finished();
                         return next;
                       });
  if (timer) {
    task->timer = *timer;
  } else {
    // Listed as failed, with the reason, until a restart; its claim goes.
    task->claim.reset();
    task->finished = true;
    task->status = "failed";
    task->error = timer.error().message;
    task->publisher->stage_status(task->status, task->error);
  }
  task_lock.unlock();
  std::lock_guard lock(mutex_);
  tasks_[spec.name] = std::move(task);
  if (!timer) return std::unexpected(timer.error());
  return {};
}

Status SinkManager::resume_all() {
  // The blob store's reads retry as the shards' reads do (a fault at start
  // must not leave the stored sinks stopped until the next look), and one
  // definition that cannot be read or parsed does not stop the others.
  const RetryPolicy& retry = client_->options().read_retry;
  Blob& blob = *client_->location().blob;
  std::vector<std::string> keys;
  TM_TRY(with_retries(retry, [&]() -> Status {
    keys.clear();
    return blob.list(kDefinitionsPrefix,
                     [&](std::string_view key, std::uint64_t) { keys.emplace_back(key); });
  }));
  Status first_error;
  for (const auto& [name, latest] : latest_keys(keys).latest) {
    const std::string key = spec_key(name, latest.revision);
    auto bytes = with_retries(retry, [&] { return blob.get(key); });
    if (!bytes) {
      if (first_error) first_error = std::unexpected(bytes.error());
      continue;
    }
    if (!*bytes) continue;  // deleted (or updated) meanwhile: the next look
    auto spec = SinkSpec::parse(**bytes);
    if (!spec) {
      if (first_error)
        first_error = corruption("sink definition " + key + ": " + spec.error().message);
      continue;
    }
    spec->revision = latest.revision;
    // The first look takes every free sink at once (its own previous
    // life's included); the ones held elsewhere stay there.
    (void)adopt(*spec, /*spread=*/false);
  }
  return first_error;
}

std::optional<std::string> SinkManager::not_here(const SinkSpec& spec) const {
  auto url = parse_sink_url(spec.to, spec.format);
  if (!url) return url.error().message;
  if (auto allowed = allowed_.check(*url); !allowed) return allowed.error().message;
  if (!url->directory) return std::nullopt;
  // A directory is its machine's disk.
  if (!spec.host.empty()) {
    if (spec.host == self_.host) return std::nullopt;
    return "its directory is on host " + spec.host + ": only a server there runs it";
  }
  if (spec.owner.empty() || spec.owner == runner_.owner) return std::nullopt;
  return "its directory is on the machine of server " + spec.owner + ", which runs it";
}

bool SinkManager::may_run(const SinkSpec& spec, const ServerPresence& target) const {
  auto url = parse_sink_url(spec.to, spec.format);
  if (!url) return false;
  auto allowed = DestinationAllowList::parse(target.s3_endpoints, target.kafka_brokers);
  if (!allowed || !allowed->check(*url)) return false;
  if (!url->directory) return true;
  if (!spec.host.empty()) return spec.host == target.host;
  return spec.owner.empty() || spec.owner == target.owner;
}

SinkManager::Handed SinkManager::handed(const std::string& name, std::uint64_t now_ms) const {
  std::lock_guard lock(adoption_mu_);
  for (const ServerPresence& server : presence_) {
    for (const ServerPresence::Handing& h : server.handing) {
      if (h.sink != name || h.until_ms < now_ms) continue;
      if (h.to == runner_.owner) return Handed::kHere;
      // Left to its taker while that one is alive.
      if (std::any_of(presence_.begin(), presence_.end(),
                      [&](const ServerPresence& p) { return p.owner == h.to; })) {
        return Handed::kElsewhere;
      }
    }
  }
  return Handed::kNo;
}

bool SinkManager::publish_presence_now(std::uint64_t now_ms, const std::string& scope) {
  if (runner_.owner.empty() || stopping_) return false;
  ServerPresence self;
  self.owner = runner_.owner;
  self.runner = runner_.label;
  self.host = self_.host;
  self.scope = scope;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [name, task] : tasks_) self.sinks += task->moved ? 0 : 1;
  }
  self.s3_endpoints = allowed_.s3_endpoints();
  self.kafka_brokers = allowed_.kafka_brokers();
  {
    std::lock_guard lock(adoption_mu_);
    std::erase_if(handing_, [&](const ServerPresence::Handing& h) { return h.until_ms < now_ms; });
    self.handing = handing_;
  }
  auto servers = publish_presence(*client_->location().consensus, std::move(self), now_ms);
  if (!servers) return false;
  // Servers that see other sinks share only the Consensus (another blob
  // store, or a listing taken while a sink was created or deleted): none
  // of their hand-overs concern this one, nor this one's them.
  std::erase_if(*servers, [&](const ServerPresence& s) { return s.scope != scope; });
  std::lock_guard lock(adoption_mu_);
  presence_ = std::move(*servers);
  scope_ = scope;
  return true;
}

void SinkManager::balance(std::uint64_t now_ms) {
  std::vector<ServerPresence> servers;
  {
    std::lock_guard lock(adoption_mu_);
    if (now_ms < next_hand_over_ms_) return;
    std::erase_if(handed_at_, [&](const auto& e) {
      return e.second + static_cast<std::uint64_t>(kHandAgainAfter.count()) < now_ms;
    });
    servers = presence_;
  }
  std::vector<std::shared_ptr<Task>> running;  // by name
  {
    std::lock_guard lock(mutex_);
    for (const auto& [name, task] : tasks_) {
      if (!task->moved) running.push_back(task);
    }
  }
  const std::uint64_t load = running.size();
  std::sort(servers.begin(), servers.end(), [](const ServerPresence& a, const ServerPresence& b) {
    return std::tie(a.sinks, a.owner) < std::tie(b.sinks, b.owner);
  });
  for (const ServerPresence& target : servers) {
    if (target.owner == runner_.owner) continue;
    // Moving one sink narrows a gap of two or more; the rest are no lighter.
    if (load < target.sinks + 2) return;
    for (auto it = running.rbegin(); it != running.rend(); ++it) {
      const std::shared_ptr<Task>& task = *it;
      {
        // Only a sink past its snapshot (a frontier committed) and running:
        // it stops at a commit, and its taker resumes from there.
        std::lock_guard lock(task->mutex);
        if (task->status != "running" || !task->frontier || task->frontier->is_closed()) continue;
      }
      {
        std::lock_guard lock(adoption_mu_);
        if (handed_at_.contains(task->spec.name)) continue;
      }
      if (!may_run(task->spec, target)) continue;
      const std::string& name = task->spec.name;
      {
        std::lock_guard lock(adoption_mu_);
        handing_.push_back(
            {name, target.owner, now_ms + static_cast<std::uint64_t>(kHandOverFor.count())});
        handed_at_[name] = now_ms;
        next_hand_over_ms_ = now_ms + static_cast<std::uint64_t>(kHandOverEvery.count());
      }
      // Published before the lease goes, so that every other server's next
      // look leaves the sink to `target`.
      std::string scope;
      {
        std::lock_guard lock(adoption_mu_);
        scope = scope_;
      }
      if (!publish_presence_now(now_ms, scope)) {
        std::lock_guard lock(adoption_mu_);
        std::erase_if(handing_, [&](const ServerPresence::Handing& h) { return h.sink == name; });
        return;
      }
      {
        std::lock_guard lock(mutex_);
        auto found = tasks_.find(name);
        if (found == tasks_.end() || found->second != task) return;  // deleted meanwhile
        tasks_.erase(found);
      }
      log_line(LogLevel::kInfo, "sink " + name + " of shard " + task->spec.shard +
                                    ": handed over to " + target.runner + " (server " +
                                    target.owner + ", running " + std::to_string(target.sinks) +
                                    " sinks against " + std::to_string(load) + " here)");
      // It commits what it has written and lets go of its lease.
      task->stop_by(timers_, std::chrono::steady_clock::now() + kStopGrace);
      task->join();
      return;
    }
  }
}

void SinkManager::note_adoption(const std::string& name, std::optional<std::string> error) {
  std::lock_guard lock(adoption_mu_);
  if (error) {
    adoption_errors_[name] = std::move(*error);
  } else {
    adoption_errors_.erase(name);
  }
}

bool SinkManager::adopt(const SinkSpec& spec, bool spread) {
  // One at a time (the first look at start and the timer's may meet), and
  // none once stop_all() has begun.
  std::lock_guard adopting(adopt_mu_);
  if (stopping_) return false;
  if (not_here(spec)) return false;
  {
    std::lock_guard lock(mutex_);
    if (auto it = tasks_.find(spec.name); it != tasks_.end() && !it->second->moved) return false;
  }
  Consensus& consensus = *client_->location().consensus;
  const std::string key = sink_lease_key(spec.shard, spec.name);
  const std::uint64_t now = wall_clock_millis();
  // A sink its runner is handing to another server is left to that one;
  // one handed here is taken at once.
  const Handed hand = handed(spec.name, now);
  if (hand == Handed::kElsewhere) return false;
  if (hand != Handed::kHere) {
    // A runner that renews is not looked at again before its lease ends,
    // unless it was a process of this machine that has died since.
    std::lock_guard lock(adoption_mu_);
    if (auto it = held_leases_.find(spec.name); it != held_leases_.end() &&
                                                now <= it->second.expires_at_ms &&
                                                liveness(it->second.process) != Liveness::kDead) {
      return false;
    }
  }
  auto lease = read_lease(consensus, key);
  if (!lease) return false;  // the next look tries again
  // This process holds it (a sink being created, or one still stopping).
  if (*lease && !(*lease)->released() && (*lease)->process == self_) return false;
  LeaseRecord candidate;
  candidate.owner = runner_.owner;
  candidate.sink = spec.shard + "/" + spec.name;
  const Liveness alive =
      *lease && !(*lease)->released() ? liveness((*lease)->process) : Liveness::kUnknown;
  const Takeover takeover = take_over(*lease, candidate, now, alive);
  {
    std::lock_guard lock(adoption_mu_);
    if (takeover == Takeover::kRefused) {
      held_leases_[spec.name] = **lease;
      waiting_rounds_.erase(spec.name);
      return false;
    }
    held_leases_.erase(spec.name);
    if (spread && hand != Handed::kHere && takeover != Takeover::kSameRunner) {
      // Spread: a server that runs n sinks already lets min(n, kSpreadLooks) looks go
      // by first, so the idler servers take a lost server's sinks.
      std::size_t running = 0;
      {
        std::lock_guard tasks_lock(mutex_);
        for (const auto& [name, task] : tasks_) running += task->moved ? 0 : 1;
      }
      int& waited = waiting_rounds_[spec.name];
      if (waited < static_cast<int>(std::min<std::size_t>(running, kSpreadLooks))) {
        ++waited;
        return false;
      }
    }
    waiting_rounds_.erase(spec.name);
  }
  // A sink that finished (its shard closed) stays finished.
  if (auto report = read_sink_status(consensus, spec.name); report && *report) {
    if ((*report)->status == "done") return false;
  }
  auto url = parse_sink_url(spec.to, spec.format);
  if (!url) return false;
  auto claim =
      SinkClaim::acquire(client_->location().consensus, spec.shard, spec.name, *url, runner_);
  if (!claim) {
    // Taken by another server first, or its destination is held by another
    // runner (shown while no server runs it).
    note_adoption(spec.name, claim.error().message);
    return false;
  }
  note_adoption(spec.name, std::nullopt);
  // Deleted between the listing and the claim? (A deletion removes the
  // definition before its runner lets go of the lease.)
  // (Or updated: the next look takes the new revision.)
  auto stored = client_->location().blob->get(spec_key(spec.name, spec.revision));
  if (!stored || !*stored) return false;
  log_line(LogLevel::kInfo,
           "sink " + spec.name + " of shard " + spec.shard + ": taken over (" +
               (hand == Handed::kHere               ? "handed over by its runner"
                : takeover == Takeover::kFree       ? "its lease was free"
                : takeover == Takeover::kExpired    ? "its runner's lease lapsed"
                : takeover == Takeover::kHolderDead ? "its runner is not running"
                                                    : "a previous life of this server") +
               ")");
  return static_cast<bool>(start(spec, std::move(*claim)));
}

Status SinkManager::check_name_free(const std::string& name) const {
  {
    std::lock_guard lock(mutex_);
    if (tasks_.contains(name)) {
      return make_error(ErrorKind::kAlreadyExists,
                        "a sink named " + name + " exists (run by " + runner_.label + ")");
    }
  }
  // Another server's sink of this name? (Blob has no create-if-absent: two
  // servers creating one name at once both write; create() reads back
  // which definition won, and only its owner runs it.)
  auto stored = stored_spec(name);
  if (!stored) {
    if (!stored.error().is(ErrorKind::kInvalidUsage)) return std::unexpected(stored.error());
    return taken(name, SinkSpec{});  // stored, but unreadable
  }
  if (!*stored) return {};
  return taken(name, **stored);
}

Result<std::optional<SinkSpec>> SinkManager::stored_spec(const std::string& name) const {
  Blob& blob = *client_->location().blob;
  // An update writes the next revision before it removes the one before:
  // a revision gone between the listing and the read was updated (or
  // deleted), so the listing is read again.
  for (int attempt = 0; attempt < 3; ++attempt) {
    TM_ASSIGN(const std::vector<std::string> keys, keys_of(blob, name));
    const LatestKeys latest = latest_keys(keys);
    const auto it = latest.latest.find(name);
    if (it == latest.latest.end()) return std::nullopt;
    TM_ASSIGN(auto bytes, blob.get(spec_key(name, it->second.revision)));
    if (!bytes) continue;
    TM_ASSIGN(SinkSpec spec, SinkSpec::parse(*bytes));
    spec.revision = it->second.revision;
    return std::optional<SinkSpec>(std::move(spec));
  }
  return std::nullopt;
}

Status SinkManager::remove_definition(const std::string& name) {
  Blob& blob = *client_->location().blob;
  TM_ASSIGN(const std::vector<std::string> keys, keys_of(blob, name));
  return keys.empty() ? Status{} : blob.remove_many(keys);
}

void SinkManager::restart(const std::shared_ptr<Task>& task, const SinkSpec& spec) {
  {
    std::lock_guard lock(mutex_);
    auto it = tasks_.find(spec.name);
    if (it == tasks_.end() || it->second != task) return;  // deleted or restarted meanwhile
    tasks_.erase(it);
  }
  log_line(LogLevel::kInfo, "sink " + spec.name + " of shard " + spec.shard +
                                ": updated (revision " + std::to_string(spec.revision) +
                                "); restarting it on its new definition");
  task->stop_by(timers_, std::chrono::steady_clock::now() + kStopGrace);
  task->join();
  (void)adopt(spec, /*spread=*/false);
}

Result<std::string> SinkManager::update(const SinkSpec& requested) {
  TM_ASSIGN(auto current, stored_spec(requested.name));
  if (!current) return make_error(ErrorKind::kNotFound, "no sink named " + requested.name);
  if (requested.shard != current->shard) {
    return invalid_usage("sink " + requested.name + " reads shard " + current->shard +
                         ": a sink's shard cannot change (delete the sink and create another)");
  }
  TM_ASSIGN(SinkUrl url, parse_sink_url(requested.to, requested.format));
  SinkSpec next = requested;
  // A directory is on the machine of the server that takes the request, as
  // at creation.
  next.owner = url.directory ? runner_.owner : current->owner;
  next.host = url.directory ? self_.host : std::string();
  next.revision = current->revision;
  if (next.to_json() == current->to_json()) return status_json(next.name);  // nothing changes
  next.revision = current->revision + 1;
  Blob& blob = *client_->location().blob;
  const std::string key = spec_key(next.name, next.revision);
  TM_TRY(blob.set(key, next.to_json()));
  TM_ASSIGN(auto written, blob.get(key));
  if (!written || *written != next.to_json()) {
    return make_error(
        ErrorKind::kAlreadyExists,
        "sink " + next.name +
            " was updated by another request at the same time; read it and try again");
  }
  (void)blob.remove(spec_key(next.name, current->revision));  // else a later look removes it
  std::shared_ptr<Task> task;
  {
    std::lock_guard lock(mutex_);
    if (auto it = tasks_.find(next.name); it != tasks_.end() && !it->second->moved) {
      task = it->second;
    }
  }
  if (task) restart(task, next);
  return status_json(next.name);
}

std::unexpected<Error> SinkManager::taken(const std::string& name, const SinkSpec& stored) const {
  std::string where;
  if (auto runner = stored.shard.empty() ? std::nullopt : live_runner(stored.shard, name)) {
    where = " (run by " + *runner + ")";
  } else if (!stored.owner.empty()) {
    where = " (created by server " + stored.owner + ", which does not run it now)";
  }
  return make_error(ErrorKind::kAlreadyExists, "a sink named " + name + " exists" + where);
}

Result<std::string> SinkManager::create(const SinkSpec& spec) {
  TM_TRY(check_name_free(spec.name));
  TM_ASSIGN(auto shard, client_->open_shard(spec.shard));  // NotFound early
  (void)shard;
  Blob& blob = *client_->location().blob;
  // The sink and its destination, before anything is stored: a runner
  // elsewhere is named in the 409.
  TM_ASSIGN(SinkUrl url, parse_sink_url(spec.to, spec.format));
  TM_ASSIGN(auto claim,
            SinkClaim::acquire(client_->location().consensus, spec.shard, spec.name, url, runner_));
  SinkSpec owned = spec;
  owned.owner = runner_.owner;
  owned.host = url.directory ? self_.host : std::string();
  TM_TRY(blob.set(spec_key(spec.name), owned.to_json()));
  TM_ASSIGN(auto written, blob.get(spec_key(spec.name)));
  if (!written) return make_error(ErrorKind::kNotFound, "sink " + spec.name + " was deleted");
  if (*written != owned.to_json()) {
    auto stored = SinkSpec::parse(*written);
    return taken(spec.name, stored ? *stored : SinkSpec{});
  }
  if (auto started = start(owned, std::move(claim)); !started) {
    // Nothing half made: the definition goes again, and the request fails.
    {
      std::lock_guard lock(mutex_);
      tasks_.erase(spec.name);
    }
    (void)blob.remove(spec_key(spec.name));
    return std::unexpected(started.error());
  }
  return status_json(spec.name);
}

namespace {

// The upper of each shard the tasks read, as this process last saw it
// (kept fresh by the sinks' change subscriptions; null when a task has
// not opened its shard yet): a status never waits on a backend's retry.
template <typename Tasks>
std::map<std::string, std::optional<Frontier>> uppers_of(const Tasks& tasks) {
  std::map<std::string, std::optional<Frontier>> uppers;
  for (const auto& task : tasks) {
    auto& upper = uppers[task->spec.shard];
    if (upper) continue;
    if (auto shard = task->opened_shard()) {
      if (auto read = shard->upper(false)) upper = *read;
    }
  }
  return uppers;
}

}  // namespace

Result<std::string> SinkManager::status_json(const std::string& name) const {
  std::shared_ptr<Task> task;
  {
    std::lock_guard lock(mutex_);
    if (auto it = tasks_.find(name); it != tasks_.end() && !it->second->moved) task = it->second;
  }
  if (task) {
    auto uppers = uppers_of(std::vector<std::shared_ptr<Task>>{task});
    return task->to_json(uppers[task->spec.shard], runner_);
  }
  // Another server's sink, or none.
  TM_ASSIGN(auto spec, stored_spec(name));
  if (!spec) return make_error(ErrorKind::kNotFound, "no sink named " + name);
  return reported_json(*spec);
}

namespace {

// Whether a sink's lease still names a runner: not released, not lapsed,
// and its holder not a process of this machine that runs no more (one
// elsewhere is gone only when its lease lapses).
bool held_now(const LeaseRecord& lease) {
  return !lease.released() && lease.expires_at_ms >= wall_clock_millis() &&
         liveness(lease.process) != Liveness::kDead;
}

}  // namespace

std::optional<std::string> SinkManager::live_runner(const std::string& shard,
                                                    const std::string& name) const {
  auto lease = read_lease(*client_->location().consensus, sink_lease_key(shard, name));
  if (!lease || !*lease || !held_now(**lease)) return std::nullopt;
  const LeaseRecord& holder = **lease;
  return holder.runner.empty() ? std::string("a sink runner") : holder.runner;
}

// A sink this server does not run, as the shared backends show it: the
// runner's last report (sink_status.h), whether its lease is live, and
// this server's view of the shard's upper. What cannot be read is said in
// "error" rather than failing the answer.
std::string SinkManager::reported_json(const SinkSpec& spec) const {
  Consensus& consensus = *client_->location().consensus;
  std::string status = "starting";  // created; its runner has not reported yet
  std::optional<Frontier> frontier;
  std::optional<std::string> error, runner, runner_server;
  std::optional<std::uint64_t> reported_at;
  auto record = read_sink_status(consensus, spec.name);
  if (!record) {
    error = "reading its status: " + record.error().message;
  } else if (*record) {
    status = (*record)->status;
    error = (*record)->error;
    frontier = (*record)->frontier;
    reported_at = (*record)->written_at_ms;
  }
  auto lease = read_lease(consensus, sink_lease_key(spec.shard, spec.name));
  if (!lease) {
    if (!error) error = "reading its lease: " + lease.error().message;
  } else if (*lease && !(*lease)->released()) {
    const LeaseRecord& holder = **lease;
    if (held_now(holder)) {
      runner = holder.runner;
      runner_server = holder.owner;
    } else if (status == "starting" || status == "running" || status == "failed") {
      // Its runner went without releasing it (killed, cut off): nothing
      // runs the sink until another server takes it over.
      status = "waiting";
      error = "its runner " + holder.describe_holder() +
              (liveness(holder.process) == Liveness::kDead ? " is not running"
                                                           : " stopped renewing its lease");
    }
  } else if (status != "done") {
    // Released (its server stopped or let it go), or never claimed: the
    // next server to look takes it.
    status = "waiting";
  }
  if (status == "waiting" && !runner) {
    // Why this server has not taken it, when it cannot.
    if (const Handed hand = handed(spec.name, wall_clock_millis()); hand != Handed::kNo) {
      error = hand == Handed::kHere ? "handed over to this server by its runner"
                                    : "handed over by its runner to another server";
    } else if (auto reason = not_here(spec)) {
      error = (error ? *error + "; " : std::string()) + "not run by this server: " + *reason;
    } else {
      std::lock_guard lock(adoption_mu_);
      if (auto it = adoption_errors_.find(spec.name); it != adoption_errors_.end()) {
        error = it->second;
      }
    }
  }
  std::optional<Frontier> upper;
  if (auto shard = client_->open_shard(spec.shard)) {
    if (auto read = (*shard)->upper(false)) upper = *read;
  }
  return sink_json(spec, status, frontier, upper, error, runner, runner_server, reported_at);
}

std::string SinkManager::list_json() const {
  std::vector<std::shared_ptr<Task>> tasks;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [name, task] : tasks_) {
      if (!task->moved) tasks.push_back(task);
    }
  }
  auto uppers = uppers_of(tasks);
  std::map<std::string, std::string> rows;  // by name
  for (const auto& task : tasks)
    rows[task->spec.name] = task->to_json(uppers[task->spec.shard], runner_);
  // Every other server's sinks, from the stored definitions. A store that
  // cannot be listed leaves the list to this server's sinks.
  std::set<std::string> here;
  for (const auto& [name, row] : rows) here.insert(name);
  for (const SinkSpec& spec : stored_definitions(here)) rows[spec.name] = reported_json(spec);
  std::string out = "[";
  for (const auto& [name, row] : rows) {
    if (out.size() > 1) out += ",";
    out += row;
  }
  return out + "]";
}

std::vector<SinkSpec> SinkManager::stored_definitions(const std::set<std::string>& skip) const {
  Blob& blob = *client_->location().blob;
  std::vector<std::string> keys;
  if (!blob.list(kDefinitionsPrefix,
                 [&](std::string_view key, std::uint64_t) { keys.emplace_back(key); })) {
    return {};
  }
  return definitions_of(keys, skip);
}

std::vector<SinkSpec> SinkManager::definitions_of(const std::vector<std::string>& keys,
                                                  const std::set<std::string>& skip) const {
  Blob& blob = *client_->location().blob;
  std::vector<SinkSpec> specs;
  std::lock_guard lock(definitions_mu_);
  std::map<std::string, SinkSpec> seen;
  for (const auto& [name, latest] : latest_keys(keys).latest) {
    if (skip.contains(name)) continue;
    // A key's definition never changes once stored: read each one once.
    const std::string key = spec_key(name, latest.revision);
    if (auto known = definitions_.find(key); known != definitions_.end()) {
      seen.emplace(key, known->second);
      specs.push_back(known->second);
      continue;
    }
    auto bytes = blob.get(key);
    if (!bytes || !*bytes) continue;  // unreadable now, or deleted meanwhile
    auto spec = SinkSpec::parse(**bytes);
    if (!spec) continue;
    spec->revision = latest.revision;
    seen.emplace(key, *spec);
    specs.push_back(std::move(*spec));
  }
  definitions_ = std::move(seen);  // the deleted ones go
  return specs;
}

Result<bool> SinkManager::remove(const std::string& name) {
  std::shared_ptr<Task> task;
  {
    std::lock_guard lock(mutex_);
    if (auto it = tasks_.find(name); it != tasks_.end() && !it->second->moved) task = it->second;
  }
  if (!task) {
    // Another server runs it (or none does now): its definition goes, and
    // its runner, which looks for its definition every kReconcileEvery,
    // stops it and drops its hold.
    TM_ASSIGN(auto stored, stored_spec(name));
    if (!stored) return make_error(ErrorKind::kNotFound, "no sink named " + name);
    const SinkSpec& spec = *stored;
    TM_TRY(remove_definition(name));
    expire_hold(spec);
    // Answers once the runner has let go of its lease, or after
    // kRemoteStopWait with stopped false (a runner cut off from the
    // backends cannot be told; it stops writing when its lease lapses).
    const auto deadline = std::chrono::steady_clock::now() + kRemoteStopWait;
    while (live_runner(spec.shard, spec.name)) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    // Its runner may have moved the hold once more before it stopped.
    expire_hold(spec);
    return true;
  }
  // The definition goes first: a server looking for free sinks never finds
  // this one's lease released while its definition is still stored.
  TM_TRY(remove_definition(name));
  {
    std::lock_guard lock(mutex_);
    if (auto it = tasks_.find(name); it != tasks_.end() && it->second == task) tasks_.erase(it);
  }
  // Deleted: nothing more of it is wanted, so it is not waited for.
  task->stop_by(timers_, std::chrono::steady_clock::now());
  task->join();
  expire_hold(task->spec);
  return true;
}

void SinkManager::expire_hold(const SinkSpec& spec) const {
  // Its hold on the shard goes too: history it no longer needs.
  if (auto shard = client_->open_shard(spec.shard)) {
    if (auto reader = (*shard)->open_critical_reader("sink-" + spec.name)) {
      (void)(*reader)->expire();
    }
  }
}

// Every kReconcileEvery: publishes what the sinks' reports held back,
// stops the sinks of this server whose definitions are gone (deleted
// through another server), drops the ones another runner took over, and
// takes the free ones (see adopt()).
void SinkManager::reconcile() {
  std::map<std::string, std::shared_ptr<Task>> tasks;
  {
    std::lock_guard lock(mutex_);
    for (auto it = tasks_.begin(); it != tasks_.end();) {
      if (it->second->moved) {
        it = tasks_.erase(it);  // its last step has ended it (moved is set there, last)
      } else {
        tasks.insert(*it);
        ++it;
      }
    }
  }
  for (const auto& [name, task] : tasks) {
    if (task->publisher) task->publisher->flush();
  }
  // Listed after the tasks were taken: a task's definition is stored before
  // it starts, so a task taken above whose definition is not listed was
  // deleted. (Read through the store, not the cache.)
  Blob& blob = *client_->location().blob;
  std::vector<std::string> listed;
  if (!blob.list(kDefinitionsPrefix,
                 [&](std::string_view key, std::uint64_t) { listed.emplace_back(key); })) {
    return;  // the next round tries again
  }
  LatestKeys latest = latest_keys(listed);
  // Revisions an update left behind (it removes the one before itself,
  // unless it stopped in between).
  if (!latest.superseded.empty() && !stopping_) (void)blob.remove_many(latest.superseded);
  const std::map<std::string, SpecKey>& stored = latest.latest;
  std::vector<std::pair<std::shared_ptr<Task>, std::uint64_t>> updated;
  for (const auto& [name, task] : tasks) {
    if (stopping_) continue;
    if (auto it = stored.find(name); it != stored.end()) {
      if (it->second.revision != task->spec.revision)
        updated.emplace_back(task, it->second.revision);
      continue;
    }
    {
      std::lock_guard lock(mutex_);
      auto it = tasks_.find(name);
      if (it == tasks_.end() || it->second != task) continue;  // deleted here meanwhile
      tasks_.erase(it);
    }
    log_line(LogLevel::kInfo, "sink " + name + " of shard " + task->spec.shard +
                                  ": deleted through another server; stopping it");
    task->stop_by(timers_, std::chrono::steady_clock::now());
    task->join();
    expire_hold(task->spec);
  }
  {
    // adopt()'s memory keeps only the sinks still defined.
    std::lock_guard lock(adoption_mu_);
    std::erase_if(held_leases_, [&](const auto& e) { return !stored.contains(e.first); });
    std::erase_if(waiting_rounds_, [&](const auto& e) { return !stored.contains(e.first); });
    std::erase_if(adoption_errors_, [&](const auto& e) { return !stored.contains(e.first); });
  }
  // Where the servers stand (each publishes itself while sinks are
  // defined), read before the free sinks are looked at: one being handed
  // over is left to its taker.
  const std::uint64_t now = wall_clock_millis();
  std::string names;
  for (const auto& [name, key] : stored) names += name + "\n";
  const bool present =
      !stored.empty() && publish_presence_now(now, sha256_hex(names).substr(0, 16));
  // Sinks of this server updated through another: restarted on their new
  // definitions.
  bool adopted = false;
  if (!updated.empty()) {
    std::set<std::string> names;
    for (const auto& [task, revision] : updated) names.insert(task->spec.name);
    std::set<std::string> others;
    for (const auto& [name, key] : stored) {
      if (!names.contains(name)) others.insert(name);
    }
    for (const SinkSpec& spec : definitions_of(listed, others)) {
      for (const auto& [task, revision] : updated) {
        if (task->spec.name == spec.name && spec.revision == revision && !stopping_) {
          restart(task, spec);
          adopted = true;
        }
      }
    }
  }
  std::set<std::string> here;
  for (const auto& [name, task] : tasks) here.insert(name);
  for (const SinkSpec& spec : definitions_of(listed, here)) {
    if (stopping_) return;
    adopted = adopt(spec, /*spread=*/true) || adopted;
  }
  // A look that took a sink published the count before it: balance at the
  // next one.
  if (present && !adopted && !stopping_) balance(now);
}

void SinkManager::stop_all(std::chrono::milliseconds grace) {
  const bool first = !stopping_.exchange(true);
  {
    // A sink being taken over now is started before the tasks are taken.
    std::lock_guard adopted(adopt_mu_);
  }
  bool published = false;
  {
    std::lock_guard lock(adoption_mu_);
    published = !presence_.empty();
  }
  // No server hands sinks to this one any more.
  if (first && published) withdraw_presence(*client_->location().consensus, runner_.owner);
  std::map<std::string, std::shared_ptr<Task>> tasks;
  {
    std::lock_guard lock(mutex_);
    tasks = tasks_;
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (auto& [name, task] : tasks) {
    task->stop = true;
    task->wake.notify_all();
  }
  for (auto& [name, task] : tasks) task->stop_by(timers_, deadline);
  for (auto& [name, task] : tasks) task->join();
}

void SinkManager::render_metrics(std::string* out) const {
  std::map<std::string, std::shared_ptr<Task>> tasks;
  {
    std::lock_guard lock(mutex_);
    tasks = tasks_;
  }
  std::string lag;
  out->append("# HELP tidemark_sink_frontier Every pair at a time below it is committed.\n");
  out->append("# TYPE tidemark_sink_frontier gauge\n");
  for (const auto& [name, task] : tasks) {
    std::optional<Frontier> frontier;
    std::shared_ptr<Shard> shard;
    {
      std::lock_guard lock(task->mutex);
      frontier = task->frontier;
      shard = task->shard;
    }
    if (!frontier || frontier->is_closed()) continue;
    const std::string label = "sink=\"" + name + "\",shard=\"" + task->spec.shard + "\"";
    append_sample(out, "tidemark_sink_frontier", label, static_cast<double>(frontier->time()));
    if (!shard) continue;
    auto upper = shard->upper();
    if (upper && !upper->is_closed()) {
      const double behind = upper->time() > frontier->time()
                                ? static_cast<double>(upper->time() - frontier->time())
                                : 0.0;
      append_sample(&lag, "tidemark_sink_lag", label, behind);
    }
  }
  out->append(
      "# HELP tidemark_sink_lag The shard's upper minus the sink's frontier, in time "
      "units.\n# TYPE tidemark_sink_lag gauge\n");
  out->append(lag);
  std::size_t idle = 0;
  for (const auto& [name, task] : tasks) idle += task->parked ? 1 : 0;
  out->append(
      "# HELP tidemark_sinks_idle Sinks whose destination is closed until their shard changes "
      "(idle_close).\n# TYPE tidemark_sinks_idle gauge\n");
  append_sample(out, "tidemark_sinks_idle", "", static_cast<double>(idle));
}

}  // namespace tidemark
