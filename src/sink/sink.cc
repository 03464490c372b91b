// The sink entry points of tidemark/sink.h that open a destination from
// its URL: the claims, then the destination, then the run.
#include "tidemark/sink.h"

#include <utility>

#include "sink/destination_url.h"
#include "sink/sink_claim.h"
#include "util/try.h"

namespace tidemark {

Status check_sink_destination(std::string_view to, SinkFormat format) {
  TM_TRY(parse_sink_url(to, format));
  return {};
}

Result<SinkProgress> run_sink(Client& client, Shard& shard, const SinkTarget& target,
                              const SinkOptions& options) {
  if (options.sink_name.empty())
    return invalid_usage("a sink needs a name (SinkOptions::sink_name)");
  TM_ASSIGN(SinkUrl url, parse_sink_url(target.to, target.format));
  // One runner per sink and one sink per destination: claimed before the
  // destination is opened, which deletes what a crashed run left.
  TM_ASSIGN(auto claim, SinkClaim::acquire(client.location().consensus, shard.name(),
                                           options.sink_name, url, SinkRunner{target.runner, ""}));
  std::shared_ptr<MemoryPool> pool =
      target.pool ? target.pool : MemoryPool::create("sink", kSinkPoolBytes);
  TM_ASSIGN(auto destination,
            open_sink_destination(url, target.envelope, target.format, shard.name(),
                                  options.sink_name, std::move(pool), std::move(claim)));
  return run_sink(shard, *destination, options);
}

}  // namespace tidemark
