#include "tidemark/blob_key.h"

#include <string>

namespace tidemark {

namespace {

bool allowed_character(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || c == '/';
}

std::unexpected<Error> bad_key(std::string_view what, std::string_view key, std::string_view why) {
  std::string message(what);
  message += " \"";
  message += key;
  message += "\": ";
  message += why;
  return invalid_usage(std::move(message));
}

// Checks the rules shared by keys and prefixes. `components` is the part of
// `text` made of whole components: all of a key; a prefix up to its last '/'.
Status validate_path(std::string_view what, std::string_view text, std::string_view components) {
  if (text.size() > kMaxBlobKeyLength) {
    return bad_key(what, text.substr(0, 64),
                   "longer than " + std::to_string(kMaxBlobKeyLength) + " characters");
  }
  for (char c : text) {
    if (!allowed_character(c)) return bad_key(what, text, "characters must be [A-Za-z0-9._/-]");
  }
  if (text.starts_with('/')) return bad_key(what, text, "must be relative (no leading '/')");
  if (components.empty()) return {};
  std::size_t start = 0;
  while (true) {
    std::size_t end = components.find('/', start);
    std::string_view component = components.substr(start, end - start);
    if (component.empty()) return bad_key(what, text, "empty path component");
    if (component == "." || component == "..") {
      return bad_key(what, text, "\".\" and \"..\" components are not allowed");
    }
    if (component.starts_with(kBlobTemporaryPrefix)) {
      return bad_key(what, text, "components starting with \".tmp-\" are reserved");
    }
    if (end == std::string_view::npos) return {};
    start = end + 1;
  }
}

}  // namespace

Status validate_blob_key(std::string_view key) {
  if (key.empty()) return invalid_usage("blob key must not be empty");
  return validate_path("blob key", key, key);
}

Status validate_blob_prefix(std::string_view prefix) {
  auto slash = prefix.find_last_of('/');
  std::string_view components =
      slash == std::string_view::npos ? std::string_view() : prefix.substr(0, slash);
  return validate_path("blob prefix", prefix, components);
}

}  // namespace tidemark
