// tidemark-kafka-mock: librdkafka's mock Kafka cluster in a process of its
// own, for tests and benchmarks of the Kafka sink.
//
//   tidemark-kafka-mock [--brokers N] [--topic NAME[:PARTITIONS]]...
//
// Prints one line, the bootstrap address ("127.0.0.1:PORT[,...]"), on stdout
// and flushes it, then serves until it is killed (SIGTERM or SIGINT end it
// cleanly; SIGKILL is fine too) or its parent exits: a test that crashes
// must not leave a broker behind holding its runner's output pipes. Running the broker apart from
// the sink keeps its memory (it holds every message produced) out of the sink's figures, and lets a
// test kill the sink without losing the broker.
//
// The mock is librdkafka's (rdkafka_mock.h), not a Kafka broker: in
// librdkafka 2.0 it accepts transactions (InitProducerId, AddPartitionsToTxn,
// EndTxn) but does not write control records or hide aborted messages from
// read_committed consumers. See src/sink/kafka_destination.h for how the
// sink and its tests stay exact regardless.
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) {
  g_stop = 1;
}

int usage() {
  std::fprintf(stderr, "usage: tidemark-kafka-mock [--brokers N] [--topic NAME[:PARTITIONS]]...\n");
  return 2;
}

bool parse_positive(const char* text, int* out) {
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 1 || value > 1000) return false;
  *out = static_cast<int>(value);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const pid_t parent = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) return 0;  // the parent is already gone
  int brokers = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--brokers") == 0 && i + 1 < argc) {
      if (!parse_positive(argv[++i], &brokers)) return usage();
    } else if (std::strcmp(argv[i], "--topic") == 0 && i + 1 < argc) {
      ++i;  // created below, once the cluster exists
    } else {
      return usage();
    }
  }

  char errstr[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  // The hosting handle never connects anywhere; silence its warning about
  // having no bootstrap servers.
  rd_kafka_conf_set(conf, "log_level", "0", errstr, sizeof errstr);
  rd_kafka_t* host = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
  if (host == nullptr) {
    std::fprintf(stderr, "tidemark-kafka-mock: %s\n", errstr);
    return 1;
  }
  rd_kafka_mock_cluster_t* cluster = rd_kafka_mock_cluster_new(host, brokers);
  if (cluster == nullptr) {
    std::fprintf(stderr, "tidemark-kafka-mock: could not start the mock cluster\n");
    return 1;
  }
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--topic") != 0) continue;
    std::string spec = argv[++i];
    int partitions = 1;
    if (auto colon = spec.find(':'); colon != std::string::npos) {
      if (!parse_positive(spec.c_str() + colon + 1, &partitions)) return usage();
      spec.resize(colon);
    }
    if (spec.empty()) return usage();
    rd_kafka_resp_err_t err =
        rd_kafka_mock_topic_create(cluster, spec.c_str(), partitions, std::min(brokers, 3));
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      std::fprintf(stderr, "tidemark-kafka-mock: topic %s: %s\n", spec.c_str(),
                   rd_kafka_err2str(err));
      return 1;
    }
  }

  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  std::printf("%s\n", rd_kafka_mock_cluster_bootstraps(cluster));
  std::fflush(stdout);
  while (!g_stop) ::pause();
  rd_kafka_mock_cluster_destroy(cluster);
  rd_kafka_destroy(host);
  return 0;
}
