// S3MultipartUpload: one S3 multipart upload (CreateMultipartUpload, parts
// in order, CompleteMultipartUpload), shared by S3Blob (an object too large
// for one PUT) and the s3:// sink destination (an object streamed in parts
// of unknown total size).
//
// The object appears only when complete() succeeds, atomically: until then
// nothing any reader sees has changed, so every failure before complete()
// is Determinate. An upload that is not completed is aborted when it is
// destroyed (or by abort()), best effort: a failed abort is ignored (the
// upload already failed), and S3 keeps the parts of an upload nobody
// aborts until a bucket lifecycle rule expires them
// (AbortIncompleteMultipartUpload): give the bucket one.
//
// Parts are numbered 1, 2, ... in the order they are uploaded; S3 allows
// 10000 (kMaxParts) and requires every part but the last to be at least
// 5 MiB: the caller sizes them. A part is either bytes (upload_part) or a
// byte range of an existing object copied server-side (upload_part_copy,
// UploadPartCopy).
//
// Errors: as S3Client's, each message naming the step ("<operation>
// (upload part 3)") and the object. complete() is Indeterminate when an
// attempt may have completed the upload and the outcome is unknown (or S3
// answered 200 with an <Error> inside, every attempt), Determinate when S3
// definitely refused it.
//
// Memory: a part's bytes are sent from the caller's memory without a copy;
// the upload keeps one ETag per part.
//
// Thread-safety: one thread uses an upload at a time; the S3Client it
// points to is thread-safe and must outlive it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "s3/s3_client.h"
#include "tidemark/error.h"

namespace tidemark {

class S3MultipartUpload {
 public:
  static constexpr std::size_t kMaxParts = 10000;

  // Starts an upload of the object `name` (below the client's prefix, as
  // S3Client::object_path takes it). `headers` ("Content-Type: ...",
  // "x-amz-meta-...: ...") become the object's. `operation` ("s3 blob:
  // set") starts every error message.
  [[nodiscard]] static Result<S3MultipartUpload> create(S3Client& client, std::string name,
                                                        std::string operation,
                                                        std::vector<std::string> headers = {});

  S3MultipartUpload(S3MultipartUpload&& other) noexcept;
  S3MultipartUpload& operator=(S3MultipartUpload&& other) noexcept;
  S3MultipartUpload(const S3MultipartUpload&) = delete;
  S3MultipartUpload& operator=(const S3MultipartUpload&) = delete;
  ~S3MultipartUpload();  // aborts an upload not completed

  // Uploads the next part. REQUIRES: not completed or aborted; fewer than
  // kMaxParts parts.
  [[nodiscard]] Status upload_part(std::string_view bytes);
  // Makes the next part the bytes [first, last] (inclusive) of the object
  // at `source_path` ("/bucket/name", S3Client::object_path), copied by S3.
  // Same REQUIRES.
  [[nodiscard]] Status upload_part_copy(const std::string& source_path, std::uint64_t first,
                                        std::uint64_t last);
  // Completes the upload: the object appears whole. REQUIRES: at least one
  // part; not completed or aborted.
  [[nodiscard]] Status complete();
  // Best effort, at most once; nothing after it but destruction.
  void abort();

  const std::string& name() const { return name_; }
  std::size_t parts() const { return etags_.size(); }

 private:
  S3MultipartUpload(S3Client& client, std::string name, std::string operation,
                    std::string upload_id);

  // "<operation> (<step>)".
  std::string step(std::string_view what) const;
  // The part's target: "?partNumber=N&uploadId=...".
  std::string part_target(std::size_t number) const;

  S3Client* client_ = nullptr;  // null once moved from
  std::string name_;
  std::string operation_;
  std::string upload_id_;
  std::vector<std::string> etags_;  // of parts 1, 2, ...
  bool finished_ = false;           // completed or aborted
};

}  // namespace tidemark
