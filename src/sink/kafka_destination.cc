#include "sink/kafka_destination.h"

#include <librdkafka/rdkafka.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <functional>
#include <map>

#include "sink/kafka_reader.h"
#include "util/json.h"
#include "util/number.h"
#include "util/try.h"

namespace tidemark {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view kScheme = "kafka://";
constexpr std::string_view kTimeHeader = "tidemark-time";
// Delivery reports are served at least this often while writing.
constexpr std::uint64_t kPollEveryMessages = 1024;
// The per-message opaque that marks the progress record's delivery report.
int g_progress_tag = 0;

bool valid_topic(std::string_view topic) {
  if (topic.empty() || topic.size() > 249 || topic == "." || topic == "..") return false;
  return std::all_of(topic.begin(), topic.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

Status set(rd_kafka_conf_t* conf, const char* name, const std::string& value) {
  char errstr[512];
  if (rd_kafka_conf_set(conf, name, value.c_str(), errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
    return invalid_usage(std::string("kafka: ") + name + "=" + value + ": " + errstr);
  }
  return {};
}

// Takes ownership of `error`; OK when it is null.
Status txn_error(rd_kafka_error_t* error, const std::string& what, ErrorKind kind) {
  if (error == nullptr) return {};
  std::string message = "kafka: " + what + ": " + rd_kafka_error_string(error);
  if (rd_kafka_error_is_fatal(error)) message += " (fatal: another sink with this id took over?)";
  rd_kafka_error_destroy(error);
  return make_error(kind, std::move(message));
}

struct ConfDeleter {
  void operator()(rd_kafka_conf_t* conf) const { rd_kafka_conf_destroy(conf); }
};
struct HandleDeleter {
  void operator()(rd_kafka_t* handle) const { rd_kafka_destroy(handle); }
};
using ConfPtr = std::unique_ptr<rd_kafka_conf_t, ConfDeleter>;
using HandlePtr = std::unique_ptr<rd_kafka_t, HandleDeleter>;

Result<HandlePtr> new_handle(rd_kafka_type_t type, ConfPtr conf) {
  char errstr[512];
  rd_kafka_t* handle = rd_kafka_new(type, conf.get(), errstr, sizeof errstr);
  if (handle == nullptr) return invalid_usage(std::string("kafka: ") + errstr);
  (void)conf.release();  // rd_kafka_new owns it now
  return HandlePtr(handle);
}

}  // namespace

// ---------------------------------------------------------------------------
// Addresses and progress records.

Result<KafkaAddress> KafkaAddress::parse(std::string_view url) {
  auto fail = [&](std::string why) {
    return invalid_usage("kafka destination " + std::string(url) + ": " + why +
                         " (expected kafka://host:port[,host:port]/topic)");
  };
  if (!url.starts_with(kScheme)) return fail("not a kafka:// URL");
  std::string_view rest = url.substr(kScheme.size());
  std::string_view query;
  if (auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  auto slash = rest.find('/');
  if (slash == std::string_view::npos) return fail("no topic");
  KafkaAddress address;
  address.brokers = std::string(rest.substr(0, slash));
  address.topic = std::string(rest.substr(slash + 1));
  if (address.brokers.empty()) return fail("no brokers");
  std::string_view brokers = address.brokers;
  while (!brokers.empty()) {
    auto comma = brokers.find(',');
    std::string_view broker = brokers.substr(0, comma);
    auto colon = broker.rfind(':');
    // The whole port: "9092x" was read as 9092.
    if (colon == std::string_view::npos || colon == 0 ||
        !parse_decimal(broker.substr(colon + 1), 1, 65535)) {
      return fail("broker \"" + std::string(broker) + "\" is not host:port");
    }
    if (comma == std::string_view::npos) break;
    brokers = brokers.substr(comma + 1);
    if (brokers.empty()) return fail("a trailing comma after the brokers");
  }
  if (!valid_topic(address.topic)) return fail("invalid topic \"" + address.topic + "\"");
  address.progress_topic = address.topic + "-progress";
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    constexpr std::string_view kProgress = "progress_topic=";
    if (!item.starts_with(kProgress)) return fail("unknown option \"" + std::string(item) + "\"");
    address.progress_topic = std::string(item.substr(kProgress.size()));
    if (!valid_topic(address.progress_topic)) {
      return fail("invalid progress topic \"" + address.progress_topic + "\"");
    }
  }
  if (address.progress_topic == address.topic) return fail("the progress topic is the topic");
  return address;
}

std::string KafkaProgressRecord::to_json() const {
  std::string out = "{\"frontier\":";
  append_u64(&out, frontier.time());
  out += ",\"topic\":";
  append_json_string(&out, topic);
  out += ",\"offsets\":[";
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    if (i > 0) out += ',';
    out += '[';
    append_i64(&out, offsets[i].partition);
    out += ',';
    append_i64(&out, offsets[i].first);
    out += ',';
    append_i64(&out, offsets[i].last);
    out += ']';
  }
  out += ']';
  if (snapshot) {
    out += ",\"snapshot\":{\"as_of\":";
    append_u64(&out, snapshot->as_of);
    out += ",\"key_hex\":\"";
    constexpr char kDigits[] = "0123456789abcdef";
    for (const char c : snapshot->key) {
      const auto byte = static_cast<unsigned char>(c);
      out += kDigits[byte >> 4];
      out += kDigits[byte & 0xf];
    }
    out += "\",\"key_pairs\":";
    append_u64(&out, snapshot->key_pairs);
    out += ",\"pairs\":";
    append_u64(&out, snapshot->pairs);
    out += '}';
  }
  out += '}';
  return out;
}

Result<KafkaProgressRecord> KafkaProgressRecord::parse(std::string_view text) {
  auto bad = [&](std::string why) {
    return corruption("kafka progress record " + std::string(text.substr(0, 200)) + ": " + why);
  };
  auto json = parse_json(text);
  if (!json) return bad(json.error().message);
  const JsonValue* frontier = json->find("frontier");
  const JsonValue* topic = json->find("topic");
  const JsonValue* offsets = json->find("offsets");
  if (frontier == nullptr || !frontier->as_u64()) return bad("no frontier");
  if (topic == nullptr || !topic->is_string()) return bad("no topic");
  if (offsets == nullptr || !offsets->is_array()) return bad("no offsets");
  KafkaProgressRecord record;
  record.frontier = Frontier::at(*frontier->as_u64());
  record.topic = topic->as_string();
  for (const JsonValue& item : offsets->as_array()) {
    if (!item.is_array() || item.as_array().size() != 3)
      return bad("an offset range is not a triple");
    const auto& a = item.as_array();
    auto partition = a[0].as_i64(), first = a[1].as_i64(), last = a[2].as_i64();
    if (!partition || !first || !last || *partition < 0 || *partition > INT32_MAX || *first < 0 ||
        *last < *first) {
      return bad("an offset range is invalid");
    }
    record.offsets.push_back({static_cast<std::int32_t>(*partition), *first, *last});
  }
  if (const JsonValue* snapshot = json->find("snapshot"); snapshot != nullptr) {
    if (!snapshot->is_object()) return bad("snapshot is not an object");
    const JsonValue* as_of = snapshot->find("as_of");
    const JsonValue* key = snapshot->find("key_hex");
    const JsonValue* key_pairs = snapshot->find("key_pairs");
    const JsonValue* pairs = snapshot->find("pairs");
    if (as_of == nullptr || !as_of->as_u64() || key == nullptr || !key->is_string() ||
        key_pairs == nullptr || !key_pairs->as_u64() || pairs == nullptr || !pairs->as_u64()) {
      return bad("a snapshot position needs as_of, key_hex, key_pairs and pairs");
    }
    SnapshotPosition position;
    position.as_of = *as_of->as_u64();
    position.key_pairs = *key_pairs->as_u64();
    position.pairs = *pairs->as_u64();
    const std::string& hex = key->as_string();
    if (hex.size() % 2 != 0) return bad("key_hex has an odd length");
    for (std::size_t i = 0; i < hex.size(); i += 2) {
      std::uint8_t byte = 0;
      const auto [end, ec] = std::from_chars(hex.data() + i, hex.data() + i + 2, byte, 16);
      if (ec != std::errc{} || end != hex.data() + i + 2) return bad("key_hex is not hex");
      position.key += static_cast<char>(byte);
    }
    if (position.key_pairs == 0 || position.pairs < position.key_pairs) {
      return bad("a snapshot position's counts are inconsistent");
    }
    if (record.frontier != Frontier::at(0)) return bad("a snapshot part's frontier is not 0");
    record.snapshot = std::move(position);
  }
  return record;
}

// ---------------------------------------------------------------------------
// The destination.

struct KafkaDestination::State {
  State(const KafkaAddress& a, Envelope envelope, const KafkaDestinationOptions& o)
      : address(a), options(o), encoder(envelope, SinkFormat::kJson) {}

  KafkaAddress address;
  KafkaDestinationOptions options;
  MessageEncoder encoder;
  Lease queue_lease;
  HandlePtr producer;

  std::optional<Frontier> progress;
  std::optional<SnapshotPosition> snapshot;  // a snapshot in progress
  bool open = false;
  Frontier lower;
  std::uint64_t bytes = 0;
  std::uint64_t messages = 0;
  // The open transaction's data offsets per partition, from delivery reports.
  std::map<std::int32_t, std::pair<std::int64_t, std::int64_t>> ranges;
  std::optional<std::string> delivery_error;  // the first failed delivery
  std::optional<std::string> fatal_error;

  KafkaMessage scratch;
  std::string time_text;

  static void on_delivery(rd_kafka_t*, const rd_kafka_message_t* message, void* opaque) {
    auto* self = static_cast<State*>(opaque);
    if (message->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      if (!self->delivery_error) {
        self->delivery_error = std::string("kafka: delivery to ") +
                               rd_kafka_topic_name(message->rkt) +
                               " failed: " + rd_kafka_err2str(message->err);
      }
      return;
    }
    if (message->_private == &g_progress_tag) return;
    auto [it, inserted] =
        self->ranges.try_emplace(message->partition, message->offset, message->offset);
    if (!inserted) {
      it->second.first = std::min(it->second.first, message->offset);
      it->second.second = std::max(it->second.second, message->offset);
    }
  }

  // librdkafka's log lines, printed as its own logger prints them; an
  // error or warning (a broker it cannot reach: it logs these from its
  // threads at once, while an error callback waits for a poll that a
  // blocked init_transactions never makes) is also the destination's
  // trouble.
  static void on_log(const rd_kafka_t* handle, int level, const char* facility, const char* text) {
    rd_kafka_log_print(handle, level, facility, text);
    auto* self = static_cast<State*>(rd_kafka_opaque(handle));
    if (self != nullptr && level <= 4 && self->options.on_trouble) {
      std::string_view what = text;
      if (what.starts_with("[thrd:")) {  // the thread's name: not for users
        if (auto end = what.find("]: "); end != std::string_view::npos) what.remove_prefix(end + 3);
      }
      self->options.on_trouble("kafka: " + std::string(what));
    }
  }

  static void on_error(rd_kafka_t* handle, int err, const char* reason, void* opaque) {
    auto* self = static_cast<State*>(opaque);
    if (err != RD_KAFKA_RESP_ERR__FATAL) {  // librdkafka retries the rest itself
      if (self->options.on_trouble) self->options.on_trouble(std::string("kafka: ") + reason);
      return;
    }
    char text[512];
    rd_kafka_fatal_error(handle, text, sizeof text);
    if (!self->fatal_error) self->fatal_error = std::string("kafka: fatal error: ") + text;
  }

  Status check_errors() const {
    if (fatal_error) return determinate(*fatal_error);
    if (delivery_error) return determinate(*delivery_error);
    return {};
  }

  bool cancelled() const { return is_cancelled(options.cancel.get()); }

  // Calls a transactional call that resumes where it was when called again
  // after a timeout, in slices, until it is done, fails otherwise, runs
  // past operation_timeout or is cancelled. `call` takes the slice's
  // timeout in milliseconds. An error is of `kind`.
  Status resumable(const std::string& what, ErrorKind kind,
                   const std::function<rd_kafka_error_t*(int)>& call) const {
    const auto deadline = Clock::now() + options.operation_timeout;
    for (;;) {
      rd_kafka_error_t* error = call(slice_ms(deadline, options.cancel.get()));
      if (error == nullptr || rd_kafka_error_code(error) != RD_KAFKA_RESP_ERR__TIMED_OUT ||
          Clock::now() >= deadline) {
        return txn_error(error, what, kind);
      }
      rd_kafka_error_destroy(error);
      if (cancelled()) return cancelled_error("kafka: " + what);
    }
  }

  Status make_producer() {
    ConfPtr conf(rd_kafka_conf_new());
    TM_TRY(set(conf.get(), "bootstrap.servers", address.brokers));
    TM_TRY(set(conf.get(), "transactional.id", options.sink_id));
    TM_TRY(set(conf.get(), "transaction.timeout.ms",
               std::to_string(options.transaction_timeout.count())));
    const std::uint64_t half = std::max<std::uint64_t>(options.queue_bytes / 2, 1);
    TM_TRY(set(conf.get(), "queue.buffering.max.kbytes",
               std::to_string(std::max<std::uint64_t>(half / 1024, 1))));
    TM_TRY(set(conf.get(), "queue.buffering.max.messages",
               std::to_string(std::max<std::uint64_t>(half / kMessageOverheadBytes, 1))));
    TM_TRY(set(conf.get(), "linger.ms", "5"));
    rd_kafka_conf_set_dr_msg_cb(conf.get(), &State::on_delivery);
    rd_kafka_conf_set_error_cb(conf.get(), &State::on_error);
    if (options.on_trouble) rd_kafka_conf_set_log_cb(conf.get(), &State::on_log);
    rd_kafka_conf_set_opaque(conf.get(), this);
    TM_ASSIGN(producer, new_handle(RD_KAFKA_PRODUCER, std::move(conf)));
    TM_TRY(resumable("init_transactions with " + address.brokers, ErrorKind::kDeterminate,
                     [&](int ms) { return rd_kafka_init_transactions(producer.get(), ms); }));
    // Both topics must exist: a missing one is a clear error now, not a
    // delivery timeout later. (This also warms the producer's metadata.)
    TM_ASSIGN(auto data, topic_partitions(producer.get(), address.topic, options.operation_timeout,
                                          options.cancel.get()));
    if (data.empty()) {
      return determinate("kafka: topic " + address.topic + " does not exist on " + address.brokers);
    }
    TM_ASSIGN(auto progress_partitions,
              topic_partitions(producer.get(), address.progress_topic, options.operation_timeout,
                               options.cancel.get()));
    if (progress_partitions.empty()) {
      return determinate("kafka: progress topic " + address.progress_topic + " does not exist on " +
                         address.brokers +
                         " (create it with one partition and cleanup.policy=compact)");
    }
    return {};
  }

  // Reads the progress topic to its end (read_committed) for this sink's
  // last record.
  Status read_progress() {
    return consume_topic(
        address.brokers, address.progress_topic, options.operation_timeout,
        [&](const KafkaMessageView& message) -> Status {
          if (message.key != options.sink_id || !message.value) return {};
          TM_ASSIGN(auto record, KafkaProgressRecord::parse(*message.value));
          // A snapshot part's frontier 0 is no progress: the snapshot is
          // not complete.
          snapshot = std::move(record.snapshot);
          progress = snapshot ? std::nullopt : std::optional<Frontier>(record.frontier);
          return {};
        },
        options.cancel.get());
  }

  // Produces one message, waiting (serving delivery reports) while the
  // queue is full.
  Status produce(const std::string& topic, std::string_view key,
                 const std::optional<std::string>& value, std::string_view time, void* tag) {
    // (librdkafka's macros do not parenthesise their arguments.)
    void* payload = value ? const_cast<char*>(value->data()) : nullptr;
    const std::size_t payload_size = value ? value->size() : 0;
    for (;;) {
      TM_TRY(check_errors());
      rd_kafka_resp_err_t err = rd_kafka_producev(
          producer.get(), RD_KAFKA_V_TOPIC(topic.c_str()),
          RD_KAFKA_V_KEY(const_cast<char*>(key.data()), key.size()),
          RD_KAFKA_V_VALUE(payload, payload_size),
          RD_KAFKA_V_HEADER(kTimeHeader.data(), time.data(), static_cast<ssize_t>(time.size())),
          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE(tag), RD_KAFKA_V_END);
      if (err == RD_KAFKA_RESP_ERR_NO_ERROR) break;
      if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
        if (cancelled()) return cancelled_error("kafka: producing to " + topic);
        rd_kafka_poll(producer.get(), 10);  // backpressure: the queue is at its bound
        continue;
      }
      const std::size_t size = key.size() + (value ? value->size() : 0);
      if (err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE) {
        return make_error(ErrorKind::kTooLarge, "kafka: a message of " + std::to_string(size) +
                                                    " bytes for " + topic +
                                                    " is over the producer's message.max.bytes");
      }
      return determinate("kafka: producing to " + topic + ": " + rd_kafka_err2str(err));
    }
    if (++messages % kPollEveryMessages == 0) rd_kafka_poll(producer.get(), 0);
    return {};
  }

  Status commit(KafkaProgressRecord record);

  // Aborts the open transaction, if any; the first error wins.
  Status abort(Status cause) {
    if (!open) return cause;
    open = false;
    Status aborted = resumable("abort_transaction", ErrorKind::kDeterminate, [&](int ms) {
      return rd_kafka_abort_transaction(producer.get(), ms);
    });
    return cause.has_value() ? aborted : cause;
  }
};

KafkaDestination::KafkaDestination(std::unique_ptr<State> state) : state_(std::move(state)) {}

KafkaDestination::~KafkaDestination() {
  if (state_ && state_->producer) (void)state_->abort({});
}

Result<std::unique_ptr<KafkaDestination>> KafkaDestination::open(
    const KafkaAddress& address, Envelope envelope, const KafkaDestinationOptions& options) {
  if (options.sink_id.empty()) return invalid_usage("a Kafka sink needs an id");
  if (options.queue_bytes < 2 * kMessageOverheadBytes) {
    return invalid_usage("a Kafka sink's queue needs at least " +
                         std::to_string(2 * kMessageOverheadBytes) + " bytes");
  }
  auto state = std::make_unique<State>(address, envelope, options);
  if (options.pool) {
    TM_ASSIGN(state->queue_lease,
              reserve_for_sink(*options.pool, options.queue_bytes, options.pool_wait,
                               "kafka sink: its producer queue"));
  }
  TM_TRY(state->make_producer());
  TM_TRY(state->read_progress());
  return std::unique_ptr<KafkaDestination>(new KafkaDestination(std::move(state)));
}

std::optional<Frontier> KafkaDestination::progress() const {
  return state_->progress;
}

Status KafkaDestination::begin(Frontier lower) {
  State& s = *state_;
  if (s.open) return invalid_usage("kafka destination: an interval is already open");
  if (lower.is_closed()) return invalid_usage("kafka destination: lower is closed");
  if (s.progress && lower < *s.progress) {
    return invalid_usage("kafka destination: lower " + lower.to_string() + " is below progress " +
                         s.progress->to_string());
  }
  TM_TRY(s.check_errors());
  TM_TRY(txn_error(rd_kafka_begin_transaction(s.producer.get()), "begin_transaction",
                   ErrorKind::kDeterminate));
  s.open = true;
  s.lower = lower;
  s.bytes = 0;
  s.ranges.clear();
  return {};
}

Status KafkaDestination::write(const DiffPair& pair) {
  State& s = *state_;
  if (!s.open) return invalid_usage("kafka destination: write with no interval open");
  if (!s.lower.includes(pair.time)) {
    return invalid_usage("kafka destination: a pair at " + std::to_string(pair.time) +
                         " is below the interval's lower " + s.lower.to_string());
  }
  s.encoder.kafka_message(pair, &s.scratch);
  s.time_text.clear();
  append_u64(&s.time_text, pair.time);
  Status status = s.produce(s.address.topic, s.scratch.key, s.scratch.value, s.time_text, nullptr);
  if (!status) return s.abort(std::move(status));
  s.bytes += s.scratch.key.size() + (s.scratch.value ? s.scratch.value->size() : 0);
  return {};
}

std::uint64_t KafkaDestination::open_bytes() const {
  return state_->open ? state_->bytes : 0;
}

Status KafkaDestination::commit(Frontier upper) {
  State& s = *state_;
  if (!s.open) return invalid_usage("kafka destination: commit with no interval open");
  if (upper.is_closed() || !(s.lower < upper)) {
    return invalid_usage("kafka destination: commit upper " + upper.to_string() +
                         " is not above lower " + s.lower.to_string());
  }
  KafkaProgressRecord record;
  record.frontier = upper;
  TM_TRY(s.commit(std::move(record)));
  s.progress = upper;
  s.snapshot.reset();
  return {};
}

Status KafkaDestination::commit_snapshot_part(const SnapshotPosition& position) {
  State& s = *state_;
  if (!s.open) return invalid_usage("kafka destination: commit with no interval open");
  if (s.progress || s.lower != Frontier::at(0)) {
    return invalid_usage("kafka destination: a snapshot part after the snapshot");
  }
  if (position.key_pairs == 0 || position.pairs < position.key_pairs ||
      (s.snapshot && (s.snapshot->as_of != position.as_of || position.pairs < s.snapshot->pairs))) {
    return invalid_usage("kafka destination: snapshot position " + std::to_string(position.pairs) +
                         " at " + std::to_string(position.as_of) +
                         " does not follow the committed one");
  }
  KafkaProgressRecord record;
  record.frontier = Frontier::at(0);
  record.snapshot = position;
  TM_TRY(s.commit(std::move(record)));
  s.snapshot = position;
  return {};
}

std::optional<SnapshotPosition> KafkaDestination::snapshot_position() const {
  return state_->snapshot;
}

// Commits the open transaction with `record` (its topic and offsets filled
// in here) as its progress record.
Status KafkaDestination::State::commit(KafkaProgressRecord record) {
  State& s = *this;
  const Frontier upper = record.frontier;
  // Every data message acknowledged before the progress record is produced.
  rd_kafka_resp_err_t flushed;
  for (const auto deadline = Clock::now() + s.options.operation_timeout;;) {
    flushed = rd_kafka_flush(s.producer.get(), slice_ms(deadline, s.options.cancel.get()));
    if (flushed != RD_KAFKA_RESP_ERR__TIMED_OUT || Clock::now() >= deadline) break;
    if (s.cancelled()) {
      return s.abort(cancelled_error("kafka: flushing the transaction"));
    }
  }
  if (flushed != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return s.abort(
        determinate(std::string("kafka: flushing the transaction: ") + rd_kafka_err2str(flushed)));
  }
  if (Status errors = s.check_errors(); !errors) return s.abort(std::move(errors));

  record.topic = s.address.topic;
  for (const auto& [partition, range] : s.ranges) {
    record.offsets.push_back({partition, range.first, range.second});
  }
  const std::string value = record.to_json();
  std::string frontier_text;
  append_u64(&frontier_text, upper.time());
  if (Status produced = s.produce(s.address.progress_topic, s.options.sink_id, value, frontier_text,
                                  &g_progress_tag);
      !produced) {
    return s.abort(std::move(produced));
  }

  if (s.options.claim) {
    if (Status owned = s.options.claim->check(); !owned) return s.abort(std::move(owned));
  }
  const auto deadline = Clock::now() + s.options.operation_timeout;
  for (;;) {
    rd_kafka_error_t* error =
        rd_kafka_commit_transaction(s.producer.get(), slice_ms(deadline, s.options.cancel.get()));
    if (error == nullptr) break;
    if (rd_kafka_error_code(error) == RD_KAFKA_RESP_ERR__TIMED_OUT && s.cancelled()) {
      rd_kafka_error_destroy(error);
      s.open = false;  // unknown outcome: a reopened destination reads the truth
      return cancelled_error("kafka: commit_transaction", true);
    }
    if (rd_kafka_error_txn_requires_abort(error)) {
      return s.abort(txn_error(error, "commit_transaction", ErrorKind::kDeterminate));
    }
    if (rd_kafka_error_is_retriable(error) && Clock::now() < deadline) {
      rd_kafka_error_destroy(error);
      continue;
    }
    s.open = false;  // unknown outcome: a reopened destination reads the truth
    return txn_error(error, "commit_transaction", ErrorKind::kIndeterminate);
  }
  s.open = false;
  return {};
}

std::uint64_t KafkaDestination::primary_key_violations() const {
  return state_->encoder.primary_key_violations();
}

}  // namespace tidemark
