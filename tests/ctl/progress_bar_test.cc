// ckptctl's progress line: it fits every width, and drops detail before it would wrap.
#include "ctl/progress_bar.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace ckpt::ctl {
namespace {

TEST(ProgressBarTest, EveryLineFitsBelowTheWidth) {
  const uint64_t totals[] = {0, 1, 1023, 9876543210ull, ~0ull};
  for (size_t width = 0; width <= 200; ++width) {
    for (uint64_t total : totals) {
      for (uint64_t done : {uint64_t{0}, total / 3, total}) {
        const std::string line = RenderProgressLine(done, total, 123456789.0, 3725, width);
        EXPECT_LE(line.size(), std::max<size_t>(1, width > 0 ? width - 1 : 1)) << width << ": " << line;
        EXPECT_FALSE(line.empty());
        EXPECT_EQ(line.find('\n'), std::string::npos);
        EXPECT_EQ(line.find('\r'), std::string::npos);
      }
    }
  }
}

TEST(ProgressBarTest, DetailIsDroppedInOrder) {
  const uint64_t total = 2ull << 30, done = 1ull << 30;
  const std::string wide = RenderProgressLine(done, total, 512.0 * (1 << 20), 2, 120);
  EXPECT_EQ(wide, "[###############...............] 50.0%  1.00 GiB / 2.00 GiB  512.00 MiB/s  ETA 2 s");
  const std::string forty = RenderProgressLine(done, total, 512.0 * (1 << 20), 2, 40);
  EXPECT_EQ(forty, "[#####.....] 50.0%  1.00 GiB / 2.00 GiB");
  EXPECT_EQ(RenderProgressLine(done, total, 0, -1, 12), "50.0%");
  EXPECT_EQ(RenderProgressLine(done, total, 0, -1, 3), "50");
}

TEST(ProgressBarTest, ColumnsOverridesTheTerminalAndBadValuesAreIgnored) {
  ::setenv("COLUMNS", "40", 1);
  EXPECT_EQ(TerminalWidth(-1), 40u);
  ::setenv("COLUMNS", "40x", 1);
  EXPECT_EQ(TerminalWidth(-1), 80u) << "not a terminal, no usable COLUMNS: 80";
  ::setenv("COLUMNS", "0", 1);
  EXPECT_EQ(TerminalWidth(-1), 80u);
  ::unsetenv("COLUMNS");
  EXPECT_EQ(TerminalWidth(-1), 80u);
}

}  // namespace
}  // namespace ckpt::ctl
