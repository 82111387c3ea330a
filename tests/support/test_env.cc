#include "support/test_env.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <map>
#include <mutex>

#include "common/unique_fd.h"
#include "daemon/segment_location.h"
#include "format/safetensors_writer.h"
#include "protocol/daemon_connection.h"

namespace ckpt::testing {
namespace {

// Hermetic from the first instruction (tests/CMakeLists.txt): a daemon a test starts reads
// the build's empty configuration unless the test names one, and no socket, plugin or
// launcher variable of the shell that ran the binary reaches the test or its children.
[[maybe_unused]] const bool kHermetic = [] {
  std::string names = CKPT_TEST_ENV_UNSET;
  for (size_t at = 0; at <= names.size();) {
    const size_t end = std::min(names.find(':', at), names.size());
    if (end > at) ::unsetenv(names.substr(at, end - at).c_str());
    at = end + 1;
  }
  ::setenv("CKPTD_CONFIG", CKPT_HERMETIC_CONFIG, 1);
  return true;
}();

}  // namespace

namespace fs = std::filesystem;

ScratchDir::ScratchDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/ckpt-test-XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) std::abort();
  path_ = buf.data();
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

CommandResult RunCommand(const std::vector<std::string>& argv, const std::string& stdin_data) {
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) || ::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC)) std::abort();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  std::thread writer([&] {
    size_t off = 0;
    while (off < stdin_data.size()) {
      ssize_t n = ::write(in[1], stdin_data.data() + off, stdin_data.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    ::close(in[1]);
  });
  CommandResult result;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? result.out : result.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  writer.join();
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv) {
  int in[2];
  if (::pipe2(in, O_CLOEXEC) != 0) std::abort();
  const std::string out = dir_.File("stdout"), err = dir_.File("stderr");
  pid_ = ::fork();
  if (pid_ == 0) {
    ::dup2(in[0], 0);
    int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1);
    ::dup2(e, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(in[0]);
  stdin_fd_ = in[1];
}

ChildProcess::~ChildProcess() { Wait(); }

void ChildProcess::CloseStdin() {
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  stdin_fd_ = -1;
}

bool ChildProcess::WaitForOutput(const std::string& needle, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (ReadFile(dir_.File("stdout")).find(needle) != std::string::npos) return true;
    int status;
    if (!waited_ && ::waitpid(pid_, &status, WNOHANG) == pid_) {
      waited_ = true;
      result_.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      return ReadFile(dir_.File("stdout")).find(needle) != std::string::npos;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

CommandResult ChildProcess::Wait() {
  CloseStdin();
  if (!waited_ && pid_ > 0) {
    int status = 0;
    for (int i = 0; i < 1000 && ::waitpid(pid_, &status, WNOHANG) != pid_; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (i == 999) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
      }
    }
    waited_ = true;
    result_.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  result_.out = ReadFile(dir_.File("stdout"));
  result_.err = ReadFile(dir_.File("stderr"));
  return result_;
}

void MakeCheckpoint(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {CKPT_TORCH_PYTHON, std::string(CKPT_TOOLS_DIR) + "/make_checkpoint.py"};
  argv.insert(argv.end(), args.begin(), args.end());
  CommandResult r = RunCommand(argv);
  ASSERT_EQ(r.exit_code, 0) << "make_checkpoint.py failed: " << r.err;
}

CommandResult RunTorchPython(const std::string& code, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {CKPT_TORCH_PYTHON, "-c", code};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv);
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

std::string Le64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

std::string SafetensorsBytes(const std::string& header, const std::string& data) {
  return Le64(header.size()) + header + data;
}

std::string SafetensorsOf(const std::vector<TestTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  std::vector<TensorInfo> entries;
  std::vector<std::string_view> data;
  for (const TestTensor& t : tensors) {
    entries.push_back({t.name, t.dtype, t.shape, t.data.size(), 0});
    data.push_back(t.data);
  }
  auto bytes = format::SafetensorsFileBytes(entries, data, metadata);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? std::move(*bytes) : std::string();
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

namespace {
// The live DaemonProcess of each shm prefix (prefixes are unique per process).
std::mutex daemons_mu;
std::map<std::string, const DaemonProcess*>& Daemons() {
  static std::map<std::string, const DaemonProcess*> daemons;
  return daemons;
}
}  // namespace

std::string SegmentDirOf(const std::string& prefix) {
  {
    std::lock_guard<std::mutex> lock(daemons_mu);
    auto it = Daemons().find(prefix);
    if (it != Daemons().end()) return it->second->segment_dir();
  }
  return std::string(shm::kShmRoot) + "/" + prefix;
}

std::vector<std::string> ListSegments(const std::string& prefix, const std::string& name_prefix) {
  std::vector<std::string> names;
  const std::string dir = SegmentDirOf(prefix);
  if (dir.empty()) return names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.compare(0, name_prefix.size(), name_prefix) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

Result<std::unique_ptr<shm::SegmentReader>> OpenSegmentReader(const shm::SegmentDirectory& dir,
                                                              const std::string& file) {
  UniqueFd fd(::openat(dir.fd(), file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return NotFound("no segment " + dir.PathOf(file));
    return ErrnoError("opening " + dir.PathOf(file), errno);
  }
  return shm::SegmentReader::FromFd(fd.get(), dir.PathOf(file));
}

void RemoveSegmentDirectory(const std::string& prefix) {
  const std::string dir = SegmentDirOf(prefix);
  if (dir.empty()) return;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) fs::remove_all(e.path(), ec);
  fs::remove(dir, ec);  // EBUSY for a mount point: it stays
}

namespace {
std::string UniquePrefix() {
  static std::atomic<int> counter{0};
  return "ckpttest-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}
}  // namespace

ScratchSegmentDirectory::ScratchSegmentDirectory() : prefix_(UniquePrefix()) {
  auto dir = shm::SegmentDirectory::Open(std::string(shm::kShmRoot) + "/" + prefix_);
  if (!dir.ok()) {
    ADD_FAILURE() << dir.status().ToString();
    std::abort();
  }
  dir_ = std::move(dir).value();
}

ScratchSegmentDirectory::~ScratchSegmentDirectory() {
  dir_.reset();
  RemoveSegmentDirectory(prefix_);
}

DaemonProcess::DaemonProcess(std::vector<std::string> extra_args, bool own_segment_dir)
    : extra_args_(std::move(extra_args)) {
  socket_ = dir_.File("ckptd.sock");
  prefix_ = UniquePrefix();
  log_ = dir_.File("ckptd.log");
  state_ = dir_.File("state");
  pause_ = dir_.File("pause");
  if (own_segment_dir) {
    extra_args_.push_back("--segment-dir");
    extra_args_.push_back(dir_.File("segments"));
  }
  std::lock_guard<std::mutex> lock(daemons_mu);
  Daemons()[prefix_] = this;
}

DaemonProcess::~DaemonProcess() {
  if (Running()) Stop();
  RemoveSegmentDirectory(prefix_);
  std::lock_guard<std::mutex> lock(daemons_mu);
  Daemons().erase(prefix_);
}

std::string DaemonProcess::segment_dir() const {
  for (size_t i = 0; i + 1 < extra_args_.size(); ++i) {
    if (extra_args_[i] == "--segment-dir") return extra_args_[i + 1];
  }
  std::string name = ReadFile(state_ + "/" + daemon::kSegmentDirectoryRecord);
  while (!name.empty() && name.back() == '\n') name.pop_back();
  return name.empty() ? "" : std::string(shm::kShmRoot) + "/" + name;
}

namespace {

// Whether the daemon at `socket` answers a request (false while nobody listens there).
// Connectable is not yet serving: ckptd
// listens first (claiming its socket) and adopts the segments it finds before it accepts;
// any answer, an error too (a refused role), comes after that.
bool Answers(const std::string& socket) {
  auto connection = protocol::DaemonConnection::Open(socket);
  if (!connection.ok()) return false;
  auto answer = (*connection)->Call("status");
  return answer.ok() || answer.status().code() != StatusCode::kUnavailable;
}

}  // namespace

bool DaemonProcess::Start() {
  std::vector<std::string> argv = {CKPTD_BIN,    "--socket",    socket_, "--shm-prefix", prefix_,
                                   "--state-dir", state_,       "--log-level", "debug"};
  argv.insert(argv.end(), extra_args_.begin(), extra_args_.end());
  if (::mkdir(pause_.c_str(), 0700) != 0 && errno != EEXIST) return false;
  pid_ = ::fork();
  if (pid_ == 0) {
    ::setenv("CKPT_PAUSE_DIR", pause_.c_str(), 1);
    int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  // A deadline for a daemon that never answers, not a race: on a busy one-CPU machine a
  // start can take seconds.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    if (Answers(socket_)) return true;
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

bool DaemonProcess::Running() const { return pid_ > 0; }

int DaemonProcess::Stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = 0;
  for (int i = 0; i < 1000; ++i) {  // 10 s, then SIGKILL
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Kill();
  return -1;
}

void DaemonProcess::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

CommandResult DaemonProcess::Ctl(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {CKPTCTL_BIN, "--socket", socket_};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv);
}

uint64_t NodeSharedPlusAnonBytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t value = 0, total = 0;
  std::string unit;
  while (f >> key >> value) {
    if (key == "Shmem:" || key == "AnonPages:") total += value * 1024;
    std::getline(f, unit);
  }
  return total;
}

}  // namespace ckpt::testing

namespace ckpt::testing {

uint64_t ProcessPssBytes(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/smaps_rollup");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("Pss:", 0) == 0) return std::stoull(line.substr(4)) * 1024;
  }
  return 0;
}

PausePointControl::PausePointControl(const std::string& dir, const std::string& name)
    : reached_(dir + "/" + name + ".reached"), resume_(dir + "/" + name + ".resume") {
  // The reading end first: the point is armed only once both FIFOs exist.
  if (::mkfifo(reached_.c_str(), 0600) != 0 || ::mkfifo(resume_.c_str(), 0600) != 0) {
    ADD_FAILURE() << "cannot make the FIFOs of pause point " << reached_ << ": " << std::strerror(errno);
    return;
  }
  reached_fd_ = ::open(reached_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (reached_fd_ < 0) ADD_FAILURE() << "cannot open " << reached_ << ": " << std::strerror(errno);
}

PausePointControl::~PausePointControl() {
  if (stopped_) (void)Resume();
  ::unlink(resume_.c_str());
  ::unlink(reached_.c_str());
  if (reached_fd_ >= 0) ::close(reached_fd_);
}

bool PausePointControl::WaitReached(int timeout_s) {
  if (reached_fd_ < 0) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{reached_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) > 0 && (p.revents & POLLIN)) {
      char byte;
      if (::read(reached_fd_, &byte, 1) == 1) return stopped_ = true;
    }
  }
  return false;
}

bool PausePointControl::Resume(int timeout_s) {
  if (!stopped_) return false;
  // The stopped thread opens the resume FIFO for reading; opening it for writing without
  // blocking fails (ENXIO) until it has.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int fd = -1;
  while ((fd = ::open(resume_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC)) < 0 && errno == ENXIO &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (fd < 0) return false;
  ::unlink(resume_.c_str());  // disarmed before the thread goes on
  ::unlink(reached_.c_str());
  ::close(fd);  // end of file: the thread goes on
  stopped_ = false;
  return true;
}

}  // namespace ckpt::testing
