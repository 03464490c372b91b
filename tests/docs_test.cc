// The documents' examples, run as shown. Every ```console block of the
// README and of docs/semantics.md is a list of `$ command` lines, each
// followed by the output it prints (stdout and stderr together, as on a
// terminal). Each document runs in order, in one bash process, in an empty
// directory with `tidemark` on the PATH and `build/tidemark` beside it, and
// each command's output is compared with the lines shown: `...` in a shown
// line stands for any text (a wall-clock time, a process id). A command
// ending in `&` runs in the background with its output not compared; a
// background `serve` is waited for until it accepts connections. The
// server's documented port, 6875, becomes a free port for the run.
//
// So a document cannot drift from what the binary does: change one and
// this test fails naming the line.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct Step {
  std::string command;
  std::vector<std::string> expected;
  int line = 0;  // in the document, 1-based
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// The ```console blocks' steps, in document order.
std::vector<Step> console_steps(const std::string& markdown) {
  std::vector<Step> steps;
  bool in_block = false, in_other = false;
  int number = 0;
  for (const std::string& line : split_lines(markdown)) {
    ++number;
    if (line.starts_with("```")) {
      if (in_block || in_other) {
        in_block = in_other = false;
      } else if (line == "```console") {
        in_block = true;
      } else {
        in_other = true;
      }
      continue;
    }
    if (!in_block) continue;
    if (line.starts_with("$ ")) {
      steps.push_back(Step{line.substr(2), {}, number});
    } else if (!steps.empty() && !steps.back().command.empty() &&
               steps.back().command.back() == '\\' && steps.back().expected.empty()) {
      steps.back().command += "\n" + line;  // a continued command
    } else {
      EXPECT_FALSE(steps.empty()) << "line " << number << ": output before any command";
      if (!steps.empty()) steps.back().expected.push_back(line);
    }
  }
  EXPECT_FALSE(in_block) << "a ```console block is not closed";
  return steps;
}

bool matches(const std::string& shown, const std::string& got) {
  if (shown.find("...") == std::string::npos) return shown == got;
  std::string pattern;
  for (std::size_t i = 0; i < shown.size();) {
    if (shown.compare(i, 3, "...") == 0) {
      pattern += ".*";
      i += 3;
      continue;
    }
    const char c = shown[i++];
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) pattern += '\\';
    pattern += c;
  }
  return std::regex_match(got, std::regex(pattern));
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t size = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &size) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

void run_document(const std::string& relative) {
  const fs::path source = fs::path(TIDEMARK_SOURCE_DIR) / relative;
  ASSERT_TRUE(fs::exists(source)) << source;
  const std::vector<Step> steps = console_steps(slurp(source));
  ASSERT_FALSE(steps.empty()) << relative << " has no ```console example";

  const fs::path dir = fs::temp_directory_path() / ("tidemark-docs-" + std::to_string(::getpid()) +
                                                    "-" + fs::path(relative).stem().string());
  fs::remove_all(dir);
  fs::create_directories(dir / "bin");
  fs::create_directories(dir / "work" / "build");
  fs::create_symlink(TIDEMARK_BINARY, dir / "bin" / "tidemark");
  fs::create_symlink(TIDEMARK_BINARY, dir / "work" / "build" / "tidemark");
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::string port_text = std::to_string(port);

  std::string script = "export PATH=" + shell_quote((dir / "bin").string()) + ":\"$PATH\"\n";
  script += "unset TIDEMARK_DATA TIDEMARK_BLOB TIDEMARK_CONSENSUS\n";
  script += "cd " + shell_quote((dir / "work").string()) + " || exit 1\n";
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const std::string command = replace_all(steps[i].command, "6875", port_text);
    const std::string out = shell_quote((dir / ("out." + std::to_string(i))).string());
    if (command.ends_with("&")) {
      script += "{ " + command + " } > " + out + " 2>&1 < /dev/null\n";
      if (command.find(" serve") != std::string::npos) {
        script += "for i in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/" + port_text +
                  ") 2>/dev/null && break; sleep 0.05; done\n";
      }
    } else {
      script += "{ " + command + "\n} > " + out + " 2>&1 < /dev/null\n";
    }
  }
  script += "kill $(jobs -p) 2>/dev/null\nwait\n";
  std::ofstream(dir / "script.sh") << script;
  const int raw = std::system(
      ("timeout 120 bash " + shell_quote((dir / "script.sh").string()) + " > /dev/null 2>&1")
          .c_str());
  EXPECT_TRUE(WIFEXITED(raw) && WEXITSTATUS(raw) != 124) << relative << ": timed out";

  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Step& step = steps[i];
    if (step.command.ends_with("&")) {
      EXPECT_TRUE(step.expected.empty())
          << relative << ":" << step.line << ": a background command's output is not compared";
      continue;
    }
    std::vector<std::string> got = split_lines(slurp(dir / ("out." + std::to_string(i))));
    for (std::string& line : got) line = replace_all(line, port_text, "6875");
    bool same = got.size() == step.expected.size();
    for (std::size_t j = 0; same && j < got.size(); ++j) same = matches(step.expected[j], got[j]);
    if (!same) {
      std::string shown, printed;
      for (const auto& l : step.expected) shown += "  " + l + "\n";
      for (const auto& l : got) printed += "  " + l + "\n";
      ADD_FAILURE() << relative << ":" << step.line << ": $ " << step.command << "\nshown:\n"
                    << shown << "printed:\n"
                    << printed;
    }
  }
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

TEST(DocsTest, TheReadmeExamplesRunAsShown) {
  run_document("README.md");
}

TEST(DocsTest, TheSemanticsExamplesRunAsShown) {
  run_document("docs/semantics.md");
}

// The checker itself: a wrong line is found, `...` matches only where it
// stands.
TEST(DocsTest, ShownOutputMatchesOnlyWhatItSays) {
  EXPECT_TRUE(matches("{\"time\":...,\"count\":1}", "{\"time\":17,\"count\":1}"));
  EXPECT_FALSE(matches("{\"time\":...,\"count\":1}", "{\"time\":17,\"count\":2}"));
  EXPECT_TRUE(matches("a.b (c)", "a.b (c)"));
  EXPECT_FALSE(matches("a.b", "axb"));
  auto steps = console_steps("```console\n$ echo a \\\n  b\na b\n$ true\n```\n```sh\n$ no\n```\n");
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].command, "echo a \\\n  b");
  EXPECT_EQ(steps[0].expected, std::vector<std::string>{"a b"});
  EXPECT_TRUE(steps[1].expected.empty());
}

}  // namespace
