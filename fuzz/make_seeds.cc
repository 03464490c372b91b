// Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/:
// small valid inputs of each format, from the code that writes them, so
// that fuzzing starts from inputs that reach deep. Run from the repository
// root after the format changes: build-fuzz/fuzz_seeds (scripts/fuzz.sh
// --seeds builds and runs it).
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "part/part.h"
#include "sample_state.h"
#include "shard/state.h"
#include "sink/consensus_lease.h"
#include "sink/kafka_destination.h"

namespace {

namespace fs = std::filesystem;
using namespace tidemark;

void write(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = fs::path("fuzz/corpus") / target;
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

std::string part_of(const std::vector<Update>& updates, std::size_t block_bytes) {
  PartWriter writer(Description{Frontier::at(0), Frontier::at(100), Frontier::at(0)},
                    PartOptions{block_bytes, 1});
  for (const Update& u : updates) {
    if (!writer.add(UpdateView{u.key, u.value, u.time, u.diff})) std::abort();
  }
  auto bytes = writer.finish();
  if (!bytes) std::abort();
  return *bytes;
}

}  // namespace

int main() {
  write("part", "one", part_of({{"k", "\"v\"", 1, 1}}, 64 << 10));
  std::vector<Update> many;
  for (int i = 0; i < 40; ++i) {
    many.push_back(Update{"key" + std::to_string(100 + i), std::to_string(i), Time(i % 7),
                          i % 3 == 0 ? -1 : 2});
  }
  write("part", "blocks", part_of(many, 128));  // several blocks
  write("part", "carry",
        part_of({{"a", "1", 5, INT64_MAX}, {"a", "1", 5, INT64_MAX}, {"a", "1", 5, 3}}, 64 << 10));
  write("part", "empty", part_of({}, 64 << 10));

  const ShardState state = sample_state();
  write("state", "full", encode_state(state));
  ShardState after = state;
  after.seqno = 7;
  after.upper = Frontier::at(20);
  HollowBatch next = state.batches.front();
  next.desc = Description{Frontier::at(10), Frontier::at(20), Frontier::at(0)};
  next.ordered = true;
  after.batches.push_back(next);
  after.writers.erase("w1");
  write("state", "diff", encode_diff(state, after, RollupRef{1, "r"}));
  write("state", "registry", encode_registry({"a", "orders", "s"}));

  write("records", "managed", "{\"key\":\"k\",\"value\":{\"a\":[1,2.5,null,true]},\"diff\":-2}\n");
  write("records", "explicit", "{\"key\": 1, \"value\": \"x\\u00e9\\n\", \"time\": 3}\r\n\n");
  write("records", "sink", "{\"name\":\"f\",\"shard\":\"s\",\"to\":\"file:///tmp/x\"}");
  write("records", "url", "s3://bucket/p?endpoint=http://127.0.0.1:9000&region=r");
  write("records", "allow", "http://minio:9000,https://S3.example.com;kafka-1:9092,[::1]");

  write("s3_listing", "page",
        "<?xml version=\"1.0\"?><ListBucketResult><IsTruncated>true</IsTruncated>"
        "<Contents><Key>a/b&amp;c</Key><Size>12</Size></Contents>"
        "<Contents><Key>a/d</Key><Size>0</Size></Contents>"
        "<NextContinuationToken> t0k&lt;en </NextContinuationToken></ListBucketResult>");

  LeaseRecord lease;
  lease.token = "t0";
  lease.subject = "sink f of shard s";
  lease.sink = "s/f";
  lease.owner = "server-1";
  lease.runner = "tidemark serve on 127.0.0.1:6875";
  lease.epoch = 3;
  lease.acquired_at_ms = 1000;
  lease.expires_at_ms = 16000;
  write("sink_records", "lease", lease.to_json());
  KafkaProgressRecord progress;
  progress.frontier = Frontier::at(12);
  progress.topic = "out";
  progress.offsets = {{0, 5, 9}, {1, 0, 3}};
  write("sink_records", "progress", progress.to_json());
  progress.frontier = Frontier::at(0);
  progress.snapshot = SnapshotPosition{11, "\"hot\"", 4096, 20480};
  write("sink_records", "snapshot_part", progress.to_json());
  write("sink_records", "name", "00000000000000000000-00000000000000000002.json");
  write("sink_records", "kafka", "kafka://h1:9092,h2:9093/topic?progress_topic=p");
  // The first byte is the size of the pieces the request arrives in.
  write("http", "managed",
        "\x07POST /v1/shards/s/append HTTP/1.1\r\nHost: x\r\nContent-Length: 27\r\n\r\n"
        "{\"key\": \"k\", \"value\": 1}\n");
  write("http", "chunked",
        "\x20POST /v1/shards/s/append?lower=0&upper=2 HTTP/1.1\r\nHost: x\r\n"
        "Transfer-Encoding: chunked\r\n\r\n5\r\n{\"key\r\n0\r\n\r\n");
  write("http", "listen",
        "\x03GET /v1/shards/s/listen?from=3&after_key=%7B%22a%22%3A1%7D&until=9 HTTP/1.1\r\n"
        "Authorization: Bearer t\r\n\r\n");
  return 0;
}
