// The control protocol between ckptd and its clients, over a Unix stream socket.
//
// Every message is a frame: a 4-byte little-endian length, then that many bytes of JSON
// (an object). Requests carry {"v": kProtocolVersion, "op": "...", ...}. The daemon answers
// each request with exactly one response {"v", "ok": true, ...} or
// {"v", "ok": false, "code": StatusCodeName, "error": "..."}, optionally preceded by event
// frames {"v", "event": "progress", "done": N, "total": N} when the request asked for them.
// A connection that sent "attach" holds that attachment until it closes. The messages
// themselves (one struct each, with their JSON) are in protocol/messages.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "ckpt/status.h"
#include "common/unique_fd.h"

namespace ckpt::protocol {

inline constexpr int kProtocolVersion = 1;
inline constexpr uint32_t kMaxRequestBytes = 1u << 20;     // what the daemon accepts
// What the daemon accepts from a writer or an admin: a write's declaration lists every
// piece (about 80 bytes each plus the name): 100 000 tensors need about 10 MiB.
inline constexpr uint32_t kMaxWriterRequestBytes = 64u << 20;
inline constexpr uint32_t kMaxResponseBytes = 256u << 20;  // what clients accept

// A point in time by which a whole frame must have been read or written.
using Deadline = std::chrono::steady_clock::time_point;
inline constexpr Deadline kNoDeadline = Deadline::max();
// now + seconds.
Deadline DeadlineIn(double seconds);

// Writes one frame. IoError/Unavailable if the peer is gone; DeadlineExceeded if the
// peer did not take the whole frame by `deadline` (the connection is then unusable).
Status WriteFrame(int fd, const nlohmann::json& message, Deadline deadline = kNoDeadline);
// Writes one frame and passes `pass_fd` (SCM_RIGHTS) along with its first byte; the
// caller keeps ownership of `pass_fd` (the kernel duplicates it for the receiver).
Status WriteFrameWithFd(int fd, const nlohmann::json& message, int pass_fd, Deadline deadline = kNoDeadline);
// Reads one frame holding a JSON object. Unavailable if the peer closed the connection
// before a frame began; Corrupt for a frame over `max_bytes`, cut short, or not a JSON
// object; DeadlineExceeded if the whole frame (its first byte included) did not arrive
// by `deadline`, however the bytes trickle in (the connection is then out of step).
// When `received_fd` is not null, a descriptor passed with the frame (see
// WriteFrameWithFd) is stored there (close-on-exec); descriptors are otherwise closed.
Result<nlohmann::json> ReadFrame(int fd, uint32_t max_bytes, UniqueFd* received_fd = nullptr,
                                 Deadline deadline = kNoDeadline);
// True if the peer of connected socket `fd` hung up or sent bytes not yet read (a
// connection the daemon closed shows both). Does not block.
bool PeerClosedOrReadable(int fd);

// A success response with the fields of `body` (an object) added.
nlohmann::json OkResponse(nlohmann::json body = nlohmann::json::object());
// The error response for `status` (not OK).
nlohmann::json ErrorResponse(const Status& status);
// The Status a response carries: OK for "ok": true, else its code and message.
Status StatusOf(const nlohmann::json& response);

// $CKPTD_SOCKET if set and not empty, else "/run/ckptd/ckptd.sock".
std::string DefaultSocketPath();
// Connects to the daemon's socket. Unavailable (naming the path) if nobody listens.
Result<UniqueFd> ConnectUnix(const std::string& path);
// Binds and listens on `path` with permission bits `mode`. A stale socket file (nobody
// listening) is replaced; AlreadyExists if a live daemon listens there.
Result<UniqueFd> ListenUnix(const std::string& path, uint32_t mode);

}  // namespace ckpt::protocol
