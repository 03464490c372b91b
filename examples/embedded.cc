// Tidemark embedded: a shard in a data directory of its own (files for the
// parts, SQLite for the state), written at explicit times and through the
// background appender, then read back as a snapshot and as a listen.
//
//   embedded DIR     (DIR is made if missing; run it in an empty one)
//
// Prints what it read and exits 0, or prints the error and exits 1.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "tidemark/appender.h"
#include "tidemark/client.h"
#include "tidemark/read.h"
#include "tidemark/version.h"
#include "tidemark/write.h"

namespace {

int fail(const char* what, const tidemark::Error& error) {
  std::fprintf(stderr, "%s: %s\n", what, error.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: embedded DIR\n");
    return 2;
  }
  const std::filesystem::path dir = std::filesystem::absolute(argv[1]);
  std::filesystem::create_directories(dir);
  std::printf("tidemark %s\n", tidemark::version());

  // The embedded default: parts as files, the state in one SQLite file.
  auto client = tidemark::Client::open("file://" + (dir / "blob").string(),
                                       "sqlite://" + (dir / "consensus.db").string());
  if (!client) return fail("open", client.error());
  if (auto created = (*client)->create_shard("orders"); !created) {
    return fail("create_shard", created.error());
  }
  auto shard = (*client)->open_shard("orders");
  if (!shard) return fail("open_shard", shard.error());

  // Explicit times: the updates of [0, 2), committed only if the shard's
  // upper is still 0.
  auto writer = (*shard)->open_writer();
  if (!writer) return fail("open_writer", writer.error());
  std::vector<tidemark::Update> updates{{"order-1", "{\"qty\":2}", 0, 1},
                                        {"order-1", "{\"qty\":2}", 1, -1},
                                        {"order-1", "{\"qty\":3}", 1, 1}};
  auto batch = (*writer)->batch(updates, tidemark::Frontier::at(0), tidemark::Frontier::at(2));
  if (!batch) return fail("batch", batch.error());
  std::vector<tidemark::Batch> batches;
  batches.push_back(std::move(*batch));
  if (auto appended = (*writer)->compare_and_append(batches, tidemark::Frontier::at(0),
                                                    tidemark::Frontier::at(2));
      !appended) {
    return fail("compare_and_append", appended.error());
  }

  // Managed times: the appender batches records in the background and gives
  // each commit the wall clock in milliseconds; the token says when it is
  // durable.
  auto appender = tidemark::Appender::open(*shard);
  if (!appender) return fail("appender", appender.error());
  tidemark::AppendSender sender = (*appender)->sender();
  auto token = sender.enqueue_with_token(tidemark::AppendRecord{"order-2", "{\"qty\":5}", 1});
  if (!token) return fail("enqueue", token.error());
  auto committed_at = token->wait();
  if (!committed_at) return fail("commit", committed_at.error());
  (*appender)->close();

  // The consolidated contents as of time 1.
  auto snapshot = (*shard)->snapshot(1);
  if (!snapshot) return fail("snapshot", snapshot.error());
  for (;;) {
    auto row = snapshot->next();
    if (!row) return fail("snapshot", row.error());
    if (!*row) break;
    std::printf("snapshot at 1: %.*s = %.*s (diff %lld)\n", static_cast<int>((*row)->key.size()),
                (*row)->key.data(), static_cast<int>((*row)->value.size()), (*row)->value.data(),
                static_cast<long long>((*row)->diff));
  }

  // Every change from the start up to the managed commit, in time order.
  auto listener = (*shard)->listen(tidemark::ListenStart::at_progress(tidemark::Frontier::at(0)),
                                   *committed_at + 1);
  if (!listener) return fail("listen", listener.error());
  int changes = 0;
  for (;;) {
    auto event = (*listener)->next();
    if (!event) return fail("listen", event.error());
    if (!*event) break;
    if ((*event)->kind == tidemark::ListenEvent::Kind::kUpdate) {
      ++changes;
      std::printf("change: %.*s at %s, diff %lld\n", static_cast<int>((*event)->key.size()),
                  (*event)->key.data(),
                  (*event)->time == *committed_at ? "the managed time"
                                                  : std::to_string((*event)->time).c_str(),
                  static_cast<long long>((*event)->diff));
    }
  }
  std::printf("%d changes\n", changes);
  return changes == 4 ? 0 : 1;
}
