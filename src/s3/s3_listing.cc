#include "s3/s3_listing.h"

#include <charconv>

#include "util/number.h"
#include "util/try.h"

namespace tidemark {

namespace {

std::optional<std::uint64_t> parse_count(std::string_view text) {
  return parse_decimal(trim_whitespace(text));
}

std::string quoted(std::string_view text) {
  return "\"" + printable_excerpt(text) + "\"";
}

}  // namespace

Result<S3ListPage> list_s3_page(S3Client& client, std::string_view operation,
                                std::string_view subject, const std::string& name_prefix,
                                const std::optional<std::string>& from) {
  const S3Url& url = client.url();
  std::vector<std::pair<std::string, std::string>> parameters = {
      {"max-keys", std::to_string(url.list_page_size)},
      {"prefix", name_prefix},
  };
  if (url.list_version == 2) {
    parameters.emplace_back("list-type", "2");
    if (from) parameters.emplace_back("continuation-token", *from);
  } else if (from) {
    parameters.emplace_back("marker", *from);
  }
  S3Request request{
      .method = "GET",
      .target = client.bucket_path() + "?" + s3_canonical_query(std::move(parameters)),
  };
  S3Call call{
      .operation = operation,
      .subject = subject,
      .accepted = {200},
      .check = [](const S3Answer& answer) -> std::optional<Error> {
        if (answer.body.find("<ListBucketResult") != std::string::npos) return std::nullopt;
        return determinate("the answer is not a ListBucketResult: " +
                           printable_excerpt(answer.body))
            .error();
      },
  };
  TM_ASSIGN(S3Answer answer, client.exchange(request, call));
  auto malformed = [&](std::string why) {
    return determinate(std::string(operation) + " " + quoted(subject) + ": GET " +
                       client.bucket_path() + ": malformed ListBucketResult: " + why);
  };

  S3ListPage page;
  std::string last_name;
  for (std::string_view contents : xml_elements(answer.body, "Contents")) {
    auto name_element = xml_element(contents, "Key");
    auto size_element = xml_element(contents, "Size");
    if (!name_element || !size_element) return malformed("an object without Key or Size");
    std::string name = xml_unescape(*name_element);
    std::optional<std::uint64_t> size = parse_count(*size_element);
    if (!size) return malformed("object " + quoted(name) + " has Size " + quoted(*size_element));
    last_name = name;
    if (!name.starts_with(name_prefix)) continue;  // not what we asked for
    page.objects.emplace_back(std::move(name), *size);
  }

  auto truncated = xml_element(answer.body, "IsTruncated");
  if (!truncated || trim_whitespace(*truncated) != "true") return page;
  std::string next;
  if (url.list_version == 2) {
    auto token = xml_element(answer.body, "NextContinuationToken");
    if (token) next = xml_unescape(trim_whitespace(*token));
    if (next.empty()) return malformed("IsTruncated without a NextContinuationToken");
  } else {
    // Without a delimiter S3 may omit NextMarker: the last name is the marker.
    auto marker = xml_element(answer.body, "NextMarker");
    next = marker ? xml_unescape(trim_whitespace(*marker)) : last_name;
    if (next.empty()) return malformed("IsTruncated without a marker to go on from");
  }
  if (from &&
      ((url.list_version == 2 && next == *from) || (url.list_version == 1 && next <= *from))) {
    return malformed("the next page starts where this one did");
  }
  page.next = std::move(next);
  return page;
}

Status list_s3_objects(
    S3Client& client, std::string_view operation, std::string_view subject,
    const std::string& name_prefix,
    const std::function<void(std::string_view name, std::uint64_t size)>& visit) {
  std::optional<std::string> from;
  while (true) {
    TM_ASSIGN(S3ListPage page, list_s3_page(client, operation, subject, name_prefix, from));
    for (const auto& [name, size] : page.objects) visit(name, size);
    if (!page.next) return {};
    from = std::move(page.next);
  }
}

}  // namespace tidemark
