#include "crypto/digest.h"

#include <openssl/evp.h>

#include <cstddef>
#include <optional>

namespace tidemark {
namespace {

std::string to_hex(const unsigned char* bytes, std::size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * size);
  for (std::size_t i = 0; i < size; ++i) {
    out.push_back(kDigits[bytes[i] >> 4]);
    out.push_back(kDigits[bytes[i] & 0xf]);
  }
  return out;
}

// The digest of `bytes`, or nullopt if OpenSSL fails (only out of memory).
std::optional<std::string> digest(const EVP_MD* type, std::string_view bytes) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), out, &size, type, nullptr) != 1) return std::nullopt;
  return std::string(reinterpret_cast<const char*>(out), size);
}

}  // namespace

std::string sha256_hex(std::string_view bytes) {
  std::optional<std::string> sha256 = digest(EVP_sha256(), bytes);
  if (!sha256) return "";
  return to_hex(reinterpret_cast<const unsigned char*>(sha256->data()), sha256->size());
}

std::string md5_base64(std::string_view bytes) {
  std::optional<std::string> md5 = digest(EVP_md5(), bytes);
  if (!md5) return "";
  unsigned char out[4 * ((EVP_MAX_MD_SIZE + 2) / 3) + 1];
  int size = EVP_EncodeBlock(out, reinterpret_cast<const unsigned char*>(md5->data()),
                             static_cast<int>(md5->size()));
  return std::string(reinterpret_cast<const char*>(out), static_cast<std::size_t>(size));
}

}  // namespace tidemark
