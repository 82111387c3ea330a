#include "daemon/server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>

#include "daemon/request_handler.h"
#include "protocol/wire.h"
#include "daemon/segment_adoption.h"

namespace ckpt::daemon {

namespace {
Status ValidateOptions(const ServerOptions& o) {
  if (o.shm_prefix.empty() || o.shm_prefix.size() > 64) return InvalidArgument("shm prefix must be 1 to 64 characters");
  for (char c : o.shm_prefix) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) {
      return InvalidArgument("shm prefix may hold only letters, digits, '_' and '-': '" + o.shm_prefix + "'");
    }
  }
  if (o.load_threads < 1 || o.load_threads > 256) return InvalidArgument("load threads must be 1 to 256");
  if (o.max_connections < 1) return InvalidArgument("max connections must be >= 1");
  if (o.metrics_interval_s < 1) return InvalidArgument("metrics interval must be >= 1 s");
  if ((o.shm_mode & 07133) != 0 || (o.shm_mode & 0600) != 0600) {
    return InvalidArgument("the shm mode must give the owner read and write and others at most read (e.g. 0640)");
  }
  if (o.state_dir.empty() || o.state_dir[0] != '/') return InvalidArgument("the state directory must be an absolute path");
  return Status::Ok();
}
}  // namespace

Result<std::unique_ptr<Server>> Server::Create(const ServerOptions& options) {
  CKPT_RETURN_IF_ERROR(ValidateOptions(options));
  CKPT_ASSIGN_OR_RETURN(auto access, AccessPolicy::Create(options.admin_group, options.reader_group));
  std::string fixed;
  CKPT_ASSIGN_OR_RETURN(auto segments, shm::SegmentDirectory::Open(shm::SegmentDirectoryPath(options.shm_prefix),
                                                                   {access->reader_gid(), true}, &fixed));
  if (!fixed.empty()) spdlog::warn("{}", fixed);
  CKPT_ASSIGN_OR_RETURN(auto generations, GenerationStore::Open(options.state_dir));
  std::unique_ptr<Server> server(new Server(options, std::move(segments), std::move(generations)));
  server->access_ = std::move(access);
  server->started_unix_s_ = std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch()).count();
  server->wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!server->wake_fd_.valid()) return ErrnoError("eventfd", errno);
  CKPT_ASSIGN_OR_RETURN(server->roots_, ModelRoots::Create(options.model_roots));
  if (!server->roots_->restricted()) spdlog::warn("no model roots configured: loads from any path are allowed");
  CKPT_ASSIGN_OR_RETURN(server->listen_fd_, protocol::ListenUnix(options.socket_path, options.socket_mode));
  if (server->access_->reader_gid() &&
      ::chown(options.socket_path.c_str(), static_cast<uid_t>(-1), *server->access_->reader_gid()) != 0) {
    spdlog::warn("cannot give the socket to the reader group: {}", std::strerror(errno));
  }
  CKPT_RETURN_IF_ERROR(server->AdoptExistingSegments());
  return server;
}

Status Server::AdoptExistingSegments() {
  AdoptionOptions adoption;
  adoption.segment_mode = options_.shm_mode;
  adoption.verify_threads = options_.load_threads;
  adoption.legacy_prefix = options_.shm_prefix + ".";
  adoption.validate_name = ValidateCheckpointName;
  adoption.cancel = &stopping_;
  return AdoptSegments(*segments_, adoption, &catalog_).status();
}

Server::~Server() {
  Stop();
  std::lock_guard<std::mutex> lock(connections_mu_);
  for (auto& c : connections_) {
    if (c->thread.joinable()) c->thread.join();
  }
}

void Server::Stop() {
  stopping_.store(true);
  rendezvous_.Shutdown();  // waiting ranks get Unavailable now
  if (wake_fd_.valid()) {
    uint64_t one = 1;
    (void)!::write(wake_fd_.get(), &one, sizeof(one));
  }
}

void Server::ReapFinishedConnections() {
  std::lock_guard<std::mutex> lock(connections_mu_);
  for (auto it = connections_.begin(); it != connections_.end();) {
    if ((*it)->done.load()) {
      (*it)->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void Server::WriteMetricsFile() {
  // The daemon's own view, rendered as for an admin's "metrics" request.
  RequestHandler handler(DaemonContext{&options_, &catalog_, &stopping_, started_unix_s_, &connection_count_,
                                       access_.get(), roots_.get(), &counters_, &rendezvous_, segments_.get()},
                         -1, PeerCredentials{static_cast<int32_t>(::getpid()), 0, 0}, Role::kAdmin);
  const std::string text = handler.Metrics().value("text", "");
  const std::string tmp = options_.metrics_file + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "we");
  if (f == nullptr) {
    spdlog::warn("cannot write metrics to {}: {}", tmp, std::strerror(errno));
    return;
  }
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), options_.metrics_file.c_str()) != 0) {
    spdlog::warn("cannot write metrics to {}: {}", options_.metrics_file, std::strerror(errno));
    std::remove(tmp.c_str());
  }
}

void Server::NotifyStatus() {
  const auto entries = catalog_.List();
  uint32_t attached = 0;
  for (const auto& e : entries) attached += e.attached;
  char status[256];
  std::snprintf(status, sizeof(status), "STATUS=%zu checkpoints, %zu loading, %.1f GiB in use%s, %u attached, %d connections",
                entries.size(), catalog_.Loading().size(), catalog_.UsedBytes() / 1073741824.0,
                catalog_.budget_bytes() ? (" of " + std::to_string(catalog_.budget_bytes() >> 30) + " GiB").c_str() : "",
                attached, connection_count_.load());
  if (last_status_ != status) {
    last_status_ = status;
    sd_notify(0, status);
  }
}

void Server::Run() {
  spdlog::info("ckptd {} serving on {} (segments in {}, state in {})", CKPT_VERSION, options_.socket_path,
               segments_->path(), options_.state_dir);
  auto next_metrics = std::chrono::steady_clock::now();
  while (!stopping_.load()) {
    if (!options_.metrics_file.empty() && std::chrono::steady_clock::now() >= next_metrics) {
      WriteMetricsFile();
      next_metrics = std::chrono::steady_clock::now() + std::chrono::seconds(options_.metrics_interval_s);
    }
    NotifyStatus();
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    int n = ::poll(fds, 2, 1000);
    ReapFinishedConnections();
    if (n <= 0 || !(fds[0].revents & POLLIN)) continue;
    UniqueFd client(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!client.valid()) continue;
    ++counters_.connections_total;
    if (connection_count_.load() >= options_.max_connections) {
      ++counters_.connections_refused;
      (void)protocol::WriteFrame(client.get(), protocol::ErrorResponse(ResourceExhausted(
                                                   "too many connections to ckptd")));
      continue;  // closes it
    }
    auto connection = std::make_unique<Connection>();
    connection->fd = std::move(client);
    Connection* raw = connection.get();
    ++connection_count_;
    std::lock_guard<std::mutex> lock(connections_mu_);
    connections_.push_back(std::move(connection));
    raw->thread = std::thread([this, raw] { Serve(raw); });
  }

  // Wake every connection thread (blocked reads return), then wait for all of them.
  {
    std::lock_guard<std::mutex> lock(connections_mu_);
    for (auto& c : connections_) ::shutdown(c->fd.get(), SHUT_RDWR);
  }
  {
    std::lock_guard<std::mutex> lock(connections_mu_);
    for (auto& c : connections_) {
      if (c->thread.joinable()) c->thread.join();
    }
    connections_.clear();
  }
  if (options_.cleanup_on_exit) {
    for (const CatalogEntry& e : catalog_.TakeAll()) {
      Status st = segments_->Remove(e.shm_name);
      if (st.ok()) {
        spdlog::info("removed segment {}", segments_->PathOf(e.shm_name));
      } else {
        spdlog::error("cannot remove segment {}: {}", segments_->PathOf(e.shm_name), st.ToString());
      }
    }
  }
  ::unlink(options_.socket_path.c_str());
  listen_fd_.reset();
  spdlog::info("ckptd stopped");
}

void Server::Serve(Connection* connection) {
  const int fd = connection->fd.get();
  {
    auto peer = PeerOf(fd);
    PeerCredentials cred = peer.ok() ? *peer : PeerCredentials{0, 65534, 65534};  // unknown: nobody
    const Role role = peer.ok() ? access_->RoleOf(cred) : Role::kNone;
    DaemonContext context{&options_, &catalog_, &stopping_, started_unix_s_, &connection_count_,
                          access_.get(), roots_.get(), &counters_, &rendezvous_, segments_.get()};
    RequestHandler handler(context, fd, cred, role);
    // A frame must arrive whole within 30 s once it began, and a response must be taken
    // within 30 s; a connection idle for 10 minutes is dropped unless it holds an
    // attachment (a lease is idle by design).
    timeval stall{30, 0};
    (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &stall, sizeof(stall));
    (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &stall, sizeof(stall));
    auto idle_since = std::chrono::steady_clock::now();
    while (!stopping_.load()) {
      pollfd p{fd, POLLIN, 0};
      const int ready = ::poll(&p, 1, 1000);
      if (ready < 0 && errno != EINTR) break;
      if (ready <= 0) {
        if (!handler.holds_attachments() && std::chrono::steady_clock::now() - idle_since > std::chrono::minutes(10)) {
          spdlog::debug("dropping a connection idle for 10 minutes");
          break;
        }
        continue;
      }
      idle_since = std::chrono::steady_clock::now();
      auto request = protocol::ReadFrame(fd, protocol::kMaxRequestBytes);
      if (!request.ok()) {
        // A malformed frame loses the framing: answer once, then drop the connection.
        if (request.status().code() == StatusCode::kCorrupt) {
          ++counters_.bad_frames;
          spdlog::warn("dropping a connection: {}", request.status().message());
          (void)protocol::WriteFrame(fd, protocol::ErrorResponse(request.status()));
        }
        break;
      }
      nlohmann::json response = handler.Handle(*request);
      UniqueFd pass = handler.TakeResponseFd();
      Status sent = pass.valid() ? protocol::WriteFrameWithFd(fd, response, pass.get())
                                 : protocol::WriteFrame(fd, response);
      if (!sent.ok()) break;
    }
  }  // the handler's destructor releases this connection's attachments
  --connection_count_;
  connection->done.store(true);
}

}  // namespace ckpt::daemon
