// ckptctl: the operator's command line for ckptd, written on the public client API
// (include/ckpt/client.h). --json prints the typed responses in their wire encoding
// (src/protocol/messages.cc), and every error as {"ok": false, "code", "message"} on
// stdout; tables and messages escape what came from the daemon. Global options (--socket,
// --json) go before or after the subcommand.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <optional>
#include <utility>
#include <vector>

#include "ckpt/client.h"
#include "client/wire_mapping.h"
#include "common/hex.h"
#include "common/suggest.h"
#include "ctl/persist.h"
#include "ctl/progress_bar.h"
#include "ctl/table.h"
#include "shm/huge_pages.h"
#include "protocol/messages.h"
#include "protocol/wire.h"

namespace {

using ckpt::DidYouMean;
using ckpt::ctl::HumanBytes;
using ckpt::ctl::Printable;
using ckpt::ctl::RenderTable;
using nlohmann::json;

struct Options {
  std::string socket = ckpt::protocol::DefaultSocketPath();
  bool json_output = false;
};

// Set once from the command line, before anything can fail: errors print as JSON.
bool g_json_errors = false;

void PrintJson(const json& j) { std::cout << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n"; }

// Reports an error and returns the exit status: 1, or `exit_status`. With --json it is
// {"ok": false, "code": "<StatusCodeName>", "message": "...", "suggestions": [...]} on
// stdout (nothing on stderr); otherwise one line "ckptctl: <message>" on stderr.
int Fail(const ckpt::Status& status, const std::vector<std::string>& suggestions = {}, int exit_status = 1) {
  if (g_json_errors) {
    json j{{"ok", false}, {"code", ckpt::StatusCodeName(status.code())}, {"message", status.message()}};
    if (!suggestions.empty()) j["suggestions"] = suggestions;
    PrintJson(j);
  } else {
    std::fprintf(stderr, "ckptctl: %s\n", Printable(status.message() + DidYouMean(suggestions)).c_str());
  }
  return exit_status;
}

// Fail for a call about checkpoint `name`. A NotFound's message already names the closest
// names (the client adds them: Client::SimilarNames); --json lists them in "suggestions" too.
int FailForName(ckpt::Client& client, const ckpt::Status& status, const std::string& name) {
  if (status.code() != ckpt::StatusCode::kNotFound || !g_json_errors) return Fail(status);
  return Fail(status, client.SimilarNames(name));  // as JSON: the message stays as it is
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

ckpt::Result<std::unique_ptr<ckpt::Client>> Connect(const Options& o) { return ckpt::Client::Connect(o.socket); }

// "2.0 MiB in 3 generations, 1 write (limits: 8.0 GiB, 256, 32)": what the caller holds.
std::string UsageText(const ckpt::DaemonStatus& s) {
  auto limit = [](uint64_t v, bool bytes) { return v == 0 ? std::string("none") : bytes ? HumanBytes(v) : std::to_string(v); };
  std::string text = "uid " + std::to_string(s.your_uid) + ": " + HumanBytes(s.your_shm_bytes) + " in " +
                     std::to_string(s.your_segments) + " generation(s), " + std::to_string(s.your_writes) + " write(s)";
  if (s.your_role == "admin") return text + " (admins have no per-user limits)";
  return text + " (limits: " + limit(s.max_shm_bytes_per_uid, true) + ", " + limit(s.max_segments_per_uid, false) +
         " generations, " + limit(s.max_writes_per_uid, false) + " writes)";
}

// "alice (uid 1001)", "root (uid 0, admin)", "uid 1001" (no user name).
std::string OwnerText(const ckpt::CheckpointSummary& c) {
  std::string text = c.owner_user.empty() ? "uid " + std::to_string(c.owner_uid)
                                          : Printable(c.owner_user) + " (uid " + std::to_string(c.owner_uid);
  if (c.owner_admin) text += c.owner_user.empty() ? " (admin)" : ", admin";
  if (!c.owner_user.empty()) text += ")";
  return text;
}

std::vector<std::string> CheckpointRow(const ckpt::CheckpointSummary& c) {
  return {c.name,
          std::to_string(c.generation),
          std::to_string(c.tensor_count),
          HumanBytes(c.data_bytes),
          std::to_string(c.attached),
          Seconds(c.load_seconds),
          LocalTime(c.loaded_unix_s),
          OwnerText(c),
          c.source};
}
// "2 MiB, 9.8 GiB of 9.9 GiB on huge pages", "4 KiB", "-" when the daemon did not say.
std::string PagesText(const ckpt::CheckpointSummary& c) {
  if (c.page_bytes == 0) return "-";
  std::string out = ckpt::shm::PageSizeName(c.page_bytes);
  if (c.huge_bytes < 0) return out + (c.page_bytes > 4096 ? " (huge mapping not measured: adopted segment)" : "");
  if (c.page_bytes > 4096 || c.huge_bytes > 0) {
    out += ", " + HumanBytes(static_cast<uint64_t>(c.huge_bytes)) + " of " + HumanBytes(c.segment_bytes) +
           " on huge pages";
  }
  return out;
}
const std::vector<std::string> kCheckpointHeader = {"NAME", "GEN", "TENSORS", "SIZE", "ATTACHED",
                                                    "LOAD TIME", "LOADED", "OWNER", "SOURCE"};

// SIGINT during a load: the first one cancels it (the daemon publishes nothing), a
// second one ends ckptctl at once.
volatile sig_atomic_t g_interrupts = 0;

// What the memory budget evicted to make room for a load, one line (none: nothing).
void PrintEvicted(const std::vector<std::string>& evicted) {
  if (evicted.empty()) return;
  std::string names;
  for (const std::string& n : evicted) names += (names.empty() ? "'" : ", '") + Printable(n) + "'";
  std::printf("evicted to fit the memory budget: %s\n", names.c_str());
}
void OnInterrupt(int) {
  if (++g_interrupts > 1) _exit(130);
}

// While it lives, the first SIGINT asks the running operation to cancel (cancelled()
// turns true) and a second ends ckptctl at once (exit status 130); the previous handler
// is put back when it ends.
class CancelOnSigint {
 public:
  CancelOnSigint() {
    struct sigaction action {};
    action.sa_handler = OnInterrupt;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGINT, &action, &previous_);
  }
  ~CancelOnSigint() { ::sigaction(SIGINT, &previous_, nullptr); }
  CancelOnSigint(const CancelOnSigint&) = delete;
  CancelOnSigint& operator=(const CancelOnSigint&) = delete;
  bool cancelled() const { return g_interrupts > 0; }

 private:
  struct sigaction previous_ {};
};

int Load(const Options& o, const std::string& path, const std::string& name, bool replace, bool allow_expansion) {
  auto client = Connect(o);
  if (!client.ok()) return Fail(client.status());
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  const bool show_progress = !o.json_output;  // a bar on a terminal, plain lines otherwise
  ckpt::LoadOptions options;
  options.name = name;
  options.replace = replace;
  options.allow_expansion = allow_expansion;
  ckpt::Result<ckpt::LoadResult> result = ckpt::Internal("unreached");
  {
    CancelOnSigint sigint;
    ckpt::ctl::ProgressBar bar(STDERR_FILENO, tty);
    // Progress events come about every 100 ms whether or not a bar is drawn: each is a
    // chance to cancel.
    options.progress = [&](uint64_t done, uint64_t total) {
      if (sigint.cancelled()) return false;
      if (show_progress) bar.Update(done, total);
      return true;
    };
    result = (*client)->Load(path, options);
  }
  if (!result.ok()) {
    if (result.status().code() == ckpt::StatusCode::kCancelled) {
      return Fail(ckpt::Cancelled("load cancelled; nothing was published"), {}, 130);
    }
    return Fail(result.status());
  }
  const ckpt::CheckpointSummary& c = result->checkpoint;
  if (o.json_output) {
    PrintJson(ckpt::client::EncodePublic(*result));
  } else {
    const double secs = c.load_seconds;
    std::printf("loaded '%s' (generation %llu): %llu tensors, %s in %s (%s/s)\n", Printable(c.name).c_str(),
                static_cast<unsigned long long>(c.generation), static_cast<unsigned long long>(c.tensor_count),
                HumanBytes(c.data_bytes).c_str(), Seconds(secs).c_str(),
                HumanBytes(static_cast<uint64_t>(c.data_bytes / std::max(secs, 1e-9))).c_str());
    PrintEvicted(result->evicted);
  }
  return 0;
}

// `ckptctl ensure`: a load only when needed, shared with concurrent callers (Client::Ensure).
int Ensure(const Options& o, const std::string& path, const std::string& name, bool allow_expansion) {
  auto client = Connect(o);
  if (!client.ok()) return Fail(client.status());
  ckpt::EnsureOptions options;
  options.name = name;
  options.allow_expansion = allow_expansion;
  ckpt::Result<ckpt::EnsureResult> result = ckpt::Internal("unreached");
  {
    CancelOnSigint sigint;
    ckpt::ctl::ProgressBar bar(STDERR_FILENO, ::isatty(STDERR_FILENO) != 0);
    options.progress = [&](uint64_t done, uint64_t total) {
      if (sigint.cancelled()) return false;
      if (!o.json_output) bar.Update(done, total);
      return true;
    };
    result = (*client)->Ensure(path, options);
  }
  if (!result.ok()) {
    if (result.status().code() == ckpt::StatusCode::kCancelled) {
      return Fail(ckpt::Cancelled("ensure cancelled (a load other callers wait for goes on for them)"), {}, 130);
    }
    return Fail(result.status());
  }
  if (o.json_output) {
    PrintJson(ckpt::client::EncodePublic(*result));
    return 0;
  }
  const ckpt::CheckpointSummary& c = result->checkpoint;
  const char* what = result->action == "current"    ? "already loaded, source unchanged"
                     : result->action == "reloaded" ? "source changed: loaded a new generation"
                     : result->action == "joined"   ? "loaded by a concurrent caller"
                                                    : "loaded";
  std::printf("ensured '%s' (generation %llu): %s; %llu tensors, %s\n", Printable(c.name).c_str(),
              static_cast<unsigned long long>(c.generation), what, static_cast<unsigned long long>(c.tensor_count),
              HumanBytes(c.data_bytes).c_str());
  PrintEvicted(result->evicted);
  return 0;
}

int Evict(const Options& o, const std::string& name, bool force, double wait_s) {
  auto client = Connect(o);
  if (!client.ok()) return Fail(client.status());
  ckpt::EvictOptions options;
  options.force = force;
  options.wait_s = wait_s;
  auto evicted = (*client)->Evict(name, options);
  if (!evicted.ok()) return FailForName(**client, evicted.status(), name);
  if (o.json_output) {
    PrintJson(ckpt::protocol::Encode(ckpt::protocol::CheckpointResponse{ckpt::client::ToWire(*evicted)}));
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
    PrintJson(ckpt::client::EncodePublic(*list));
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& c : list->checkpoints) rows.push_back(CheckpointRow(c));
  for (const auto& n : list->loading) rows.push_back({n, "-", "-", "-", "-", "loading", "-", "-", "-"});
  std::cout << RenderTable(kCheckpointHeader, rows, {1, 2, 3, 4, 5});
  return 0;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (int64_t d : shape) text += (text.size() > 1 ? ", " : "") + std::to_string(d);
  return text + "]";
}

// Whether config.json was stored (plan "auto" and ckpt.transformers.load_model read it),
// then the other side files, one line each: "config.json: stored (612 B)\nother side files: ...".
std::string SideFilesText(const std::vector<ckpt::SideFileInfo>& sides) {
  std::string config = "config.json: not stored (plan \"auto\" and ckpt.transformers.load_model then need config=; "
                       "loading the model's folder keeps it)";
  std::string others;
  for (const ckpt::SideFileInfo& side : sides) {
    const std::string sized = side.name + " (" + HumanBytes(side.bytes) + ")";
    if (side.name == "config.json") config = "config.json: stored (" + HumanBytes(side.bytes) + ")";
    else others += (others.empty() ? "" : ", ") + sized;
  }
  return Printable(config) + "\n" + (others.empty() ? "" : "other side files: " + Printable(others) + "\n");
}

int Info(const Options& o, const std::string& name) {
  auto client = Connect(o);
  if (!client.ok()) return Fail(client.status());
  auto info = (*client)->GetInfo(name);
  if (!info.ok()) return FailForName(**client, info.status(), name);
  if (o.json_output) {
    PrintJson(ckpt::client::EncodePublic(*info));
    return 0;
  }
  std::cout << RenderTable(kCheckpointHeader, {CheckpointRow(info->checkpoint)}, {1, 2, 3, 4, 5}) << "\n";
  std::cout << "pages: " << PagesText(info->checkpoint) << "\n";
  std::cout << "owner: " << OwnerText(info->checkpoint)
            << " (only the owner or an admin may replace or evict it)\n";
  std::cout << SideFilesText(info->side_files) << "\n";
  std::vector<std::vector<std::string>> rows;
  for (const ckpt::TensorInfo& t : info->tensors) {
    rows.push_back({t.name, ckpt::DTypeName(t.dtype), ShapeText(t.shape), HumanBytes(t.nbytes), ckpt::Hex64(t.checksum)});
  }
  std::cout << RenderTable({"TENSOR", "DTYPE", "SHAPE", "SIZE", "XXH3"}, rows, {3});
  return 0;
}

// Exit status 0 when every tensor matches its checksum, 1 on a mismatch or an error.
int Verify(const Options& o, const std::string& name) {
  auto client = Connect(o);
  if (!client.ok()) return Fail(client.status());
  auto result = (*client)->Verify(name);
  if (!result.ok()) return FailForName(**client, result.status(), name);
  const ckpt::VerifyResult& r = *result;
  if (o.json_output) {
    PrintJson(ckpt::client::EncodePublic(r));
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
    PrintJson(ckpt::client::EncodePublic(s));
    return 0;
  }
  std::cout << RenderTable({"FIELD", "VALUE"},
                           {{"version", s.version},
                            {"pid", std::to_string(s.pid)},
                            {"uptime", std::to_string(s.uptime_s) + " s"},
                            {"socket", s.socket},
                            {"shm prefix", s.shm_prefix},
                            {"segment dir", s.segment_dir.empty() ? "-" : s.segment_dir},
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
                            {"segment pages", s.segment_pages.empty() ? "-" : s.segment_pages},
                            {"your role", s.your_role},
                            {"your usage", UsageText(s)}});
  // Per generation: current ones, then retired ones still attached.
  std::vector<std::vector<std::string>> rows;
  auto add = [&](const ckpt::CheckpointSummary& c, const char* state) {
    std::string pids;
    for (int64_t p : c.attached_pids) pids += (pids.empty() ? "" : ",") + std::to_string(p);
    rows.push_back({c.name, std::to_string(c.generation), state, HumanBytes(c.segment_bytes),
                    std::to_string(c.attached), pids.empty() ? "-" : pids, Seconds(c.load_seconds),
                    LocalTime(c.loaded_unix_s), PagesText(c)});
  };
  for (const auto& c : s.checkpoint_list) add(c, "current");
  for (const auto& c : s.retired) add(c, "retired");
  if (!rows.empty()) {
    std::cout << "\n"
              << RenderTable({"NAME", "GEN", "STATE", "SIZE", "ATTACHED", "PIDS", "LOAD TIME", "LOADED", "PAGES"}, rows,
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

// The subcommand word of a command line: the first argument that is neither an option nor
// the value of --socket; "" if none (or only after "--").
std::string SubcommandWord(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") return "";
    if (a == "--socket") {
      ++i;
      continue;
    }
    if (!a.empty() && a[0] == '-') continue;
    return a;
  }
  return "";
}

// The subcommands and what their arguments set.
struct Commands {
  CLI::App *load = nullptr, *ensure = nullptr, *evict = nullptr, *list = nullptr, *info = nullptr,
           *status = nullptr, *metrics = nullptr, *verify = nullptr, *persist = nullptr;
  std::string path, name;
  bool force = false, replace = false, allow_expansion = false;
  double wait_s = 0;
  ckpt::ctl::PersistArgs persist_args;
};

// Adds every subcommand to `app`, their arguments stored in `c` (which must outlive app).
void AddCommands(CLI::App& app, Commands& c) {
  c.load = app.add_subcommand("load", "load a checkpoint file into shared memory");
  c.load->add_option("path", c.path, "checkpoint file or model folder (safetensors, sharded *.index.json, PyTorch .bin/.pt)")->required();
  c.load->add_option("--name", c.name, "name to publish it under (default: file name)");
  c.load->add_flag("--replace", c.replace,
                   "publish a new generation under an existing name; clients attached to the old "
                   "one keep it until they detach");
  c.load->add_flag("--allow-expansion", c.allow_expansion,
                   "admit a checkpoint whose shared-memory size is far above its file size");
  c.ensure = app.add_subcommand(
      "ensure", "load a checkpoint unless it is loaded from that path and unchanged (safe from many ranks at once)");
  c.ensure->add_option("path", c.path, "checkpoint file or model folder")->required();
  c.ensure->add_option("--name", c.name, "name to publish it under (default: file name)");
  c.ensure->add_flag("--allow-expansion", c.allow_expansion,
                     "admit a checkpoint whose shared-memory size is far above its file size");
  c.evict = app.add_subcommand("evict", "remove a checkpoint from shared memory");
  c.evict->add_option("name", c.name, "checkpoint name")->required();
  c.evict->add_flag("--force", c.force, "evict even while processes are attached (they keep their mapping)");
  c.evict->add_option("--wait", c.wait_s, "wait up to this many seconds for attached processes to detach");
  c.list = app.add_subcommand("list", "list loaded checkpoints");
  c.info = app.add_subcommand("info", "show a checkpoint's tensors");
  c.info->add_option("name", c.name, "checkpoint name")->required();
  c.status = app.add_subcommand("status", "show the daemon's state, budget and attachments");
  c.metrics = app.add_subcommand("metrics", "print metrics in the Prometheus text format");
  c.verify = app.add_subcommand("verify", "re-check a checkpoint's shared memory against its checksums");
  c.verify->add_option("name", c.name, "checkpoint name")->required();
  c.persist = ckpt::ctl::AddPersistCommand(app, &c.persist_args);
}

// An unknown subcommand gets the known ones closest to it (CLI11 would only say that an
// argument was not expected): the exit status, or nothing when the word is known.
std::optional<int> RefuseUnknownCommand(const Commands& c, int argc, char** argv) {
  if (const std::string word = SubcommandWord(argc, argv); !word.empty()) {
    std::vector<std::string> known;
    for (const CLI::App* sub : {c.load, c.ensure, c.evict, c.list, c.info, c.status, c.metrics, c.verify, c.persist}) {
      known.push_back(sub->get_name());
    }
    if (std::find(known.begin(), known.end(), word) == known.end()) {
      return Fail(ckpt::InvalidArgument("unknown command '" + word + "'; run ckptctl --help for the commands"),
                  ckpt::Suggest(word, known), static_cast<int>(CLI::ExitCodes::ExtrasError));
    }
  }
  return std::nullopt;
}

// Runs the subcommand that was parsed; its exit status.
int RunCommand(const Options& o, Commands& c) {
  if (*c.load) return Load(o, c.path, c.name, c.replace, c.allow_expansion);
  if (*c.ensure) return Ensure(o, c.path, c.name, c.allow_expansion);
  if (*c.evict) return Evict(o, c.name, c.force, c.wait_s);
  if (*c.list) return List(o);
  if (*c.info) return Info(o, c.name);
  if (*c.status) return Status(o);
  if (*c.metrics) return Metrics(o);
  if (*c.verify) return Verify(o, c.name);
  if (*c.persist) {
    auto bar = std::make_unique<ckpt::ctl::ProgressBar>(STDERR_FILENO, ::isatty(STDERR_FILENO) != 0);
    auto sigint = std::make_unique<CancelOnSigint>();
    return ckpt::ctl::RunPersist(
        o.socket, o.json_output, c.persist_args, [&](uint64_t done, uint64_t total) { bar->Update(done, total); },
        [&] {
          if (bar) bar->Finish();
          bar.reset();
          sigint.reset();  // the persist is over: Ctrl-C is plain again
        },
        [](const ckpt::Status& s) { return Fail(s); }, [&] { return sigint && sigint->cancelled(); });
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Known before parsing, so that even a usage error prints as JSON.
  for (int i = 1; i < argc && std::string(argv[i]) != "--"; ++i) {
    if (std::string(argv[i]) == "--json") g_json_errors = true;
  }
  Options o;
  CLI::App app{"ckptctl: control the node's checkpoint daemon (ckptd)"};
  app.require_subcommand(1);
  // Global options may follow the subcommand: what a subcommand does not know falls
  // through to these.
  app.fallthrough();
  app.add_option("--socket", o.socket, "ckptd control socket ($CKPTD_SOCKET)")->capture_default_str();
  app.add_flag("--json", o.json_output,
               "print the daemon's JSON instead of tables, and errors as {\"ok\": false, \"code\", \"message\"} on stdout");
  // The project's version (CMake's project(VERSION), as ckptd --version prints it).
  app.add_flag_callback("--version", [] {
    std::printf("ckptctl %s\n", CKPT_VERSION);
    std::exit(0);
  }, "print the version and exit");

  Commands c;
  AddCommands(app, c);
  if (std::optional<int> refused = RefuseUnknownCommand(c, argc, argv)) return *refused;

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (!g_json_errors || e.get_exit_code() == 0) return app.exit(e);  // --help prints as usual
    return Fail(ckpt::InvalidArgument(e.what()), {}, e.get_exit_code());
  }
  try {
    return RunCommand(o, c);
  } catch (const std::exception& e) {
    return Fail(ckpt::Internal(std::string("ckptctl failed: ") + e.what()));
  }
}
