#include "ctl/progress_bar.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "ctl/table.h"

namespace ckpt::ctl {

namespace {

// "1:05" / "12 s" / "--" for an unknown ETA.
std::string Eta(double seconds) {
  if (!(seconds >= 0) || seconds > 360000) return "--";
  char buf[32];
  const long s = static_cast<long>(seconds + 0.5);
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%ld s", s);
  } else {
    std::snprintf(buf, sizeof(buf), "%ld:%02ld", s / 60, s % 60);
  }
  return buf;
}

}  // namespace

size_t TerminalWidth(int fd) {
  if (const char* env = std::getenv("COLUMNS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(env, &end, 10);
    if (errno == 0 && *end == '\0' && v >= 1 && v <= 10000) return static_cast<size_t>(v);
  }
  struct winsize ws {};
  if (::ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

std::string RenderProgressLine(uint64_t done, uint64_t total, double rate, double eta, size_t width) {
  const size_t budget = std::max<size_t>(1, width > 0 ? width - 1 : 1);
  const double fraction = total ? std::min(1.0, static_cast<double>(done) / total) : 1.0;
  char pct_buf[16];
  std::snprintf(pct_buf, sizeof(pct_buf), "%.1f%%", fraction * 100);
  const std::string pct = pct_buf;
  const std::string sizes = HumanBytes(done) + " / " + HumanBytes(total);
  const std::string speed = rate > 0 ? HumanBytes(static_cast<uint64_t>(rate)) + "/s" : "-- B/s";
  const std::string left = "ETA " + Eta(eta);
  const std::vector<std::string> stats = {pct + "  " + sizes + "  " + speed + "  " + left,
                                          pct + "  " + sizes + "  " + left, pct + "  " + sizes, pct};
  constexpr size_t kMinBar = 10, kMaxBar = 30;
  for (const std::string& s : stats) {
    if (budget >= s.size() + 3 + kMinBar) {  // "[" bar "] " s
      const size_t bar = std::min(kMaxBar, budget - s.size() - 3);
      const size_t filled = std::min(bar, static_cast<size_t>(fraction * bar));
      return "[" + std::string(filled, '#') + std::string(bar - filled, '.') + "] " + s;
    }
  }
  for (const std::string& s : stats) {
    if (s.size() <= budget) return s;
  }
  return pct.substr(0, budget);
}

ProgressBar::ProgressBar(int fd, bool tty, std::chrono::milliseconds plain_interval)
    : fd_(fd), tty_(tty), plain_(plain_interval, ProgressThrottle::First::kAfterInterval) {}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Write(const std::string& text) const {
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a progress display is not worth an error
    off += static_cast<size_t>(n);
  }
}

void ProgressBar::Update(uint64_t done, uint64_t total) {
  const auto now = std::chrono::steady_clock::now();
  // Rate over a sliding window of about one second, so the ETA follows the disk.
  samples_.push_back({now, done});
  while (samples_.size() > 2 && now - samples_[1].first >= std::chrono::seconds(1)) samples_.erase(samples_.begin());
  const double window = std::chrono::duration<double>(now - samples_.front().first).count();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  double rate = 0;
  if (window > 0.05 && done >= samples_.front().second) {
    rate = (done - samples_.front().second) / window;
  } else if (elapsed > 0) {
    rate = done / elapsed;
  }
  const double eta = done >= total ? 0 : (rate > 0 ? (total - done) / rate : -1);
  if (tty_) {
    Write("\r" + RenderProgressLine(done, total, rate, eta, TerminalWidth(fd_)) + "\x1b[K");
    drawn_ = true;
    return;
  }
  if (!plain_.Due()) return;
  Write("loading: " + RenderProgressLine(done, total, rate, eta, 100) + "\n");
}

void ProgressBar::Finish() {
  if (drawn_) Write("\n");
  drawn_ = false;
}

}  // namespace ckpt::ctl
