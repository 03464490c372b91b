#include "util/number.h"

#include <gtest/gtest.h>

namespace tidemark {
namespace {

TEST(ParseDecimalTest, TakesOnlyWholeDecimalTextWithinBounds) {
  EXPECT_EQ(parse_decimal("0"), 0u);
  EXPECT_EQ(parse_decimal("007"), 7u);
  EXPECT_EQ(parse_decimal("18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"", "12x", "x12", "-1", "+1", " 1", "1 ", "0x10", "1.5", "1e3",
                          "18446744073709551616", "99999999999999999999999"}) {
    EXPECT_EQ(parse_decimal(bad), std::nullopt) << "\"" << bad << "\"";
  }
  EXPECT_EQ(parse_decimal("1", 1, 65535), 1u);
  EXPECT_EQ(parse_decimal("65535", 1, 65535), 65535u);
  EXPECT_EQ(parse_decimal("0", 1, 65535), std::nullopt);
  EXPECT_EQ(parse_decimal("65536", 1, 65535), std::nullopt);
}

}  // namespace
}  // namespace tidemark
