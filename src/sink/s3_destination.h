// S3Destination: a sink's output as objects under one S3 prefix
// (`s3://bucket/prefix?endpoint=http://host:port&region=R`; the URL, its
// parameters, signing and retries are S3Client's,
// s3_client.h).
//
// The objects are FileDestination's files: each holds the pairs of the
// times in [lower, upper), one MessageEncoder line each (csv: after the
// header row), and is named `<prefix>/<lower>-<upper>.<json|csv>`
// (committed_name.h). The committed objects are the sink's progress: the
// largest committed upper is the frontier fully emitted, and a restarted
// sink resumes there.
//
// How an interval becomes an object. Its lines collect in one buffer.
//   - Small: if commit() comes before the buffer reaches part_size, the
//     buffer is PUT under the final name: one request.
//   - Large: once the buffer reaches part_size, a multipart upload starts
//     to a temporary `<prefix>/.<lower>-<random id>.tmp`, the buffer is
//     uploaded as a part, and so on. commit() uploads the rest as the last
//     part, completes the upload (the temporary appears), copies the
//     temporary to the final name server-side and deletes the temporary.
//     The copy is one CopyObject up to options.max_copy_object_bytes (S3's
//     limit for one copy, 5 GiB); a larger temporary is copied by
//     UploadPartCopy ranges (copy_part_bytes each) into a multipart upload
//     of the final name.
// A PUT, a CopyObject and a CompleteMultipartUpload each make their object
// appear whole: a committed object is never visible half-written, and
// output being written is never under a committed name. (The final name
// needs the upper, known only at commit(); hence the temporary and copy.)
//
// Memory: the buffer holds at most part_size + one line (a part is
// uploaded as soon as the buffer reaches part_size), whatever the
// interval's size; a part is sent from it without a copy. Its bytes,
// part_size + kLineSlackBytes (8 MiB + 64 KiB by default), are reserved
// from options.pool by open() and held until the destination goes; a line
// longer than the slack grows the reservation (force_grow: an overdraft of
// at most that one line) until the next part goes up. Without a pool the
// same bound holds, unaccounted. The URL's multipart_threshold does not
// apply: part_size is the threshold.
//
// The prefix belongs to one sink at a time: the runner claims it before
// open() (options.claim, a lease in the location's Consensus: see
// sink_claim.h), and commit() checks the claim right before the PUT or
// the copy that makes a committed name appear (nothing appears when it
// fails). Without a claim the caller promises that no other sink writes
// the prefix. open() lists it, deletes every
// temporary (".*.tmp": a crashed sink's, left between completing and
// deleting it) and reads the progress from the committed names, of either
// format (a sink whose format was changed goes on where the other format
// stopped). Names that are not `<20 digits>-<20 digits>.<json|csv>`, and
// names below a further '/', are ignored. Multipart uploads a crashed sink
// left incomplete are not looked for (ListMultipartUploads is not
// reliable everywhere; s3rver does not implement it) and never appear as
// objects: give the bucket a lifecycle rule that aborts incomplete
// multipart uploads (AbortIncompleteMultipartUpload, e.g. after a day).
//
// Limits: an interval's object has at most 10000 parts, so at most
// 10000 x part_size bytes (78 GiB at the default 8 MiB); a write past that
// fails (Determinate, naming the limit: raise part_size). A snapshot is
// committed in parts (commit_snapshot_part, below), so it never meets the
// limit, and the runner rolls later intervals at SinkOptions::roll_bytes. A pair at time
// 2^64-1 can never be committed: no finite upper is above it.
//
// Errors: usage errors (a broken REQUIRES) are InvalidUsage and change
// nothing. An S3 failure before the object can appear is Determinate and
// abandons the open interval (its upload is aborted and its temporary
// deleted, best effort): starting the upload, a part, completing the
// temporary, a copy or PUT that S3 definitely refused. A final PUT or copy
// (or the copy's completion) whose outcome is unknown is Indeterminate:
// progress() stays what this process knows (unchanged), and a reopened
// destination reads the truth from the listing. After an abandon, write()
// and commit() fail until the next begin(). A temporary that cannot be
// deleted once its copy succeeded does not fail the commit: it is never
// read as output, and the next open() deletes it.
//
// Objects carry no x-amz-meta-tidemark-sha256 digest (S3Blob::get cannot
// read them; read them with S3Client). S3 checks each request's body
// against its signed SHA-256.
//
// s3rver (the tests' S3 server, 3.7) takes every request of the PUT and
// CopyObject paths, but writes objects in place (PUT and CopyObject alike
// are not atomic there, unlike S3); it does not implement UploadPartCopy
// (501: a temporary above 5 GiB cannot be committed on it) nor
// AbortMultipartUpload (405: abandoned uploads stay in its directory).
//
// Thread-safety: one sink uses a destination from one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "s3/s3_client.h"
#include "sink/destination.h"
#include "sink/destination_claim.h"
#include "sink/envelope.h"
#include "tidemark/error.h"
#include "tidemark/frontier.h"
#include "tidemark/memory_pool.h"
#include "util/cancel.h"

namespace tidemark {

struct S3DestinationOptions {
  static constexpr std::uint64_t kMaxCopyObjectBytes = 5ull << 30;  // S3's CopyObject limit
  static constexpr std::uint64_t kCopyPartBytes = 512ull << 20;

  // The buffer's bytes are reserved from it (unaccounted if null).
  std::shared_ptr<MemoryPool> pool;
  // How long open() waits for the pool to have room for them; none: as
  // long as it takes. Past it, open() fails with Full naming the pool.
  std::optional<std::chrono::milliseconds> pool_wait = std::nullopt;
  // Checked before each commit's PUT or copy (none: unclaimed).
  std::shared_ptr<DestinationClaim> claim = nullptr;
  // Once cancelled, every S3 call gives up within about a second (the
  // sink is being deleted or the server stopped); none: never.
  std::shared_ptr<const Cancellation> cancel = nullptr;
  // Temporaries up to this size are copied with one CopyObject, larger ones
  // with UploadPartCopy ranges of copy_part_bytes (raised to fit S3's 10000
  // parts). Tests lower both.
  std::uint64_t max_copy_object_bytes = kMaxCopyObjectBytes;
  std::uint64_t copy_part_bytes = kCopyPartBytes;
};

class S3Destination final : public SinkDestination {
 public:
  static constexpr std::size_t kLineSlackBytes = 64 << 10;

  // Reserves the buffer's bytes (InvalidUsage when the pool can never hold
  // them), lists the prefix, deletes leftover temporaries and reads the
  // progress from the committed names. A committed-looking name that does
  // not parse, or committed ranges that overlap, is a Corruption error
  // naming the objects. InvalidUsage for empty credentials.
  [[nodiscard]] static Result<std::unique_ptr<S3Destination>> open(
      S3Url url, S3Credentials credentials, Envelope envelope, SinkFormat format,
      S3DestinationOptions options = {});
  ~S3Destination() override;  // an open interval is abandoned (upload aborted)

  // The largest committed upper: everything before it is in committed
  // objects. nullopt when nothing is committed yet.
  std::optional<Frontier> progress() const override { return progress_; }

  // Starts an interval at `lower` (no request yet; csv buffers its header
  // row). REQUIRES: none open; lower is not closed; lower >= progress()
  // (when set).
  [[nodiscard]] Status begin(Frontier lower) override;
  // Buffers the line of one pair, uploading the buffer as a part once it
  // reaches part_size. REQUIRES: an interval open; the pair's time >= its
  // lower.
  [[nodiscard]] Status write(const DiffPair& pair) override;
  // Bytes of the open interval so far (uploaded and buffered).
  std::uint64_t open_bytes() const override;
  // Makes the open interval the object `<lower>-<upper>.<ext>` (see above);
  // progress() becomes upper. REQUIRES: an interval open; upper > every
  // time written; upper > lower; upper is not closed.
  [[nodiscard]] Status commit(Frontier upper) override;

  std::uint64_t primary_key_violations() const override;

  // A snapshot in parts: each part an object of its own (committed_name.h's
  // snapshot_part_name), made to appear whole as commit() makes one; the
  // snapshot's last part is commit(as_of + 1)'s object, and only that one
  // moves progress(). So a snapshot of any size is objects of at most
  // about SinkOptions::snapshot_part_bytes, each far below the 10000-part
  // limit.
  bool commits_snapshot_in_parts() const override { return true; }
  // From the parts' names (open() reads them), with `check` and no key.
  std::optional<SnapshotPosition> snapshot_position() const override { return snapshot_position_; }
  // Commits the open interval as the snapshot part ending at `position`.
  // Errors as for commit(). REQUIRES: progress() is nullopt; the interval
  // began at 0 and holds only pairs at position.as_of; the position follows
  // the last part's (same as_of, more pairs).
  [[nodiscard]] Status commit_snapshot_part(const SnapshotPosition& position) override;

  const S3Url& url() const;

 private:
  struct State;
  explicit S3Destination(std::unique_ptr<State> state);
  Status publish(const std::string& target);
  std::unique_ptr<State> state_;
  std::optional<Frontier> progress_;
  std::optional<SnapshotPosition> snapshot_position_;
};

}  // namespace tidemark
