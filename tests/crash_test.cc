// Crash test: child processes work on one shard on the embedded default
// (file blob + SQLite) and are killed with SIGKILL at random moments, many
// times. Two kinds of child, run alone or together on the same directory:
//   - the appender (`--child DIR`) appends in a loop; its client compacts
//     and collects garbage in the background (the default);
//   - the compactor (`--child-compact DIR`) loops over an append,
//     Shard::compact() and Shard::collect_garbage(), so kills land
//     mid-upload, mid-merge and mid-GC.
// Both append with the same scheme (time t carries records_at(t) records
// "t<t>-<j>" with value t), so whichever wins the race for a time writes it
// and the check below does not care which one did. A child prints "ack T"
// once the append at time T returned success.
//
// After each kill a fresh client checks that every acknowledged append is
// present, every visible append is whole, and no update is counted twice
// (compaction merging an input in twice would show as a diff of 2). At the
// end, once the killed children's writer leases ran out, one garbage
// collection must leave exactly the parts the state references: no orphan
// of a killed upload or merge survives it.
//
// TIDEMARK_RANDOM_CONFIG=N (or `random`) runs the parent and every child
// under the configuration drawn from N (shard/random_config.h), except for
// the knobs crash_options() keeps, and seeds the kill schedule with N.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "random_config.h"
#include "tidemark/client.h"
#include "tidemark/read.h"
#include "tidemark/write.h"

extern char** environ;

namespace tidemark {
namespace {

std::string g_self;

constexpr char kShard[] = "crash";
constexpr char kPartPrefix[] = "shard/crash/part/";

// Short, so the writers of killed children are gone (and their orphans
// collectable) soon after the kill.
constexpr std::chrono::milliseconds kWriterLease{1500};

// Appends at time t: a big multi-part batch every fifth time, else a small one.
int records_at(Time t) {
  return t % 5 == 4 ? 3000 : 20;
}

// The drawn configuration's client options under TIDEMARK_RANDOM_CONFIG
// (block size, uploads in flight, compression, listen knobs), else the
// defaults. Never its faults or latencies: a child takes any error as fatal,
// and a slowed child would do too little before its kill.
ClientOptions base_options() {
  const auto& random = testing::random_config();
  if (!random) {
    std::fprintf(stderr, "%s\n", random.error().to_string().c_str());
    std::exit(2);
  }
  return *random ? (*random)->client : ClientOptions{};
}

// The appender's client: small parts, so big batches span many, and
// compaction in the background (the default). These three stay as the
// test sets them under a random configuration too, and so do the parent's
// and the compactor's below: the test relies on them.
ClientOptions crash_options() {
  ClientOptions options = base_options();
  options.part_target_bytes = 16 << 10;
  options.writer_lease = kWriterLease;
  options.background_compaction = true;
  return options;
}

// The parent's client: it only reads, and collects garbage when told.
ClientOptions parent_options() {
  ClientOptions options = crash_options();
  options.background_compaction = false;
  return options;
}

// The compactor child's client: compacts only when told. Its parts are
// bigger because a merge of the whole shard (which the spine asks for while
// its oldest batch is small) writes one fsynced part per part_target_bytes:
// at 16 KiB it outlasts a child's life, so no merge would ever finish and
// the spine would never take shape.
ClientOptions compactor_options() {
  ClientOptions options = parent_options();
  options.part_target_bytes = 256 << 10;
  return options;
}

std::shared_ptr<Client> open_dir(const std::string& dir, ClientOptions options = crash_options()) {
  auto client = Client::open("file://" + dir + "/blob", "sqlite://" + dir + "/consensus.db",
                             std::move(options));
  if (!client) {
    std::fprintf(stderr, "open: %s\n", client.error().to_string().c_str());
    std::exit(2);
  }
  return *client;
}

// Output lines are written whole (one fflush per line), so a kill leaves
// at most a torn last line, which the parent ignores.
void say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// Appends records_at(t) at the time t = the writer's upper. Returns false
// when another writer took that time first (the writer's upper then moved
// on); any other failure ends the child.
bool append_next(WriteHandle& writer) {
  const Time t = writer.upper().time();
  BatchBuilder builder = writer.builder(Frontier::at(t));
  for (int j = 0; j < records_at(t); ++j) {
    if (!builder.add("t" + std::to_string(t) + "-" + std::to_string(j), std::to_string(t), t, 1)) {
      std::exit(2);
    }
  }
  auto batch = builder.finish(Frontier::at(t + 1));
  if (!batch) {
    std::fprintf(stderr, "finish: %s\n", batch.error().to_string().c_str());
    std::exit(2);
  }
  std::vector<Batch> batches;
  batches.push_back(std::move(*batch));
  auto appended = writer.compare_and_append(batches, Frontier::at(t), Frontier::at(t + 1));
  if (!appended && appended.error().is(ErrorKind::kUpperMismatch)) return false;
  if (!appended) {
    std::fprintf(stderr, "append: %s\n", appended.error().to_string().c_str());
    std::exit(2);
  }
  say("ack " + std::to_string(t));
  return true;
}

int appender_main(const std::string& dir) {
  auto shard = open_dir(dir)->open_shard(kShard);
  if (!shard) return 2;
  auto writer = (*shard)->open_writer();
  if (!writer) return 2;
  for (;;) (void)append_next(**writer);
}

// Prints "compacting" before and "merges M L" after each compact()
// (registered, lost), "collecting" before and "gc P O R V" after each
// collect_garbage() (parts, orphans and rollups deleted, versions
// truncated), so the last line before a kill says where it landed. Errors
// are printed, not fatal: passes racing each other across processes may
// lose (an input deleted under a merge, versions truncated under a fold);
// the data checks are the judge.
int compactor_main(const std::string& dir) {
  auto shard = open_dir(dir, compactor_options())->open_shard(kShard);
  if (!shard) return 2;
  auto writer = (*shard)->open_writer();
  if (!writer) return 2;
  for (;;) {
    (void)append_next(**writer);
    say("compacting");
    auto compacted = (*shard)->compact();
    if (compacted) {
      say("merges " + std::to_string(compacted->merges) + " " +
          std::to_string(compacted->merges_lost));
    } else {
      say("error compact " + compacted.error().to_string());
    }
    say("collecting");
    auto collected = (*shard)->collect_garbage();
    if (collected) {
      say("gc " + std::to_string(collected->parts_deleted) + " " +
          std::to_string(collected->orphans_deleted) + " " +
          std::to_string(collected->rollups_deleted) + " " +
          std::to_string(collected->versions_truncated));
    } else {
      say("error gc " + collected.error().to_string());
    }
  }
}

// What the children reported, summed over the test.
struct Totals {
  int kills = 0;
  int appender_kills = 0;
  int compactor_kills = 0;
  std::set<Time> acked;
  std::uint64_t merges = 0;
  std::uint64_t merges_lost = 0;
  std::uint64_t parts_deleted = 0;
  std::uint64_t orphans_deleted = 0;
  std::uint64_t rollups_deleted = 0;
  std::uint64_t versions_truncated = 0;
  std::map<std::string, int> errors;  // by first words, e.g. "error gc Determinate:"
  // Where the compactor children were when killed: "startup", "append",
  // "compact" or "gc".
  std::map<std::string, int> compactor_killed_in;
};

// A running child. One still alive when it goes out of scope (a failed
// assertion left the round early) is killed, so none outlives the test.
struct Child {
  Child() = default;
  Child(Child&& other) noexcept
      : mode(std::move(other.mode)),
        pid(std::exchange(other.pid, -1)),
        out(std::exchange(other.out, -1)),
        pending(std::move(other.pending)),
        phase(std::move(other.phase)),
        kill_at(other.kill_at),
        spawned(other.spawned),
        reported(other.reported) {}
  Child& operator=(Child&&) = delete;
  ~Child() {
    if (pid > 0 && kill(pid, SIGKILL) == 0) waitpid(pid, nullptr, 0);
    if (out >= 0) close(out);
  }

  std::string mode;  // "--child" or "--child-compact"
  pid_t pid = -1;
  int out = -1;
  std::string pending;            // output not yet parsed (an incomplete last line)
  std::string phase = "startup";  // a compactor's step, from its last line
  std::chrono::steady_clock::time_point kill_at;
  std::chrono::steady_clock::time_point spawned;
  bool reported = false;  // it has written something: it is past its start
};

Child spawn_child(const std::string& mode, const std::string& dir,
                  std::chrono::steady_clock::time_point kill_at) {
  Child child;
  child.mode = mode;
  child.kill_at = kill_at;
  child.spawned = std::chrono::steady_clock::now();
  int out[2];
  if (pipe(out) != 0) return child;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::string dir_arg = dir;
  char* argv[] = {g_self.data(), child.mode.data(), dir_arg.data(), nullptr};
  if (posix_spawn(&child.pid, g_self.c_str(), &actions, nullptr, argv, environ) != 0) {
    child.pid = -1;
  }
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  child.out = out[0];
  return child;
}

// Parses the complete lines in the child's pending output.
void parse_lines(Child& child, Totals& totals) {
  std::size_t start = 0;
  for (std::size_t end; (end = child.pending.find('\n', start)) != std::string::npos;
       start = end + 1) {
    const std::string line = child.pending.substr(start, end - start);
    unsigned long long a = 0, b = 0, c = 0, d = 0;
    if (line == "compacting") {
      child.phase = "compact";
    } else if (line == "collecting") {
      child.phase = "gc";
    } else if (std::sscanf(line.c_str(), "ack %llu", &a) == 1) {
      EXPECT_TRUE(totals.acked.insert(a).second) << "time " << a << " acknowledged twice";
    } else if (std::sscanf(line.c_str(), "merges %llu %llu", &a, &b) == 2) {
      totals.merges += a;
      totals.merges_lost += b;
    } else if (std::sscanf(line.c_str(), "gc %llu %llu %llu %llu", &a, &b, &c, &d) == 4) {
      totals.parts_deleted += a;
      totals.orphans_deleted += b;
      totals.rollups_deleted += c;
      totals.versions_truncated += d;
      child.phase = "append";
    } else if (line.starts_with("error ")) {
      if (line.starts_with("error gc")) child.phase = "append";
      // Key by "error <op> <Kind>:" so the summary stays short.
      std::size_t kind_end = line.find(':');
      if (totals.errors[line.substr(0, kind_end)]++ == 0) {
        std::printf("first %s\n", line.c_str());
      }
      EXPECT_EQ(line.find("Corruption"), std::string::npos) << line;
    }
  }
  child.pending.erase(0, start);
}

// Reads what the child wrote, waiting at most `timeout_ms`.
void read_some(Child& child, int timeout_ms, Totals& totals) {
  pollfd p{child.out, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return;
  char buffer[4096];
  ssize_t n = read(child.out, buffer, sizeof buffer);
  if (n > 0) {
    child.pending.append(buffer, static_cast<std::size_t>(n));
    child.reported = true;
  }
  parse_lines(child, totals);
}

void kill_child(Child& child, Totals& totals) {
  ASSERT_EQ(kill(child.pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child.pid, &status, 0), child.pid);
  child.pid = -1;  // reaped
  ASSERT_TRUE(WIFSIGNALED(status)) << child.mode << " exited on its own (status " << status << ")";
  char buffer[4096];
  for (ssize_t n; (n = read(child.out, buffer, sizeof buffer)) > 0;) {
    child.pending.append(buffer, static_cast<std::size_t>(n));
  }
  close(std::exchange(child.out, -1));
  parse_lines(child, totals);  // a torn last line stays unparsed: not acknowledged
  ++totals.kills;
  if (child.mode == "--child") {
    ++totals.appender_kills;
  } else {
    ++totals.compactor_kills;
    ++totals.compactor_killed_in[child.phase];
  }
}

// A fresh client (as after a restart) sees every acknowledged append whole,
// every visible append whole, and each update once.
void check_shard(const std::string& dir, const Totals& totals) {
  auto shard = *open_dir(dir, parent_options())->open_shard(kShard);
  auto info = shard->inspect();
  ASSERT_TRUE(info) << info.error().to_string();
  const Frontier upper = info->upper;
  ASSERT_FALSE(upper.is_closed());
  if (!totals.acked.empty()) {
    ASSERT_GT(upper.time(), *totals.acked.rbegin()) << "an acknowledged append is lost";
  }
  if (upper.time() == 0) return;
  // No reader ever downgrades, so since stays at 0 and as_of = upper - 1 is
  // at or past it.
  ASSERT_TRUE(info->since.includes(upper.time() - 1))
      << "since passed upper - 1: " << info->to_json();
  auto cursor = shard->snapshot(upper.time() - 1);
  ASSERT_TRUE(cursor) << cursor.error().to_string();
  std::map<Time, int> per_time;
  for (;;) {
    auto row = cursor->next();
    ASSERT_TRUE(row) << row.error().to_string();
    if (!*row) break;
    ASSERT_EQ((*row)->diff, 1) << "an update counted " << (*row)->diff << " times: " << (*row)->key;
    per_time[std::stoull(std::string((*row)->value))]++;
  }
  for (Time t = 0; t < upper.time(); ++t) {
    ASSERT_EQ(per_time[t], records_at(t)) << "append at time " << t << " is not whole";
  }
  ASSERT_EQ(per_time.size(), upper.time());
  // Stored updates, before consolidation: with distinct keys and diffs of
  // 1 they equal the records appended below upper, unless a merge kept an
  // update besides its input.
  std::uint64_t expected_updates = 0;
  for (Time t = 0; t < upper.time(); ++t) expected_updates += records_at(t);
  ASSERT_EQ(info->updates, expected_updates) << info->to_json();
}

// Kills are scheduled for a Release build's speed; an AddressSanitizer
// build runs the children several times slower, so its schedule stretches
// to kill them at the same points of their work.
#if defined(__SANITIZE_ADDRESS__)
constexpr int kSanitizerSlowdown = 4;
#else
constexpr int kSanitizerSlowdown = 1;
#endif

TEST(CrashTest, AcknowledgedAppendsSurviveSigkillDuringAppendCompactionAndGc) {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tidemark-crash-" + std::to_string(getpid()));
  const auto& random = testing::random_config();
  ASSERT_TRUE(random) << random.error().to_string();
  if (*random) testing::print_random_config(**random, "crash_test");
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(open_dir(dir.string(), parent_options())->create_shard(kShard));

  const std::uint64_t seed = *random ? (*random)->seed : std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Totals totals;
  const int rounds = 48;
  for (int round = 0; round < rounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // Appender alone, compactor alone, or both, each killed at its own
    // random moment: a kill lands mid-append, mid-merge or mid-GC, and a
    // survivor keeps working on what the other left behind.
    std::vector<std::string> modes;
    switch (round % 4) {
      case 0:
        modes = {"--child"};
        break;
      case 2:
        modes = {"--child-compact"};
        break;
      default:
        modes = {"--child", "--child-compact"};
    }
    const auto start = std::chrono::steady_clock::now();
    std::vector<Child> children;
    for (const std::string& mode : modes) {
      auto delay = std::chrono::milliseconds(std::uniform_int_distribution<int>(5, 300)(rng) *
                                             kSanitizerSlowdown);
      children.push_back(spawn_child(mode, dir.string(), start + delay));
      ASSERT_GT(children.back().pid, 0) << "spawn " << mode;
    }
    for (std::size_t alive = children.size(); alive > 0;) {
      for (Child& child : children) {
        if (child.pid < 0) continue;
        read_some(child, 1, totals);
        const auto now = std::chrono::steady_clock::now();
        if (now < child.kill_at) continue;
        // A child that has written nothing yet is still starting (slowly,
        // under a sanitizer): it is killed once it works, so the rounds
        // kill appends, merges and GC, not only process startups.
        if (!child.reported && now < child.spawned + std::chrono::seconds(10)) continue;
        ASSERT_NO_FATAL_FAILURE(kill_child(child, totals));
        --alive;
        // Checked while the other child, if any, goes on appending,
        // compacting and collecting garbage.
        ASSERT_NO_FATAL_FAILURE(check_shard(dir.string(), totals));
      }
    }
  }

  // Once the killed children's leases ran out, one pass deletes every part
  // the state does not reference: what compaction replaced, and the
  // orphans of uploads and merges killed before they were registered.
  std::this_thread::sleep_for(kWriterLease + std::chrono::milliseconds(500));
  auto client = open_dir(dir.string(), parent_options());
  auto shard = *client->open_shard(kShard);
  auto collected = shard->collect_garbage();
  ASSERT_TRUE(collected) << collected.error().to_string();
  totals.parts_deleted += collected->parts_deleted;
  totals.orphans_deleted += collected->orphans_deleted;
  totals.rollups_deleted += collected->rollups_deleted;
  totals.versions_truncated += collected->versions_truncated;

  std::uint64_t listed = 0;
  ASSERT_TRUE(client->location().blob->list(kPartPrefix,
                                            [&](std::string_view, std::uint64_t) { ++listed; }));
  auto info = shard->inspect();
  ASSERT_TRUE(info) << info.error().to_string();
  // No reader is left, so "live" means referenced by the head: every part
  // listed is one the state references, and each referenced part not held
  // inline in the state is there.
  EXPECT_EQ(collected->parts_live, listed) << info->to_json();
  EXPECT_EQ(info->parts - info->inline_parts, listed) << info->to_json();
  auto again = shard->collect_garbage();
  ASSERT_TRUE(again) << again.error().to_string();
  EXPECT_EQ(again->parts_deleted, 0u);
  EXPECT_EQ(again->orphans_deleted, 0u);
  EXPECT_EQ(again->parts_live, listed);
  ASSERT_NO_FATAL_FAILURE(check_shard(dir.string(), totals));

  // Temporaries of uploads killed before their rename: the file backend
  // documents that it never cleans these up, so they are only counted.
  std::uint64_t temporaries = 0;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(dir / "blob" / "shard" / kShard)) {
    if (entry.path().filename().string().starts_with(".tmp-")) ++temporaries;
  }

  std::printf(
      "%d kills (%d appender, %d compactor), %zu acknowledged appends verified\n"
      "compactor children: %llu merges registered, %llu lost\n"
      "garbage collected (children and final pass): %llu parts, %llu orphans, %llu rollups, "
      "%llu versions truncated; final pass: %llu parts, %llu orphans\n"
      "final state: %llu batches, %llu parts (all listed), upper %llu; %llu .tmp- leftovers\n",
      totals.kills, totals.appender_kills, totals.compactor_kills, totals.acked.size(),
      static_cast<unsigned long long>(totals.merges),
      static_cast<unsigned long long>(totals.merges_lost),
      static_cast<unsigned long long>(totals.parts_deleted),
      static_cast<unsigned long long>(totals.orphans_deleted),
      static_cast<unsigned long long>(totals.rollups_deleted),
      static_cast<unsigned long long>(totals.versions_truncated),
      static_cast<unsigned long long>(collected->parts_deleted),
      static_cast<unsigned long long>(collected->orphans_deleted),
      static_cast<unsigned long long>(info->batches), static_cast<unsigned long long>(info->parts),
      static_cast<unsigned long long>(info->upper.time()),
      static_cast<unsigned long long>(temporaries));
  std::printf("compactor children killed in:");
  for (const auto& [phase, count] : totals.compactor_killed_in) {
    std::printf(" %s %d", phase.c_str(), count);
  }
  std::printf("\n");
  for (const auto& [kind, count] : totals.errors) std::printf("%s: %d\n", kind.c_str(), count);
  EXPECT_GT(totals.acked.size(), 10u) << "the children made too little progress to test anything";
  EXPECT_GT(totals.merges, 0u) << "no compaction ran to completion";
  // Some of the 70-odd kills land mid-upload or mid-merge (uploads are most
  // of a child's time), and the last lease's worth of them is collected by
  // the final pass at the latest.
  EXPECT_GT(totals.orphans_deleted, 0u) << "no kill left an orphan for garbage collection";
  // Fewer batches than appends: compaction ran (and survived its kills).
  EXPECT_LT(info->batches, info->upper.time());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tidemark

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--child") == 0) return tidemark::appender_main(argv[2]);
  if (argc == 3 && std::strcmp(argv[1], "--child-compact") == 0) {
    return tidemark::compactor_main(argv[2]);
  }
  tidemark::g_self = std::filesystem::read_symlink("/proc/self/exe").string();
  // The children draw the parent's configuration: `random` becomes its seed.
  if (const auto& random = tidemark::testing::random_config(); random && *random) {
    setenv(tidemark::kRandomConfigVariable, std::to_string((*random)->seed).c_str(), 1);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
