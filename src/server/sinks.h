// SinkManager: the sinks a server runs (POST/GET/DELETE /v1/sinks).
//
// A sink's definition {"name", "shard", "to", "envelope", "format"} is
// stored in the blob store under "server/sinks/<name>" when it is created
// (an update stores revision N under "server/sink-revisions/<name>/<N>",
// then removes the one before; the latest revision is the definition),
// so a restarted server resumes every sink: each one picks up from its
// destination's progress (run_sink), and its critical reader still holds
// the shard's since. Sinks share a pool of threads (`threads`, by default
// max(8, 4 x cores)) whatever their number: each sink is a SinkRun
// (tidemark/sink.h) stepped on the pool, and waits between steps on the
// manager's timers, holding no thread. A step that blocks (a destination
// call, a read retrying a failing backend) holds one thread until it
// returns, so that many stuck destinations at once delay the other sinks
// (never requests): each such call is bounded by its timeout and
// cancelled when its sink is deleted or stopped. A sink that fails
// (an unreachable broker, a full disk) reports "failed" with its error
// and is retried every kRetryInterval until it runs or is deleted.
// Deleting a sink stops it, drops its critical reader's hold and its
// definition; its output stays where it is.
//
// Several servers sharing one blob store and consensus (PostgreSQL + S3)
// see every stored definition, and each sink runs on exactly one of them:
// the one holding its lease (sink/sink_claim.h). The server that creates a
// sink runs it first. Every kReconcileEvery each server looks at the
// stored sinks it does not run and takes over those whose lease is free
// (released by a server stopping cleanly: a draining server hands its
// sinks over this way), lapsed (its runner stopped renewing: killed,
// paused, cut off; LeaseOptions says when), held by a dead process of this
// machine, or held by this server's previous life. A sink is taken over
// within the lease's duration (8 s) after its runner's last renewal, plus
// two looks at most (kReconcileEvery each, one for the spread below): 12 s
// with the defaults; at the next look when its runner was a process of
// this machine that died. A runner whose sink was taken over learns
// it at its next check of the claim, before it makes anything visible,
// and lets go ("moved": the task ends, its report is the new runner's).
// Spread: a server running n sinks lets min(n, kSpreadLooks) looks go by
// before it takes one, so the idler servers take a lost server's sinks
// first. A held lease is read again only once it could have lapsed. What
// a server may take: a destination it allows, and a file:// sink only on
// the machine of the server that created it (its "host": the directory is
// that machine's disk); a sink whose report says "done" (its shard
// closed) stays done. Balance: while any sink is defined, each look
// also publishes this server in consensus (sink/server_presence.h: how
// many sinks it runs, what it may reach), and a server running at least
// two sinks more than the lightest other live server hands it one of its
// running sinks past their snapshot (kHandOverEvery at most; the same
// sink not again for kHandAgainAfter): the hand-over is published first,
// then the sink stops as at shutdown (commits, releases its lease), and
// the other servers leave it to its target for kHandOverFor; the target
// takes it at its next look. A name taken by any server is AlreadyExists on every
// server, naming its runner. Every server answers for every sink: its own
// live, the others from what their runners publish in consensus
// (sink/sink_status.h: status and error at once, the frontier at most
// every 2 s) and from their leases (a lapsed lease: "waiting"). DELETE
// through any server removes the definition and the hold; the runner
// stops the sink when it next looks for its definitions (every
// kReconcileEvery), and the DELETE waits for its lease to go (at most
// kRemoteStopWait).
//
// A running sink holds a SinkClaim (sink/sink_claim.h) on itself and its
// destination, from its start until it is stopped, deleted or taken over
// (across its retries), so no other runner (a `tidemark sink run`, another
// server, or another sink of this server) writes its destination
// meanwhile. create() claims before it stores anything: a sink or
// destination held elsewhere is Held naming the holder (409).
//
// Status: "starting", "running" (snapshot or following), "failed" (with
// error; retried), "done" (the shard closed), "stopped".
//
// Idle sinks close their destinations. A sink that has committed all it
// wrote and seen no change of its shard for `idle_close` (by default the
// server's idle_close, 30 s) closes its destination: a Kafka producer's
// threads (librdkafka starts four per producer with one broker) and its
// queue, an S3 part's buffer, a file's handle go back. It keeps its claim,
// its hold and its subscription, and stays "running": the next change of
// its shard opens the destination again (a Kafka producer fences and reads
// its progress topic anew, which that change waits for) and the run
// resumes from the destination's progress. So threads and memory grow
// with the sinks that have work in hand, not with the sinks defined, and
// more sinks can be defined than the pool holds buffers for: one that
// finds the pool full fails for kRetryInterval and runs once others idle.
//
// Memory: sinks draw from one pool (a Kafka producer's queue or an S3
// part's buffer is reserved from it, and the blocks its reads decode are
// charged to it: read.h); per sink its walker's O(1) state and a timer
// entry.
//
// Thread-safety: all methods are safe for concurrent use.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "sink/destination_url.h"
#include "sink/envelope.h"
#include "sink/server_presence.h"
#include "sink/sink_claim.h"
#include "sink/sink_spec.h"
#include "tidemark/client.h"
#include "tidemark/memory_pool.h"
#include "util/executor.h"

namespace tidemark {

class SinkManager {
 public:
  static constexpr std::chrono::seconds kRetryInterval{5};
  // How long a sink's run waits for its destination's buffer (a Kafka
  // queue, an S3 part) in the sinks' pool before it fails, naming it.
  static constexpr std::chrono::milliseconds kPoolWait{1000};
  static constexpr std::chrono::seconds kStopGrace{10};
  static constexpr std::chrono::milliseconds kIdleClose{30'000};
  // How often a server publishes its sinks' held-back reports and looks
  // for its sinks deleted through other servers.
  static constexpr std::chrono::milliseconds kReconcileEvery{2'000};
  // How long a DELETE through another server waits for the runner to stop.
  static constexpr std::chrono::milliseconds kRemoteStopWait{10'000};
  // A server running n sinks lets min(n, kSpreadLooks) looks go by before
  // it takes a free sink (see the header).
  static constexpr std::size_t kSpreadLooks = 1;
  // Balance (see the header): a sink handed to another server is left to
  // it for kHandOverFor; a server hands over at most one sink every
  // kHandOverEvery, and the same sink at most once every kHandAgainAfter.
  static constexpr std::chrono::milliseconds kHandOverFor{10'000};
  static constexpr std::chrono::milliseconds kHandOverEvery{6'000};
  static constexpr std::chrono::milliseconds kHandAgainAfter{300'000};

  // `runner.owner`: this server's id, written into the sinks it creates;
  // "" runs every stored sink. `runner.label` names this server in claims
  // ("tidemark serve on HOST:PORT").
  // `allowed`: the S3 endpoints and Kafka brokers its sinks may reach; a
  // sink whose destination is not allowed fails (status "failed", the
  // reason in "error") without connecting, stored sinks too.
  // `threads`: the most threads every sink's steps share.
  // `idle_close`: a sink that has committed everything and seen no change
  // of its shard for this long closes its destination (see above); 0:
  // never. `snapshot_part_bytes`: SinkOptions::snapshot_part_bytes of
  // every sink it runs.
  SinkManager(std::shared_ptr<Client> client, std::shared_ptr<MemoryPool> pool, SinkRunner runner,
              DestinationAllowList allowed, std::chrono::milliseconds idle_close = kIdleClose,
              std::size_t threads = default_threads(),
              std::uint64_t snapshot_part_bytes = SinkOptions{}.snapshot_part_bytes);
  ~SinkManager();  // stop_all()

  // The first look (see above): takes and starts every stored sink whose
  // lease is free, at once (no spread). Its blob reads retry under
  // ClientOptions::read_retry; a definition that still cannot be read or
  // parsed is skipped (the first such error is returned) and the others
  // start.
  [[nodiscard]] Status resume_all();
  // OK when no sink has `name`; AlreadyExists naming its runner otherwise.
  [[nodiscard]] Status check_name_free(const std::string& name) const;
  // Claims, stores and starts a sink, owned by this server; AlreadyExists
  // (here or on another server sharing the blob store), NotFound (no such
  // shard), Held (the sink or its destination is run by another runner,
  // named).
  [[nodiscard]] Result<std::string> create(const SinkSpec& spec);
  // PUT /v1/sinks/NAME: stores `spec` as the next revision of sink
  // spec.name's definition (its "to", "envelope" and "format" may change,
  // its shard may not), then restarts the sink on it: at once when this
  // server runs it, at its runner's next look (within kReconcileEvery)
  // otherwise. The run stops as at shutdown (it commits what it wrote) and
  // resumes from the new destination's progress: where it stopped when the
  // destination is the same, with a snapshot when it is new. A definition
  // equal to the stored one changes nothing. Answers as status_json.
  // NotFound; InvalidUsage (another shard); AlreadyExists (another update
  // at the same time won).
  [[nodiscard]] Result<std::string> update(const SinkSpec& spec);
  // {"name", "shard", "to", ..., "status", "frontier", "upper", "lag",
  // "error"}: lag is upper - frontier in time units (milliseconds on a
  // shard of managed appends); error is what stopped the last run, or
  // what the destination is retrying (a broker it cannot reach). Reads
  // each shard's upper from consensus: call off the I/O threads. NotFound.
  [[nodiscard]] Result<std::string> status_json(const std::string& name) const;
  std::string list_json() const;
  // Stops the sink at once (an S3 or Kafka call in progress is cancelled,
  // within about a second; what it wrote since its last commit is not
  // committed), then drops its hold and its definition. Another server's
  // sink: its definition and hold go, and its runner stops it within
  // kReconcileEvery; true once its lease is let go (within
  // kRemoteStopWait), false when the runner has not answered by then.
  // NotFound.
  [[nodiscard]] Result<bool> remove(const std::string& name);
  // Stops every sink: each running one commits what it has written
  // (progress recorded) if it can within `grace`; after that, and at once
  // for a sink still opening its destination, calls still waiting on a
  // destination are cancelled (within about a second).
  void stop_all(std::chrono::milliseconds grace = kStopGrace);
  // tidemark_sink_frontier and tidemark_sink_lag (shard upper - frontier).
  void render_metrics(std::string* out) const;

  // max(8, 4 x cores).
  static std::size_t default_threads();
  std::size_t threads() const { return threads_.threads(); }

  struct Task;

 private:
  // Who holds the sink's lease now ("tidemark serve on HOST:PORT"), when
  // the lease is live.
  std::optional<std::string> live_runner(const std::string& shard, const std::string& name) const;
  std::string reported_json(const SinkSpec& spec) const;
  // AlreadyExists for `name`, stored as `stored`, naming its runner.
  std::unexpected<Error> taken(const std::string& name, const SinkSpec& stored) const;
  // Every stored definition but those named in `skip` (read once each,
  // then cached), or none when the store cannot be listed.
  std::vector<SinkSpec> stored_definitions(const std::set<std::string>& skip) const;
  // The same for the definitions under `keys`, listed already (each
  // name's latest revision).
  std::vector<SinkSpec> definitions_of(const std::vector<std::string>& keys,
                                       const std::set<std::string>& skip) const;
  // The latest stored definition of `name` (its revision set), or nullopt.
  [[nodiscard]] Result<std::optional<SinkSpec>> stored_spec(const std::string& name) const;
  // Removes every stored revision of `name`'s definition.
  [[nodiscard]] Status remove_definition(const std::string& name);
  // Stops this server's run of a sink whose definition is now `spec` (it
  // commits what it wrote and lets go of its lease), then takes `spec`.
  void restart(const std::shared_ptr<Task>& task, const SinkSpec& spec);
  // Why this server may not run `spec`, or nullopt when it may: its
  // destination must be allowed here, and a file:// sink's host be this
  // machine's.
  std::optional<std::string> not_here(const SinkSpec& spec) const;
  // Whether the server `target` (as it publishes itself) may run `spec`:
  // not_here's rules, with its host and allowed destinations.
  bool may_run(const SinkSpec& spec, const ServerPresence& target) const;
  // Where adopt() stands with `name` given the servers' presence: handed by
  // its runner to this server (taken at once), to another live one (left
  // to it), or neither.
  enum class Handed : std::uint8_t { kNo, kHere, kElsewhere };
  Handed handed(const std::string& name, std::uint64_t now_ms) const;
  // Publishes this server's presence (sink/server_presence.h) and keeps
  // the servers' as read, those that see the same sinks (`scope`, a digest
  // of the names listed); false when it could not.
  bool publish_presence_now(std::uint64_t now_ms, const std::string& scope);
  // When another live server runs at least two sinks fewer than this one,
  // hands it one of this server's running sinks (see the header).
  void balance(std::uint64_t now_ms);
  // What stopped this server from taking `name` last time (nullopt: clear).
  void note_adoption(const std::string& name, std::optional<std::string> error);
  // Takes `spec` and starts it when no runner holds its lease (free,
  // released, lapsed, its holder dead, or this server's previous life),
  // `spread`ing as the header says; true once started.
  bool adopt(const SinkSpec& spec, bool spread);
  void expire_hold(const SinkSpec& spec) const;
  void reconcile();

  // Schedules the sink's first step; when it cannot, the sink is listed as
  // failed (with the reason) and the error returned.
  [[nodiscard]] Status start(const SinkSpec& spec, std::shared_ptr<SinkClaim> claim);

  std::shared_ptr<Client> client_;
  std::shared_ptr<MemoryPool> pool_;
  const SinkRunner runner_;
  const DestinationAllowList allowed_;
  const std::chrono::milliseconds idle_close_;
  const std::uint64_t snapshot_part_bytes_;
  // This process, read from /proc once: its host names the machine of the
  // file sinks it creates and may run, and a lease naming it is held here.
  const ProcessIdentity self_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Task>> tasks_;
  mutable std::mutex definitions_mu_;
  mutable std::map<std::string, SinkSpec> definitions_;  // by key; guarded by definitions_mu_
  // adopt()'s memory, by sink name, guarded by adoption_mu_: the lease of
  // a sink held elsewhere as last read (not read again before it can
  // lapse, unless its holder was a process of this machine that died), how
  // many looks a free sink has been let go by (spread), and what stopped
  // this server from taking one (its destination held elsewhere). Each
  // holds only sinks still defined (pruned at every look).
  mutable std::mutex adoption_mu_;
  std::mutex adopt_mu_;  // held by each adopt(), and by stop_all() once
  std::map<std::string, LeaseRecord> held_leases_;
  std::map<std::string, int> waiting_rounds_;
  std::map<std::string, std::string> adoption_errors_;
  // Balance, guarded by adoption_mu_: the live servers as last published
  // (this one included), the sinks this server is handing over now, when
  // it last handed each sink (kept kHandAgainAfter), and when it may hand
  // the next one (wall clock, ms).
  std::vector<ServerPresence> presence_;
  std::string scope_;
  std::vector<ServerPresence::Handing> handing_;
  std::map<std::string, std::uint64_t> handed_at_;
  std::uint64_t next_hand_over_ms_ = 0;
  std::atomic<bool> stopping_{false};
  WorkPool threads_;  // before timers_: destroyed after them
  Timers timers_;
};

}  // namespace tidemark
