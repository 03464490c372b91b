// Fuzz target: S3 answers as the listing reads them (ListBucketResult
// pages: Contents, Key, Size, IsTruncated, the continuation token), with
// the XML helpers of the S3 client. Any input must give names or nothing,
// never a crash or a sanitizer report.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "s3/s3_client.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tidemark;
  const std::string_view xml(reinterpret_cast<const char*>(data), size);
  for (std::string_view contents : xml_elements(xml, "Contents")) {
    if (auto key = xml_element(contents, "Key")) (void)xml_unescape(*key);
    (void)xml_element(contents, "Size");
  }
  if (auto token = xml_element(xml, "NextContinuationToken")) {
    (void)xml_unescape(trim_whitespace(*token));
  }
  (void)xml_element(xml, "IsTruncated");
  (void)xml_unescape(xml);
  (void)xml_escape(xml);
  return 0;
}
