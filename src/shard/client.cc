#include "tidemark/client.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "location/retrying_blob.h"
#include "shard/change_watch.h"
#include "shard/compactor.h"
#include "shard/context.h"
#include "shard/gc.h"
#include "shard/read_internal.h"
#include "shard/state.h"
#include "util/json.h"
#include "util/try.h"

namespace tidemark {

namespace {

void append_json_string_or_null(std::string* out, const std::string& text) {
  if (text.empty()) {
    *out += "null";
  } else {
    append_json_string(out, text);
  }
}

// "<host name>:<process id>": who a client is when its options do not say.
std::string default_owner() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  return std::string(host) + ":" + std::to_string(getpid());
}

}  // namespace

std::string ShardInfo::to_json() const {
  std::string out =
      "{\"name\":\"" + name + "\",\"upper\":" + upper.to_json() + ",\"since\":" + since.to_json() +
      ",\"seqno\":" + std::to_string(seqno) + ",\"batches\":" + std::to_string(batches) +
      ",\"parts\":" + std::to_string(parts) + ",\"inline_parts\":" + std::to_string(inline_parts) +
      ",\"updates\":" + std::to_string(updates) + ",\"bytes\":" + std::to_string(bytes);
  out += ",\"readers\":[";
  for (std::size_t i = 0; i < readers.size(); ++i) {
    const ReaderInfo& r = readers[i];
    out += i == 0 ? "{\"id\":" : ",{\"id\":";
    append_json_string(&out, r.id);
    out += ",\"since\":" + r.since.to_json() + ",\"critical\":" + (r.critical ? "true" : "false") +
           ",\"expires_ms\":" + (r.critical ? "null" : std::to_string(r.lease_expires_ms)) +
           ",\"owner\":";
    append_json_string_or_null(&out, r.owner);
    out += "}";
  }
  out += "],\"writers\":[";
  for (std::size_t i = 0; i < writers.size(); ++i) {
    out += i == 0 ? "{\"id\":" : ",{\"id\":";
    append_json_string(&out, writers[i].id);
    out += ",\"expires_ms\":" + std::to_string(writers[i].lease_expires_ms) + ",\"owner\":";
    append_json_string_or_null(&out, writers[i].owner);
    out += "}";
  }
  out += "]}";
  return out;
}

Result<std::shared_ptr<Client>> Client::open(Location location, ClientOptions options) {
  if (!location.blob || !location.consensus) {
    return invalid_usage("a location needs both a blob and a consensus");
  }
  return std::make_shared<Client>(std::move(location), options);
}

Result<std::shared_ptr<Client>> Client::open(std::string_view blob_url,
                                             std::string_view consensus_url,
                                             ClientOptions options) {
  Location location;
  TM_ASSIGN(location.blob, open_blob(blob_url));
  TM_ASSIGN(location.consensus, open_consensus(consensus_url));
  return open(std::move(location), options);
}

Client::Client(Location location, ClientOptions options)
    : location_(std::move(location)),
      options_(std::move(options)),
      changes_(std::make_shared<ChangeWatch>(location_.consensus, options_.change_poll_interval,
                                             options_.listen_poll_interval)) {
  if (options_.owner.empty()) options_.owner = default_owner();
}

Status Client::update_registry(const std::function<Result<bool>(std::vector<std::string>&)>& edit) {
  const std::string key = registry_consensus_key();
  for (;;) {
    TM_ASSIGN(auto head, location_.consensus->head(key));
    std::vector<std::string> names;
    if (head) {
      TM_ASSIGN(names, decode_registry(head->data));
    }
    TM_ASSIGN(bool write, edit(names));
    if (!write) return {};
    std::optional<SeqNo> expected;
    SeqNo next = 1;
    if (head) {
      expected = head->seqno;
      next = head->seqno + 1;
    }
    const std::string encoded = encode_registry(names);
    auto cas = location_.consensus->compare_and_set(key, expected, VersionedData{next, encoded});
    if (cas && *cas == CasOutcome::kCommitted) return {};
    if (!cas && !cas.error().is(ErrorKind::kIndeterminate)) return std::unexpected(cas.error());
    // Lost a race or an unknown outcome: only our own bytes at our seqno
    // prove the write landed; otherwise edit what is there now.
    if (!cas) {
      auto again = location_.consensus->head(key);
      if (again && *again && (*again)->seqno == next && (*again)->data == encoded) return {};
    }
  }
}

Status Client::create_shard(std::string_view name) {
  TM_TRY(validate_shard_name(name));
  bool revived = false;
  return update_registry([&](std::vector<std::string>& names) -> Result<bool> {
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      return make_error(ErrorKind::kAlreadyExists,
                        "shard " + std::string(name) + " already exists");
    }
    // A shard of this name that was deleted left a tombstone: the new one
    // starts from it, as the next incarnation, before its name is listed
    // (listed, it must be openable).
    if (!revived) {
      ShardMachine machine(std::string(name), location_.consensus, location_.blob,
                           options_.inline_rollup_max_bytes);
      TM_TRY(with_retries(options_.write_retry, [&] {
        return machine.apply([](ShardState& state) -> Result<TransitionResult> {
          return revive(state) ? TransitionResult::kWrite : TransitionResult::kUnchanged;
        });
      }));
      revived = true;
    }
    names.emplace_back(name);
    return true;
  });
}

Result<std::vector<std::string>> Client::list_shards() {
  TM_ASSIGN(auto head, location_.consensus->head(registry_consensus_key()));
  if (!head) return std::vector<std::string>{};
  TM_ASSIGN(auto names, decode_registry(head->data));
  std::sort(names.begin(), names.end());
  return names;
}

std::shared_ptr<ShardContext> Client::make_context(std::string_view name) {
  auto context = std::make_shared<ShardContext>();
  context->name = std::string(name);
  context->location = location_;
  context->options = options_;
  context->machine = std::make_shared<ShardMachine>(
      context->name, location_.consensus, location_.blob, options_.inline_rollup_max_bytes);
  context->read_blob =
      std::make_shared<RetryingBlob>(location_.blob, options_.read_retry, context->stop_reads());
  return context;
}

Result<DeleteReport> Client::delete_shard(std::string_view name, bool force) {
  TM_TRY(validate_shard_name(name));
  TM_ASSIGN(auto names, list_shards());
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    return make_error(ErrorKind::kNotFound, "no shard named " + std::string(name));
  }
  // 1. The tombstone: from here on no handle reads or writes the shard.
  std::shared_ptr<ShardContext> context = make_context(name);
  TM_TRY(with_retries(options_.write_retry, [&] {
    return context->machine->apply([&](ShardState& state) -> Result<TransitionResult> {
      TM_ASSIGN(bool buried, bury(state, force));
      return buried ? TransitionResult::kWrite : TransitionResult::kUnchanged;
    });
  }));
  // 2. Its data. The tombstone references nothing and no writer: every
  // part is garbage, and the versions before it go.
  DeleteReport report;
  TM_ASSIGN(GcReport gc,
            with_retries(options_.write_retry, [&] { return collect_garbage(*context); }));
  report.objects_deleted = gc.parts_deleted + gc.orphans_deleted + gc.rollups_deleted;
  report.versions_truncated = gc.versions_truncated;
  // 3. The name (already gone if another delete finished first).
  TM_TRY(update_registry([&](std::vector<std::string>& listed) -> Result<bool> {
    auto it = std::find(listed.begin(), listed.end(), name);
    if (it == listed.end()) return false;
    listed.erase(it);
    return true;
  }));
  return report;
}

Result<std::shared_ptr<Shard>> Client::open_shard(std::string_view name) {
  TM_TRY(validate_shard_name(name));
  TM_ASSIGN(auto names, list_shards());
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    return make_error(ErrorKind::kNotFound, "no shard named " + std::string(name));
  }
  std::shared_ptr<ShardContext> context = make_context(name);
  // The handle is bound to the incarnation it finds (machine.h).
  TM_ASSIGN(StatePtr state,
            with_retries(options_.read_retry, [&] { return context->machine->fetch(); }));
  if (state->deleted) {
    return make_error(
        ErrorKind::kNotFound,
        "shard " + std::string(name) + " was deleted (a delete that did not finish: run it again)");
  }
  context->machine->expect_incarnation(state->incarnation);
  context->changes = changes_;
  context->machine->report_to(changes_);
  context->reader_heartbeats = make_reader_heartbeats(options_.reader_lease);
  context->listen_readers = make_listen_readers();
  if (options_.background_compaction) {
    context->compactor = std::make_unique<BackgroundCompactor>(context.get());
  }
  return std::shared_ptr<Shard>(new Shard(std::move(context)));
}

Subscription::Subscription(Subscription&& other) noexcept
    : watch_(std::move(other.watch_)), id_(std::exchange(other.id_, 0)) {}

Subscription& Subscription::operator=(Subscription&& other) noexcept {
  if (this != &other) {
    reset();
    watch_ = std::move(other.watch_);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

Subscription::~Subscription() {
  reset();
}

void Subscription::reset() {
  if (watch_) watch_->unsubscribe(id_);
  watch_.reset();
  id_ = 0;
}

}  // namespace tidemark
