// ckptctl: the operator's command line for ckptd.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <utility>
#include <vector>

#include "protocol/daemon_connection.h"
#include "protocol/wire.h"
#include "ctl/table.h"

namespace {

using ckpt::ctl::HumanBytes;
using ckpt::ctl::RenderTable;
using nlohmann::json;

struct Options {
  std::string socket = ckpt::protocol::DefaultSocketPath();
  bool json_output = false;
  bool allow_expansion = false;  // load: "allow_expansion": true (admin)
};

int Fail(const ckpt::Status& status) {
  std::fprintf(stderr, "ckptctl: %s\n", status.message().c_str());
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

ckpt::Result<json> Call(const Options& o, const std::string& op, json fields = json::object(),
                        const std::function<void(const json&)>& on_event = nullptr) {
  CKPT_ASSIGN_OR_RETURN(auto connection, ckpt::protocol::DaemonConnection::Open(o.socket));
  return connection->Call(op, std::move(fields), on_event);
}

void PrintJson(const json& j) { std::cout << j.dump(2) << "\n"; }

std::vector<std::string> CheckpointRow(const json& c) {
  return {c.at("name").get<std::string>(),
          std::to_string(c.at("generation").get<uint64_t>()),
          std::to_string(c.at("tensor_count").get<uint64_t>()),
          HumanBytes(c.at("data_bytes").get<uint64_t>()),
          std::to_string(c.at("attached").get<uint32_t>()),
          Seconds(c.at("load_seconds").get<double>()),
          LocalTime(c.at("loaded_unix_s").get<int64_t>()),
          c.at("source").get<std::string>()};
}
const std::vector<std::string> kCheckpointHeader = {"NAME", "GEN", "TENSORS", "SIZE", "ATTACHED",
                                                    "LOAD TIME", "LOADED", "SOURCE"};

int Load(const Options& o, const std::string& path, const std::string& name, bool replace) {
  std::string absolute = path;
  if (!path.empty() && path[0] != '/') {
    char cwd[4096];
    if (::getcwd(cwd, sizeof(cwd)) != nullptr) absolute = std::string(cwd) + "/" + path;
  }
  const bool show_progress = !o.json_output && ::isatty(STDERR_FILENO);
  json fields{{"path", absolute}, {"progress", show_progress}};
  if (!name.empty()) fields["name"] = name;
  if (replace) fields["replace"] = true;
  if (o.allow_expansion) fields["allow_expansion"] = true;
  ckpt::Result<json> response = ckpt::Internal("unreached");
  {
    ProgressBar bar;
    response = Call(o, "load", fields, [&](const json& e) {
      bar.Update(e.value("done", uint64_t{0}), e.value("total", uint64_t{0}));
    });
  }
  if (!response.ok()) return Fail(response.status());
  const json& c = response->at("checkpoint");
  if (o.json_output) {
    PrintJson(*response);
  } else {
    const double secs = c.at("load_seconds").get<double>();
    const uint64_t bytes = c.at("data_bytes").get<uint64_t>();
    std::printf("loaded '%s' (generation %llu): %llu tensors, %s in %s (%s/s)\n",
                c.at("name").get<std::string>().c_str(),
                static_cast<unsigned long long>(c.at("generation").get<uint64_t>()),
                static_cast<unsigned long long>(c.at("tensor_count").get<uint64_t>()), HumanBytes(bytes).c_str(),
                Seconds(secs).c_str(), HumanBytes(static_cast<uint64_t>(bytes / std::max(secs, 1e-9))).c_str());
  }
  return 0;
}

int Evict(const Options& o, const std::string& name, bool force, double wait_s) {
  json fields{{"name", name}, {"force", force}};
  if (wait_s > 0) fields["wait_s"] = wait_s;
  auto response = Call(o, "evict", fields);
  if (!response.ok()) return Fail(response.status());
  if (o.json_output) {
    PrintJson(*response);
  } else {
    std::printf("evicted '%s'\n", name.c_str());
  }
  return 0;
}

int List(const Options& o) {
  auto response = Call(o, "list");
  if (!response.ok()) return Fail(response.status());
  if (o.json_output) {
    PrintJson(*response);
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const json& c : response->at("checkpoints")) rows.push_back(CheckpointRow(c));
  for (const json& n : response->at("loading")) rows.push_back({n.get<std::string>(), "-", "-", "-", "-", "loading", "-", "-"});
  std::cout << RenderTable(kCheckpointHeader, rows, {1, 2, 3, 4, 5});
  return 0;
}

int Info(const Options& o, const std::string& name) {
  auto response = Call(o, "info", json{{"name", name}});
  if (!response.ok()) return Fail(response.status());
  if (o.json_output) {
    PrintJson(*response);
    return 0;
  }
  std::cout << RenderTable(kCheckpointHeader, {CheckpointRow(response->at("checkpoint"))}, {1, 2, 3, 4, 5}) << "\n";
  std::vector<std::vector<std::string>> rows;
  for (const json& t : response->at("tensors")) {
    std::string shape = "[";
    for (const json& d : t.at("shape")) shape += (shape.size() > 1 ? ", " : "") + std::to_string(d.get<int64_t>());
    rows.push_back({t.at("name").get<std::string>(), t.at("dtype").get<std::string>(), shape + "]",
                    HumanBytes(t.at("nbytes").get<uint64_t>()), t.at("checksum").get<std::string>()});
  }
  std::cout << RenderTable({"TENSOR", "DTYPE", "SHAPE", "SIZE", "XXH3"}, rows, {3});
  return 0;
}

// Exit status 0 when every tensor matches its checksum, 1 on a mismatch or an error.
int Verify(const Options& o, const std::string& name) {
  auto response = Call(o, "verify", json{{"name", name}});
  if (!response.ok()) return Fail(response.status());
  const json& r = *response;
  const bool ok = r.at("passed").get<bool>();
  if (o.json_output) {
    PrintJson(r);
    return ok ? 0 : 1;
  }
  if (ok) {
    std::printf("OK: '%s' (generation %llu): %llu tensors, %s match their checksums (%s)\n", name.c_str(),
                static_cast<unsigned long long>(r.at("generation").get<uint64_t>()),
                static_cast<unsigned long long>(r.at("tensors").get<uint64_t>()),
                HumanBytes(r.at("bytes").get<uint64_t>()).c_str(), Seconds(r.at("seconds").get<double>()).c_str());
    return 0;
  }
  std::printf("MISMATCH: '%s' (generation %llu): %llu of %llu tensors differ from their checksums:\n", name.c_str(),
              static_cast<unsigned long long>(r.at("generation").get<uint64_t>()),
              static_cast<unsigned long long>(r.at("mismatch_count").get<uint64_t>()),
              static_cast<unsigned long long>(r.at("tensors").get<uint64_t>()));
  for (const json& t : r.at("mismatched")) std::printf("  %s\n", t.get<std::string>().c_str());
  if (r.at("mismatch_count").get<uint64_t>() > r.at("mismatched").size()) std::printf("  ...\n");
  return 1;
}

int Status(const Options& o) {
  auto response = Call(o, "status");
  if (!response.ok()) return Fail(response.status());
  if (o.json_output) {
    PrintJson(*response);
    return 0;
  }
  const json& s = *response;
  std::cout << RenderTable({"FIELD", "VALUE"},
                           {{"version", s.at("version").get<std::string>()},
                            {"pid", std::to_string(s.at("pid").get<int64_t>())},
                            {"uptime", std::to_string(s.at("uptime_s").get<int64_t>()) + " s"},
                            {"socket", s.at("socket").get<std::string>()},
                            {"shm prefix", s.at("shm_prefix").get<std::string>()},
                            {"checkpoints", std::to_string(s.at("checkpoints").get<uint64_t>())},
                            {"loading", std::to_string(s.at("loading").get<uint64_t>())},
                            {"shared memory", HumanBytes(s.at("shm_bytes").get<uint64_t>())},
                            {"attachments", std::to_string(s.at("attached").get<uint64_t>())},
                            {"connections", std::to_string(s.at("connections").get<int64_t>())},
                            {"memory budget", s.value("memory_budget_bytes", uint64_t{0}) == 0
                                                  ? std::string("none")
                                                  : HumanBytes(s.value("memory_budget_bytes", uint64_t{0}))},
                            {"memory used", HumanBytes(s.value("memory_used_bytes", uint64_t{0}))},
                            {"your role", s.value("your_role", std::string("?"))}});
  // Per generation: current ones, then retired ones still attached.
  std::vector<std::vector<std::string>> rows;
  auto add = [&](const json& c, const char* state) {
    std::string pids;
    for (const json& p : c.value("attached_pids", json::array())) {
      pids += (pids.empty() ? "" : ",") + std::to_string(p.get<int64_t>());
    }
    rows.push_back({c.at("name").get<std::string>(), std::to_string(c.at("generation").get<uint64_t>()), state,
                    HumanBytes(c.at("segment_bytes").get<uint64_t>()), std::to_string(c.at("attached").get<uint32_t>()),
                    pids.empty() ? "-" : pids, Seconds(c.at("load_seconds").get<double>()),
                    LocalTime(c.at("loaded_unix_s").get<int64_t>())});
  };
  for (const json& c : s.value("checkpoint_list", json::array())) add(c, "current");
  for (const json& c : s.value("retired", json::array())) add(c, "retired");
  if (!rows.empty()) {
    std::cout << "\n"
              << RenderTable({"NAME", "GEN", "STATE", "SIZE", "ATTACHED", "PIDS", "LOAD TIME", "LOADED"}, rows,
                             {1, 3, 4});
  }
  return 0;
}

int Metrics(const Options& o) {
  auto response = Call(o, "metrics");
  if (!response.ok()) return Fail(response.status());
  if (o.json_output) {
    PrintJson(*response);
  } else {
    std::cout << response->at("text").get<std::string>();
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
  bool force = false, replace = false;
  double wait_s = 0;
  auto* load = app.add_subcommand("load", "load a checkpoint file into shared memory");
  load->add_option("path", path, "checkpoint file or model folder (safetensors, sharded *.index.json, PyTorch .bin/.pt)")->required();
  load->add_option("--name", name, "name to publish it under (default: file name)");
  load->add_flag("--replace", replace,
                 "publish a new generation under an existing name; clients attached to the old "
                 "one keep it until they detach");
  load->add_flag("--allow-expansion", o.allow_expansion,
                 "load even if it needs far more shared memory than the files' size (ckptd --max-expansion)");
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
  for (auto* sub : {load, evict, list, info, status, metrics, verify}) {
    sub->add_flag("--json", o.json_output, "print the daemon's JSON instead of tables");
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*load) return Load(o, path, name, replace);
    if (*evict) return Evict(o, name, force, wait_s);
    if (*list) return List(o);
    if (*info) return Info(o, name);
    if (*status) return Status(o);
    if (*metrics) return Metrics(o);
    if (*verify) return Verify(o, name);
  } catch (const json::exception& e) {
    return Fail(ckpt::Corrupt(std::string("malformed response from ckptd: ") + e.what()));
  }
  return 1;
}
