// ckptd: the per-node checkpoint daemon. See README.md and docs/.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <thread>

#include "daemon/server.h"

int main(int argc, char** argv) {
  ckpt::daemon::ServerOptions options;
  std::string log_level = "info";
  std::string socket_mode = "0660", shm_mode = "0644";

  CLI::App app{"ckptd: holds checkpoints once per node in POSIX shared memory"};
  app.add_option("--socket", options.socket_path, "control socket path")->capture_default_str();
  app.add_option("--shm-prefix", options.shm_prefix, "prefix of shared-memory object names")
      ->capture_default_str();
  app.add_option("--socket-mode", socket_mode, "permission bits of the socket (octal)")->capture_default_str();
  app.add_option("--shm-mode", shm_mode, "permission bits of segments (octal)")->capture_default_str();
  app.add_option("--load-threads", options.load_threads, "reader threads per load")->capture_default_str();
  app.add_option("--max-connections", options.max_connections, "concurrent client connections")
      ->capture_default_str();
  app.add_flag("--cleanup-on-exit", options.cleanup_on_exit,
               "unlink every segment on shutdown instead of leaving it for the next start");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();
  app.add_flag_callback("--version", [] {
    std::printf("ckptd %s\n", CKPT_VERSION);
    std::exit(0);
  }, "print the version");
  CLI11_PARSE(app, argc, argv);

  auto logger = spdlog::stderr_color_mt("ckptd");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(log_level));
  try {
    options.socket_mode = static_cast<uint32_t>(std::stoul(socket_mode, nullptr, 8));
    options.shm_mode = static_cast<uint32_t>(std::stoul(shm_mode, nullptr, 8));
  } catch (const std::exception&) {
    spdlog::error("modes must be octal numbers such as 0660");
    return 2;
  }

  // Signals are taken synchronously by one thread, so no handler runs inside the server.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGUSR1);  // main() ends the signal thread with it
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  auto server = ckpt::daemon::Server::Create(options);
  if (!server.ok()) {
    spdlog::error("cannot start: {}", server.status().ToString());
    return 1;
  }
  ckpt::daemon::Server* raw = server->get();
  std::thread signal_thread([&signals, raw] {
    int sig = 0;
    while (sigwait(&signals, &sig) == 0) {
      if (sig == SIGHUP) continue;  // reserved for a config reload
      if (sig == SIGUSR1) break;    // sent by main() to end this thread
      spdlog::info("signal {} received, shutting down", sig);
      raw->Stop();
      break;
    }
  });
  raw->Run();
  pthread_kill(signal_thread.native_handle(), SIGUSR1);
  signal_thread.join();
  return 0;
}
