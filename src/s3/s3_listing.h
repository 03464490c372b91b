// S3 listings: the objects whose names start with a prefix, one page at a
// time, shared by S3Blob::list and the s3:// sink destination.
//
// ListObjectsV2 with continuation tokens, or ListObjects (V1) with markers
// (NextMarker, else the page's last name), as the URL's list_version says;
// list_page_size names per page. A page that does not advance (the next
// page would start where this one did) is an error, so a broken server
// cannot make a listing loop.
//
// Errors: as S3Client's, Determinate (a listing changes nothing); an
// answer that is not a well-formed ListBucketResult is Determinate, naming
// what is wrong. Messages start with "<operation> \"<subject>\": GET /bucket".
//
// Bounds: one page (the answer's body and its names) at a time.
//
// Thread-safety: as S3Client's: safe from many threads.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "s3/s3_client.h"
#include "tidemark/error.h"

namespace tidemark {

struct S3ListPage {
  // Full object names (unescaped) starting with the prefix, and sizes, in
  // S3's order (by name).
  std::vector<std::pair<std::string, std::uint64_t>> objects;
  // Where the next page starts (a token or a marker); nullopt after the last.
  std::optional<std::string> next;
};

// One page of the objects whose full names (bucket-relative, the client's
// prefix included) start with `name_prefix`, from `from` (a previous
// page's next; nullopt for the first).
[[nodiscard]] Result<S3ListPage> list_s3_page(S3Client& client, std::string_view operation,
                                              std::string_view subject,
                                              const std::string& name_prefix,
                                              const std::optional<std::string>& from);

// Every page: calls `visit` with each object's full name and size.
[[nodiscard]] Status list_s3_objects(
    S3Client& client, std::string_view operation, std::string_view subject,
    const std::string& name_prefix,
    const std::function<void(std::string_view name, std::uint64_t size)>& visit);

}  // namespace tidemark
