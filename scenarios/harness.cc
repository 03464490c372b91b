#include "scenarios/harness.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace tidemark::scenarios {
namespace {

namespace fs = std::filesystem;

bool write_file(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// "name N" in a flat-keyed cgroup file (memory.events, memory.oom_control).
std::uint64_t keyed_value(const std::string& path, const std::string& name) {
  std::istringstream in(read_file(path));
  std::string key;
  std::uint64_t value = 0;
  while (in >> key >> value) {
    if (key == name) return value;
  }
  return 0;
}

// The cgroup v2 mount point, if any.
std::optional<std::string> cgroup2_mount() {
  std::ifstream mounts("/proc/mounts");
  std::string device, point, type, rest;
  while (mounts >> device >> point >> type && std::getline(mounts, rest)) {
    if (type == "cgroup2") return point;
  }
  return std::nullopt;
}

}  // namespace

MemoryCap::MemoryCap(Kind kind, std::uint64_t bytes, std::string directory)
    : kind_(kind), bytes_(bytes), directory_(std::move(directory)) {
  if (!directory_.empty()) procs_file_ = directory_ + "/cgroup.procs";
}

std::unique_ptr<MemoryCap> MemoryCap::create(std::uint64_t bytes, const std::string& name,
                                             bool force_watchdog) {
  const std::string limit = std::to_string(bytes);
  if (!force_watchdog) {
    if (auto root = cgroup2_mount()) {
      const std::string dir = *root + "/" + name;
      std::error_code error;
      fs::create_directory(dir, error);
      if (!error && !fs::exists(dir + "/memory.max")) {
        // Enable the memory controller for the root's children.
        write_file(*root + "/cgroup.subtree_control", "+memory");
      }
      if (!error && write_file(dir + "/memory.max", limit)) {
        write_file(dir + "/memory.swap.max", "0");
        return std::unique_ptr<MemoryCap>(new MemoryCap(Kind::kCgroupV2, bytes, dir));
      }
      if (!error) fs::remove(dir, error);
    }
    const std::string v1 = "/sys/fs/cgroup/memory";
    if (fs::exists(v1 + "/memory.limit_in_bytes")) {
      const std::string dir = v1 + "/" + name;
      std::error_code error;
      fs::create_directory(dir, error);
      if (!error && write_file(dir + "/memory.limit_in_bytes", limit)) {
        write_file(dir + "/memory.swappiness", "0");
        if (fs::exists(dir + "/memory.memsw.limit_in_bytes")) {
          write_file(dir + "/memory.memsw.limit_in_bytes", limit);
        }
        return std::unique_ptr<MemoryCap>(new MemoryCap(Kind::kCgroupV1, bytes, dir));
      }
      if (!error) fs::remove(dir, error);
    }
  }
  return std::unique_ptr<MemoryCap>(new MemoryCap(Kind::kWatchdog, bytes, ""));
}

MemoryCap::~MemoryCap() {
  if (directory_.empty()) return;
  // The last process may take a moment to leave after it is reaped.
  for (int i = 0; i < 100 && ::rmdir(directory_.c_str()) != 0 && errno == EBUSY; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string MemoryCap::describe() const {
  switch (kind_) {
    case Kind::kCgroupV2:
      return "cgroup v2 " + directory_;
    case Kind::kCgroupV1:
      return "cgroup v1 " + directory_;
    case Kind::kWatchdog:
      break;
  }
  return "RSS watchdog (no writable memory cgroup)";
}

std::uint64_t MemoryCap::cap_hits() const {
  switch (kind_) {
    case Kind::kCgroupV2:
      return keyed_value(directory_ + "/memory.events", "max");
    case Kind::kCgroupV1: {
      std::uint64_t count = 0;
      std::istringstream(read_file(directory_ + "/memory.failcnt")) >> count;
      return count;
    }
    case Kind::kWatchdog:
      break;
  }
  return 0;
}

std::uint64_t MemoryCap::oom_kills() const {
  switch (kind_) {
    case Kind::kCgroupV2:
      return keyed_value(directory_ + "/memory.events", "oom_kill");
    case Kind::kCgroupV1:
      return keyed_value(directory_ + "/memory.oom_control", "oom_kill");
    case Kind::kWatchdog:
      break;
  }
  return 0;
}

std::uint64_t proc_status_bytes(pid_t pid, const char* field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  const std::size_t length = std::strlen(field);
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, length, field) == 0 && line.size() > length && line[length] == ':') {
      return std::stoull(line.substr(length + 1)) * 1024;  // "VmRSS:   1234 kB"
    }
  }
  return 0;
}

std::string format_mib(std::uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

CappedServer::CappedServer(Options options, MemoryCap& cap)
    : options_(std::move(options)), cap_(cap) {}

CappedServer::~CappedServer() {
  if (running()) kill();
  if (sampler_.joinable()) sampler_.join();
}

bool CappedServer::running() const {
  std::lock_guard lock(mutex_);
  return !exited_;
}

bool CappedServer::start() {
  if (running()) {
    error_ = "already running";
    return false;
  }
  if (sampler_.joinable()) sampler_.join();
  ++incarnation_;
  const fs::path log =
      options_.data_dir.parent_path() / ("server-" + std::to_string(incarnation_) + ".log");
  // Everything the child needs, built before fork (only async-signal-safe
  // calls after it).
  // Sinks reach the Kafka mock broker, on 127.0.0.1 at a port of its own.
  std::vector<std::string> words = {
      options_.binary, "--data",      options_.data_dir.string(), "serve",
      "--listen",      "127.0.0.1:0", "--allow-kafka-brokers",    "127.0.0.1"};
  words.insert(words.end(), options_.serve_args.begin(), options_.serve_args.end());
  std::vector<char*> argv;
  for (auto& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('='));
    if (!options_.extra_env.contains(key)) env_strings.push_back(entry);
  }
  for (const auto& [key, value] : options_.extra_env) env_strings.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (auto& entry : env_strings) envp.push_back(entry.data());
  envp.push_back(nullptr);
  const std::string procs = cap_.procs_file();
  const std::string log_path = log.string();

  // The sampler starts only once exec has happened (this pipe's write end
  // closes on exec): until then the child is a copy of this process, whose
  // VmHWM would count as the server's peak (and under the watchdog, its
  // VmRSS could get it killed).
  int exec_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) {
    error_ = std::string("pipe2: ") + std::strerror(errno);
    return false;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    error_ = std::string("fork: ") + std::strerror(errno);
    ::close(exec_pipe[0]);
    ::close(exec_pipe[1]);
    return false;
  }
  if (pid == 0) {
    ::close(exec_pipe[0]);
    if (!procs.empty()) {
      char digits[24];
      int n = 0;
      char reversed[24];
      for (pid_t self = ::getpid(); self > 0; self /= 10) reversed[n++] = '0' + self % 10;
      for (int i = 0; i < n; ++i) digits[i] = reversed[n - 1 - i];
      const int fd = ::open(procs.c_str(), O_WRONLY);
      if (fd < 0 || ::write(fd, digits, n) != n) ::_exit(121);
      ::close(fd);
    }
    const int in = ::open("/dev/null", O_RDONLY);
    const int out = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0) ::_exit(122);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    ::execvpe(argv[0], argv.data(), envp.data());
    const char failed = 1;
    [[maybe_unused]] const auto written = ::write(exec_pipe[1], &failed, 1);
    ::_exit(123);
  }
  ::close(exec_pipe[1]);
  char exec_failed = 0;
  ssize_t got;
  do {
    got = ::read(exec_pipe[0], &exec_failed, 1);
  } while (got < 0 && errno == EINTR);
  ::close(exec_pipe[0]);
  // got == 0: exec happened. Otherwise the child exits (its status says
  // why), and the sampler reaps it.
  {
    std::lock_guard lock(mutex_);
    pid_ = pid;
    exited_ = false;
    expected_exit_ = false;
  }
  port_ = 0;
  sampler_ = std::thread([this, pid] { sample_loop(pid); });

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string text = read_file(log_path);
    const auto at = text.find("serving on http://127.0.0.1:");
    if (at != std::string::npos) {
      port_ = static_cast<std::uint16_t>(std::stoul(text.substr(at + 28)));
      return true;
    }
    if (!running()) {
      error_ = "the server exited while starting: " + unexpected_exit() + "\n" + text;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  error_ = "the server did not start serving within 60 s";
  kill();
  return false;
}

void CappedServer::sample_loop(pid_t pid) {
  const double cap = static_cast<double>(cap_.bytes());
  for (;;) {
    int status = 0;
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid || (done < 0 && errno == ECHILD)) {
      reap(pid, status);
      return;
    }
    const std::uint64_t hwm = proc_status_bytes(pid, "VmHWM");
    const std::uint64_t rss = proc_status_bytes(pid, "VmRSS");
    std::uint64_t peak = peak_.load();
    while (hwm > peak && !peak_.compare_exchange_weak(peak, hwm)) {
    }
    const double now =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - options_.epoch).count();
    {
      std::lock_guard lock(mutex_);
      samples_.push_back({now, rss});
      if (cap_.kind() == MemoryCap::Kind::kWatchdog && static_cast<double>(rss) > cap &&
          !expected_exit_ && unexpected_.empty()) {
        unexpected_ = "the watchdog killed it at RSS " + format_mib(rss) + ", over the cap of " +
                      format_mib(cap_.bytes());
        ::kill(pid, SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void CappedServer::reap(pid_t pid, int status) {
  std::lock_guard lock(mutex_);
  exited_ = true;
  if (!expected_exit_ && unexpected_.empty()) {
    if (WIFSIGNALED(status)) {
      unexpected_ = "killed by signal " + std::to_string(WTERMSIG(status));
      if (WTERMSIG(status) == SIGKILL && cap_.oom_kills() > 0) {
        unexpected_ +=
            ": the kernel's OOM killer, at the cgroup's cap of " + format_mib(cap_.bytes());
      }
    } else if (WIFEXITED(status)) {
      unexpected_ = "exited with status " + std::to_string(WEXITSTATUS(status));
    }
    unexpected_ +=
        " (incarnation " + std::to_string(incarnation_) + ", pid " + std::to_string(pid) + ")";
  }
  exited_cv_.notify_all();
}

void CappedServer::kill() {
  end(SIGKILL);
}

void CappedServer::stop() {
  end(SIGTERM);
}

void CappedServer::end(int signal) {
  pid_t pid;
  {
    std::lock_guard lock(mutex_);
    if (exited_) return;
    expected_exit_ = true;
    pid = pid_;
  }
  // The last word on its peak, read while it still runs.
  const std::uint64_t hwm = proc_status_bytes(pid, "VmHWM");
  std::uint64_t peak = peak_.load();
  while (hwm > peak && !peak_.compare_exchange_weak(peak, hwm)) {
  }
  ::kill(pid, signal);
  std::unique_lock lock(mutex_);
  if (!exited_cv_.wait_for(lock, std::chrono::seconds(60), [&] { return exited_; })) {
    ::kill(pid, SIGKILL);
    exited_cv_.wait(lock, [&] { return exited_; });
  }
}

std::string CappedServer::unexpected_exit() const {
  std::lock_guard lock(mutex_);
  return unexpected_;
}

std::vector<RssSample> CappedServer::samples() const {
  std::lock_guard lock(mutex_);
  return samples_;
}

std::string CappedServer::log_tail(std::size_t bytes) const {
  std::string all;
  for (int i = 1; i <= incarnation_; ++i) {
    all += "--- server incarnation " + std::to_string(i) + "\n";
    all += read_file(
        (options_.data_dir.parent_path() / ("server-" + std::to_string(i) + ".log")).string());
  }
  return all.size() > bytes ? all.substr(all.size() - bytes) : all;
}

}  // namespace tidemark::scenarios
