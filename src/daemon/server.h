// Server: ckptd's control plane. Listens on a Unix socket, serves each connection on its
// own thread, loads checkpoints into shared memory and tracks attachments.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ckpt/status.h"
#include "common/unique_fd.h"
#include "daemon/catalog.h"

namespace ckpt::daemon {

struct ServerOptions {
  std::string socket_path = "/run/ckptd/ckptd.sock";
  std::string shm_prefix = "ckpt";  // [A-Za-z0-9_-]+; segments are <prefix>.<name>.<gen>
  uint32_t socket_mode = 0660;
  uint32_t shm_mode = 0644;
  int load_threads = 8;
  int max_connections = 1024;
  bool cleanup_on_exit = false;  // unlink every segment on Stop (otherwise re-adopted later)
};

class Server {
 public:
  // Validates options, adopts complete segments left under the prefix (removing
  // incomplete or corrupt ones) and binds the socket. Errors: InvalidArgument for bad
  // options; AlreadyExists if another daemon serves the socket; IoError.
  static Result<std::unique_ptr<Server>> Create(const ServerOptions& options);
  ~Server();

  // Serves until Stop() is called; then closes every connection, cancels loads in
  // progress and joins all threads before returning.
  void Run();
  // Asks Run() to return. Thread-safe; may be called before Run().
  void Stop();

 private:
  struct Connection {
    UniqueFd fd;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  explicit Server(ServerOptions options) : options_(std::move(options)) {}
  Status AdoptExistingSegments();
  void Serve(Connection* connection);
  void ReapFinishedConnections();

  ServerOptions options_;
  Catalog catalog_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd that wakes Run() for Stop()
  std::atomic<bool> stopping_{false};
  std::mutex connections_mu_;
  std::list<std::unique_ptr<Connection>> connections_;
  std::atomic<int> connection_count_{0};
  int64_t started_unix_s_ = 0;
};

}  // namespace ckpt::daemon
