// Digests, from OpenSSL's libcrypto: what S3 requests carry
// (x-amz-content-sha256, Content-MD5) and how a sink names the lease of
// its destination.
//
// The crypto layer is built when S3 or Kafka is (TIDEMARK_WITH_S3,
// TIDEMARK_WITH_KAFKA); the core engine does without it.
//
// Thread-safety: plain functions. Memory: the digest's few bytes.
#pragma once

#include <string>
#include <string_view>

namespace tidemark {

// Lowercase hex SHA-256, and base64 MD5, of `bytes`. "" only if OpenSSL
// fails (out of memory): an S3 server then refuses the request.
std::string sha256_hex(std::string_view bytes);
std::string md5_base64(std::string_view bytes);

}  // namespace tidemark
