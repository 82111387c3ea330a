// ckptctl's progress display for loads: a bar redrawn in place on a terminal, plain lines
// (at most one every few seconds) otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/progress_throttle.h"

namespace ckpt::ctl {

// Columns of the terminal on `fd`: $COLUMNS when it is a number from 1 to 10000, else the
// terminal's size (TIOCGWINSZ), else 80.
size_t TerminalWidth(int fd);

// One progress line of at most max(1, width - 1) columns (the last column is left free so
// that no terminal wraps it): "[####....] 45.2%  1.00 GiB / 2.21 GiB  512.00 MiB/s  ETA 3 s",
// dropping the rate, then the ETA, then the sizes, then the bar as the width shrinks.
// `rate` in bytes/s (0: unknown); `eta` in seconds (negative: unknown). Plain ASCII.
std::string RenderProgressLine(uint64_t done, uint64_t total, double rate, double eta, size_t width);

// Draws progress on `fd` (stderr). On a terminal (`tty`) each Update redraws one line in
// place ("\r", the line, then erase-to-end-of-line), sized to the terminal's width at that
// moment; Finish ends it with a newline. Otherwise Update writes a plain line
// ("loading: <RenderProgressLine at 100 columns>") at most every `plain_interval`.
// Not thread-safe.
class ProgressBar {
 public:
  ProgressBar(int fd, bool tty, std::chrono::milliseconds plain_interval = std::chrono::seconds(2));
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void Update(uint64_t done, uint64_t total);
  // Ends a drawn bar's line. Idempotent; the destructor calls it.
  void Finish();

 private:
  void Write(const std::string& text) const;
  const int fd_;
  const bool tty_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  ProgressThrottle plain_;  // the first plain line an interval after the start
  std::vector<std::pair<std::chrono::steady_clock::time_point, uint64_t>> samples_;
  bool drawn_ = false;
};

}  // namespace ckpt::ctl
