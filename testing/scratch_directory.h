// ScratchDirectory: a fresh temporary directory for one test, removed with
// everything in it when the object is destroyed. Test-only.
//
// Invariant: path() is an absolute directory made by mkdtemp under /tmp,
// unique to this object.
//
// Thread-safety: immutable after construction; destroy it once no thread
// uses the directory.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace tidemark {

class ScratchDirectory {
 public:
  ScratchDirectory() {
    std::string pattern = "/tmp/tidemark-location-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp " << pattern << " failed";
      return;
    }
    path_ = pattern;
  }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;
  ~ScratchDirectory() {
    if (path_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tidemark
