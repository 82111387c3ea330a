// Helpers shared by the operations tests (access control, budget, recovery, load, abuse):
// safetensors files written directly (fast, with contents the tests can predict),
// temporary users and groups, and commands run as another user.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "format/safetensors_writer.h"
#include "support/test_env.h"

namespace ckpt::testing {

// The float at index i of tensor `salt` (a deterministic pattern).
inline float PatternValue(uint32_t salt, uint64_t i) {
  uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ (salt * 40503u + 17u);
  return static_cast<float>(x % 100003u) + static_cast<float>(salt);
}

// Writes a safetensors file with tensors "meta" (I64 [2] = {salt, version}) and "w"
// (F32 [rows, 256]) filled with PatternValue(salt * 1000 + version, i).
inline void WritePatternCheckpoint(const std::string& path, uint32_t salt, uint32_t version, uint64_t rows) {
  const int64_t meta[2] = {salt, version};
  std::vector<float> w(rows * 256);
  for (uint64_t i = 0; i < w.size(); ++i) w[i] = PatternValue(salt * 1000 + version, i);
  WriteFile(path, testing::SafetensorsOf(
                      {{"meta", DType::kI64, {2}, std::string(reinterpret_cast<const char*>(meta), sizeof(meta))},
                       {"w", DType::kF32, {static_cast<int64_t>(rows), 256},
                        std::string(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(float))}}));
}

// Counts floats of `w` that differ from the pattern that `meta` announces.
inline uint64_t WrongFloats(const int64_t* meta, const float* w, uint64_t count) {
  const uint32_t salt = static_cast<uint32_t>(meta[0] * 1000 + meta[1]);
  uint64_t wrong = 0;
  for (uint64_t i = 0; i < count; ++i) wrong += w[i] != PatternValue(salt, i);
  return wrong;
}

// A safetensors file of one F32 tensor of `bytes` bytes whose data is a hole (reads as
// zeros, costs no disk): a large checkpoint that loads for a while.
inline void WriteSparseCheckpoint(const std::string& path, uint64_t bytes) {
  auto out = format::SafetensorsPrefix({{"big", DType::kF32, {static_cast<int64_t>(bytes / 4)}, bytes, 0}}, {}, nullptr);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  WriteFile(path, *out);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(out->size() + bytes)), 0);
}

inline std::string UniqueName(const char* stem) {
  static std::atomic<int> n{0};
  return std::string(stem) + std::to_string(::getpid() % 100000) + "x" + std::to_string(n++);
}

// A group created for the test and deleted afterwards.
class TempGroup {
 public:
  TempGroup() : name_(UniqueName("ckg")) {
    CommandResult r = RunCommand({"groupadd", name_});
    ok_ = r.exit_code == 0;
    EXPECT_TRUE(ok_) << "groupadd: " << r.err;
  }
  ~TempGroup() {
    if (ok_) RunCommand({"groupdel", name_});
  }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  bool ok_ = false;
};

// A user (no home, no login) in `groups`, deleted afterwards.
class TempUser {
 public:
  explicit TempUser(const std::vector<std::string>& groups = {}) : name_(UniqueName("cku")) {
    std::vector<std::string> argv = {"useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group"};
    if (!groups.empty()) {
      std::string list;
      for (const auto& g : groups) list += (list.empty() ? "" : ",") + g;
      argv.push_back("--groups");
      argv.push_back(list);
    }
    argv.push_back(name_);
    CommandResult r = RunCommand(argv);
    ok_ = r.exit_code == 0;
    EXPECT_TRUE(ok_) << "useradd: " << r.err;
  }
  ~TempUser() {
    if (ok_) RunCommand({"userdel", name_});
  }
  const std::string& name() const { return name_; }
  // argv that runs `command` as this user with its groups from the group database.
  std::vector<std::string> As(const std::vector<std::string>& command) const {
    std::vector<std::string> argv = {"setpriv", "--reuid", name_, "--regid", name_, "--init-groups", "--"};
    argv.insert(argv.end(), command.begin(), command.end());
    return argv;
  }

 private:
  std::string name_;
  bool ok_ = false;
};

// Waits until `pred` holds or `timeout_ms` passed; returns pred().
template <typename F>
bool WaitFor(F pred, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// Segments in the segment directory of shm prefix `prefix`.
inline size_t SegmentCount(const std::string& prefix) { return ListSegments(prefix).size(); }

}  // namespace ckpt::testing
