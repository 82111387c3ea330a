// The PyTorch checkpoints that tests/format/torch_cases.py writes, generated once per
// build tree (under a file lock, so parallel test processes share one run) and reused
// until the script changes.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "support/test_env.h"

namespace ckpt::testing {

// Returns the directory of the generated cases; fails the calling test if the script fails.
inline std::string TorchCasesDir() {
  namespace fs = std::filesystem;
  const std::string dir = CKPT_TORCH_CASES_DIR;
  const std::string script = std::string(CKPT_TESTS_DIR) + "/format/torch_cases.py";
  const std::string stamp = dir + "/.complete";
  int lock = ::open((dir + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  EXPECT_GE(lock, 0);
  ::flock(lock, LOCK_EX);
  struct stat s_script {}, s_stamp {};
  const bool fresh = ::stat(stamp.c_str(), &s_stamp) == 0 && ::stat(script.c_str(), &s_script) == 0 &&
                     s_stamp.st_mtime >= s_script.st_mtime;
  if (!fresh) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    CommandResult r = RunCommand({CKPT_TORCH_PYTHON, script, dir});
    EXPECT_EQ(r.exit_code, 0) << "torch_cases.py failed: " << r.err;
    if (r.exit_code == 0) WriteFile(stamp, "");
  }
  ::flock(lock, LOCK_UN);
  ::close(lock);
  return dir;
}

}  // namespace ckpt::testing
