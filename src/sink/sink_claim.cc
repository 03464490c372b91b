#include "sink/sink_claim.h"

#if TIDEMARK_WITH_S3 || TIDEMARK_WITH_KAFKA
#include "crypto/digest.h"
#endif
#include "sink/file_destination.h"
#include "util/try.h"

namespace tidemark {

std::string sink_lease_key(std::string_view shard, std::string_view sink_name) {
  std::string key = "lease/sink/";
  key += shard;
  key += "/";
  key += sink_name;
  return key;
}

SinkClaim::~SinkClaim() = default;

Result<std::shared_ptr<SinkClaim>> SinkClaim::acquire(std::shared_ptr<Consensus> consensus,
                                                      const std::string& shard,
                                                      const std::string& sink_name,
                                                      const SinkUrl& url, const SinkRunner& runner,
                                                      LeaseOptions options) {
  auto claim = std::shared_ptr<SinkClaim>(new SinkClaim());
  TM_ASSIGN(claim->destination_, destination_identity(url));
  LeaseRecord holder;
  holder.sink = shard + "/" + sink_name;
  holder.owner = runner.owner;
  holder.runner = runner.label;
  holder.process = this_process();
  holder.subject = "sink " + sink_name + " of shard " + shard;
  TM_ASSIGN(claim->sink_,
            ConsensusLease::acquire(consensus, sink_lease_key(shard, sink_name), holder, options));

  if (url.directory) {
    // The lock file's line: what a refused runner reports.
    std::string line = holder.subject + ", run by " + holder.describe_holder();
    TM_ASSIGN(claim->directory_, FileDestination::lock_directory(*url.directory, line));
    return claim;
  }
#if !TIDEMARK_WITH_S3 && !TIDEMARK_WITH_KAFKA
  // parse_sink_url gives only file:// URLs in such a build.
  return invalid_usage("sink destination " + claim->destination_ + ": not a file:// destination");
#else
  holder.subject = "destination " + claim->destination_ + " (written by " + holder.subject + ")";
  auto lease = ConsensusLease::acquire(std::move(consensus),
                                       "lease/destination/" + sha256_hex(claim->destination_),
                                       holder, options);
  if (!lease) return std::unexpected(lease.error());
  claim->destination_lease_ = std::move(*lease);
  return claim;
#endif
}

Status SinkClaim::check() {
  TM_TRY(sink_->check());
  if (destination_lease_) TM_TRY(destination_lease_->check());
  if (directory_ && !directory_->still_at_path()) {
    return make_error(
        ErrorKind::kHeld,
        directory_->path() + " was deleted or replaced: another sink may hold the directory now");
  }
  return {};
}

}  // namespace tidemark
