#include "sink/s3_destination.h"

#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

#include "s3/s3_listing.h"
#include "s3/s3_multipart_upload.h"
#include "sink/committed_name.h"
#include "util/ids.h"
#include "util/try.h"

namespace tidemark {
namespace {

// Adds "s3 destination: " to a helper's error, keeping its kind.
std::unexpected<Error> in_destination(Error error) {
  error.message = "s3 destination: " + error.message;
  return std::unexpected(std::move(error));
}

std::string content_type_of(SinkFormat format) {
  return format == SinkFormat::kJson ? "Content-Type: application/x-ndjson"
                                     : "Content-Type: text/csv";
}

}  // namespace

struct S3Destination::State {
  // The interval being written, and what commit() must check.
  struct OpenInterval {
    Time lower = 0;
    std::optional<Time> max_time;  // the largest time written, if any
    // The temporary's upload, once the buffer first reached part_size.
    std::optional<S3MultipartUpload> upload;
    std::uint64_t uploaded_bytes = 0;  // in the upload's parts
    // Set once completing the upload may have made the temporary appear.
    bool temporary_may_exist = false;
  };

  State(S3Url url, S3Credentials credentials, Envelope envelope, SinkFormat format,
        S3DestinationOptions options)
      : client(std::move(url), std::move(credentials), options.cancel),
        encoder(envelope, format),
        extension(extension_of(format)),
        content_type(content_type_of(format)),
        options(std::move(options)),
        buffer_bytes(client.url().part_size + kLineSlackBytes) {}

  // "s3://bucket/prefix", for messages.
  std::string where() const {
    const S3Url& url = client.url();
    return "s3://" + url.bucket + (url.prefix.empty() ? "" : "/" + url.prefix);
  }

  // Keeps the lease at least the buffer's capacity: a line longer than the
  // slack grew the buffer.
  void account_for_buffer() {
    if (options.pool && buffer.capacity() > lease.size()) {
      lease.force_grow(buffer.capacity() - lease.size());
    }
  }

  // Empties the buffer, keeping room for part_size + kLineSlackBytes;
  // gives back what a long line grew it by.
  void clear_buffer() {
    buffer.clear();
    if (buffer.capacity() > buffer_bytes) {
      std::string().swap(buffer);
      buffer.reserve(buffer_bytes);
    }
    if (options.pool && lease.size() > buffer_bytes) lease.shrink(lease.size() - buffer_bytes);
  }

  // Uploads the buffer as the temporary's next part, starting the upload
  // first if need be. REQUIRES: open_interval.
  Status upload_buffer() {
    OpenInterval& open = *open_interval;
    if (!open.upload) {
      std::string temporary =
          "." + bound_text(open.lower) + "-" + random_id() + std::string(kTemporarySuffix);
      TM_ASSIGN(open.upload, S3MultipartUpload::create(client, std::move(temporary),
                                                       "s3 destination: write", {content_type}));
    }
    if (open.upload->parts() == S3MultipartUpload::kMaxParts) {
      return determinate("s3 destination: the interval from " + std::to_string(open.lower) +
                         " is larger than S3's " + std::to_string(S3MultipartUpload::kMaxParts) +
                         " parts of part_size " + std::to_string(client.url().part_size) +
                         " bytes: raise part_size in the URL (" + where() + ")");
    }
    TM_TRY(open.upload->upload_part(buffer));
    open.uploaded_bytes += buffer.size();
    clear_buffer();
    return {};
  }

  // OK while the claim (if any) holds: checked right before a committed
  // name can appear.
  Status check_claim() {
    if (options.claim) return options.claim->check();
    return {};
  }

  // Deletes the object `name`. A missing object is fine.
  Status delete_object(const std::string& name, std::string_view operation) {
    S3Request request{.method = "DELETE", .target = client.object_path(name)};
    S3Call call{
        .operation = operation, .subject = name, .mutates = true, .accepted = {200, 204, 404}};
    TM_TRY(client.exchange(request, call));
    return {};
  }

  // Copies the completed temporary of `size` bytes to `target`: one
  // CopyObject, or UploadPartCopy ranges above max_copy_object_bytes. The
  // error's kind is whether `target` may have appeared.
  Status copy_object(const std::string& temporary, std::uint64_t size, const std::string& target) {
    const std::string source = client.object_path(temporary);
    if (size <= options.max_copy_object_bytes) {
      S3Request request{
          .method = "PUT",
          .target = client.object_path(target),
          .headers = {content_type, "x-amz-copy-source: " + source},
      };
      const std::string operation = "s3 destination: commit (copy " + temporary + ")";
      S3Call call{
          .operation = operation,
          .subject = target,
          .mutates = true,
          .accepted = {200},
          .check =
              [](const S3Answer& answer) {
                return s3_error_inside_success(answer, ErrorKind::kIndeterminate,
                                               "CopyObjectResult");
              },
      };
      TM_TRY(client.exchange(request, call));
      return {};
    }
    // Nothing of `target` appears before the upload completes; an upload
    // not completed is aborted when `upload` goes.
    TM_ASSIGN(S3MultipartUpload upload,
              S3MultipartUpload::create(client, target,
                                        "s3 destination: commit (copy " + temporary + " in parts)",
                                        {content_type}));
    const std::uint64_t part =
        std::max<std::uint64_t>(options.copy_part_bytes, (size + S3MultipartUpload::kMaxParts - 1) /
                                                             S3MultipartUpload::kMaxParts);
    for (std::uint64_t first = 0; first < size; first += part) {
      TM_TRY(upload.upload_part_copy(source, first, std::min(size, first + part) - 1));
    }
    return upload.complete();
  }

  // Drops the open interval: aborts its upload and deletes its temporary.
  // Best effort: neither is ever read as output, and open() deletes
  // leftover temporaries.
  void abandon() {
    if (!open_interval) return;
    if (open_interval->upload) {
      const std::string temporary = open_interval->upload->name();
      open_interval->upload->abort();
      if (open_interval->temporary_may_exist) {
        (void)delete_object(temporary, "s3 destination: delete the abandoned temporary");
      }
    }
    open_interval.reset();
    clear_buffer();
  }

  // Abandons the open interval and returns `error`, so that a failure
  // leaves nothing half-written behind.
  std::unexpected<Error> fail(std::unexpected<Error> error) {
    abandon();
    abandoned_after_error = true;
    return error;
  }

  S3Client client;
  MessageEncoder encoder;
  const std::string_view extension;
  const std::string content_type;  // the objects' Content-Type header
  const S3DestinationOptions options;
  // The buffer's bound: part_size + kLineSlackBytes.
  const std::uint64_t buffer_bytes;
  // The buffer's bytes, from options.pool (empty without one).
  Lease lease;
  std::optional<OpenInterval> open_interval;
  // Lines not yet uploaded. Uploaded as a part once it reaches part_size.
  std::string buffer;
  // Set when an error abandoned the open interval, for a clearer message if
  // the caller keeps writing; cleared by begin().
  bool abandoned_after_error = false;
};

Result<std::unique_ptr<S3Destination>> S3Destination::open(S3Url url, S3Credentials credentials,
                                                           Envelope envelope, SinkFormat format,
                                                           S3DestinationOptions options) {
  if (credentials.access_key_id.empty() || credentials.secret_access_key.empty()) {
    return invalid_usage(
        "s3 destination: the credentials need an access key id and a secret access key");
  }
  if (options.copy_part_bytes == 0) {
    return invalid_usage("s3 destination: copy_part_bytes must be positive");
  }
  auto state = std::make_unique<State>(std::move(url), std::move(credentials), envelope, format,
                                       std::move(options));
  if (state->options.pool) {
    TM_ASSIGN(state->lease,
              reserve_for_sink(*state->options.pool, state->buffer_bytes, state->options.pool_wait,
                               "s3 destination: its buffer (part_size + " +
                                   std::to_string(kLineSlackBytes) + " bytes)"));
  }

  // Every object directly below the prefix: the sink's.
  const S3Url& address = state->client.url();
  const std::string name_prefix = address.prefix.empty() ? "" : address.prefix + "/";
  const std::string where = state->where();
  std::vector<std::string> names;
  TM_TRY(list_s3_objects(state->client, "s3 destination: open (list)", where, name_prefix,
                         [&](std::string_view name, std::uint64_t) {
                           std::string_view own = name.substr(name_prefix.size());
                           if (own.find('/') == std::string_view::npos) names.emplace_back(own);
                         }));
  ListedOutputs outputs;
  for (const std::string& name : names) {
    if (is_temporary_name(name)) {
      // The prefix is this sink's (claimed before open, or promised by an
      // unclaimed caller), so no other writer is using it: a crashed run's
      // leftover.
      TM_TRY(state->delete_object(name, "s3 destination: open (delete leftover temporary)"));
      continue;
    }
    if (auto added = outputs.add(where, name); !added) return in_destination(added.error());
  }
  auto progress = committed_progress(where, outputs.committed);
  if (!progress) return in_destination(progress.error());
  auto position = snapshot_in_progress(where, outputs.parts, *progress);
  if (!position) return in_destination(position.error());

  auto destination = std::unique_ptr<S3Destination>(new S3Destination(std::move(state)));
  destination->progress_ = *progress;
  destination->snapshot_position_ = std::move(*position);
  return destination;
}

S3Destination::S3Destination(std::unique_ptr<State> state) : state_(std::move(state)) {}

S3Destination::~S3Destination() {
  state_->abandon();
}

const S3Url& S3Destination::url() const {
  return state_->client.url();
}

Status S3Destination::begin(Frontier lower) {
  State& state = *state_;
  if (state.open_interval) {
    return invalid_usage("s3 destination: begin at " + lower.to_string() +
                         " while the interval from " + std::to_string(state.open_interval->lower) +
                         " is open");
  }
  if (lower.is_closed()) return invalid_usage("s3 destination: begin at a closed lower");
  if (progress_ && lower < *progress_) {
    return invalid_usage("s3 destination: begin at " + lower.to_string() +
                         " is below the progress " + progress_->to_string() +
                         " (already committed)");
  }
  state.abandoned_after_error = false;
  state.open_interval.emplace();
  state.open_interval->lower = lower.time();
  // Room for the line that takes the buffer past part_size, so a usual
  // line never regrows it (only one over kLineSlackBytes does).
  if (state.buffer.capacity() < state.buffer_bytes) state.buffer.reserve(state.buffer_bytes);
  state.buffer.assign(state.encoder.file_header());
  state.account_for_buffer();
  return {};
}

Status S3Destination::write(const DiffPair& pair) {
  State& state = *state_;
  if (!state.open_interval) {
    return invalid_usage(state.abandoned_after_error
                             ? "s3 destination: write after an error abandoned the open interval; "
                               "begin a new one"
                             : "s3 destination: write with no open interval (call begin first)");
  }
  State::OpenInterval& open = *state.open_interval;
  if (pair.time < open.lower) {
    return invalid_usage("s3 destination: write at time " + std::to_string(pair.time) +
                         " below the open interval's lower " + std::to_string(open.lower));
  }
  state.encoder.append_file_line(pair, &state.buffer);
  state.account_for_buffer();
  open.max_time = std::max(open.max_time.value_or(pair.time), pair.time);
  if (state.buffer.size() >= state.client.url().part_size) {
    if (auto uploaded = state.upload_buffer(); !uploaded) {
      return state.fail(std::unexpected(uploaded.error()));
    }
  }
  return {};
}

std::uint64_t S3Destination::open_bytes() const {
  if (!state_->open_interval) return 0;
  return state_->open_interval->uploaded_bytes + state_->buffer.size();
}

Status S3Destination::commit(Frontier upper) {
  State& state = *state_;
  if (!state.open_interval) {
    return invalid_usage(state.abandoned_after_error
                             ? "s3 destination: commit after an error abandoned the open "
                               "interval; begin a new one"
                             : "s3 destination: commit with no open interval (call begin first)");
  }
  State::OpenInterval& open = *state.open_interval;
  if (upper.is_closed()) {
    return invalid_usage(
        "s3 destination: commit at a closed upper (an object name needs a finite upper: commit "
        "at the last finite frontier)");
  }
  if (upper.time() <= open.lower) {
    return invalid_usage("s3 destination: commit at " + upper.to_string() +
                         " is not above the open interval's lower " + std::to_string(open.lower));
  }
  if (open.max_time && upper.time() <= *open.max_time) {
    return invalid_usage("s3 destination: commit at " + upper.to_string() +
                         " is not above the time written " + std::to_string(*open.max_time));
  }

  TM_TRY(publish(committed_name(open.lower, upper.time(), state.extension)));
  progress_ = upper;
  snapshot_position_.reset();
  return {};
}

Status S3Destination::commit_snapshot_part(const SnapshotPosition& position) {
  State& state = *state_;
  if (!state.open_interval) {
    return invalid_usage("s3 destination: commit_snapshot_part with no open interval");
  }
  const State::OpenInterval& open = *state.open_interval;
  TM_ASSIGN(const std::string name,
            next_snapshot_part_name("s3 destination", open.lower, open.max_time, progress_,
                                    snapshot_position_, position, state.extension));
  TM_TRY(publish(name));
  snapshot_position_ = position;
  return {};
}

// Makes the open interval the object `target`, whole (see the header).
Status S3Destination::publish(const std::string& target) {
  State& state = *state_;
  State::OpenInterval& open = *state.open_interval;
  if (!open.upload) {
    // Small: one PUT makes the object appear whole. Its error's kind says
    // whether it may have.
    S3Request request{
        .method = "PUT",
        .target = state.client.object_path(target),
        .body = state.buffer,
        .headers = {state.content_type},
    };
    S3Call call{.operation = "s3 destination: commit (put)",
                .subject = target,
                .mutates = true,
                .accepted = {200}};
    if (auto owned = state.check_claim(); !owned) return state.fail(std::unexpected(owned.error()));
    if (auto put = state.client.exchange(request, call); !put) {
      return state.fail(std::unexpected(put.error()));
    }
  } else {
    // Large: the last part, then the temporary appears, then the copy.
    // Until the copy nothing under a committed name has changed: every
    // failure before it is Determinate.
    if (!state.buffer.empty()) {
      if (auto uploaded = state.upload_buffer(); !uploaded) {
        return state.fail(std::unexpected(uploaded.error()));
      }
    }
    const std::string temporary = open.upload->name();
    open.temporary_may_exist = true;
    if (auto completed = open.upload->complete(); !completed) {
      Error error = completed.error();
      // Only the temporary may have appeared: nothing is committed.
      error.kind = ErrorKind::kDeterminate;
      error.message += " (nothing was committed: only the temporary may have appeared)";
      return state.fail(std::unexpected(std::move(error)));
    }
    if (auto owned = state.check_claim(); !owned) return state.fail(std::unexpected(owned.error()));
    if (auto copied = state.copy_object(temporary, open.uploaded_bytes, target); !copied) {
      return state.fail(std::unexpected(copied.error()));
    }
    // The object is committed; the temporary is garbage that open() would
    // delete if this fails.
    (void)state.delete_object(temporary, "s3 destination: commit (delete the temporary)");
  }
  state.open_interval.reset();
  state.clear_buffer();
  return {};
}

std::uint64_t S3Destination::primary_key_violations() const {
  return state_->encoder.primary_key_violations();
}

}  // namespace tidemark
