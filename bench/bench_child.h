// Benchmarks that measure a cold start run part of their work in a child:
// this same binary as `tidemark bench <mode> <dir>`, which prints its
// figures on stdout.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "tidemark/error.h"

namespace tidemark::cli {

// Runs the child and returns its standard output; an error if it could not
// start or did not exit with status 0.
[[nodiscard]] Result<std::string> run_bench_child(std::string_view mode,
                                                  const std::filesystem::path& dir);

}  // namespace tidemark::cli
