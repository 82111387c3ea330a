// The daemon's ops, one function each, grouped in files by concern:
//   ops_load.cc        load (the part that reads files and publishes: LoadAndPublish)
//   ops_catalog.cc     evict, attach, info, list, status
//   ops_verify.cc      verify
//   ops_rendezvous.cc  rendezvous
//   metrics.cc         metrics (a table of series)
//   ops_write.cc       write (one part of a generation written by processes; write_sessions.h)
// Each takes the decoded request (protocol/messages.h) and returns the typed response;
// roles were checked by the caller (RequestHandler, see daemon/policy.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/status.h"
#include "common/unique_fd.h"
#include "daemon/access_policy.h"
#include "daemon/catalog.h"
#include "daemon/ensure_table.h"
#include "daemon/model_roots.h"
#include "daemon/rendezvous_table.h"
#include "daemon/server.h"
#include "protocol/messages.h"
#include "shm/segment_directory.h"

namespace ckpt::daemon {

class ConnectionLimits;
class WriteSessions;

// What every op may use: the daemon's state. Pointers owned by the Server.
struct DaemonContext {
  const ServerOptions* options;
  Catalog* catalog;
  const std::atomic<bool>* stopping;  // cancels loads and waits in progress
  int64_t started_unix_s;
  const ConnectionLimits* limits;
  const AccessPolicy* access;
  const ModelRoots* roots;
  DaemonCounters* counters;
  RendezvousTable* rendezvous;
  const shm::SegmentDirectory* segments;  // where loads create their segments
  EnsureTable* ensures;                   // ensure loads in progress, shared by their callers
  WriteSessions* writes;                  // generations being written by processes
};

// The connection an op runs for.
struct Caller {
  int fd = -1;  // the connection (progress events, cancel and hang-up checks); -1: none
  PeerCredentials peer;
  Role role = Role::kNone;
  Owner actor;  // who acts (peer.uid, admin role): what ownership and quotas judge
};

// The summary of a catalog entry, as list, load, attach and status report it.
protocol::WireSummary SummaryOf(const CatalogEntry& entry);
int64_t NowUnixSeconds();
// Records the device and inode of segment descriptor `fd` in `entry` (the daemon keeps no
// descriptor per segment); IoError if fstat fails.
Status RecordSegmentIdentity(int fd, CatalogEntry* entry);
// Opens `entry`'s segment read-only again (relative to the segment directory, no link
// followed) and checks that it is the same file. NotFound if it is gone or another file;
// ResourceExhausted when the daemon is out of descriptors.
Result<UniqueFd> OpenSegment(const DaemonContext& ctx, const CatalogEntry& entry);

// What a load learned about its connection while it ran.
struct LoadWatch {
  bool cancel_consumed = false;  // a cancel frame was read: the answer must be Cancelled
  bool drop_connection = false;  // the client hung up or broke the protocol
};

// Loads and publishes a checkpoint. With a connection, it watches it every progress tick
// (about 100 ms): a cancel frame or a hang-up cancels this load (Cancelled, nothing
// published); see docs/architecture.md.
Result<protocol::LoadResponse> Load(const DaemonContext& ctx, const Caller& caller,
                                    const protocol::LoadRequest& request, LoadWatch* watch);
// Loads `request.path` under its name unless that name already holds the file's current
// content; concurrent callers share one load (see Client::Ensure for every case). A
// waiter watches its own connection like a load does: a cancel or a hang-up withdraws it
// alone (Cancelled; `watch` says which), and the load is cancelled once nobody waits.
Result<protocol::EnsureResponse> Ensure(const DaemonContext& ctx, const Caller& caller,
                                        const protocol::EnsureRequest& request, LoadWatch* watch);
// Evicts for `caller` (its owner or an admin only, see Catalog::Evict).
Result<protocol::CheckpointResponse> Evict(const DaemonContext& ctx, const Caller& caller,
                                           const protocol::EvictRequest& request);
// The attachment is recorded for `caller` (released by RequestHandler); `*segment_fd`
// gets the read-only descriptor to pass with the response.
Result<protocol::CheckpointResponse> Attach(const DaemonContext& ctx, const Caller& caller,
                                            const protocol::AttachRequest& request, UniqueFd* segment_fd);
Result<protocol::InfoResponse> Info(const DaemonContext& ctx, const protocol::InfoRequest& request);
protocol::ListResponse List(const DaemonContext& ctx);
protocol::StatusResponse GetStatus(const DaemonContext& ctx, const Caller& caller);
// Re-hashes a published checkpoint's tensors against its index checksums. OK with
// passed == false and the first mismatching tensors when bytes differ; NotFound if unknown.
Result<protocol::VerifyResponse> Verify(const DaemonContext& ctx, const protocol::VerifyRequest& request);
// Rank 0 publishes a job's hex value (answered at once with it); the other ranks wait up
// to timeout_s for it, in the caller uid's own namespace (see RendezvousTable).
Result<protocol::RendezvousResponse> Rendezvous(const DaemonContext& ctx, const Caller& caller,
                                                const protocol::RendezvousRequest& request);

// Runs one part of a write (see protocol::WriteRequest and docs/write-path.md) on the
// caller's connection, from its declaration to the publish: `ring_fd` is the ring passed
// with the request. Returns what was published, or the error that failed the whole
// generation (nothing published). Errors after the declaration are answered on the
// connection by the op itself, which then sets watch->drop_connection (the part may still
// be streaming frames that must not be read as requests).
Result<protocol::LoadResponse> Write(const DaemonContext& ctx, const Caller& caller,
                                     const protocol::WriteRequest& request, UniqueFd ring_fd, LoadWatch* watch);

}  // namespace ckpt::daemon
