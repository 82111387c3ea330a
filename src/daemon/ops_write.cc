// The write op (issue 15, docs/write-path.md): one part of a generation written by
// processes. The part's connection is held for the whole write: declaration, the wait for
// the other parts, the streamed chunks (copied from the part's read-only ring into the
// segment only the daemon maps writable), the seal and the wait for the publish.
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "common/checked_math.h"
#include "common/progress_throttle.h"
#include "common/side_file_name.h"
#include "common/thread_pool.h"
#include "daemon/ops.h"
#include "daemon/policy.h"
#include "daemon/write_sessions.h"
#include "protocol/messages.h"
#include "protocol/wire.h"
#include "shm/shm_object.h"

namespace ckpt::daemon {

namespace {

// Below this many bytes a chunk is copied on the connection's own thread.
constexpr uint64_t kParallelCopyBytes = 8u << 20;

// Maps the part's ring read-only after checking that it cannot shrink under the daemon's
// reads (a shrunk shared file would fault the daemon): a memfd sealed F_SEAL_SHRINK.
Result<std::unique_ptr<shm::ShmMapping>> MapRing(int fd, uint64_t ring_bytes) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return InvalidArgument("the write's ring must be a memfd sealed with F_SEAL_SHRINK");
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("fstat of the write's ring", errno);
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < ring_bytes) {
    return InvalidArgument("the write's ring holds " + std::to_string(st.st_size) + " bytes, not the " +
                           std::to_string(ring_bytes) + " declared");
  }
  return shm::ShmMapping::MapFd(fd, "write ring", /*writable=*/false);
}

class PartConnection {
 public:
  PartConnection(const DaemonContext& ctx, const Caller& caller, LoadWatch* watch, int64_t part)
      : ctx_(ctx), caller_(caller), watch_(watch), part_(part) {}

  // What WaitReady/SealAndWait check between waits: the daemon stopping, and this
  // connection (a cancel frame is an abort; a hang-up or another frame fails the write).
  Status Check() {
    if (ctx_.stopping->load()) return Unavailable("ckptd is stopping");
    if (caller_.fd < 0 || !protocol::PeerClosedOrReadable(caller_.fd)) return Status::Ok();
    auto frame = protocol::ReadFrame(caller_.fd, protocol::kMaxRequestBytes, nullptr,
                                     protocol::DeadlineIn(ctx_.options->frame_timeout_s));
    if (!frame.ok()) {
      watch_->drop_connection = true;
      return Unavailable("part " + std::to_string(part_) + " disconnected before its write was published");
    }
    auto op = protocol::DecodeOp(*frame);
    if (op.ok() && *op == protocol::CancelRequest::kOp) {
      watch_->cancel_consumed = true;
      return Cancelled("part " + std::to_string(part_) + " aborted the write");
    }
    return InvalidArgument("part " + std::to_string(part_) + " sent '" + (op.ok() ? op->substr(0, 64) : "?") +
                           "' while waiting for the other parts (only 'cancel' may come then)");
  }

  // Sends an event frame; a part that does not take it within the frame timeout is gone.
  Status Send(const nlohmann::json& frame) {
    Status sent = protocol::WriteFrame(caller_.fd, frame, protocol::DeadlineIn(ctx_.options->frame_timeout_s));
    if (!sent.ok()) {
      watch_->drop_connection = true;
      return Unavailable("part " + std::to_string(part_) + " stopped reading: " + sent.message());
    }
    return Status::Ok();
  }

  // The error answers the request now and the connection is closed after it, so frames
  // the part may still be streaming are never read as requests.
  Status AnswerAndClose(const Status& why) {
    if (!watch_->drop_connection && caller_.fd >= 0) {
      (void)protocol::WriteFrame(caller_.fd, protocol::ErrorResponse(why), protocol::DeadlineIn(0.5));
    }
    watch_->drop_connection = true;
    return why;
  }

 private:
  const DaemonContext& ctx_;
  const Caller& caller_;
  LoadWatch* watch_;
  const int64_t part_;
};

// Copies a chunk's items from the ring into the segment, on the daemon's load threads for
// a large chunk. Items were checked by the caller; their pages are reserved.
Status CopyItems(const DaemonContext& ctx, const WriteSession& session, int64_t part,
                 const protocol::WriteChunkRequest& chunk, const std::byte* ring, const shm::SegmentWriter& segment) {
  struct Task {
    const protocol::WriteChunkItem* item;
    uint64_t begin, size;  // within the item
  };
  uint64_t total = 0;
  for (const auto& item : chunk.items) total += item.bytes;
  const int threads = total >= kParallelCopyBytes ? std::max(1, ctx.options->load_threads) : 1;
  const uint64_t piece_size = std::max<uint64_t>(1u << 20, (total + threads - 1) / threads);
  std::vector<Task> tasks;
  for (const auto& item : chunk.items) {
    for (uint64_t b = 0; b < item.bytes; b += piece_size) tasks.push_back({&item, b, std::min(piece_size, item.bytes - b)});
  }
  auto run = [&](const Task& t) {
    const PieceTarget& target = session.target(part, t.item->piece);
    std::byte* tensor = segment.tensor_data(target.tensor);
    const std::byte* src = ring + t.item->ring_offset + t.begin;
    const uint64_t piece_begin = t.item->offset + t.begin;
    ForEachRun(target, piece_begin, t.size, [&](uint64_t tensor_byte, uint64_t piece_byte, uint64_t n) {
      std::memcpy(tensor + tensor_byte, src + (piece_byte - piece_begin), n);
    });
  };
  if (threads == 1 || tasks.size() == 1) {
    for (const Task& t : tasks) run(t);
    return Status::Ok();
  }
  std::atomic<size_t> next{0};
  return RunWorkers(
      std::min<int>(threads, static_cast<int>(tasks.size())),
      [&](int, const std::atomic<bool>&) {
        for (size_t i = next++; i < tasks.size(); i = next++) run(tasks[i]);
        return Status::Ok();
      },
      nullptr);
}

// Copies one chunk into the segment once the pages under it are reserved (the segment is
// reserved in the background while the first chunks come), then hands the ranges of
// in-order tensors to the hasher (their checksums are computed while streaming).
Status CopyChunk(const DaemonContext& ctx, WriteSession& session, int64_t part,
                 const protocol::WriteChunkRequest& chunk, const std::byte* ring) {
  std::shared_ptr<TensorHasher> hasher;
  CKPT_ASSIGN_OR_RETURN(std::shared_ptr<shm::SegmentWriter> segment, session.Segment(&hasher));
  uint64_t end = 0;  // one past the last segment byte this chunk writes
  for (const auto& item : chunk.items) {
    const PieceTarget& target = session.target(part, item.piece);
    const uint64_t at = segment->tensor_offset(target.tensor);
    ForEachRun(target, item.offset, item.bytes,
               [&](uint64_t tensor_byte, uint64_t, uint64_t n) { end = std::max(end, at + tensor_byte + n); });
  }
  CKPT_RETURN_IF_ERROR(segment->WaitReserved(end));
  CKPT_RETURN_IF_ERROR(CopyItems(ctx, session, part, chunk, ring, *segment));
  for (const auto& item : chunk.items) {
    const PieceTarget& target = session.target(part, item.piece);
    if (session.in_order(target.tensor)) {
      hasher->Add(target.tensor, segment->tensor_data(target.tensor) + item.offset, item.bytes);
    }
  }
  return Status::Ok();
}

// Checks the request's names (persist's rule for side files) and maps its ring read-only
// (null when it has none); the ring's descriptor is closed either way.
Result<std::unique_ptr<shm::ShmMapping>> CheckNamesAndMapRing(const protocol::WriteRequest& request,
                                                              UniqueFd ring_fd) {
  CKPT_RETURN_IF_ERROR(ValidateCheckpointName(request.name));
  if (!request.job.empty()) CKPT_RETURN_IF_ERROR(ValidateJobName(request.job));
  for (const auto& side : request.side_files) CKPT_RETURN_IF_ERROR(CheckSideFileName(side.name));  // persist's rule
  std::unique_ptr<shm::ShmMapping> ring;
  if (request.ring_bytes > 0) {
    if (!ring_fd.valid()) return InvalidArgument("a write with ring_bytes needs its ring passed with the request");
    CKPT_ASSIGN_OR_RETURN(ring, MapRing(ring_fd.get(), request.ring_bytes));
  }
  ring_fd.reset();
  return ring;
}

// Refuses a name the catalog would refuse, before any part waits or streams (BeginLoad
// checks again when it reserves).
Status CheckNameFree(const DaemonContext& ctx, const Caller& caller, const protocol::WriteRequest& request) {
  if (Status name_ok = ctx.catalog->CheckName(request.name, request.replace, caller.actor); !name_ok.ok()) {
    if (name_ok.code() == StatusCode::kAlreadyExists && !request.replace) {
      return AlreadyExists(name_ok.message() + "; write with replace to publish a new one");
    }
    return name_ok;
  }
  return Status::Ok();
}

// Phase 1: declares this part, waits for every part and the segment, then tells the part
// it may stream (a part that does not take that fails the session).
Status DeclareAndWaitReady(WriteSession& session, const protocol::WriteRequest& request, PartConnection& connection,
                           const std::function<Status()>& check) {
  Status declared = session.Declare(request);
  if (declared.code() == StatusCode::kAlreadyExists && !session.finished()) return declared;  // only this part
  CKPT_RETURN_IF_ERROR(declared);
  CKPT_RETURN_IF_ERROR(session.WaitReady(check));
  if (Status sent = connection.Send(protocol::Encode(protocol::WriteReadyEvent{session.generation()})); !sent.ok()) {
    session.Fail(sent);
    return sent;
  }
  return Status::Ok();
}

// A seal is refused unless every piece of the part received all its declared bytes.
Status CheckSealed(const WriteSession& session, int64_t part, const protocol::WriteRequest& request,
                   const std::vector<uint64_t>& received) {
  for (size_t i = 0; i < received.size(); ++i) {
    const uint64_t want = session.target(part, i).bytes;
    if (received[i] != want) {
      return InvalidArgument("part " + std::to_string(part) + " sealed with piece " + std::to_string(i) + " ('" +
                             request.pieces[i].key + "') holding " + std::to_string(received[i]) + " of its " +
                             std::to_string(want) + " bytes");
    }
  }
  return Status::Ok();
}

// Checks each chunk item in order (a declared piece, the next bytes of it within its size,
// inside the ring) and counts its bytes into `received` as it passes.
Status CheckChunkItems(const WriteSession& session, int64_t part, const protocol::WriteRequest& request,
                       const shm::ShmMapping* ring, const protocol::WriteChunkRequest& chunk,
                       std::vector<uint64_t>& received) {
  const size_t piece_count = received.size();
  for (const auto& item : chunk.items) {
    if (item.piece >= piece_count) {
      return InvalidArgument("chunk names piece " + std::to_string(item.piece) + "; part " + std::to_string(part) +
                             " declared " + std::to_string(piece_count));
    }
    const uint64_t want = session.target(part, item.piece).bytes;
    auto end = CheckedAdd(item.offset, item.bytes);
    if (item.offset != received[item.piece] || !end || *end > want) {
      return InvalidArgument("part " + std::to_string(part) + " sent bytes " + std::to_string(item.offset) + " + " +
                             std::to_string(item.bytes) + " of piece " + std::to_string(item.piece) + " ('" +
                             request.pieces[item.piece].key + "', " + std::to_string(want) + " bytes, " +
                             std::to_string(received[item.piece]) +
                             " received): beyond its declared size or out of order");
    }
    auto ring_end = CheckedAdd(item.ring_offset, item.bytes);
    if (!ring || !ring_end || *ring_end > std::min<uint64_t>(request.ring_bytes, ring->size())) {
      return InvalidArgument("chunk item leaves the ring of " + std::to_string(request.ring_bytes) + " bytes");
    }
    received[item.piece] = *end;
  }
  return Status::Ok();
}

}  // namespace

Result<protocol::LoadResponse> Write(const DaemonContext& ctx, const Caller& caller,
                                     const protocol::WriteRequest& request, UniqueFd ring_fd, LoadWatch* watch) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<shm::ShmMapping> ring, CheckNamesAndMapRing(request, std::move(ring_fd)));
  CKPT_RETURN_IF_ERROR(CheckNameFree(ctx, caller, request));
  CKPT_ASSIGN_OR_RETURN(std::shared_ptr<WriteSession> session, ctx.writes->Join(caller.actor, request));
  struct Leave {
    WriteSessions* table;
    const std::shared_ptr<WriteSession>& session;
    ~Leave() { table->Release(session); }
  } leave{ctx.writes, session};
  const int64_t part = request.part;
  PartConnection connection(ctx, caller, watch, part);
  auto check = [&] { return connection.Check(); };
  CKPT_RETURN_IF_ERROR(DeclareAndWaitReady(*session, request, connection, check));

  // Phase 2: chunks until the seal.
  std::vector<uint64_t> received(session->piece_count(part), 0);
  auto fail = [&](const Status& why) {
    session->Fail(why);
    return connection.AnswerAndClose(session->failure().ok() ? why : session->failure());
  };
  for (;;) {
    if (Status failed = session->failure(); !failed.ok()) return connection.AnswerAndClose(failed);
    if (ctx.stopping->load()) return fail(Unavailable("ckptd is stopping"));
    if (std::chrono::steady_clock::now() > session->deadline()) {
      return fail(DeadlineExceeded("part " + std::to_string(part) + " did not seal in time"));
    }
    if (Status idle = session->CheckIdle(); !idle.ok()) return fail(idle);
    pollfd p{caller.fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(kProgressInterval.count()));
    if (ready < 0 && errno != EINTR) return fail(ErrnoError("poll", errno));
    if (ready <= 0) continue;
    auto frame = protocol::ReadFrame(caller.fd, protocol::kMaxRequestBytes, nullptr,
                                     protocol::DeadlineIn(ctx.options->frame_timeout_s));
    if (!frame.ok()) {
      watch->drop_connection = true;
      return fail(Unavailable("part " + std::to_string(part) + " disconnected before sealing: " +
                              frame.status().message()));
    }
    session->Touch();
    auto op = protocol::DecodeOp(*frame);
    if (!op.ok()) return fail(op.status());
    if (*op == protocol::CancelRequest::kOp) {
      watch->cancel_consumed = true;
      return fail(Cancelled("part " + std::to_string(part) + " aborted the write"));
    }
    if (*op == protocol::WriteSealRequest::kOp) {
      if (Status sealed = CheckSealed(*session, part, request, received); !sealed.ok()) return fail(sealed);
      auto published = session->SealAndWait(part, check);
      if (!published.ok()) return connection.AnswerAndClose(published.status());
      return published;
    }
    if (*op != protocol::WriteChunkRequest::kOp) {
      return fail(InvalidArgument("'" + op->substr(0, 64) + "' during a write (only write_chunk, write_seal, cancel)"));
    }
    auto chunk = protocol::DecodeAs<protocol::WriteChunkRequest>(*frame);
    if (!chunk.ok()) return fail(chunk.status());
    if (Status items = CheckChunkItems(*session, part, request, ring.get(), *chunk, received); !items.ok()) {
      return fail(items);
    }
    if (!chunk->items.empty()) {
      if (Status copied = CopyChunk(ctx, *session, part, *chunk, ring->data()); !copied.ok()) return fail(copied);
    }
    session->Touch();  // copied: the idle time counts from here
    if (Status sent = connection.Send(protocol::Encode(protocol::WriteAckEvent{chunk->slot})); !sent.ok()) {
      return fail(sent);
    }
  }
}

}  // namespace ckpt::daemon
