#include "scenarios/report.h"

#include <cstdio>
#include <fstream>

#include "util/json.h"

namespace tidemark::scenarios {

namespace {

std::string number(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

double mib(std::uint64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

void append_strings(std::string* out, const std::vector<std::string>& items) {
  *out += "[";
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) *out += ", ";
    append_json_string(out, items[i]);
  }
  *out += "]";
}

}  // namespace

bool write_json_report(const std::filesystem::path& file, const Report& report,
                       std::string* error) {
  std::string out = "{\n  \"command\": ";
  append_json_string(&out, report.command);
  out += ",\n  \"commit\": ";
  if (report.commit.empty()) {
    out += "null";
  } else {
    append_json_string(&out, report.commit);
  }
  out += ",\n  \"date\": ";
  append_json_string(&out, report.date);
  out += ",\n  \"seed\": ";
  append_u64(&out, report.seed);
  out += std::string(",\n  \"random_config\": ") + (report.random_config ? "true" : "false");
  out += std::string(",\n  \"search\": ") + (report.search ? "true" : "false");
  out += ",\n  \"scenarios\": ";
  append_strings(&out, report.scenarios);
  out += ",\n  \"not_run\": ";
  append_strings(&out, report.not_run);
  out += ",\n  \"runs\": [";
  for (std::size_t i = 0; i < report.runs.size(); ++i) {
    const RunReport& run = report.runs[i];
    out += i ? ",\n    {\"scenario\": " : "\n    {\"scenario\": ";
    append_json_string(&out, run.scenario);
    out += std::string(", \"result\": ") + (run.passed ? "\"pass\"" : "\"fail\"");
    out += ", \"peak_rss_mib\": " + number(mib(run.peak_bytes), 1);
    out += ", \"cap_mib\": " + number(mib(run.cap_bytes), 1);
    out += ", \"seconds\": " + number(run.seconds, 1);
    out += ", \"server_starts\": " + std::to_string(run.server_starts);
    out += ", \"cap_hits\": ";
    append_u64(&out, run.cap_hits);
    out += ", \"cap_mechanism\": ";
    append_json_string(&out, run.cap_mechanism);
    out += ",\n     \"notes\": ";
    append_strings(&out, run.notes);
    out += ", \"failures\": ";
    append_strings(&out, run.failures);
    out += "}";
  }
  out += report.runs.empty() ? "]\n}\n" : "\n  ]\n}\n";

  // Whole or not at all: write beside the file, then rename over it.
  const std::filesystem::path partial = file.string() + ".partial";
  {
    std::ofstream stream(partial, std::ios::binary | std::ios::trunc);
    stream << out;
    stream.flush();
    if (!stream) {
      *error = "cannot write " + partial.string();
      return false;
    }
  }
  std::error_code failed;
  std::filesystem::rename(partial, file, failed);
  if (failed) {
    *error = "cannot rename " + partial.string() + " to " + file.string() + ": " + failed.message();
    return false;
  }
  return true;
}

}  // namespace tidemark::scenarios
