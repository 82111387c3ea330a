// Helpers for tests that run the real binaries: a private ckptd per test, ckptctl runs,
// checkpoints written by PyTorch, scratch directories.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/status.h"
#include "shm/segment_directory.h"
#include "shm/segment_reader.h"

namespace ckpt::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = -1;  // -1 if it did not exit normally
  std::string out;     // stdout
  std::string err;     // stderr
};

// Runs argv[0] with arguments, waits, and captures its output. `stdin_data` is written to
// its standard input.
CommandResult RunCommand(const std::vector<std::string>& argv, const std::string& stdin_data = "");

// A child process whose standard input stays open (so it can hold an attachment) until
// CloseStdin(); its stdout and stderr go to files. The destructor closes stdin and waits.
class ChildProcess {
 public:
  explicit ChildProcess(const std::vector<std::string>& argv);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // True once `needle` appears in its stdout, false after `timeout_ms` or if it exited.
  bool WaitForOutput(const std::string& needle, int timeout_ms);
  void CloseStdin();
  // Closes stdin and waits for the exit.
  CommandResult Wait();
  pid_t pid() const { return pid_; }

 private:
  ScratchDir dir_;
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  bool waited_ = false;
  CommandResult result_;
};

// Runs tools/make_checkpoint.py (real PyTorch) with `args`; fails the test on error.
void MakeCheckpoint(const std::vector<std::string>& args);
// Runs a Python snippet with the torch interpreter; returns its result.
CommandResult RunTorchPython(const std::string& code, const std::vector<std::string>& args = {});

// Writes `bytes` to `path`.
void WriteFile(const std::string& path, const std::string& bytes);
std::string ReadFile(const std::string& path);
// `n` as 8 little-endian bytes (a safetensors header's length prefix).
std::string Le64(uint64_t n);
// A safetensors file's bytes: the header's length, `header` (JSON), then `data`. Only for
// headers a test writes by hand because they are malformed or unusual; a well-formed file
// comes from SafetensorsOf.
std::string SafetensorsBytes(const std::string& header, const std::string& data);
// One tensor of a test file; its bytes are `data`.
struct TestTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  std::string data;
};
// A well-formed safetensors file of `tensors` (in order) and `metadata`, by the one writer
// (format::SafetensorsFileBytes); fails the test and returns "" if the writer refuses.
std::string SafetensorsOf(const std::vector<TestTensor>& tensors, const std::map<std::string, std::string>& metadata = {});

// The segment directory of shm prefix `prefix`: that of the live DaemonProcess with this
// prefix (see DaemonProcess::segment_dir()), else /dev/shm/<prefix> (a
// ScratchSegmentDirectory); "" when that daemon has not made one yet.
std::string SegmentDirOf(const std::string& prefix);
// File names in SegmentDirOf(prefix) that start with `name_prefix` (e.g. "gpt." for the
// segments of checkpoint "gpt"), sorted; empty if the directory does not exist.
std::vector<std::string> ListSegments(const std::string& prefix, const std::string& name_prefix = "");
// Removes SegmentDirOf(prefix) with everything in it (no error if absent; a mount point
// itself stays).
void RemoveSegmentDirectory(const std::string& prefix);

// Opens segment `file` of `dir` read-only (no owner or mode checks) and validates it.
Result<std::unique_ptr<shm::SegmentReader>> OpenSegmentReader(const shm::SegmentDirectory& dir,
                                                              const std::string& file);

// A private segment directory /dev/shm/ckpttest-<pid>-<n> for tests that write segments
// without a daemon; removed with its contents on destruction.
class ScratchSegmentDirectory {
 public:
  ScratchSegmentDirectory();
  ~ScratchSegmentDirectory();
  const shm::SegmentDirectory& dir() const { return *dir_; }
  const std::string& prefix() const { return prefix_; }
  // File names in it, sorted.
  std::vector<std::string> List() const { return ListSegments(prefix_); }

 private:
  std::string prefix_;
  std::unique_ptr<shm::SegmentDirectory> dir_;
};

// A ckptd child process on a private socket, shm prefix and state directory. Start()
// waits until the daemon answers; the destructor stops it (SIGTERM, then SIGKILL) and
// removes its segment directory. By default the daemon chooses that directory
// (/dev/shm/<prefix>.<random>, named in its state directory); with own_segment_dir it
// gets --segment-dir <its scratch directory>/segments (where a test may mount a tmpfs
// before Start(), as the unit does at /run/ckptd-segments).
class DaemonProcess {
 public:
  explicit DaemonProcess(std::vector<std::string> extra_args = {}, bool own_segment_dir = false);
  ~DaemonProcess();
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // Starts ckptd (CKPT_PAUSE_DIR set to pause_dir()) and waits up to 60 s for its socket to
  // answer. Returns false on failure.
  bool Start();
  // SIGTERM and wait; returns the exit status (-1 if killed by a signal).
  int Stop();
  // SIGKILL and wait.
  void Kill();
  bool Running() const;

  const std::string& socket() const { return socket_; }
  const std::string& shm_prefix() const { return prefix_; }
  // Where its segments live: the --segment-dir it was given, else the directory its
  // state directory names (/dev/shm/<prefix>.<random>); "" before the daemon made one.
  std::string segment_dir() const;
  // Its --state-dir (in its scratch directory, created by the daemon).
  const std::string& state_dir() const { return state_; }
  // Its CKPT_PAUSE_DIR (common/pause_point.h): where a PausePointControl arms its points.
  const std::string& pause_dir() const { return pause_; }
  const std::string& log_path() const { return log_; }
  pid_t pid() const { return pid_; }
  // Runs ckptctl against this daemon.
  CommandResult Ctl(const std::vector<std::string>& args) const;

 private:
  ScratchDir dir_;
  std::vector<std::string> extra_args_;
  std::string socket_, prefix_, log_, state_, pause_;
  pid_t pid_ = -1;
};

// One pause point of a process started with CKPT_PAUSE_DIR=`dir` (common/pause_point.h),
// armed from construction: the next thread to reach point `name` stops there until
// Resume(). Forces a race instead of timing it: arm, start the operation, WaitReached(),
// act, Resume(). The destructor resumes a stopped thread and disarms the point.
class PausePointControl {
 public:
  PausePointControl(const std::string& dir, const std::string& name);
  ~PausePointControl();
  PausePointControl(const PausePointControl&) = delete;
  PausePointControl& operator=(const PausePointControl&) = delete;

  // True once a thread stopped at the point; false after `timeout_s` seconds.
  bool WaitReached(int timeout_s = 120);
  // Lets the stopped thread go on and disarms the point (later passes do not stop).
  // False if no thread had stopped or it could not be told within `timeout_s`.
  bool Resume(int timeout_s = 120);

 private:
  std::string reached_, resume_;
  int reached_fd_ = -1;
  bool stopped_ = false;
};

// Shmem + AnonPages from /proc/meminfo, in bytes: node memory that checkpoints occupy.
uint64_t NodeSharedPlusAnonBytes();
// Proportional set size of process `pid` (/proc/PID/smaps_rollup), in bytes: pages it
// shares with k processes count 1/k. Summed over processes, shared memory counts once.
uint64_t ProcessPssBytes(pid_t pid);

}  // namespace ckpt::testing
