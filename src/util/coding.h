// Little-endian fixed-width and varint encoding, for the part format and
// the shard state. Decoder never reads past its input: every get_* returns
// false on truncated or malformed input, and the caller turns that into a
// Corruption error naming the object.
//
// Thread-safety: Encoder and Decoder are single-threaded value types.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "tidemark/frontier.h"

namespace tidemark {

class Encoder {
 public:
  explicit Encoder(std::string* out) : out_(out) {}

  void put_u8(std::uint8_t v) { out_->push_back(static_cast<char>(v)); }
  void put_fixed32(std::uint32_t v) {
    char b[4];
    for (int i = 0; i < 4; ++i) b[i] = static_cast<char>(v >> (8 * i));
    out_->append(b, 4);
  }
  void put_fixed64(std::uint64_t v) {
    char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
    out_->append(b, 8);
  }
  void put_varint(std::uint64_t v) {
    while (v >= 0x80) {
      out_->push_back(static_cast<char>(v | 0x80));
      v >>= 7;
    }
    out_->push_back(static_cast<char>(v));
  }
  // Zig-zag, so small negative numbers stay short.
  void put_signed_varint(std::int64_t v) {
    put_varint((static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63));
  }
  void put_bytes(std::string_view s) {
    put_varint(s.size());
    out_->append(s);
  }
  void put_raw(std::string_view s) { out_->append(s); }

 private:
  std::string* out_;
};

class Decoder {
 public:
  explicit Decoder(std::string_view in) : in_(in) {}

  bool empty() const { return in_.empty(); }
  std::size_t remaining() const { return in_.size(); }

  [[nodiscard]] bool get_u8(std::uint8_t* v) {
    if (in_.empty()) return false;
    *v = static_cast<std::uint8_t>(in_[0]);
    in_.remove_prefix(1);
    return true;
  }
  [[nodiscard]] bool get_fixed32(std::uint32_t* v) {
    if (in_.size() < 4) return false;
    *v = load_fixed32(in_.data());
    in_.remove_prefix(4);
    return true;
  }
  [[nodiscard]] bool get_fixed64(std::uint64_t* v) {
    if (in_.size() < 8) return false;
    *v = load_fixed64(in_.data());
    in_.remove_prefix(8);
    return true;
  }
  [[nodiscard]] bool get_varint(std::uint64_t* v) {
    std::uint64_t result = 0;
    for (int shift = 0; shift <= 63 && !in_.empty(); shift += 7) {
      auto byte = static_cast<std::uint8_t>(in_[0]);
      in_.remove_prefix(1);
      if (shift == 63 && byte > 1) return false;  // overflows u64
      result |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) {
        *v = result;
        return true;
      }
    }
    return false;
  }
  [[nodiscard]] bool get_signed_varint(std::int64_t* v) {
    std::uint64_t u;
    if (!get_varint(&u)) return false;
    *v = static_cast<std::int64_t>((u >> 1) ^ (~(u & 1) + 1));
    return true;
  }
  [[nodiscard]] bool get_bytes(std::string_view* s) {
    std::uint64_t n;
    if (!get_varint(&n) || n > in_.size()) return false;
    *s = in_.substr(0, n);
    in_.remove_prefix(n);
    return true;
  }
  [[nodiscard]] bool get_raw(std::size_t n, std::string_view* s) {
    if (n > in_.size()) return false;
    *s = in_.substr(0, n);
    in_.remove_prefix(n);
    return true;
  }

  static std::uint32_t load_fixed32(const char* p) {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i)
      v |= static_cast<std::uint32_t>(static_cast<std::uint8_t>(p[i])) << (8 * i);
    return v;
  }
  static std::uint64_t load_fixed64(const char* p) {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i)
      v |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(p[i])) << (8 * i);
    return v;
  }

 private:
  std::string_view in_;
};

// A frontier: tag 0 followed by a varint time, or tag 1 for closed. Parts
// and shard states both use this.
inline void put_frontier(Encoder& encoder, Frontier frontier) {
  if (frontier.is_closed()) {
    encoder.put_u8(1);
  } else {
    encoder.put_u8(0);
    encoder.put_varint(frontier.time());
  }
}

[[nodiscard]] inline bool get_frontier(Decoder& decoder, Frontier* frontier) {
  std::uint8_t tag;
  if (!decoder.get_u8(&tag)) return false;
  if (tag == 1) {
    *frontier = Frontier::closed();
    return true;
  }
  std::uint64_t time;
  if (tag != 0 || !decoder.get_varint(&time)) return false;
  *frontier = Frontier::at(time);
  return true;
}

}  // namespace tidemark
