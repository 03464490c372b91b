// A sink: a shard's changes, exactly once, as JSON lines in files.
//
//   file_sink DIR     (DIR is made if missing; run it in an empty one)
//
// Writes a key's history at explicit times 0, 1 and 2 (inserted, changed,
// deleted), runs the sink "orders-out" from time 0 until everything is
// committed into DIR/out in the upsert envelope, and prints the lines the
// files hold. Running it again in the same DIR writes nothing more: the
// sink resumes from the progress its files record.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tidemark/client.h"
#include "tidemark/sink.h"
#include "tidemark/write.h"

namespace {

int fail(const char* what, const tidemark::Error& error) {
  std::fprintf(stderr, "%s: %s\n", what, error.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: file_sink DIR\n");
    return 2;
  }
  const std::filesystem::path dir = std::filesystem::absolute(argv[1]);
  std::filesystem::create_directories(dir);
  auto client = tidemark::Client::open("file://" + (dir / "blob").string(),
                                       "sqlite://" + (dir / "consensus.db").string());
  if (!client) return fail("open", client.error());
  auto created = (*client)->create_shard("orders");
  const bool first_run = created.has_value();
  if (!created && !created.error().is(tidemark::ErrorKind::kAlreadyExists)) {
    return fail("create_shard", created.error());
  }
  auto shard = (*client)->open_shard("orders");
  if (!shard) return fail("open_shard", shard.error());

  if (first_run) {
    // A sink writes keys and values as the JSON text they are.
    auto writer = (*shard)->open_writer();
    if (!writer) return fail("open_writer", writer.error());
    std::vector<tidemark::Update> updates{{"\"order-1\"", "{\"qty\":2}", 0, 1},
                                          {"\"order-1\"", "{\"qty\":2}", 1, -1},
                                          {"\"order-1\"", "{\"qty\":3}", 1, 1},
                                          {"\"order-1\"", "{\"qty\":3}", 2, -1}};
    auto batch = (*writer)->batch(updates, tidemark::Frontier::at(0), tidemark::Frontier::at(3));
    if (!batch) return fail("batch", batch.error());
    std::vector<tidemark::Batch> batches;
    batches.push_back(std::move(*batch));
    if (auto appended = (*writer)->compare_and_append(batches, tidemark::Frontier::at(0),
                                                      tidemark::Frontier::at(3));
        !appended) {
      return fail("compare_and_append", appended.error());
    }
  }

  // From the snapshot at time 0 on, until every time below 3 is committed.
  tidemark::SinkTarget target;
  target.to = "file://" + (dir / "out").string();
  target.envelope = tidemark::Envelope::kUpsert;
  target.runner = "the file_sink example";
  tidemark::SinkOptions options;
  options.sink_name = "orders-out";
  options.as_of = 0;
  options.until = 3;
  auto ran = tidemark::run_sink(**client, **shard, target, options);
  if (!ran) return fail("run_sink", ran.error());
  std::printf("sink wrote %llu pairs in %llu commits\n",
              static_cast<unsigned long long>(ran->pairs),
              static_cast<unsigned long long>(ran->commits));

  // The committed files, in name order (the sink's own files start with
  // a dot).
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "out")) {
    if (entry.is_regular_file() && entry.path().filename().string()[0] != '.') {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) std::printf("%s\n", line.c_str());
  }
  return 0;
}
