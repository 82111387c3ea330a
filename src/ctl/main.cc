// ckptctl: the operator's command line for ckptd, written on the public client API
// (include/ckpt/client.h). --json prints the typed responses in their wire encoding
// (src/protocol/messages.cc); tables and messages escape what came from the daemon.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <utility>
#include <vector>

#include "ckpt/client.h"
#include "ctl/persist.h"
#include "ctl/table.h"
#include "protocol/messages.h"
#include "protocol/wire.h"

namespace {

using ckpt::ctl::HumanBytes;
using ckpt::ctl::Printable;
using ckpt::ctl::RenderTable;
using nlohmann::json;

struct Options {
  std::string socket = ckpt::protocol::DefaultSocketPath();
  bool json_output = false;
};

int Fail(const ckpt::Status& status) {
  std::fprintf(stderr, "ckptctl: %s\n", Printable(status.message()).c_str());
  return 1;
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f s", s);
  return buf;
}

std::string LocalTime(int64_t unix_s) {
  std::time_t t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

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

// A one-line progress bar on stderr, redrawn in place on every update (the daemon sends
// one about every 100 ms): bytes done and total, rate over the last second or so, ETA.
class ProgressBar {
 public:
  void Update(uint64_t done, uint64_t total) {
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
    const double fraction = total ? std::min(1.0, static_cast<double>(done) / total) : 1.0;
    const int filled = static_cast<int>(fraction * 30);
    const double eta = done >= total ? 0 : (rate > 0 ? (total - done) / rate : -1);
    std::fprintf(stderr, "\r[%s%s] %5.1f%%  %s / %s  %s/s  ETA %s   ", std::string(filled, '#').c_str(),
                 std::string(30 - filled, '.').c_str(), fraction * 100, HumanBytes(done).c_str(),
                 HumanBytes(total).c_str(), HumanBytes(static_cast<uint64_t>(rate)).c_str(), Eta(eta).c_str());
    std::fflush(stderr);
    drawn_ = true;
  }
  ~ProgressBar() {
    if (drawn_) std::fprintf(stderr, "\n");
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::vector<std::pair<std::chrono::steady_clock::time_point, uint64_t>> samples_;
  bool drawn_ = false;
};


ckpt::Result<std::unique_ptr<ckpt::Client>> Connect(const Options& o) { return ckpt::Client::Connect(o.socket); }

void PrintJson(const json& j) { std::cout << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n"; }

std::vector<std::string> CheckpointRow(const ckpt::CheckpointSummary& c) {
  return {c.name,
          std::to_string(c.generation),
          std::to_string(c.tensor_count),
          HumanBytes(c.data_bytes),
          std::to_string(c.attached),
          Seconds(c.load_seconds),
          LocalTime(c.loaded_unix_s),
          c.source};
}
const std::vector<std::string> kCheckpointHeader = {"NAME", "GEN", "TENSORS", "SIZE", "ATTACHED",
                                                    "LOAD TIME", "LOADED", "SOURCE"};

// SIGINT during a load: the first one cancels it (the daemon publishes nothing), a
// second one ends ckptctl at once.
volatile sig_atomic_t g_interrupts = 0;
void OnInterrupt(int) {
  if (++g_interrupts > 1) _exit(130);
}

int Load(const Options& o, const std::string& path, const std::string& name, bool replace, bool allow_expansion) {
  auto client = Connect(o);
  if (!client.ok()) return Fail(client.status());
  const bool show_progress = !o.json_output && ::isatty(STDERR_FILENO);
  struct sigaction action {};
  action.sa_handler = OnInterrupt;
  sigemptyset(&action.sa_mask);
  struct sigaction previous {};
  ::sigaction(SIGINT, &action, &previous);
  ckpt::LoadOptions options;
  options.name = name;
  options.replace = replace;
  options.allow_expansion = allow_expansion;
  ckpt::Result<ckpt::LoadResult> result = ckpt::Internal("unreached");
  {
    ProgressBar bar;
    // Progress events come about every 100 ms whether or not a bar is drawn: each is a
    // chance to cancel.
    options.progress = [&](uint64_t done, uint64_t total) {
      if (g_interrupts > 0) return false;
      if (show_progress) bar.Update(done, total);
      return true;
    };
    result = (*client)->Load(path, options);
  }
  ::sigaction(SIGINT, &previous, nullptr);
  if (!result.ok()) {
    if (result.status().code() == ckpt::StatusCode::kCancelled) {
      std::fprintf(stderr, "ckptctl: load cancelled; nothing was published\n");
      return 130;
    }
    return Fail(result.status());
  }
  const ckpt::CheckpointSummary& c = result->checkpoint;
  if (o.json_output) {
    PrintJson(ckpt::protocol::Encode(*result));
  } else {
    const double secs = c.load_seconds;
    std::printf("loaded '%s' (generation %llu): %llu tensors, %s in %s (%s/s)\n", Printable(c.name).c_str(),
                static_cast<unsigned long long>(c.generation), static_cast<unsigned long long>(c.tensor_count),
                HumanBytes(c.data_bytes).c_str(), Seconds(secs).c_str(),
                HumanBytes(static_cast<uint64_t>(c.data_bytes / std::max(secs, 1e-9))).c_str());
  }
  return 0;
}

int Evict(const Options& o, const std::string& name, bool force, double wait_s) {
  auto client = Connect(o);
  if (!client.ok()) return Fail(client.status());
  ckpt::EvictOptions options;
  options.force = force;
  options.wait_s = wait_s;
  auto evicted = (*client)->Evict(name, options);
  if (!evicted.ok()) return Fail(evicted.status());
  if (o.json_output) {
    PrintJson(ckpt::protocol::Encode(ckpt::protocol::CheckpointResponse{*evicted}));
  } else {
    std::printf("evicted '%s'\n", Printable(name).c_str());
  }
  return 0;
}

int List(const Options& o) {
  auto client = Connect(o);
  if (!client.ok()) return Fail(client.status());
  auto list = (*client)->ListAll();
  if (!list.ok()) return Fail(list.status());
  if (o.json_output) {
    PrintJson(ckpt::protocol::Encode(*list));
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& c : list->checkpoints) rows.push_back(CheckpointRow(c));
  for (const auto& n : list->loading) rows.push_back({n, "-", "-", "-", "-", "loading", "-", "-"});
  std::cout << RenderTable(kCheckpointHeader, rows, {1, 2, 3, 4, 5});
  return 0;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (int64_t d : shape) text += (text.size() > 1 ? ", " : "") + std::to_string(d);
  return text + "]";
}

int Info(const Options& o, const std::string& name) {
  auto client = Connect(o);
  if (!client.ok()) return Fail(client.status());
  auto info = (*client)->GetInfo(name);
  if (!info.ok()) return Fail(info.status());
  if (o.json_output) {
    PrintJson(ckpt::protocol::Encode(*info));
    return 0;
  }
  std::cout << RenderTable(kCheckpointHeader, {CheckpointRow(info->checkpoint)}, {1, 2, 3, 4, 5}) << "\n";
  std::vector<std::vector<std::string>> rows;
  for (const ckpt::TensorInfo& t : info->tensors) {
    char checksum[17];
    std::snprintf(checksum, sizeof(checksum), "%016llx", static_cast<unsigned long long>(t.checksum));
    rows.push_back({t.name, ckpt::DTypeName(t.dtype), ShapeText(t.shape), HumanBytes(t.nbytes), checksum});
  }
  std::cout << RenderTable({"TENSOR", "DTYPE", "SHAPE", "SIZE", "XXH3"}, rows, {3});
  return 0;
}

// Exit status 0 when every tensor matches its checksum, 1 on a mismatch or an error.
int Verify(const Options& o, const std::string& name) {
  auto client = Connect(o);
  if (!client.ok()) return Fail(client.status());
  auto result = (*client)->Verify(name);
  if (!result.ok()) return Fail(result.status());
  const ckpt::VerifyResult& r = *result;
  if (o.json_output) {
    PrintJson(ckpt::protocol::Encode(r));
    return r.passed ? 0 : 1;
  }
  if (r.passed) {
    std::printf("OK: '%s' (generation %llu): %llu tensors, %s match their checksums (%s)\n", Printable(name).c_str(),
                static_cast<unsigned long long>(r.generation), static_cast<unsigned long long>(r.tensors),
                HumanBytes(r.bytes).c_str(), Seconds(r.seconds).c_str());
    return 0;
  }
  std::printf("MISMATCH: '%s' (generation %llu): %llu of %llu tensors differ from their checksums:\n",
              Printable(name).c_str(), static_cast<unsigned long long>(r.generation),
              static_cast<unsigned long long>(r.mismatch_count), static_cast<unsigned long long>(r.tensors));
  for (const std::string& t : r.mismatched) std::printf("  %s\n", Printable(t).c_str());
  if (r.mismatch_count > r.mismatched.size()) std::printf("  ...\n");
  return 1;
}

int Status(const Options& o) {
  auto client = Connect(o);
  if (!client.ok()) return Fail(client.status());
  auto status = (*client)->GetStatus();
  if (!status.ok()) return Fail(status.status());
  const ckpt::DaemonStatus& s = *status;
  if (o.json_output) {
    PrintJson(ckpt::protocol::Encode(s));
    return 0;
  }
  std::cout << RenderTable({"FIELD", "VALUE"},
                           {{"version", s.version},
                            {"pid", std::to_string(s.pid)},
                            {"uptime", std::to_string(s.uptime_s) + " s"},
                            {"socket", s.socket},
                            {"shm prefix", s.shm_prefix},
                            {"checkpoints", std::to_string(s.checkpoints)},
                            {"loading", std::to_string(s.loading)},
                            {"shared memory", HumanBytes(s.shm_bytes)},
                            {"attachments", std::to_string(s.attached)},
                            {"connections", std::to_string(s.connections) + " (max " +
                                                std::to_string(s.max_connections) + ", " +
                                                std::to_string(s.max_connections_per_uid) + " per user, " +
                                                std::to_string(s.admin_reserved_connections) + " more for admins)"},
                            {"memory budget", s.memory_budget_bytes == 0 ? std::string("none")
                                                                         : HumanBytes(s.memory_budget_bytes)},
                            {"memory used", HumanBytes(s.memory_used_bytes)},
                            {"your role", s.your_role}});
  // Per generation: current ones, then retired ones still attached.
  std::vector<std::vector<std::string>> rows;
  auto add = [&](const ckpt::CheckpointSummary& c, const char* state) {
    std::string pids;
    for (int64_t p : c.attached_pids) pids += (pids.empty() ? "" : ",") + std::to_string(p);
    rows.push_back({c.name, std::to_string(c.generation), state, HumanBytes(c.segment_bytes),
                    std::to_string(c.attached), pids.empty() ? "-" : pids, Seconds(c.load_seconds),
                    LocalTime(c.loaded_unix_s)});
  };
  for (const auto& c : s.checkpoint_list) add(c, "current");
  for (const auto& c : s.retired) add(c, "retired");
  if (!rows.empty()) {
    std::cout << "\n"
              << RenderTable({"NAME", "GEN", "STATE", "SIZE", "ATTACHED", "PIDS", "LOAD TIME", "LOADED"}, rows,
                             {1, 3, 4});
  }
  return 0;
}

int Metrics(const Options& o) {
  auto client = Connect(o);
  if (!client.ok()) return Fail(client.status());
  auto text = (*client)->Metrics();
  if (!text.ok()) return Fail(text.status());
  if (o.json_output) {
    PrintJson(ckpt::protocol::Encode(ckpt::protocol::MetricsResponse{*text}));
  } else {
    std::cout << *text;  // Prometheus text: label values are escaped by the daemon
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"ckptctl: control the node's checkpoint daemon (ckptd)"};
  app.require_subcommand(1);
  app.add_option("--socket", o.socket, "ckptd control socket ($CKPTD_SOCKET)")->capture_default_str();
  app.add_flag("--json", o.json_output, "print the daemon's JSON instead of tables");

  std::string path, name;
  bool force = false, replace = false, allow_expansion = false;
  double wait_s = 0;
  auto* load = app.add_subcommand("load", "load a checkpoint file into shared memory");
  load->add_option("path", path, "checkpoint file or model folder (safetensors, sharded *.index.json, PyTorch .bin/.pt)")->required();
  load->add_option("--name", name, "name to publish it under (default: file name)");
  load->add_flag("--replace", replace,
                 "publish a new generation under an existing name; clients attached to the old "
                 "one keep it until they detach");
  load->add_flag("--allow-expansion", allow_expansion,
                 "admit a checkpoint whose shared-memory size is far above its file size");
  auto* evict = app.add_subcommand("evict", "remove a checkpoint from shared memory");
  evict->add_option("name", name, "checkpoint name")->required();
  evict->add_flag("--force", force, "evict even while processes are attached (they keep their mapping)");
  evict->add_option("--wait", wait_s, "wait up to this many seconds for attached processes to detach");
  auto* list = app.add_subcommand("list", "list loaded checkpoints");
  auto* info = app.add_subcommand("info", "show a checkpoint's tensors");
  info->add_option("name", name, "checkpoint name")->required();
  auto* status = app.add_subcommand("status", "show the daemon's state, budget and attachments");
  auto* metrics = app.add_subcommand("metrics", "print metrics in the Prometheus text format");
  auto* verify = app.add_subcommand("verify", "re-check a checkpoint's shared memory against its checksums");
  verify->add_option("name", name, "checkpoint name")->required();
  ckpt::ctl::PersistArgs persist_args;
  auto* persist = ckpt::ctl::AddPersistCommand(app, &persist_args, &o.json_output);
  for (auto* sub : {load, evict, list, info, status, metrics, verify}) {
    sub->add_flag("--json", o.json_output, "print the daemon's JSON instead of tables");
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*load) return Load(o, path, name, replace, allow_expansion);
    if (*evict) return Evict(o, name, force, wait_s);
    if (*list) return List(o);
    if (*info) return Info(o, name);
    if (*status) return Status(o);
    if (*metrics) return Metrics(o);
    if (*verify) return Verify(o, name);
    if (*persist) {
      auto bar = std::make_unique<ProgressBar>();
      return ckpt::ctl::RunPersist(
          o.socket, o.json_output, persist_args, [&](uint64_t done, uint64_t total) { bar->Update(done, total); },
          [&] { bar.reset(); });
    }
  } catch (const std::exception& e) {
    return Fail(ckpt::Internal(std::string("ckptctl failed: ") + e.what()));
  }
  return 1;
}
