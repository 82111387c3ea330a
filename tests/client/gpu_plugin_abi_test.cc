// The GPU plugin's C interface is checked when the plugin is opened (src/client/gpu_plugin.cc):
// libraries built here (tests/client/fake_gpu_plugin.c) with the entry symbol of another
// interface version, with an incomplete table, or without the symbol are refused with
// FailedPrecondition naming both versions (never called into), and the real plugin passes
// the check, its own errors coming back through the C message buffer. The plugin is opened
// once per process, so each case runs in a child process of its own.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "ckpt/collective.h"
#include "ckpt/gpu.h"
#include "ckpt/gpu_plugin_abi.h"

namespace ckpt {
namespace {

// The status of NcclGroup::Borrow (the first GPU call: it opens the plugin) in a child
// process with CKPT_GPU_PLUGIN=plugin.
Status BorrowWithPlugin(const std::string& plugin) {
  int fds[2];
  if (pipe(fds) != 0) return IoError("pipe");
  const pid_t pid = fork();
  if (pid < 0) return IoError("fork");
  if (pid == 0) {
    close(fds[0]);
    setenv("CKPT_GPU_PLUGIN", plugin.c_str(), 1);
    auto group = NcclGroup::Borrow(nullptr, 0, {});
    const std::string out = std::to_string(static_cast<int>(group.status().code())) + "\n" + group.status().message();
    ssize_t n = write(fds[1], out.data(), out.size());
    _exit(n == static_cast<ssize_t>(out.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) return Internal("the child crashed or failed: " + text);
  const size_t nl = text.find('\n');
  if (nl == std::string::npos) return Internal("no status from the child: " + text);
  return Status(static_cast<StatusCode>(std::stoi(text.substr(0, nl))), text.substr(nl + 1));
}

TEST(GpuPluginAbi, AnotherInterfaceVersionIsRefusedNamingBoth) {
  const Status s = BorrowWithPlugin(CKPT_FAKE_PLUGIN_V999);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find(std::string("CKPT_GPU_PLUGIN=") + CKPT_FAKE_PLUGIN_V999), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("speaks interface version 999 (ckpt fake-9.9)"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("this library interface version " + std::to_string(CKPT_GPU_PLUGIN_ABI_VERSION) +
                             " (ckpt " CKPT_VERSION ")"),
            std::string::npos)
      << s.message();
}

TEST(GpuPluginAbi, AnIncompleteTableIsRefused) {
  // Our interface version, but no functions: refused before any call through it.
  const Status s = BorrowWithPlugin(CKPT_FAKE_PLUGIN_INCOMPLETE);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("has an incomplete table"), std::string::npos) << s.message();
}

TEST(GpuPluginAbi, ALibraryWithoutTheEntryIsRefused) {
  const Status s = BorrowWithPlugin(CKPT_FAKE_PLUGIN_NO_ENTRY);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("has no " CKPT_GPU_PLUGIN_ENTRY ": not a ckpt GPU plugin"), std::string::npos)
      << s.message();
}

TEST(GpuPluginAbi, TheRealPluginPassesAndItsErrorsComeThroughTheBuffer) {
  // Borrow(nullptr) fails inside the plugin (no NCCL, no driver, or the null communicator),
  // never at the interface check; the plugin's message arrives whole.
  const Status s = BorrowWithPlugin(CKPT_REAL_PLUGIN);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(s.message().find("interface version"), std::string::npos) << s.message();
  EXPECT_FALSE(s.message().empty());
}

}  // namespace
}  // namespace ckpt
