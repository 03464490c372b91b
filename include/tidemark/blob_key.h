// BlobKey: the syntax every Blob backend accepts for keys and list prefixes.
//
// A key is a relative, '/'-separated path such as "shard/orders/part/abc":
//   - 1 to kMaxBlobKeyLength characters from [A-Za-z0-9._/-];
//   - no leading '/', no empty component ("a//b", trailing '/');
//   - no "." or ".." component, and no component starting with ".tmp-"
//     (the file backend's in-flight temporaries use that name).
// The rule is the file backend's (keys map to paths under its root and must
// not escape it), and every backend enforces it, so a key that works
// against the memory backend in tests also works against files.
//
// A list prefix is a string prefix of keys: it may be empty or end inside a
// component ("shard/ord"), but the components it completes follow the key
// rules, so it never names a directory outside the root.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string_view>

#include "tidemark/error.h"

namespace tidemark {

// Longer keys would exceed common file-system path limits once rooted.
inline constexpr std::size_t kMaxBlobKeyLength = 1024;

// Names the file backend gives its temporaries; never a key component.
inline constexpr std::string_view kBlobTemporaryPrefix = ".tmp-";

// InvalidUsage, naming the key and the rule it breaks, unless `key` is valid.
Status validate_blob_key(std::string_view key);

// InvalidUsage unless `prefix` is a valid list prefix (see above).
Status validate_blob_prefix(std::string_view prefix);

}  // namespace tidemark
