#include "s3/s3_blob.h"

#include <algorithm>
#include <utility>

#include "s3/s3_listing.h"
#include "s3/s3_multipart_upload.h"
#include "tidemark/blob_key.h"
#include "util/try.h"

namespace tidemark {

namespace {

constexpr std::size_t kMaxDeleteKeys = 1000;
constexpr std::string_view kObjectSha256Header = "x-amz-meta-tidemark-sha256: ";
constexpr std::string_view kBinaryContent = "Content-Type: application/octet-stream";
constexpr std::string_view kXmlContent = "Content-Type: application/xml";

// The object name of `key`: "prefix/key", or "key" without a prefix.
std::string object_name(const S3Url& url, std::string_view key) {
  return url.prefix.empty() ? std::string(key) : url.prefix + "/" + std::string(key);
}

// The key an object name stands for, or nullopt when it is not below the
// prefix.
std::optional<std::string_view> key_of(const S3Url& url, std::string_view name) {
  if (url.prefix.empty()) return name;
  if (name.size() <= url.prefix.size() || !name.starts_with(url.prefix) ||
      name[url.prefix.size()] != '/') {
    return std::nullopt;
  }
  return name.substr(url.prefix.size() + 1);
}

std::string quoted(std::string_view text) {
  return "\"" + printable_excerpt(text) + "\"";
}

// Per-key DeleteObjects errors that another try may fix.
bool transient_error_code(std::string_view code) {
  return code == "InternalError" || code == "SlowDown" || code == "ServiceUnavailable" ||
         code == "RequestTimeout";
}

}  // namespace

Result<std::unique_ptr<S3Blob>> S3Blob::open(std::string_view url) {
  TM_ASSIGN(S3Url parsed, parse_s3_url(url));
  TM_ASSIGN(S3Credentials credentials, s3_credentials_from_environment());
  return open(std::move(parsed), std::move(credentials));
}

Result<std::unique_ptr<S3Blob>> S3Blob::open(S3Url url, S3Credentials credentials) {
  if (credentials.access_key_id.empty() || credentials.secret_access_key.empty()) {
    return invalid_usage("s3 blob: the credentials need an access key id and a secret access key");
  }
  return std::make_unique<S3Blob>(PrivateTag{}, std::move(url), std::move(credentials));
}

S3Blob::S3Blob(PrivateTag, S3Url url, S3Credentials credentials)
    : client_(std::move(url), std::move(credentials)) {}

S3Blob::SetInFlight::SetInFlight(S3Blob& blob, std::string_view key) : blob_(blob), key_(key) {
  std::unique_lock lock(blob_.sets_mutex_);
  blob_.set_finished_.wait(lock, [&] { return !blob_.sets_in_flight_.contains(key_); });
  blob_.sets_in_flight_.insert(key_);
}

S3Blob::SetInFlight::~SetInFlight() {
  {
    std::lock_guard lock(blob_.sets_mutex_);
    blob_.sets_in_flight_.erase(key_);
  }
  blob_.set_finished_.notify_all();
}

Result<std::optional<std::string>> S3Blob::get(std::string_view key) {
  TM_TRY(validate_blob_key(key));
  S3Request request{.method = "GET", .target = client_.object_path(key)};
  S3Call call{
      .operation = "s3 blob: get",
      .subject = key,
      .accepted = {200, 404},
      .check = [](const S3Answer& answer) -> std::optional<Error> {
        if (answer.status != 200) return std::nullopt;
        if (answer.object_sha256.empty()) {
          return corruption(
                     "the object has no x-amz-meta-tidemark-sha256 digest (it was not written by "
                     "S3Blob, or is still being written by a server whose writes are not atomic)")
              .error();
        }
        std::string actual = sha256_hex(answer.body);
        if (actual == answer.object_sha256) return std::nullopt;
        return corruption("the " + std::to_string(answer.body.size()) +
                          " bytes read have SHA-256 " + actual + ", not " +
                          printable_excerpt(answer.object_sha256) +
                          " as stored with the object (a torn read, or corrupt data)")
            .error();
      },
  };
  TM_ASSIGN(S3Answer answer, client_.exchange(request, call));
  if (answer.status == 404) return std::nullopt;
  return std::optional<std::string>(std::move(answer.body));
}

Result<std::string> S3Blob::get_range(std::string_view key, std::uint64_t offset,
                                      std::uint64_t length) {
  TM_TRY(validate_blob_key(key));
  const std::string path = client_.object_path(key);
  auto not_found = [&] {
    return make_error(ErrorKind::kNotFound,
                      "s3 blob: get_range " + quoted(key) + ": no object " + path);
  };
  if (length == 0) {
    // No bytes to ask for, but an absent object must still be NotFound.
    S3Request request{.method = "HEAD", .target = path};
    S3Call call{.operation = "s3 blob: get_range", .subject = key, .accepted = {200, 404}};
    TM_ASSIGN(S3Answer answer, client_.exchange(request, call));
    if (answer.status == 404) return not_found();
    return std::string();
  }
  std::string range = "Range: bytes=" + std::to_string(offset) + "-";
  // Open-ended when offset + length would overflow: "to the end".
  if (length <= UINT64_MAX - offset) range += std::to_string(offset + length - 1);
  S3Request request{
      .method = "GET", .target = path, .headers = {std::move(range)}, .body_limit = length};
  S3Call call{.operation = "s3 blob: get_range", .subject = key, .accepted = {200, 206, 404, 416}};
  TM_ASSIGN(S3Answer answer, client_.exchange(request, call));
  switch (answer.status) {
    case 404:
      return not_found();
    case 416:  // the object exists and ends at or before `offset`
      return std::string();
    case 206:
      if (answer.range_past_end) return std::string();
      return std::move(answer.body);
    default:  // 200: a server that ignores Range sent the whole object
      if (offset >= answer.body.size()) return std::string();
      return answer.body.substr(offset, length);
  }
}

Status S3Blob::set(std::string_view key, std::string_view bytes) {
  TM_TRY(validate_blob_key(key));
  std::string sha256 = sha256_hex(bytes);
  SetInFlight in_flight(*this, key);
  if (bytes.size() > client_.url().multipart_threshold) return put_multipart(key, bytes, sha256);
  S3Request request{
      .method = "PUT",
      .target = client_.object_path(key),
      .body = bytes,
      .body_sha256 = sha256,
      .headers = {std::string(kBinaryContent), std::string(kObjectSha256Header) + sha256},
  };
  S3Call call{.operation = "s3 blob: set", .subject = key, .mutates = true, .accepted = {200}};
  TM_TRY(client_.exchange(request, call));
  return {};
}

Status S3Blob::put_multipart(std::string_view key, std::string_view bytes,
                             const std::string& sha256) {
  // The object is untouched until the upload completes, so only completing
  // it mutates; failures before are Determinate. An upload not completed is
  // aborted when `upload` goes.
  TM_ASSIGN(S3MultipartUpload upload,
            S3MultipartUpload::create(
                client_, std::string(key), "s3 blob: set",
                {std::string(kBinaryContent), std::string(kObjectSha256Header) + sha256}));
  // Parts of part_size, larger if S3's 10000 parts would not hold the object.
  const std::uint64_t part_size = std::max<std::uint64_t>(
      client_.url().part_size,
      (bytes.size() + S3MultipartUpload::kMaxParts - 1) / S3MultipartUpload::kMaxParts);
  for (std::uint64_t offset = 0; offset < bytes.size(); offset += part_size) {
    TM_TRY(upload.upload_part(bytes.substr(offset, part_size)));
  }
  return upload.complete();
}

Status S3Blob::remove(std::string_view key) {
  TM_TRY(validate_blob_key(key));
  S3Request request{.method = "DELETE", .target = client_.object_path(key)};
  S3Call call{
      .operation = "s3 blob: remove", .subject = key, .mutates = true, .accepted = {200, 204, 404}};
  TM_TRY(client_.exchange(request, call));
  return {};
}

Status S3Blob::remove_many(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) TM_TRY(validate_blob_key(key));
  std::vector<std::string> one_by_one;
  std::size_t batched = 0;
  while (batched < keys.size() && !delete_objects_unsupported_.load()) {
    std::size_t end = std::min(keys.size(), batched + kMaxDeleteKeys);
    std::vector<std::string> batch(keys.begin() + static_cast<std::ptrdiff_t>(batched),
                                   keys.begin() + static_cast<std::ptrdiff_t>(end));
    TM_ASSIGN(bool supported, delete_objects(batch, &one_by_one));
    if (!supported) break;
    batched = end;
  }
  one_by_one.insert(one_by_one.end(), keys.begin() + static_cast<std::ptrdiff_t>(batched),
                    keys.end());
  for (const std::string& key : one_by_one) TM_TRY(remove(key));
  return {};
}

Result<bool> S3Blob::delete_objects(const std::vector<std::string>& keys,
                                    std::vector<std::string>* retry) {
  const S3Url& url = client_.url();
  std::string body = R"(<?xml version="1.0" encoding="UTF-8"?><Delete><Quiet>true</Quiet>)";
  for (const std::string& key : keys) {
    body += "<Object><Key>" + xml_escape(object_name(url, key)) + "</Key></Object>";
  }
  body += "</Delete>";
  const std::string subject = std::to_string(keys.size()) + " keys from " + keys.front();
  S3Request request{
      .method = "POST",
      .target = client_.bucket_path() + "?" + s3_canonical_query({{"delete", ""}}),
      .body = body,
      .headers = {std::string(kXmlContent), "Content-MD5: " + md5_base64(body)},
  };
  S3Call call{
      .operation = "s3 blob: remove_many",
      .subject = subject,
      .mutates = true,
      .accepted = {200, 405, 501},
      .check = [](const S3Answer& answer) -> std::optional<Error> {
        if (answer.status != 200 || answer.body.find("<DeleteResult") != std::string::npos) {
          return std::nullopt;
        }
        return indeterminate("the answer is not a DeleteResult: " + printable_excerpt(answer.body))
            .error();
      },
  };
  TM_ASSIGN(S3Answer answer, client_.exchange(request, call));
  if (answer.status != 200) {
    // 405 or 501: no DeleteObjects here; nothing was deleted.
    delete_objects_unsupported_ = true;
    return false;
  }
  std::vector<std::string> failures;
  for (std::string_view error : xml_elements(answer.body, "Error")) {
    auto element = [&](std::string_view name) {
      auto found = xml_element(error, name);
      return found ? xml_unescape(*found) : std::string();
    };
    std::string name = element("Key");
    std::string code = element("Code");
    if (code == "NoSuchKey") continue;  // absent: as good as deleted
    std::optional<std::string_view> key = key_of(url, name);
    bool ours = key && std::find(keys.begin(), keys.end(), *key) != keys.end();
    if (ours && transient_error_code(code)) {
      retry->emplace_back(*key);
      continue;
    }
    failures.push_back(quoted(key.value_or(name)) + ": " + printable_excerpt(code) + ": " +
                       printable_excerpt(element("Message")));
  }
  if (failures.empty()) return true;
  std::string message = "s3 blob: remove_many: S3 did not delete " +
                        std::to_string(failures.size()) + " of " + std::to_string(keys.size()) +
                        " keys";
  for (std::size_t i = 0; i < failures.size() && i < 3; ++i) {
    message += (i == 0 ? ": " : "; ") + failures[i];
  }
  if (failures.size() > 3) message += "; ...";
  // The other keys of the request may be gone.
  return indeterminate(std::move(message));
}

Status S3Blob::list(std::string_view prefix,
                    const std::function<void(std::string_view key, std::uint64_t size)>& visit) {
  TM_TRY(validate_blob_prefix(prefix));
  const S3Url& url = client_.url();
  return list_s3_objects(client_, "s3 blob: list", prefix, object_name(url, prefix),
                         [&](std::string_view name, std::uint64_t size) {
                           std::optional<std::string_view> key = key_of(url, name);
                           // Objects whose names are not keys (written by other
                           // tools) are not part of this blob.
                           if (!key || !validate_blob_key(*key)) return;
                           visit(*key, size);
                         });
}

}  // namespace tidemark
