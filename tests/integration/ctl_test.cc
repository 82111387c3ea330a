// ckptctl as people use it (issue 13), against the real ckptd: the progress bar in a real
// pty fits the terminal's width and redraws in place, plain lines off a terminal; every
// --json error is a parseable object with a code (exit status unchanged); "did you mean"
// for unknown commands and checkpoint names; global options after the subcommand; the
// checkpoints a load's budget evicted are reported.
#include <gtest/gtest.h>
#include <pty.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <thread>

#include "ckpt/client.h"
#include "integration/ops_helpers.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::ReadFile;
using testing::RunCommand;
using testing::ScratchDir;

struct PtyRun {
  std::string output;  // everything the terminal received
  int exit_code = -1;
};

// Runs `argv` on a fresh pty of `columns` columns, with $COLUMNS set to `columns_env`
// (or unset when empty). Once `sigint_after` carriage returns came, sends SIGINT.
PtyRun RunOnPty(const std::vector<std::string>& argv, unsigned short columns, const std::string& columns_env,
                int sigint_after) {
  PtyRun run;
  struct winsize ws {};
  ws.ws_row = 24;
  ws.ws_col = columns;
  int master = -1;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, &ws);
  if (pid < 0) return run;
  if (pid == 0) {
    if (columns_env.empty()) {
      ::unsetenv("COLUMNS");
    } else {
      ::setenv("COLUMNS", columns_env.c_str(), 1);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    _exit(127);
  }
  bool interrupted = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(master, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EIO once the child closed its side
    run.output.append(buf, static_cast<size_t>(n));
    if (!interrupted && (std::count(run.output.begin(), run.output.end(), '\r') >= sigint_after ||
                         std::chrono::steady_clock::now() > deadline)) {
      ::kill(pid, SIGINT);
      interrupted = true;
    }
  }
  ::close(master);
  int status = 0;
  ::waitpid(pid, &status, 0);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// The pieces a terminal shows on separate (re)drawn lines: split at \r and \n, with the
// erase-to-end-of-line sequence removed.
std::vector<std::string> DrawnLines(std::string output) {
  for (size_t at; (at = output.find("\x1b[K")) != std::string::npos;) output.erase(at, 3);
  std::vector<std::string> lines;
  std::string current;
  for (char c : output) {
    if (c == '\r' || c == '\n') {
      if (!current.empty()) lines.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) lines.push_back(current);
  return lines;
}

class CtlTest : public ::testing::Test {
 protected:
  ScratchDir files_;
};

TEST_F(CtlTest, TheProgressBarFitsTheTerminalAndRedrawsInPlace) {
  ASSERT_NO_FATAL_FAILURE(testing::WriteSparseCheckpoint(files_.File("big"), 2ull << 30));
  DaemonProcess daemon({"--load-threads", "1"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  struct Case {
    unsigned short columns;
    const char* env;
    size_t limit;
  } cases[] = {{40, "40", 40}, {200, "40", 40}, {30, "", 30}, {12, "", 12}, {120, "", 120}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.columns) + " columns, COLUMNS=" + c.env);
    PtyRun run = RunOnPty({CKPTCTL_BIN, "--socket", daemon.socket(), "load", files_.File("big"), "--name", "big"},
                          c.columns, c.env, 6);
    EXPECT_EQ(run.exit_code, 130) << run.output;
    // Everything drawn before the cancel message: the bar's redraws.
    const std::string drawn = run.output.substr(0, run.output.find("ckptctl:"));
    size_t bars = 0;
    for (const std::string& line : DrawnLines(drawn)) {
      EXPECT_LT(line.size(), c.limit) << "'" << line << "' would wrap";
      EXPECT_NE(line.find('%'), std::string::npos) << "'" << line << "' is not a progress line";
      ++bars;
    }
    EXPECT_GE(bars, 5u) << run.output;
    // In place: every redraw starts with \r on the same line; the only newlines are the
    // one that ends the bar and the cancel message's (the pty writes \r\n for each).
    EXPECT_LE(std::count(drawn.begin(), drawn.end(), '\n'), 1) << run.output;
    EXPECT_GE(std::count(drawn.begin(), drawn.end(), '\r'), 5) << run.output;
    EXPECT_NE(run.output.find("\x1b[K"), std::string::npos) << "each redraw clears the rest of the line";
    if (c.limit >= 60) EXPECT_NE(run.output.find("ETA"), std::string::npos) << run.output;
    if (c.limit >= 40) EXPECT_NE(run.output.find("] "), std::string::npos) << "a bar: " << run.output;
  }
  EXPECT_TRUE(testing::WaitFor([&] { return testing::ListSegments(daemon.shm_prefix(), "big.").empty(); }, 5000));
}

TEST_F(CtlTest, OffATerminalProgressIsPlainLines) {
  ASSERT_NO_FATAL_FAILURE(testing::WriteSparseCheckpoint(files_.File("big"), 2ull << 30));
  DaemonProcess daemon({"--load-threads", "1"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  const auto start = std::chrono::steady_clock::now();
  CommandResult r = daemon.Ctl({"load", files_.File("big"), "--name", "big"});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
  const std::vector<std::string> lines = DrawnLines(r.err);
  for (const std::string& line : lines) {
    EXPECT_EQ(line.rfind("loading: ", 0), 0u) << line;
    EXPECT_NE(line.find('%'), std::string::npos) << line;
  }
  // One line every 2 s at most: a load that ran for 3 s or more wrote at least one.
  if (seconds >= 3) EXPECT_GE(lines.size(), 1u) << "a " << seconds << " s load wrote no progress line";
  EXPECT_LE(lines.size(), static_cast<size_t>(seconds / 2) + 1) << r.err;
  EXPECT_NE(r.out.find("loaded 'big'"), std::string::npos) << r.out;
  CommandResult j = daemon.Ctl({"evict", "big", "--json"});
  EXPECT_EQ(j.exit_code, 0);
  EXPECT_TRUE(j.err.empty()) << j.err;
}

TEST_F(CtlTest, EveryJsonErrorIsAnObjectWithACodeAndTheSameExitStatus) {
  testing::WritePatternCheckpoint(files_.File("good.safetensors"), 1, 1, 16);
  testing::WriteFile(files_.File("bad.safetensors"), std::string(100, '#'));
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  ASSERT_EQ(daemon.Ctl({"load", files_.File("good.safetensors"), "--name", "good"}).exit_code, 0);
  ScratchDir nowhere;
  struct Case {
    std::vector<std::string> args;
    const char* code;
  } cases[] = {
      {{"info", "nope"}, "not_found"},
      {{"evict", "nope"}, "not_found"},
      {{"verify", "nope"}, "not_found"},
      {{"load", files_.File("missing.safetensors")}, "not_found"},
      {{"load", files_.File("bad.safetensors"), "--name", "bad"}, nullptr},
      {{"load", files_.File("good.safetensors"), "--name", "good"}, "already_exists"},
      {{"load", files_.File("good.safetensors"), "--name", "../x"}, "invalid_argument"},
      {{"ensure", files_.File("missing.safetensors")}, "not_found"},
      {{"frobnicate"}, "invalid_argument"},
      {{"info"}, "invalid_argument"},
      {{"evict", "good", "--wait", "soon"}, "invalid_argument"},
      {{"list", "--no-such-option"}, "invalid_argument"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args[0] + (c.args.size() > 1 ? " " + c.args[1] : ""));
    CommandResult human = daemon.Ctl(c.args);
    std::vector<std::string> args = c.args;
    args.push_back("--json");
    CommandResult r = daemon.Ctl(args);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_EQ(r.exit_code, human.exit_code) << "--json changed the exit status";
    EXPECT_TRUE(r.err.empty()) << r.err;
    json j = json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.out;
    EXPECT_EQ(j["ok"], false);
    ASSERT_TRUE(j["code"].is_string()) << r.out;
    if (c.code) EXPECT_EQ(j["code"], c.code) << r.out;
    EXPECT_FALSE(j["code"].get<std::string>().empty());
    ASSERT_TRUE(j["message"].is_string()) << r.out;
    EXPECT_FALSE(j["message"].get<std::string>().empty());
  }
  CommandResult no_daemon = RunCommand({CKPTCTL_BIN, "--json", "--socket", nowhere.File("none.sock"), "list"});
  EXPECT_EQ(no_daemon.exit_code, 1);
  json j = json::parse(no_daemon.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << no_daemon.out;
  EXPECT_EQ(j["code"], "unavailable");
  // --help still prints help, with status 0.
  CommandResult help = RunCommand({CKPTCTL_BIN, "--json", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("ensure"), std::string::npos) << help.out;
}

TEST_F(CtlTest, UnknownCommandsAndNamesGetDidYouMean) {
  testing::WritePatternCheckpoint(files_.File("m.safetensors"), 1, 1, 16);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  ASSERT_EQ(daemon.Ctl({"load", files_.File("m.safetensors"), "--name", "gpt-neo"}).exit_code, 0);
  ASSERT_EQ(daemon.Ctl({"load", files_.File("m.safetensors"), "--name", "llama-7b"}).exit_code, 0);
  struct Case {
    std::vector<std::string> args;
    const char* expected;
  } cases[] = {
      {{"lsit"}, "did you mean 'list'?"},
      {{"evcit", "gpt-neo"}, "did you mean 'evict'?"},
      {{"staus"}, "did you mean 'status'?"},
      {{"info", "gpt-neox"}, "did you mean 'gpt-neo'?"},
      {{"evict", "gpt_neo"}, "did you mean 'gpt-neo'?"},
      {{"verify", "lama-7b"}, "did you mean 'llama-7b'?"},
      {{"info", "llama"}, "did you mean 'llama-7b'?"},
  };
  for (const Case& c : cases) {
    CommandResult r = daemon.Ctl(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args[0];
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  }
  CommandResult far = daemon.Ctl({"info", "zzzzzzzz"});
  EXPECT_EQ(far.exit_code, 1);
  EXPECT_EQ(far.err.find("did you mean"), std::string::npos) << far.err;
  CommandResult j = daemon.Ctl({"info", "gpt-neox", "--json"});
  json e = json::parse(j.out, nullptr, false);
  ASSERT_TRUE(e.is_object()) << j.out;
  EXPECT_EQ(e["code"], "not_found");
  EXPECT_EQ(e["suggestions"], json::array({"gpt-neo"}));
  CommandResult cmd = RunCommand({CKPTCTL_BIN, "--json", "lsit"});
  json ce = json::parse(cmd.out, nullptr, false);
  ASSERT_TRUE(ce.is_object()) << cmd.out;
  EXPECT_EQ(ce["suggestions"], json::array({"list"}));
  EXPECT_EQ(e["message"].get<std::string>().find("no checkpoint named 'gpt-neox'"), 0u) << j.out;
  // The C++ client's own NotFound says it too (the Python module raises what it says).
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  for (const auto& status : {(*client)->Attach("gpt-neox").status(), (*client)->GetInfo("gpt_neo").status(),
                             (*client)->Verify("gpt-neox").status(), (*client)->Evict("lama-7b", false)}) {
    EXPECT_EQ(status.code(), StatusCode::kNotFound);
    EXPECT_NE(status.message().find(" (did you mean '"), std::string::npos) << status.message();
  }
  EXPECT_EQ((*client)->Attach("gpt-neox").status().message(), "no checkpoint named 'gpt-neox' (did you mean 'gpt-neo'?)");
  EXPECT_EQ((*client)->SimilarNames("gpt-neo"), std::vector<std::string>{}) << "a name that exists";
  EXPECT_EQ((*client)->Attach("zzzzzzzz").status().message(), "no checkpoint named 'zzzzzzzz'");
}

TEST_F(CtlTest, VersionPrintsTheProjectVersion) {
  CommandResult r = RunCommand({CKPTCTL_BIN, "--version"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, std::string("ckptctl ") + CKPT_VERSION + "\n");
}

// Issue 22: whether config.json was kept (plan "auto" and load_model need it) is in
// ckptctl info, as a line and in --json.
TEST_F(CtlTest, InfoShowsWhetherConfigJsonWasStored) {
  ASSERT_EQ(::mkdir(files_.File("model").c_str(), 0755), 0);
  testing::WritePatternCheckpoint(files_.File("model/model.safetensors"), 1, 1, 16);
  const std::string config = "{\"model_type\": \"llama\"}";
  testing::WriteFile(files_.File("model/config.json"), config);
  testing::WriteFile(files_.File("model/generation_config.json"), "{}");
  testing::WritePatternCheckpoint(files_.File("bare.safetensors"), 1, 1, 16);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  ASSERT_EQ(daemon.Ctl({"load", files_.File("model"), "--name", "folder"}).exit_code, 0);
  ASSERT_EQ(daemon.Ctl({"load", files_.File("bare.safetensors"), "--name", "bare"}).exit_code, 0);
  CommandResult folder = daemon.Ctl({"info", "folder"});
  ASSERT_EQ(folder.exit_code, 0) << folder.err;
  EXPECT_NE(folder.out.find("config.json: stored (" + std::to_string(config.size()) + " B)\n"), std::string::npos)
      << folder.out;
  EXPECT_NE(folder.out.find("other side files: generation_config.json (2 B)"), std::string::npos) << folder.out;
  CommandResult bare = daemon.Ctl({"info", "bare"});
  ASSERT_EQ(bare.exit_code, 0) << bare.err;
  EXPECT_NE(bare.out.find("config.json: not stored"), std::string::npos) << bare.out;
  EXPECT_EQ(bare.out.find("other side files"), std::string::npos) << bare.out;
  json j = json::parse(daemon.Ctl({"info", "folder", "--json"}).out, nullptr, false);
  ASSERT_TRUE(j.is_object());
  ASSERT_TRUE(j["side_files"].is_array()) << j.dump();
  bool found = false;
  for (const json& side : j["side_files"]) {
    if (side["name"] == "config.json") found = side["bytes"] == config.size();
  }
  EXPECT_TRUE(found) << j["side_files"].dump();
  EXPECT_EQ(json::parse(daemon.Ctl({"info", "bare", "--json"}).out)["side_files"], json::array());
}

TEST_F(CtlTest, GlobalOptionsWorkBeforeOrAfterTheSubcommand) {
  testing::WritePatternCheckpoint(files_.File("m.safetensors"), 1, 1, 16);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  const std::string s = daemon.socket();
  CommandResult load = RunCommand({CKPTCTL_BIN, "load", files_.File("m.safetensors"), "--socket", s, "--name", "m",
                                   "--json"});
  ASSERT_EQ(load.exit_code, 0) << load.err;
  EXPECT_EQ(json::parse(load.out)["checkpoint"]["name"], "m");
  for (const auto& argv : std::vector<std::vector<std::string>>{
           {CKPTCTL_BIN, "list", "--socket", s, "--json"},
           {CKPTCTL_BIN, "--json", "list", "--socket", s},
           {CKPTCTL_BIN, "--socket", s, "list", "--json"},
           {CKPTCTL_BIN, "list", "--json", "--socket=" + s}}) {
    CommandResult r = RunCommand(argv);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    json j = json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.out;
    EXPECT_EQ(j["checkpoints"][0]["name"], "m");
  }
  CommandResult info = RunCommand({CKPTCTL_BIN, "info", "m", "--socket", s});
  EXPECT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("TENSOR"), std::string::npos);
  CommandResult ensure = RunCommand({CKPTCTL_BIN, "ensure", files_.File("m.safetensors"), "--name", "m", "--socket", s});
  EXPECT_EQ(ensure.exit_code, 0) << ensure.err;
  EXPECT_NE(ensure.out.find("already loaded, source unchanged"), std::string::npos) << ensure.out;
}

TEST_F(CtlTest, LoadReportsWhatTheBudgetEvicted) {
  for (int i = 0; i < 2; ++i) testing::WritePatternCheckpoint(files_.File("c" + std::to_string(i)), i, 1, 3072);
  testing::WritePatternCheckpoint(files_.File("big"), 9, 1, 8192);  // 8 MiB
  DaemonProcess daemon({"--memory-budget", "10M"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  ASSERT_EQ(daemon.Ctl({"load", files_.File("c0"), "--name", "a"}).exit_code, 0);
  ASSERT_EQ(daemon.Ctl({"load", files_.File("c1"), "--name", "b"}).exit_code, 0);
  CommandResult r = daemon.Ctl({"load", files_.File("big"), "--name", "big"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("evicted to fit the memory budget: 'a', 'b'"), std::string::npos) << r.out;
  // JSON, and the C++ Client, say the same.
  CommandResult j = daemon.Ctl({"load", files_.File("c0"), "--name", "a", "--json"});
  ASSERT_EQ(j.exit_code, 0) << j.err;
  EXPECT_EQ(json::parse(j.out)["evicted"], json::array({"big"})) << j.out;
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  LoadOptions options;
  options.name = "big";
  auto loaded = (*client)->Load(files_.File("big"), options);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->evicted, (std::vector<std::string>{"a"}));
  // ensure reports evictions the same way.
  EnsureOptions e;
  e.name = "b";
  auto ensured = (*client)->Ensure(files_.File("c1"), e);
  ASSERT_TRUE(ensured.ok()) << ensured.status().ToString();
  EXPECT_EQ(ensured->action, "loaded");
  EXPECT_EQ(ensured->evicted, (std::vector<std::string>{"big"}));
}

}  // namespace
}  // namespace ckpt
