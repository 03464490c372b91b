// The calling process's own figures from /proc/self/status (Linux): its
// threads and resident memory, for the tests and benchmarks that bound
// them. -1 for a figure the file does not give.
//
// Thread-safety: reads a file; safe from any thread.
#pragma once

#include <fstream>
#include <string>

namespace tidemark {

struct ProcStatus {
  int threads = -1;
  double rss_mib = -1;
};

inline ProcStatus proc_status() {
  ProcStatus out;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("Threads:")) out.threads = std::stoi(line.substr(8));
    if (line.starts_with("VmRSS:")) out.rss_mib = std::stod(line.substr(6)) / 1024.0;
  }
  return out;
}

}  // namespace tidemark
