// S3Blob: a Blob in an S3-compatible object store, for scale-out
// deployments: `s3://bucket/prefix?endpoint=http://host:port[&region=R]`.
//
// Key "shard/s/part/abc" is the object PREFIX/shard/s/part/abc in BUCKET,
// addressed path-style: {endpoint}/{bucket}/{prefix}/{key}. The URL, its
// tuning parameters (multipart_threshold, part_size, list_page_size,
// list_version, max_attempts, stall_timeout), the credentials (from
// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), request signing, retries and
// connections are S3Client's (s3_client.h).
//
// Operations: get is a GET (404: nullopt); get_range a GET with a Range
// header (416, or a range past the end: ""; a 0-length range is a HEAD so
// that an absent object is still NotFound); set a PUT; remove a DELETE
// (absent succeeds); remove_many DeleteObjects; list ListObjectsV2 (or V1)
// paged until it is complete (s3_listing.h).
//
// Invariants:
//   - keys and prefixes are checked (blob_key.h) before any request;
//   - set is atomic by S3 semantics: one PUT up to multipart_threshold,
//     else a multipart upload (S3MultipartUpload: create, parts in order,
//     complete) whose object appears only when completed. A failed upload is aborted, best
//     effort (give the bucket a lifecycle rule for incomplete uploads);
//   - set stores the object's SHA-256 as user metadata
//     (x-amz-meta-tidemark-sha256). get checks the bytes against it, and
//     retries a mismatch or a missing digest (a torn read from a server
//     whose writes are not atomic, like s3rver) before reporting
//     Corruption: an object not written by S3Blob (or copied without its
//     user metadata) cannot be read with get. get_range does not check;
//   - sets of one key from one instance run one at a time. S3 needs none
//     of this, but a server that writes objects in place (s3rver) leaves a
//     mix of two concurrent PUTs of one object; the check above turns what
//     a reader sees of one write in progress into a retry;
//   - list reports only objects below PREFIX whose names are valid keys;
//   - open() does no I/O: a wrong endpoint shows on the first call.
//
// Errors: as S3Client's. A failed read is Determinate. A set or remove is
// Indeterminate when an attempt may have reached S3 and the outcome is
// unknown, Determinate when S3 definitely refused it; a failed part upload
// is Determinate (the object is untouched until the upload completes).
// remove_many reports keys S3 would not delete (other than absent ones) as
// Indeterminate, since the rest of the request may have applied.
//
// Bounds: get reads into one string reserved from Content-Length (the
// object's size); get_range into one of at most `length` bytes. set sends
// the caller's bytes without copying them, one part at a time when
// multipart (a part is at least part_size, raised to fit S3's 10000 parts).
// remove_many sends up to 1000 keys a request, falling back to one DELETE a
// key on a server that does not implement DeleteObjects. list holds one
// page (list_page_size keys) at a time and calls `visit` with no lock held.
// At most S3Client::kMaxConnections requests are in flight per instance.
//
// Thread-safety: safe for concurrent use from many threads, and from many
// processes sharing the bucket (each operation is one S3 request, or an
// upload S3 makes atomic).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "s3/s3_client.h"
#include "tidemark/location.h"

namespace tidemark {

class S3Blob : public Blob {
 public:
  // Opens the blob an s3:// URL names (s3_client.h), with credentials from
  // the environment. InvalidUsage for a bad URL or missing credentials.
  [[nodiscard]] static Result<std::unique_ptr<S3Blob>> open(std::string_view url);
  [[nodiscard]] static Result<std::unique_ptr<S3Blob>> open(S3Url url, S3Credentials credentials);

  [[nodiscard]] Result<std::optional<std::string>> get(std::string_view key) override;
  [[nodiscard]] Result<std::string> get_range(std::string_view key, std::uint64_t offset,
                                              std::uint64_t length) override;
  [[nodiscard]] Status set(std::string_view key, std::string_view bytes) override;
  [[nodiscard]] Status remove(std::string_view key) override;
  // DeleteObjects, up to 1000 keys a request.
  [[nodiscard]] Status remove_many(const std::vector<std::string>& keys) override;
  [[nodiscard]] Status list(
      std::string_view prefix,
      const std::function<void(std::string_view key, std::uint64_t size)>& visit) override;

  const S3Url& url() const { return client_.url(); }

 private:
  // Lets open() use std::make_unique while keeping construction private.
  struct PrivateTag {};

 public:
  S3Blob(PrivateTag, S3Url url, S3Credentials credentials);

 private:
  // Uploads `bytes` in parts (S3MultipartUpload).
  [[nodiscard]] Status put_multipart(std::string_view key, std::string_view bytes,
                                     const std::string& sha256);

  // One DeleteObjects request for 1 to 1000 valid keys; false if the
  // server does not implement DeleteObjects (nothing was deleted). Keys S3
  // could not delete for a transient reason are appended to *retry.
  [[nodiscard]] Result<bool> delete_objects(const std::vector<std::string>& keys,
                                            std::vector<std::string>* retry);

  // Waits until no other set of `key` is in flight from this instance,
  // and marks it in flight until destroyed.
  class SetInFlight {
   public:
    SetInFlight(S3Blob& blob, std::string_view key);
    SetInFlight(const SetInFlight&) = delete;
    SetInFlight& operator=(const SetInFlight&) = delete;
    ~SetInFlight();

   private:
    S3Blob& blob_;
    std::string key_;
  };

  S3Client client_;

  std::mutex sets_mutex_;
  std::condition_variable set_finished_;
  std::set<std::string, std::less<>> sets_in_flight_;  // guarded by sets_mutex_

  // Set once the server answers DeleteObjects with "not implemented";
  // remove_many then deletes one key a request.
  std::atomic<bool> delete_objects_unsupported_{false};
};

}  // namespace tidemark
