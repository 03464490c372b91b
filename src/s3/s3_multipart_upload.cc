#include "s3/s3_multipart_upload.h"

#include <utility>

#include "util/try.h"

namespace tidemark {

namespace {

constexpr std::string_view kBinaryContent = "Content-Type: application/octet-stream";
constexpr std::string_view kXmlContent = "Content-Type: application/xml";

// An accepted answer must carry an ETag (in `etag`, the header, for a part;
// in the body's <ETag> for a copied part).
std::optional<Error> missing_etag(std::string_view etag) {
  if (!trim_whitespace(etag).empty()) return std::nullopt;
  return determinate("the answer has no ETag").error();
}

}  // namespace

Result<S3MultipartUpload> S3MultipartUpload::create(S3Client& client, std::string name,
                                                    std::string operation,
                                                    std::vector<std::string> headers) {
  S3Request request{
      .method = "POST",
      .target = client.object_path(name) + "?" + s3_canonical_query({{"uploads", ""}}),
      .headers = std::move(headers),
  };
  const std::string step = operation + " (create multipart upload)";
  S3Call call{
      .operation = step,
      .subject = name,
      .accepted = {200},
      .check = [](const S3Answer& answer) -> std::optional<Error> {
        auto upload_id = xml_element(answer.body, "UploadId");
        if (upload_id && !trim_whitespace(*upload_id).empty()) return std::nullopt;
        return determinate("the answer has no UploadId: " + printable_excerpt(answer.body)).error();
      },
  };
  TM_ASSIGN(S3Answer created, client.exchange(request, call));
  std::string upload_id = xml_unescape(trim_whitespace(*xml_element(created.body, "UploadId")));
  return S3MultipartUpload(client, std::move(name), std::move(operation), std::move(upload_id));
}

S3MultipartUpload::S3MultipartUpload(S3Client& client, std::string name, std::string operation,
                                     std::string upload_id)
    : client_(&client),
      name_(std::move(name)),
      operation_(std::move(operation)),
      upload_id_(std::move(upload_id)) {}

S3MultipartUpload::S3MultipartUpload(S3MultipartUpload&& other) noexcept
    : client_(std::exchange(other.client_, nullptr)),
      name_(std::move(other.name_)),
      operation_(std::move(other.operation_)),
      upload_id_(std::move(other.upload_id_)),
      etags_(std::move(other.etags_)),
      finished_(other.finished_) {}

S3MultipartUpload& S3MultipartUpload::operator=(S3MultipartUpload&& other) noexcept {
  if (this != &other) {
    abort();
    client_ = std::exchange(other.client_, nullptr);
    name_ = std::move(other.name_);
    operation_ = std::move(other.operation_);
    upload_id_ = std::move(other.upload_id_);
    etags_ = std::move(other.etags_);
    finished_ = other.finished_;
  }
  return *this;
}

S3MultipartUpload::~S3MultipartUpload() {
  abort();
}

std::string S3MultipartUpload::step(std::string_view what) const {
  return operation_ + " (" + std::string(what) + ")";
}

std::string S3MultipartUpload::part_target(std::size_t number) const {
  return client_->object_path(name_) + "?" +
         s3_canonical_query({{"partNumber", std::to_string(number)}, {"uploadId", upload_id_}});
}

Status S3MultipartUpload::upload_part(std::string_view bytes) {
  const std::size_t number = etags_.size() + 1;
  if (client_ == nullptr || finished_ || number > kMaxParts) {
    return invalid_usage(step("upload part " + std::to_string(number)) + " \"" + name_ +
                         "\": the upload is finished or has " + std::to_string(kMaxParts) +
                         " parts");
  }
  const std::string operation = step("upload part " + std::to_string(number));
  S3Request request{
      .method = "PUT",
      .target = part_target(number),
      .body = bytes,
      .headers = {std::string(kBinaryContent)},
  };
  // Not `mutates`: a part changes nothing a reader sees.
  S3Call call{
      .operation = operation,
      .subject = name_,
      .accepted = {200},
      .check = [](const S3Answer& answer) { return missing_etag(answer.etag); },
  };
  TM_ASSIGN(S3Answer uploaded, client_->exchange(request, call));
  etags_.emplace_back(trim_whitespace(uploaded.etag));
  return {};
}

Status S3MultipartUpload::upload_part_copy(const std::string& source_path, std::uint64_t first,
                                           std::uint64_t last) {
  const std::size_t number = etags_.size() + 1;
  if (client_ == nullptr || finished_ || number > kMaxParts || last < first) {
    return invalid_usage(step("copy part " + std::to_string(number)) + " \"" + name_ +
                         "\": the upload is finished, has " + std::to_string(kMaxParts) +
                         " parts, or the range is empty");
  }
  const std::string operation = step("copy part " + std::to_string(number));
  S3Request request{
      .method = "PUT",
      .target = part_target(number),
      .headers = {std::string(kBinaryContent), "x-amz-copy-source: " + source_path,
                  "x-amz-copy-source-range: bytes=" + std::to_string(first) + "-" +
                      std::to_string(last)},
  };
  S3Call call{
      .operation = operation,
      .subject = name_,
      .accepted = {200},
      .check = [](const S3Answer& answer) -> std::optional<Error> {
        if (auto problem =
                s3_error_inside_success(answer, ErrorKind::kDeterminate, "CopyPartResult")) {
          return problem;
        }
        auto etag = xml_element(answer.body, "ETag");
        return missing_etag(etag ? *etag : std::string_view());
      },
  };
  TM_ASSIGN(S3Answer copied, client_->exchange(request, call));
  etags_.push_back(xml_unescape(trim_whitespace(*xml_element(copied.body, "ETag"))));
  return {};
}

Status S3MultipartUpload::complete() {
  if (client_ == nullptr || finished_ || etags_.empty()) {
    return invalid_usage(step("complete multipart upload") + " \"" + name_ +
                         "\": the upload is finished or has no part");
  }
  std::string parts = "<CompleteMultipartUpload>";
  for (std::size_t i = 0; i < etags_.size(); ++i) {
    parts += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" +
             xml_escape(etags_[i]) + "</ETag></Part>";
  }
  parts += "</CompleteMultipartUpload>";
  const std::string operation = step("complete multipart upload");
  S3Request request{
      .method = "POST",
      .target = client_->object_path(name_) + "?" + s3_canonical_query({{"uploadId", upload_id_}}),
      .body = parts,
      .headers = {std::string(kXmlContent)},
  };
  S3Call call{
      .operation = operation,
      .subject = name_,
      .mutates = true,
      .accepted = {200},
      .check =
          [](const S3Answer& answer) {
            return s3_error_inside_success(answer, ErrorKind::kIndeterminate,
                                           "CompleteMultipartUploadResult");
          },
  };
  TM_TRY(client_->exchange(request, call));
  finished_ = true;
  return {};
}

void S3MultipartUpload::abort() {
  if (client_ == nullptr || finished_) return;
  finished_ = true;
  S3Request request{
      .method = "DELETE",
      .target = client_->object_path(name_) + "?" + s3_canonical_query({{"uploadId", upload_id_}}),
  };
  const std::string operation = step("abort multipart upload");
  // Harmless after a completion whose answer was lost: S3 then answers
  // NoSuchUpload (404).
  S3Call call{
      .operation = operation,
      .subject = name_,
      .accepted = {200, 204, 404},
      .max_attempts = 2,
  };
  (void)client_->exchange(request, call);
}

}  // namespace tidemark
