#include "daemon/server.h"

#include <fcntl.h>
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
#include <system_error>
#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>

#include "daemon/connection_limits.h"
#include "daemon/metrics.h"
#include "daemon/policy.h"
#include "daemon/request_handler.h"
#include "protocol/messages.h"
#include "protocol/wire.h"
#include "daemon/segment_adoption.h"
#include "daemon/segment_location.h"
#include "daemon/service_checks.h"

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
  if (o.max_connections_per_uid < 1) return InvalidArgument("max connections per uid must be >= 1");
  if (o.admin_reserved_connections < 0 || o.admin_reserved_connections > 1024) {
    return InvalidArgument("admin reserved connections must be 0 to 1024");
  }
  if (!(o.frame_timeout_s > 0 && o.frame_timeout_s <= 3600)) return InvalidArgument("frame timeout must be 0 to 3600 s");
  if (!(o.idle_timeout_s > 0 && o.idle_timeout_s <= 86400)) return InvalidArgument("idle timeout must be 0 to 86400 s");
  if (o.rendezvous_per_uid < 1) return InvalidArgument("rendezvous entries per uid must be >= 1");
  if (!(o.write_idle_timeout_s > 0 && o.write_idle_timeout_s <= 86400)) {
    return InvalidArgument("write idle timeout must be 0 to 86400 s");
  }
  if (o.metrics_interval_s < 1) return InvalidArgument("metrics interval must be >= 1 s");
  if (o.metrics_file_mode > 0777) return InvalidArgument("metrics file mode must be at most 0777");
  if ((o.shm_mode & 07133) != 0 || (o.shm_mode & 0600) != 0600) {
    return InvalidArgument("the shm mode must give the owner read and write and others at most read (e.g. 0640)");
  }
  if (o.state_dir.empty() || o.state_dir[0] != '/') return InvalidArgument("the state directory must be an absolute path");
  return Status::Ok();
}

RendezvousTable::Options RendezvousOptionsOf(const ServerOptions& o) {
  RendezvousTable::Options r;
  r.max_entries_per_uid = static_cast<size_t>(std::max(1, o.rendezvous_per_uid));
  return r;
}
}  // namespace

Server::Server(ServerOptions options, std::unique_ptr<shm::SegmentDirectory> segments,
               std::unique_ptr<GenerationStore> generations)
    : options_(std::move(options)),
      segments_(std::move(segments)),
      generations_(std::move(generations)),
      catalog_(options_.memory_budget_bytes, segments_.get(), generations_.get(),
               Quotas{options_.max_shm_bytes_per_uid, options_.max_segments_per_uid, options_.max_writes_per_uid}),
      rendezvous_(RendezvousOptionsOf(options_)),
      writes_(std::make_unique<WriteSessions>(WriteSession::Environment{
          &catalog_, segments_.get(), options_.shm_mode, options_.load_threads, options_.write_idle_timeout_s,
          options_.max_writes_per_uid})),
      limits_(std::make_unique<ConnectionLimits>(ConnectionLimits::Options{
          options_.max_connections, options_.max_connections_per_uid, options_.admin_reserved_connections})) {}

DaemonContext Server::Context() {
  return DaemonContext{&options_,     &catalog_,    &stopping_, started_unix_s_, limits_.get(),
                       access_.get(), roots_.get(), &counters_, &rendezvous_,    segments_.get(),
                       &ensures_, writes_.get()};
}

Result<std::unique_ptr<Server>> Server::Create(const ServerOptions& options) {
  CKPT_RETURN_IF_ERROR(ValidateOptions(options));
  CKPT_ASSIGN_OR_RETURN(auto access, AccessPolicy::Create(options.admin_group, options.reader_group, options.writer_group));
  // The state directory first: it names the segment directory (and fails before one is made).
  CKPT_ASSIGN_OR_RETURN(auto generations, GenerationStore::Open(options.state_dir));
  SegmentLocationOptions location;
  location.segment_dir = options.segment_dir;
  location.shm_prefix = options.shm_prefix;
  location.group = access->reader_gid();
  location.state_dir_fd = generations->dir_fd();
  location.state_dir = options.state_dir;
  std::string fixed;
  CKPT_ASSIGN_OR_RETURN(auto segments, OpenSegmentLocation(location, &fixed));
  if (!fixed.empty()) spdlog::warn("{}", fixed);
  spdlog::info("segment directory {}: {}", segments->path(), segments->pages().Describe());
  for (const std::string& warning : MemoryBudgetWarnings(options.memory_budget_bytes, segments->path())) {
    spdlog::warn("{}", warning);
  }
  std::unique_ptr<Server> server(new Server(options, std::move(segments), std::move(generations)));
  server->access_ = std::move(access);
  if (Status started = server->Start(); !started.ok()) {
    // Nothing of a failed start stays behind: not even the (empty) directory it made.
    if (server->segments_->created()) (void)server->segments_->RemoveIfEmpty();
    return started;
  }
  return server;
}

Status Server::Start() {
  started_unix_s_ = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch()).count();
  spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_.valid()) return ErrnoError("eventfd", errno);
  CKPT_ASSIGN_OR_RETURN(roots_, ModelRoots::Create(options_.model_roots));
  CKPT_ASSIGN_OR_RETURN(metrics_gid_, ResolveGroup(options_.metrics_file_group));
  if (!roots_->restricted()) spdlog::warn("no model roots configured: loads from any path are allowed");
  CKPT_ASSIGN_OR_RETURN(listen_fd_, protocol::ListenUnix(options_.socket_path, options_.socket_mode));
  if (access_->reader_gid() &&
      ::chown(options_.socket_path.c_str(), static_cast<uid_t>(-1), *access_->reader_gid()) != 0) {
    spdlog::warn("cannot give the socket to the reader group: {}", std::strerror(errno));
  }
  return AdoptExistingSegments();
}

Status Server::AdoptExistingSegments() {
  AdoptionOptions adoption;
  adoption.segment_mode = options_.shm_mode;
  adoption.verify_threads = options_.load_threads;
  adoption.legacy_prefix = options_.shm_prefix + ".";
  adoption.validate_name = ValidateAdoptedName;
  adoption.cancel = &stopping_;
  return AdoptSegments(*segments_, adoption, &catalog_).status();
}

Server::~Server() {
  Stop();
  std::lock_guard<std::mutex> lock(connections_mu_);
  for (auto& c : connections_) {
    if (c->thread.joinable()) c->thread.join();
  }
  ensures_.JoinAll();  // before any member their threads use is destroyed
}

void Server::RefuseForDescriptors() {
  // The spare descriptor makes room to take the waiting connection and tell it why; the
  // listening socket would otherwise stay readable and the loop spin.
  ++counters_.connections_refused;
  if (spare_fd_.valid()) {
    spare_fd_.reset();
    UniqueFd client(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (client.valid()) {
      (void)protocol::WriteFrame(client.get(),
                                 protocol::ErrorResponse(ResourceExhausted(
                                     "ckptd is out of file descriptors (RLIMIT_NOFILE); try again later")),
                                 protocol::DeadlineIn(0.05));
    }
    client.reset();
    spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  }
  spdlog::warn("refused a connection: ckptd is out of file descriptors (RLIMIT_NOFILE)");
  if (!spare_fd_.valid()) ::usleep(50000);  // none to spare: wait for descriptors to be freed
}

void Server::Stop() {
  stopping_.store(true);
  rendezvous_.Shutdown();  // waiting ranks get Unavailable now
  if (writes_) writes_->FailAll(Unavailable("ckptd is stopping"));
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
  const std::string text = RenderMetrics(Context());
  const std::string tmp = options_.metrics_file + ".tmp";
  // Mode and group set on the descriptor, so the unit's UMask= does not decide them.
  ::unlink(tmp.c_str());
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid() || ::fchmod(fd.get(), options_.metrics_file_mode) != 0 ||
      (metrics_gid_ && ::fchown(fd.get(), static_cast<uid_t>(-1), *metrics_gid_) != 0)) {
    spdlog::warn("cannot write metrics to {}: {}", tmp, std::strerror(errno));
    if (fd.valid()) ::unlink(tmp.c_str());
    return;
  }
  FILE* f = ::fdopen(fd.release(), "w");
  if (f == nullptr) {
    spdlog::warn("cannot write metrics to {}: {}", tmp, std::strerror(errno));
    std::remove(tmp.c_str());
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
                attached, limits_->total());
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
    if (!client.valid()) {
      if (errno == EMFILE || errno == ENFILE) RefuseForDescriptors();
      continue;
    }
    ++counters_.connections_total;
    Admit(std::move(client));
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
  ensures_.JoinAll();  // ensure loads: cancelled by stopping_, published or not before this
  if (options_.cleanup_on_exit) {
    for (const CatalogEntry& e : catalog_.TakeAll()) {
      Status st = segments_->Remove(e.shm_name);
      if (st.ok()) {
        spdlog::info("removed segment {}", segments_->PathOf(e.shm_name));
      } else {
        spdlog::error("cannot remove segment {}: {}", segments_->PathOf(e.shm_name), st.ToString());
      }
    }
    // The directory too, unless it is the mount the unit made (or something is left in it).
    if (Status st = segments_->RemoveIfEmpty(); st.ok()) {
      spdlog::info("removed segment directory {}", segments_->path());
    } else {
      spdlog::info("{}", st.message());
    }
  }
  ::unlink(options_.socket_path.c_str());
  listen_fd_.reset();
  spdlog::info("ckptd stopped");
}

void Server::Admit(UniqueFd client) {
  // The peer's credentials decide before anything is spent on it: a caller with no role,
  // or over its uid's limit, or over the limits, gets one error frame and is closed
  // here (no thread, no slot). The frame is written without waiting (an empty socket
  // buffer takes it).
  auto refuse = [&](const Status& why) {
    (void)protocol::WriteFrame(client.get(), protocol::ErrorResponse(why), protocol::DeadlineIn(0.05));
  };
  auto peer = PeerOf(client.get());
  if (!peer.ok()) {
    ++counters_.connections_no_role;
    refuse(PermissionDenied("ckptd cannot tell who you are: " + peer.status().message()));
    return;
  }
  const Role role = access_->RoleOf(*peer);
  if (Status admitted = limits_->Admit(*peer, role); !admitted.ok()) {
    if (role == Role::kNone) {
      ++counters_.connections_no_role;
      spdlog::debug("refused a connection of uid {} (no role)", peer->uid);
    } else {
      ++counters_.connections_refused;
      spdlog::debug("refused a connection of uid {}: {}", peer->uid, admitted.message());
    }
    refuse(admitted);
    return;
  }
  auto connection = std::make_unique<Connection>();
  connection->fd = std::move(client);
  connection->peer = *peer;
  connection->role = role;
  Connection* raw = connection.get();
  std::lock_guard<std::mutex> lock(connections_mu_);
  connections_.push_back(std::move(connection));
  try {
    raw->thread = std::thread([this, raw] { Serve(raw); });
  } catch (const std::system_error& e) {
    // No thread for it (RLIMIT_NPROC, memory): answer and close instead of terminating.
    ++counters_.thread_start_failures;
    spdlog::warn("cannot start a thread for a connection of uid {}: {}", raw->peer.uid, e.what());
    (void)protocol::WriteFrame(raw->fd.get(),
                               protocol::ErrorResponse(ResourceExhausted(
                                   std::string("ckptd cannot start a thread for this connection: ") + e.what())),
                               protocol::DeadlineIn(0.05));
    limits_->Release(raw->peer.uid);
    connections_.pop_back();
  }
}

void Server::Serve(Connection* connection) {
  const int fd = connection->fd.get();
  {
    RequestHandler handler(Context(), fd, connection->peer, connection->role);
    // A frame must arrive whole within frame_timeout_s once it began, and a response be
    // taken within it; a connection idle for idle_timeout_s is closed unless it holds an
    // attachment (a lease is idle by design). The "closing" event tells the client that
    // no request sent meanwhile was read, so it may send it again elsewhere.
    const auto idle_limit = std::chrono::duration<double>(options_.idle_timeout_s);
    auto idle_since = std::chrono::steady_clock::now();
    while (!stopping_.load()) {
      pollfd p{fd, POLLIN, 0};
      const int ready = ::poll(&p, 1, 200);
      if (ready < 0 && errno != EINTR) break;
      if (ready <= 0) {
        if (!handler.holds_attachments() && std::chrono::steady_clock::now() - idle_since > idle_limit &&
            !protocol::PeerClosedOrReadable(fd)) {  // a request that just arrived is served, not dropped
          ++counters_.idle_closed;
          spdlog::debug("closing a connection of uid {} idle for {} s", connection->peer.uid, options_.idle_timeout_s);
          (void)protocol::WriteFrame(fd, protocol::Encode(protocol::ClosingEvent{"idle"}), protocol::DeadlineIn(0.05));
          break;
        }
        continue;
      }
      UniqueFd request_fd;  // a write's ring comes with its request
      const uint32_t max_request = static_cast<int>(connection->role) >= static_cast<int>(Role::kWriter)
                                       ? protocol::kMaxWriterRequestBytes
                                       : protocol::kMaxRequestBytes;
      auto request = protocol::ReadFrame(fd, max_request, &request_fd,
                                         protocol::DeadlineIn(options_.frame_timeout_s));
      if (!request.ok() && request.status().code() == StatusCode::kResourceExhausted) {
        // Read whole, but the descriptor sent with it was dropped (ckptd is out of
        // descriptors): the request is answered with that, the connection stays in step.
        spdlog::warn("a request of uid {} lost its descriptor: {}", connection->peer.uid, request.status().message());
        if (!protocol::WriteFrame(fd, protocol::ErrorResponse(request.status()),
                                  protocol::DeadlineIn(options_.frame_timeout_s)).ok()) {
          break;
        }
        idle_since = std::chrono::steady_clock::now();
        continue;
      }
      if (!request.ok()) {
        // A malformed or late frame loses the framing: answer once, then drop the connection.
        const StatusCode code = request.status().code();
        if (code == StatusCode::kCorrupt || code == StatusCode::kDeadlineExceeded) {
          ++(code == StatusCode::kCorrupt ? counters_.bad_frames : counters_.frame_timeouts);
          spdlog::warn("dropping a connection of uid {}: {}", connection->peer.uid, request.status().message());
          const Status why = code == StatusCode::kCorrupt
                                 ? request.status()
                                 : DeadlineExceeded("a request frame did not arrive whole within " +
                                                    std::to_string(options_.frame_timeout_s) + " s");
          (void)protocol::WriteFrame(fd, protocol::ErrorResponse(why), protocol::DeadlineIn(0.05));
        }
        break;
      }
      handler.SetRequestFd(std::move(request_fd));
      nlohmann::json response = handler.Handle(*request);
      if (handler.drop_connection()) break;
      UniqueFd pass = handler.TakeResponseFd();
      const auto deadline = protocol::DeadlineIn(options_.frame_timeout_s);
      Status sent = pass.valid() ? protocol::WriteFrameWithFd(fd, response, pass.get(), deadline)
                                 : protocol::WriteFrame(fd, response, deadline);
      if (!sent.ok()) break;
      idle_since = std::chrono::steady_clock::now();
    }
  }  // the handler's destructor releases this connection's attachments
  limits_->Release(connection->peer.uid);
  connection->done.store(true);
}

}  // namespace ckpt::daemon
