#include "sink/server_presence.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <utility>

#include "util/json.h"
#include "util/try.h"

namespace tidemark {
namespace {

constexpr std::string_view kPresenceKey = "server/presence";
constexpr int kAttempts = 4;  // races lost to other servers' writes before giving up
constexpr SeqNo kTruncateEvery = 8;

struct Head {
  std::optional<SeqNo> seqno;
  std::vector<ServerPresence> servers;
};

Result<Head> read_head(Consensus& consensus) {
  TM_ASSIGN(auto head, consensus.head(kPresenceKey));
  Head out;
  if (!head) return out;
  out.seqno = head->seqno;
  TM_ASSIGN(out.servers, parse_presence(head->data));
  return out;
}

bool same_but_time(const ServerPresence& a, const ServerPresence& b) {
  auto same_handing = [](const ServerPresence::Handing& x, const ServerPresence::Handing& y) {
    return x.sink == y.sink && x.to == y.to && x.until_ms == y.until_ms;
  };
  return a.owner == b.owner && a.runner == b.runner && a.host == b.host && a.scope == b.scope &&
         a.sinks == b.sinks && a.s3_endpoints == b.s3_endpoints &&
         a.kafka_brokers == b.kafka_brokers &&
         std::equal(a.handing.begin(), a.handing.end(), b.handing.begin(), b.handing.end(),
                    same_handing);
}

std::vector<ServerPresence> live(std::vector<ServerPresence> servers, std::uint64_t now_ms) {
  std::erase_if(servers, [&](const ServerPresence& s) {
    return s.written_at_ms + static_cast<std::uint64_t>(kPresenceLiveFor.count()) < now_ms;
  });
  return servers;
}

// Rewrites the head with `change` applied (when it returns true: changed),
// racing other servers' writes.
Result<std::vector<ServerPresence>> rewrite(
    Consensus& consensus, const std::function<bool(std::vector<ServerPresence>*)>& change) {
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    TM_ASSIGN(Head head, read_head(consensus));
    if (!change(&head.servers)) return std::move(head.servers);
    const SeqNo next = head.seqno ? *head.seqno + 1 : 1;
    TM_ASSIGN(CasOutcome outcome,
              consensus.compare_and_set(kPresenceKey, head.seqno,
                                        VersionedData{next, presence_to_json(head.servers)}));
    if (outcome == CasOutcome::kCommitted) {
      if (next % kTruncateEvery == 0) (void)consensus.truncate(kPresenceKey, next);
      return std::move(head.servers);
    }
  }
  return determinate(std::string(kPresenceKey) + ": lost " + std::to_string(kAttempts) +
                     " races to write it");
}

}  // namespace

std::string presence_to_json(const std::vector<ServerPresence>& servers) {
  std::string out = "{\"servers\":[";
  for (std::size_t i = 0; i < servers.size(); ++i) {
    const ServerPresence& s = servers[i];
    if (i > 0) out += ",";
    out += "{\"owner\":";
    append_json_string(&out, s.owner);
    out += ",\"runner\":";
    append_json_string(&out, s.runner);
    out += ",\"host\":";
    append_json_string(&out, s.host);
    out += ",\"scope\":";
    append_json_string(&out, s.scope);
    out += ",\"sinks\":";
    append_u64(&out, s.sinks);
    out += ",\"s3_endpoints\":";
    append_json_string(&out, s.s3_endpoints);
    out += ",\"kafka_brokers\":";
    append_json_string(&out, s.kafka_brokers);
    out += ",\"handing\":[";
    for (std::size_t h = 0; h < s.handing.size(); ++h) {
      if (h > 0) out += ",";
      out += "{\"sink\":";
      append_json_string(&out, s.handing[h].sink);
      out += ",\"to\":";
      append_json_string(&out, s.handing[h].to);
      out += ",\"until_ms\":";
      append_u64(&out, s.handing[h].until_ms);
      out += "}";
    }
    out += "],\"written_at_ms\":";
    append_u64(&out, s.written_at_ms);
    out += "}";
  }
  return out + "]}";
}

Result<std::vector<ServerPresence>> parse_presence(std::string_view json) {
  auto bad = [&](std::string_view what) {
    return corruption("server presence: " + std::string(what) + ": " + std::string(json));
  };
  auto value = parse_json(json);
  if (!value || !value->is_object()) return bad("not a JSON object");
  const JsonValue* servers = value->find("servers");
  if (servers == nullptr || !servers->is_array()) return bad("no \"servers\" array");
  std::vector<ServerPresence> out;
  for (const JsonValue& entry : servers->as_array()) {
    if (!entry.is_object()) return bad("an entry that is not an object");
    ServerPresence s;
    auto owner = entry.find_string("owner"), runner = entry.find_string("runner"),
         host = entry.find_string("host"), scope = entry.find_string("scope"),
         s3 = entry.find_string("s3_endpoints"), kafka = entry.find_string("kafka_brokers");
    const JsonValue* sinks = entry.find("sinks");
    const JsonValue* written = entry.find("written_at_ms");
    const JsonValue* handing = entry.find("handing");
    if (!owner || !runner || !host || !scope || !s3 || !kafka || sinks == nullptr ||
        !sinks->as_u64() || written == nullptr || !written->as_u64() || handing == nullptr ||
        !handing->is_array()) {
      return bad("an entry without every field");
    }
    s.owner = std::move(*owner);
    s.runner = std::move(*runner);
    s.host = std::move(*host);
    s.scope = std::move(*scope);
    s.s3_endpoints = std::move(*s3);
    s.kafka_brokers = std::move(*kafka);
    s.sinks = *sinks->as_u64();
    s.written_at_ms = *written->as_u64();
    for (const JsonValue& h : handing->as_array()) {
      if (!h.is_object()) return bad("a handing entry that is not an object");
      auto sink = h.find_string("sink"), to = h.find_string("to");
      const JsonValue* until = h.find("until_ms");
      if (!sink || !to || until == nullptr || !until->as_u64()) {
        return bad("a handing entry without every field");
      }
      s.handing.push_back({std::move(*sink), std::move(*to), *until->as_u64()});
    }
    out.push_back(std::move(s));
  }
  return out;
}

Result<std::vector<ServerPresence>> publish_presence(Consensus& consensus, ServerPresence self,
                                                     std::uint64_t now_ms) {
  self.written_at_ms = now_ms;
  TM_ASSIGN(auto servers, rewrite(consensus, [&](std::vector<ServerPresence>* servers) {
              // Unchanged and written lately: nothing to write.
              for (const ServerPresence& s : *servers) {
                if (s.owner == self.owner && same_but_time(s, self) && s.written_at_ms <= now_ms &&
                    now_ms - s.written_at_ms <
                        static_cast<std::uint64_t>(kPresenceRefreshEvery.count())) {
                  return false;
                }
              }
              std::erase_if(*servers, [&](const ServerPresence& s) {
                return s.owner == self.owner ||
                       s.written_at_ms + static_cast<std::uint64_t>(kPresenceForgetAfter.count()) <
                           now_ms;
              });
              servers->push_back(self);
              return true;
            }));
  return live(std::move(servers), now_ms);
}

void withdraw_presence(Consensus& consensus, const std::string& owner) {
  (void)rewrite(consensus, [&](std::vector<ServerPresence>* servers) {
    return std::erase_if(*servers, [&](const ServerPresence& s) { return s.owner == owner; }) > 0;
  });
}

Result<std::vector<ServerPresence>> read_presence(Consensus& consensus, std::uint64_t now_ms) {
  TM_ASSIGN(Head head, read_head(consensus));
  return live(std::move(head.servers), now_ms);
}

}  // namespace tidemark
