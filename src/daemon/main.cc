// ckptd: the per-node checkpoint daemon. See README.md and docs/.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>
#include <systemd/sd-daemon.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <system_error>
#include <thread>

#include "ckpt/byte_size.h"
#include "daemon/server.h"
#include "remote/remote_url.h"
#include "daemon/service_checks.h"

namespace {
// The configuration file read when --config is not given: $CKPTD_CONFIG when set and not
// empty (test harnesses and containers point it at their own file), else the installed
// one. secure_getenv: a set-user-ID ckptd never takes it from its caller.
std::string DefaultConfigPath() {
  const char* env = secure_getenv("CKPTD_CONFIG");
  return env != nullptr && *env != '\0' ? env : CKPTD_DEFAULT_CONFIG;
}

// A size option's bytes (ckpt::ParseByteSize: 64G and 64GiB are 64 * 2^30, 64GB is
// 64 * 10^9); not given (empty): 0.
ckpt::Result<uint64_t> ParseBytes(const std::string& text) {
  if (text.empty()) return uint64_t{0};
  return ckpt::ParseByteSize(text);
}

// What the command line and the configuration file set: the server's options and the
// texts parsed after CLI11 (modes, sizes, the log level).
struct CommandLine {
  ckpt::daemon::ServerOptions options;
  std::string log_level = "info";
  std::string socket_mode = "0660", shm_mode = "0640";
  std::string memory_budget;
  std::string shm_bytes_per_uid;
  std::string metrics_file_mode = "0644";
  std::string remote_chunk = "8MiB";
};

// The options of the socket, the segments, the loads and the connections.
void AddServiceOptions(CLI::App& app, CommandLine& cl) {
  app.add_option("--socket", cl.options.socket_path, "control socket path")->capture_default_str();
  app.add_option("--shm-prefix", cl.options.shm_prefix,
                 "without segment-dir, segments live in /dev/shm/<prefix>.<random>, a directory named in the state "
                 "directory")
      ->capture_default_str();
  app.add_option("--segment-dir", cl.options.segment_dir,
                 "directory for the segments, in a place only root or ckptd can create names (every parent "
                 "owned by root or ckptd, not writable by others), ideally a tmpfs of its own mounted with "
                 "huge=within_size (the unit mounts /run/ckptd-segments); created if missing and ckptd may, "
                 "else /dev/shm/<prefix>.<random> is used (default: that)");
  app.add_option("--state-dir", cl.options.state_dir,
                 "directory for the daemon's state (the generation high-water mark); systemd's StateDirectory=")
      ->capture_default_str();
  app.add_option("--socket-mode", cl.socket_mode, "permission bits of the socket (octal)")->capture_default_str();
  app.add_option("--shm-mode", cl.shm_mode, "permission bits of segments (octal)")->capture_default_str();
  app.add_option("--load-threads", cl.options.load_threads, "reader threads per load")->capture_default_str();
  app.add_option("--max-connections", cl.options.max_connections, "concurrent client connections")
      ->capture_default_str();
  app.add_option("--max-connections-per-uid", cl.options.max_connections_per_uid,
                 "concurrent connections one user may hold")
      ->capture_default_str();
  app.add_option("--admin-reserved-connections", cl.options.admin_reserved_connections,
                 "extra connections kept for root and the admin group when the others are taken")
      ->capture_default_str();
  app.add_option("--frame-timeout", cl.options.frame_timeout_s,
                 "seconds a request frame may take to arrive whole (and a response to be taken)")
      ->capture_default_str();
  app.add_option("--idle-timeout", cl.options.idle_timeout_s,
                 "seconds after which a connection without an attachment that sends nothing is closed")
      ->capture_default_str();
  app.add_option("--rendezvous-per-uid", cl.options.rendezvous_per_uid, "live rendezvous jobs one user may hold")
      ->capture_default_str();
  app.add_flag("--cleanup-on-exit", cl.options.cleanup_on_exit,
               "unlink every segment on shutdown instead of leaving it for the next start");
  app.add_option("--log-level", cl.log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->capture_default_str();
}

// The options of the budget and quotas, the model roots, the roles and the metrics.
void AddLimitOptions(CLI::App& app, CommandLine& cl) {
  app.add_option("--memory-budget", cl.memory_budget,
                 "shared memory all checkpoints may use, e.g. 64G or 64GiB (2^30 bytes each; 64GB is 64 * 10^9) "
                 "(default: no budget); a load "
                 "that does not fit evicts the least recently used unattached checkpoints or fails");
  app.add_option("--max-shm-bytes-per-uid", cl.shm_bytes_per_uid,
                 "shared memory one user without the admin role may hold (published, retired and being written), "
                 "e.g. 16G; 0: no limit (default: half the memory budget, no limit without a budget)");
  app.add_option("--max-segments-per-uid", cl.options.max_segments_per_uid,
                 "generations one user without the admin role may hold; 0: no limit")
      ->capture_default_str();
  app.add_option("--max-writes-per-uid", cl.options.max_writes_per_uid,
                 "concurrent writes one user without the admin role may have in progress; 0: no limit")
      ->capture_default_str();
  app.add_option("--write-idle-timeout", cl.options.write_idle_timeout_s,
                 "seconds a write may go without any of its parts sending a frame before it fails and frees its memory")
      ->capture_default_str();
  app.add_option("--model-root", cl.options.model_roots,
                 "directory loads may come from (repeatable; default: any path)");
  app.add_option("--max-expansion", cl.options.max_expansion,
                 "refuse a load that needs more than this many bytes of shared memory per byte of file "
                 "(and 64 MiB beyond it) unless the request allows it (ckptctl load --allow-expansion); 0: no limit")
      ->capture_default_str();
  app.add_option("--admin-group", cl.options.admin_group, "group allowed to load and evict (besides root)");
  app.add_option("--writer-group", cl.options.writer_group,
                 "group allowed to publish checkpoints from processes (write; besides root and the admin group)");
  app.add_option("--reader-group", cl.options.reader_group,
                 "group allowed to attach, list, info, status (default: anyone who can connect)");
  app.add_option("--metrics-file", cl.options.metrics_file,
                 "write metrics (Prometheus text) to this file periodically, e.g. for node-exporter's textfile collector");
  app.add_option("--metrics-interval", cl.options.metrics_interval_s, "seconds between metrics-file writes")
      ->capture_default_str();
  app.add_option("--metrics-file-mode", cl.metrics_file_mode, "permission bits of the metrics file (octal)")
      ->capture_default_str();
  app.add_option("--metrics-file-group", cl.options.metrics_file_group,
                 "group of the metrics file (default: the daemon's; ckptd must be a member)");
}

// The options of remote sources (docs/remote-sources.md). Credentials are not options:
// the daemon's environment, its shared files and systemd credentials.
void AddRemoteOptions(CLI::App& app, CommandLine& cl) {
  ckpt::remote::RemoteOptions& r = cl.options.remote;
  app.add_option("--remote-allow", r.allow,
                 "remote source prefix loads may fetch, e.g. s3://bucket/models/ or https://mirror.example/ "
                 "(repeatable; default: none, remote loads refused)");
  app.add_option("--remote-endpoint", r.s3_endpoint,
                 "S3 endpoint URL, e.g. http://127.0.0.1:9000 (default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, "
                 "the profile's endpoint_url, else AWS)");
  app.add_option("--remote-region", r.region, "S3 region (default: $AWS_REGION, $AWS_DEFAULT_REGION, the profile's, us-east-1)");
  app.add_flag("--remote-path-style", r.path_style, "S3 path-style requests (endpoint/bucket/key), for S3-compatible servers");
  app.add_option("--remote-credentials-file", r.credentials_file,
                 "AWS shared credentials file (default: $AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials)");
  app.add_option("--remote-config-file", r.config_file, "AWS config file (default: $AWS_CONFIG_FILE, else ~/.aws/config)");
  app.add_option("--remote-profile", r.profile, "AWS profile (default: $AWS_PROFILE, else default)");
  app.add_option("--remote-ca-file", r.ca_file,
                 "CA bundle for TLS to remote sources (default: $AWS_CA_BUNDLE, $CURL_CA_BUNDLE, else the system's)");
  app.add_option("--remote-connections", r.connections, "ranged GETs in flight per remote load")->capture_default_str();
  app.add_option("--remote-threads", r.threads, "threads driving a remote load's transfers")->capture_default_str();
  app.add_option("--remote-chunk", cl.remote_chunk, "longest ranged GET, e.g. 8MiB (at least 1MiB)")->capture_default_str();
  app.add_option("--remote-attempts", r.max_attempts, "tries of one range before the load fails")->capture_default_str();
  app.add_option("--remote-retry-base", r.retry_base_s, "seconds before the first retry (doubling after)")->capture_default_str();
  app.add_option("--remote-retry-max", r.retry_max_s, "longest pause between retries, seconds")->capture_default_str();
  app.add_option("--remote-timeout", r.timeout_s, "seconds after which a remote load starts no more retries")
      ->capture_default_str();
  app.add_option("--remote-connect-timeout", r.connect_timeout_s, "seconds to connect")->capture_default_str();
  app.add_option("--remote-stall-timeout", r.stall_timeout_s,
                 "seconds a transfer may stay below 1 KiB/s before it is cut and retried")->capture_default_str();
}

// Parses argv and the configuration file into `cl`; an exit status when ckptd must stop
// here (--help, --version exit inside; a configuration error is reported: ReportConfigError).
std::optional<int> ParseCommandLine(CLI::App& app, CommandLine& cl, int argc, char** argv) {
  AddServiceOptions(app, cl);
  AddLimitOptions(app, cl);
  AddRemoteOptions(app, cl);
  app.set_config("--config", DefaultConfigPath(),
                 "configuration file (TOML/INI: key = value with the long option names); "
                 "command-line flags win over it (default: $CKPTD_CONFIG, else " CKPTD_DEFAULT_CONFIG ")");
  app.add_flag_callback("--version", [] {
    std::printf("ckptd %s\n", CKPT_VERSION);
    std::exit(0);
  }, "print the version")->configurable(false);
  // Keys the configuration file names but ckptd does not know are errors, not ignored.
  app.allow_config_extras(CLI::config_extras_mode::error);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    return ckpt::daemon::ReportConfigError(ckpt::daemon::DescribeParseError(app, e));
  }

  // A default file is optional (a node may run on flags alone), but one that $CKPTD_CONFIG
  // names was meant to be read: its absence is an error, not an empty configuration.
  if (const char* env = secure_getenv("CKPTD_CONFIG");
      env != nullptr && *env != '\0' && app.get_config_ptr()->count() == 0 && ::access(env, F_OK) != 0) {
    return ckpt::daemon::ReportConfigError(std::string("CKPTD_CONFIG names ") + env +
                                           ", which does not exist: create it or unset CKPTD_CONFIG");
  }

  return std::nullopt;
}

// Sets up logging and turns cl's texts into cl.options (modes, budget, per-uid bytes),
// then checks the whole configuration; an exit status when it is wrong.
std::optional<int> ApplyCommandLine(CommandLine& cl) {
  auto logger = spdlog::stderr_color_mt("ckptd");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(cl.log_level));
  auto socket_bits = ckpt::daemon::ParseModeBits("socket-mode", cl.socket_mode);
  auto shm_bits = ckpt::daemon::ParseModeBits("shm-mode", cl.shm_mode);
  auto metrics_bits = ckpt::daemon::ParseModeBits("metrics-file-mode", cl.metrics_file_mode);
  for (const auto* bits : {&socket_bits, &shm_bits, &metrics_bits}) {
    if (!bits->ok()) return ckpt::daemon::ReportConfigError(bits->status().message());
  }
  cl.options.socket_mode = *socket_bits;
  cl.options.shm_mode = *shm_bits;
  cl.options.metrics_file_mode = *metrics_bits;
  auto budget = ParseBytes(cl.memory_budget);
  if (!budget.ok()) {
    return ckpt::daemon::ReportConfigError("memory-budget: " + budget.status().message());
  }
  cl.options.memory_budget_bytes = *budget;
  auto per_uid = ParseBytes(cl.shm_bytes_per_uid);
  if (!per_uid.ok()) return ckpt::daemon::ReportConfigError("max-shm-bytes-per-uid: " + per_uid.status().message());
  cl.options.max_shm_bytes_per_uid = cl.shm_bytes_per_uid.empty() ? cl.options.memory_budget_bytes / 2 : *per_uid;
  auto chunk = ParseBytes(cl.remote_chunk);
  if (!chunk.ok() || *chunk < (1u << 20)) {
    return ckpt::daemon::ReportConfigError("remote-chunk: " + (chunk.ok() ? std::string("less than 1MiB") : chunk.status().message()));
  }
  cl.options.remote.chunk_bytes = *chunk;
  if (cl.options.remote.connections < 1 || cl.options.remote.threads < 1 || cl.options.remote.max_attempts < 1) {
    return ckpt::daemon::ReportConfigError("remote-connections, remote-threads and remote-attempts must be at least 1");
  }
  for (const std::string& prefix : cl.options.remote.allow) {
    if (prefix.empty()) return ckpt::daemon::ReportConfigError("remote-allow: an empty prefix");
    auto url = ckpt::remote::ParseRemoteUrl(prefix.back() == '/' ? prefix + "x" : prefix);
    if (!url.ok()) return ckpt::daemon::ReportConfigError("remote-allow " + prefix + ": " + url.status().message());
  }
  if (ckpt::Status checked = ckpt::daemon::CheckServiceConfig(cl.options); !checked.ok()) {
    return ckpt::daemon::ReportConfigError(checked.message());
  }
  return std::nullopt;
}

// One descriptor per connection and per checkpoint: take the hard limit.
void RaiseFileLimit() {
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &nofile);
  }
}

// Creates the server, tells systemd, runs it until a signal of `signals` (blocked in every
// thread) stops it; the exit status.
int Serve(const CommandLine& cl, sigset_t& signals) {
  auto server = ckpt::daemon::Server::Create(cl.options);
  if (!server.ok()) {
    if (ckpt::daemon::IsConfigurationError(server.status())) {
      return ckpt::daemon::ReportConfigError(server.status().message());
    }
    spdlog::error("cannot start: {}", server.status().ToString());
    sd_notifyf(0, "STATUS=cannot start: %s", server.status().ToString().c_str());
    return 1;
  }
  // The socket listens and earlier segments are adopted: tell systemd (Type=notify).
  sd_notifyf(0, "READY=1\nSTATUS=serving on %s (budget %s)\nMAINPID=%lu", cl.options.socket_path.c_str(),
             cl.memory_budget.empty() ? "none" : cl.memory_budget.c_str(), static_cast<unsigned long>(::getpid()));
  ckpt::daemon::Server* raw = server->get();
  std::thread signal_thread;
  try {
    signal_thread = std::thread([&signals, raw] {
      int sig = 0;
      while (sigwait(&signals, &sig) == 0) {
        if (sig == SIGHUP) continue;  // reserved for a config reload
        if (sig == SIGUSR1) break;    // sent by main() to end this thread
        spdlog::info("signal {} received, shutting down", sig);
        raw->Stop();
        break;
      }
    });
  } catch (const std::system_error& e) {
    spdlog::error("cannot start: no thread for signals: {}", e.what());
    return 1;
  }
  raw->Run();
  sd_notify(0, "STOPPING=1");
  pthread_kill(signal_thread.native_handle(), SIGUSR1);
  signal_thread.join();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CommandLine cl;
  CLI::App app{"ckptd: holds checkpoints once per node in POSIX shared memory"};
  if (std::optional<int> exit = ParseCommandLine(app, cl, argc, argv)) return *exit;
  if (std::optional<int> exit = ApplyCommandLine(cl)) return *exit;
  RaiseFileLimit();

  // Signals are taken synchronously by one thread, so no handler runs inside the server.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGUSR1);  // Serve() ends the signal thread with it
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return Serve(cl, signals);
}
