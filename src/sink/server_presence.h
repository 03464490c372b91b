// ServerPresence: the servers sharing a location, as each publishes itself
// in the location's Consensus, so that a server running more sinks than
// another can hand one over to it (SinkManager's balance).
//
// Key: "server/presence", one head for every server: a JSON object whose
// "servers" array holds one entry per server: its id, its label ("tidemark
// serve on HOST:PORT"), its host, how many sinks it runs, the S3 endpoints
// and Kafka brokers it may reach (its --allow-* flags, so that another
// server knows which sinks it could take), the sinks being handed to other
// servers, and the wall-clock time it wrote the entry.
//
// Each server publishes its entry at every SinkManager::kReconcileEvery
// while any sink is defined (publish_presence(): one head read, and a
// compare_and_set when the entry changed or is kPresenceRefreshEvery old,
// tried again up to 4 times when another server wrote in between), and
// takes it out when it stops cleanly (withdraw_presence()).
// An entry not rewritten for kPresenceLiveFor belongs to a server that is
// gone (or cut off) and is not counted; one older than
// kPresenceForgetAfter is dropped by the next writer, so the record holds
// the servers alive lately, however many came and went. Every 8th version
// truncates those below.
//
// Thread-safety: the functions are safe for concurrent use (each is a few
// Consensus calls). Memory: the record, a few hundred bytes per server.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tidemark/location.h"

namespace tidemark {

struct ServerPresence {
  // A sink this server let go for `to` (a server id) to take: no other
  // server takes it before `until_ms` (wall clock), unless `to` is gone.
  struct Handing {
    std::string sink;
    std::string to;
    std::uint64_t until_ms = 0;
  };

  std::string owner;   // the server's id
  std::string runner;  // "tidemark serve on HOST:PORT"
  std::string host;
  // What the server sees of the sinks (a digest of their names): servers
  // that share a Consensus but not a blob store see different sinks, and
  // never hand sinks to one another.
  std::string scope;
  std::uint64_t sinks = 0;    // running here
  std::string s3_endpoints;   // as --allow-s3-endpoints
  std::string kafka_brokers;  // as --allow-kafka-brokers
  std::vector<Handing> handing;
  std::uint64_t written_at_ms = 0;
};

// An entry younger than this is a live server's.
inline constexpr std::chrono::milliseconds kPresenceLiveFor{10'000};
// An unchanged entry is written again once it is this old.
inline constexpr std::chrono::milliseconds kPresenceRefreshEvery{5'000};
// An entry older than this is dropped from the record.
inline constexpr std::chrono::milliseconds kPresenceForgetAfter{60'000};

std::string presence_to_json(const std::vector<ServerPresence>& servers);
// Corruption naming what is wrong.
[[nodiscard]] Result<std::vector<ServerPresence>> parse_presence(std::string_view json);

// Writes `self` (its written_at_ms set to `now_ms`) in place of its
// previous entry, drops entries older than kPresenceForgetAfter, and
// returns every entry written within kPresenceLiveFor of `now_ms`, `self`
// included.
[[nodiscard]] Result<std::vector<ServerPresence>> publish_presence(Consensus& consensus,
                                                                   ServerPresence self,
                                                                   std::uint64_t now_ms);
// Takes the entry of server `owner` out (best effort).
void withdraw_presence(Consensus& consensus, const std::string& owner);
// The entries written within kPresenceLiveFor of `now_ms`.
[[nodiscard]] Result<std::vector<ServerPresence>> read_presence(Consensus& consensus,
                                                                std::uint64_t now_ms);

}  // namespace tidemark
