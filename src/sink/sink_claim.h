// SinkClaim: what a sink's runner holds while it runs, so that a sink has
// one runner at a time and a destination one sink at a time, across
// processes, and across machines that share the location's Consensus.
//
//   - The sink: a ConsensusLease on "lease/sink/<shard>/<sink name>" (the
//     name its critical reader and Kafka producer id are derived from).
//   - Its destination, taken after the sink and before the destination is
//     opened (opening deletes a crashed run's temporaries):
//       file://  an flock on <dir>/.tidemark-sink.lock
//                (FileDestination::lock_directory);
//       s3://, kafka://  a ConsensusLease on
//                "lease/destination/<sha256 of destination_identity>".
// acquire() is Held, naming the holder, when another runner holds either
// (consensus_lease.h says when a lease is taken over instead: free, its
// holder a dead process of this machine, a previous life of the same
// server's same sink, or expired and not held by a live process of this
// machine). check() is the DestinationClaim every destination calls before
// making output visible: both leases still ours (one Consensus read each)
// and the lock file still the one locked. Destroying the claim releases
// everything.
//
// Residual window: a runner paused after check() and before its write
// lands (a stopped process, a long stall, a slow S3 copy) for longer than
// its lease's margin (LeaseOptions: 3 s by default) can overlap a
// successor that took the expired lease: one on another machine, or, when
// both are servers, one on the same machine (servers fail over to each
// other; a live `sink run` is never taken over on its machine). File
// destinations have no window at all (the kernel holds the flock while the
// process lives); and two runners of one Kafka sink cannot both commit
// (its transactional id fences the older producer).
//
// Thread-safety: check() from the sink's thread; the leases renew on the
// shared timers. Memory: two leases (a timer task each) or a lease and a
// descriptor.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "location/file_lock.h"
#include "sink/consensus_lease.h"
#include "sink/destination_claim.h"
#include "sink/destination_url.h"

namespace tidemark {

// Who runs a sink, as leases and lock files name it.
struct SinkRunner {
  std::string label;  // "tidemark sink run", "tidemark serve on 127.0.0.1:6875"
  std::string owner;  // the server's id; "" for a command
};

// The Consensus key of a sink's lease: "lease/sink/<shard>/<sink name>".
std::string sink_lease_key(std::string_view shard, std::string_view sink_name);

class SinkClaim final : public DestinationClaim {
 public:
  ~SinkClaim() override;

  // Claims sink `sink_name` of `shard`, then `url`'s destination (a file
  // destination's directory is created), for `runner`.
  [[nodiscard]] static Result<std::shared_ptr<SinkClaim>> acquire(
      std::shared_ptr<Consensus> consensus, const std::string& shard, const std::string& sink_name,
      const SinkUrl& url, const SinkRunner& runner, LeaseOptions options = {});

  const std::string& destination() const override { return destination_; }
  [[nodiscard]] Status check() override;

 private:
  SinkClaim() = default;

  std::string destination_;
  std::unique_ptr<ConsensusLease> sink_;
  std::optional<FileLock> directory_;                  // file://
  std::unique_ptr<ConsensusLease> destination_lease_;  // s3://, kafka://
};

}  // namespace tidemark
