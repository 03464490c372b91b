#include "util/ndjson_rows.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

namespace tidemark {
namespace {

TEST(NdjsonRowsTest, RowsAreTheLinesReadsPrint) {
  std::string out = "x";
  const RowOffsets at = append_snapshot_row(&out, "\"k\"", "{\"v\":1}", -3);
  EXPECT_EQ(out, "x{\"key\":\"k\",\"value\":{\"v\":1},\"diff\":-3}\n");
  EXPECT_EQ(out.substr(at.key_at, 3), "\"k\"");
  EXPECT_EQ(out.substr(at.value_at, 7), "{\"v\":1}");
  out.clear();
  append_listen_row(&out, "1", "2", std::numeric_limits<Time>::max(),
                    std::numeric_limits<Diff>::min());
  EXPECT_EQ(out,
            "{\"key\":1,\"value\":2,\"time\":18446744073709551615,\"diff\":"
            "-9223372036854775808}\n");
  out.clear();
  append_progress_row(&out, Frontier::at(7));
  append_progress_row(&out, Frontier::closed());
  EXPECT_EQ(out, "{\"progress\":7}\n{\"progress\":null}\n");
}

TEST(NdjsonRowsTest, ASnapshotWithNoTimeReadsTheLatestCompleteOne) {
  EXPECT_EQ(latest_complete_time(Frontier::at(0)), std::nullopt);
  EXPECT_EQ(latest_complete_time(Frontier::at(1)), 0u);
  EXPECT_EQ(latest_complete_time(Frontier::at(42)), 41u);
  EXPECT_EQ(latest_complete_time(Frontier::closed()), std::numeric_limits<Time>::max());
}

}  // namespace
}  // namespace tidemark
