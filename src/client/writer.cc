#include "ckpt/writer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>

#include "common/checked_math.h"
#include "common/element_count.h"
#include "common/side_file_name.h"
#include "client/wire_mapping.h"
#include "common/unique_fd.h"
#include "protocol/messages.h"
#include "protocol/wire.h"

namespace ckpt {

using nlohmann::json;

namespace {

// The staging ring: a memfd mapped read-write here and sealed against shrinking (and
// growing) before the daemon sees it, so its read-only mapping can never fault.
class Ring {
 public:
  static Result<std::unique_ptr<Ring>> Create(uint64_t bytes) {
    UniqueFd fd(::memfd_create("ckpt-write-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd.valid()) return ErrnoError("memfd_create", errno);
    if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) return ErrnoError("ftruncate of the ring", errno);
    if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      return ErrnoError("sealing the ring", errno);
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) return ErrnoError("mapping the ring", errno);
    return std::unique_ptr<Ring>(new Ring(std::move(fd), static_cast<std::byte*>(p), bytes));
  }
  ~Ring() { ::munmap(data_, bytes_); }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  int fd() const { return fd_.get(); }
  std::byte* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }

 private:
  Ring(UniqueFd fd, std::byte* data, uint64_t bytes) : fd_(std::move(fd)), data_(data), bytes_(bytes) {}
  UniqueFd fd_;
  std::byte* data_;
  uint64_t bytes_;
};

// The ring's shape: at most ring_slots x slot_bytes, less for a small write (one slot of
// whole pages, or fewer slots).
struct RingShape {
  uint64_t slot, slots;
};
RingShape ShapeRing(uint64_t total, const WriterOptions& options) {
  const uint64_t page = 4096;
  uint64_t slot = options.slot_bytes;
  uint64_t slots = options.ring_slots;
  if (total < slot * slots) {
    const uint64_t rounded = (total + page - 1) / page * page;
    if (rounded <= slot) {
      slot = std::max(rounded, page);
      slots = 1;
    } else {
      slots = std::min<uint64_t>(slots, (rounded + slot - 1) / slot);
    }
  }
  return {slot, slots};
}

struct Piece {
  protocol::WritePiece declared;
  uint64_t bytes = 0;
  PieceSource source;
};

}  // namespace

struct Writer::Impl {
  std::string socket_path;
  std::string name;
  WriterOptions options;
  std::vector<Piece> pieces;
  std::vector<protocol::WriteSideFile> side_files;  // (name, bytes)
  uint64_t total = 0;
  bool committed = false;
  std::atomic<bool> aborted{false};
  std::mutex fd_mu;  // guards fd for Abort from another thread
  UniqueFd fd;

  Status AddPiece(protocol::WritePiece declared, PieceSource source);
  Result<LoadResult> Commit();
  // Reads frames until the response; events go to on_event (ack slots are pushed to
  // `free_slots` when set). Returns the response's Status/fields through *response.
  Result<json> ReadUntilResponse(std::deque<uint64_t>* free_slots, bool stop_at_ack, bool* got_response);
  Status Sent(const Status& sent);
  // Commit's steps, in order; each error is Commit's.
  Status Connect();
  Status SendRequest(const Ring* ring);
  Status StreamPieces(Ring* ring, uint64_t slot, std::deque<uint64_t>& free_slots);
  Result<LoadResult> SealAndWait(std::deque<uint64_t>& free_slots);
};

Writer::Writer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Writer::~Writer() { Abort(); }

Result<std::unique_ptr<Writer>> Writer::Create(const std::string& socket_path, const std::string& name,
                                               const WriterOptions& options) {
  if (options.parts < 1 || options.parts > protocol::kMaxWriteParts) {
    return InvalidArgument("parts must be 1 to " + std::to_string(protocol::kMaxWriteParts));
  }
  if (options.part < 0 || options.part >= options.parts) {
    return InvalidArgument("part " + std::to_string(options.part) + " is not in [0, " + std::to_string(options.parts) +
                           ")");
  }
  if (options.parts > 1 && options.job.empty()) {
    return InvalidArgument("a write in " + std::to_string(options.parts) + " parts needs a job id shared by all parts");
  }
  if (options.ring_slots < 1 || options.ring_slots > 64 || options.slot_bytes < 4096 ||
      options.slot_bytes > (1ull << 32) || options.slot_bytes % 4096 != 0) {
    return InvalidArgument("the ring needs 1 to 64 slots of 4 KiB to 4 GiB (a multiple of 4 KiB) each");
  }
  if (!(options.timeout_s >= 0 && options.timeout_s <= 86400)) return InvalidArgument("timeout must be 0 to 86400 s");
  auto impl = std::make_unique<Impl>();
  impl->socket_path = socket_path;
  impl->name = name;
  impl->options = options;
  return std::unique_ptr<Writer>(new Writer(std::move(impl)));
}

Status Writer::Impl::AddPiece(protocol::WritePiece declared, PieceSource source) {
  if (committed) return FailedPrecondition("this writer has already committed");
  if (declared.key.empty()) return InvalidArgument("a tensor needs a name");
  if (DTypeSize(declared.dtype) == 0) {
    return Unsupported(std::string("tensor '") + declared.key + "': " + DTypeName(declared.dtype) +
                       " (a sub-byte dtype) cannot be written piecewise");
  }
  uint64_t numel = 1;
  if (declared.flat) {
    numel = declared.numel;
    auto counted = ElementCount(declared.global_shape);
    if (!counted.ok()) return InvalidArgument("tensor '" + declared.key + "': its shape: " + counted.status().message());
    const uint64_t global = *counted;
    auto end = CheckedAdd(declared.start, declared.numel);
    if (!end || *end > global) {
      return InvalidArgument("tensor '" + declared.key + "': the flat piece leaves the tensor of " +
                             std::to_string(global) + " elements");
    }
  } else {
    if (declared.offsets.empty()) declared.offsets.assign(declared.global_shape.size(), 0);
    if (declared.offsets.size() != declared.global_shape.size() ||
        declared.shape.size() != declared.global_shape.size()) {
      return InvalidArgument("tensor '" + declared.key + "': offsets and shape need one entry per global dim");
    }
    for (size_t d = 0; d < declared.shape.size(); ++d) {
      if (declared.offsets[d] < 0 || declared.shape[d] < 0 || declared.offsets[d] > declared.global_shape[d] ||
          declared.shape[d] > declared.global_shape[d] - declared.offsets[d]) {
        return InvalidArgument("tensor '" + declared.key + "': the box leaves the global shape in dim " +
                               std::to_string(d));
      }
    }
    auto counted = ElementCount(declared.shape);
    if (!counted.ok()) return InvalidArgument("tensor '" + declared.key + "': its shape: " + counted.status().message());
    numel = *counted;
  }
  auto bytes = TensorBytes(declared.dtype, numel);
  auto new_total = bytes ? CheckedAdd(total, *bytes) : std::nullopt;
  if (!new_total) return InvalidArgument("tensor '" + declared.key + "': its size overflows");
  Piece piece;
  piece.declared = std::move(declared);
  piece.bytes = *bytes;
  piece.source = std::move(source);
  pieces.push_back(std::move(piece));
  total = *new_total;
  return Status::Ok();
}

Status Writer::AddBox(const std::string& key, DType dtype, const std::vector<int64_t>& global_shape,
                      const std::vector<int64_t>& offsets, const std::vector<int64_t>& shape, PieceSource source) {
  protocol::WritePiece p;
  p.key = key;
  p.dtype = dtype;
  p.global_shape = global_shape;
  p.offsets = offsets;
  p.shape = offsets.empty() && shape.empty() ? global_shape : shape;
  return impl_->AddPiece(std::move(p), std::move(source));
}

Status Writer::Add(const std::string& key, DType dtype, const std::vector<int64_t>& shape, const void* data) {
  const auto* base = static_cast<const std::byte*>(data);
  return AddBox(key, dtype, shape, {}, shape, [base](uint64_t offset, void* dst, uint64_t size) {
    std::memcpy(dst, base + offset, size);
    return Status::Ok();
  });
}

Status Writer::AddFlat(const std::string& key, DType dtype, const std::vector<int64_t>& global_shape, uint64_t start,
                       uint64_t numel, PieceSource source) {
  protocol::WritePiece p;
  p.key = key;
  p.dtype = dtype;
  p.global_shape = global_shape;
  p.flat = true;
  p.start = start;
  p.numel = numel;
  return impl_->AddPiece(std::move(p), std::move(source));
}

Status Writer::AddSideFile(const std::string& name, std::string bytes) {
  if (impl_->committed) return FailedPrecondition("this writer has already committed");
  CKPT_RETURN_IF_ERROR(CheckSideFileName(name));  // the daemon checks it again
  for (const auto& s : impl_->side_files) {
    if (s.name == name) return AlreadyExists("side file '" + name + "' was already added");
  }
  impl_->side_files.push_back(protocol::WriteSideFile{name, std::move(bytes)});
  return Status::Ok();
}

uint64_t Writer::piece_count() const { return impl_->pieces.size(); }
uint64_t Writer::declared_bytes() const { return impl_->total; }

void Writer::Abort() {
  impl_->aborted.store(true);
  std::lock_guard<std::mutex> lock(impl_->fd_mu);
  if (impl_->fd.valid()) ::shutdown(impl_->fd.get(), SHUT_RDWR);  // the daemon fails the write
}

Result<LoadResult> Writer::Commit() {
  if (impl_->committed) return FailedPrecondition("this writer has already committed");
  impl_->committed = true;
  return impl_->Commit();
}

Result<json> Writer::Impl::ReadUntilResponse(std::deque<uint64_t>* free_slots, bool stop_at_ack, bool* got_response) {
  *got_response = false;
  for (;;) {
    if (aborted.load()) return Cancelled("the write was aborted");
    CKPT_ASSIGN_OR_RETURN(json frame, protocol::ReadFrame(fd.get(), protocol::kMaxResponseBytes));
    const std::string event = protocol::EventName(frame);
    if (event.empty()) {
      *got_response = true;
      CKPT_RETURN_IF_ERROR(protocol::StatusOf(frame));
      return frame;
    }
    if (event == protocol::kWriteAckEvent) {
      CKPT_ASSIGN_OR_RETURN(auto ack, protocol::DecodeAs<protocol::WriteAckEvent>(frame));
      if (free_slots != nullptr) free_slots->push_back(ack.slot);
      if (stop_at_ack) return frame;
      continue;
    }
    if (event == protocol::kWriteReadyEvent) return frame;
    if (event == protocol::kClosingEvent) return Unavailable("ckptd closed the connection before reading the write");
  }
}

// A send that failed because the daemon answered and closed: its answer is the error.
Status Writer::Impl::Sent(const Status& sent) {
  if (sent.ok()) return sent;
  bool got = false;
  auto answer = ReadUntilResponse(nullptr, false, &got);
  if (got && !answer.ok()) return answer.status();
  return sent;
}

// Connects to ckptd; the descriptor is stored under fd_mu so that Abort can shut it down.
Status Writer::Impl::Connect() {
  CKPT_ASSIGN_OR_RETURN(UniqueFd connected, protocol::ConnectUnix(socket_path));
  std::lock_guard<std::mutex> lock(fd_mu);
  fd = std::move(connected);
  return Status::Ok();
}

// Sends the write request (with the ring's descriptor when there is one) and waits for the
// daemon's ready event; a response instead of it is an error.
Status Writer::Impl::SendRequest(const Ring* ring) {
  protocol::WriteRequest request;
  request.name = name;
  request.job = options.job;
  request.part = options.part;
  request.parts = options.parts;
  request.replace = options.replace;
  request.timeout_s = options.timeout_s;
  request.ring_bytes = ring ? ring->bytes() : 0;
  for (const Piece& p : pieces) request.pieces.push_back(p.declared);
  request.side_files = side_files;
  json frame = protocol::Encode(request);
  frame["v"] = protocol::kProtocolVersion;
  frame["op"] = protocol::WriteRequest::kOp;
  CKPT_RETURN_IF_ERROR(Sent(ring ? protocol::WriteFrameWithFd(fd.get(), frame, ring->fd())
                                 : protocol::WriteFrame(fd.get(), frame)));
  bool got_response = false;
  CKPT_ASSIGN_OR_RETURN(json ready, ReadUntilResponse(nullptr, false, &got_response));
  if (got_response) return Internal("ckptd answered a write before it was sealed");
  return Status::Ok();
}

// Fills the ring's free slots from the pieces in order and sends them as chunks, waiting for
// acks when no slot is free; a source's error hangs up (the daemon fails the whole write).
Status Writer::Impl::StreamPieces(Ring* ring, uint64_t slot, std::deque<uint64_t>& free_slots) {
  bool got_response = false;
  protocol::WriteChunkRequest chunk;
  bool open = false;
  uint64_t fill = 0;
  auto send_chunk = [&]() -> Status {
    json c = protocol::Encode(chunk);
    c["v"] = protocol::kProtocolVersion;
    c["op"] = protocol::WriteChunkRequest::kOp;
    CKPT_RETURN_IF_ERROR(Sent(protocol::WriteFrame(fd.get(), c)));
    chunk.items.clear();
    open = false;
    fill = 0;
    return Status::Ok();
  };
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    uint64_t offset = 0;
    while (offset < p.bytes) {
      if (!open) {
        while (free_slots.empty()) {
          CKPT_RETURN_IF_ERROR(ReadUntilResponse(&free_slots, true, &got_response).status());
          if (got_response) return Internal("ckptd answered a write before it was sealed");
        }
        chunk.slot = free_slots.front();
        free_slots.pop_front();
        open = true;
        fill = 0;
      }
      const uint64_t n = std::min(p.bytes - offset, slot - fill);
      const uint64_t ring_offset = chunk.slot * slot + fill;
      if (aborted.load()) return Cancelled("the write was aborted");
      Status filled = p.source(offset, ring->data() + ring_offset, n);
      if (!filled.ok()) {
        // The daemon sees the hang-up and fails the whole write.
        std::lock_guard<std::mutex> lock(fd_mu);
        fd.reset();
        return filled;
      }
      chunk.items.push_back(protocol::WriteChunkItem{i, offset, ring_offset, n});
      offset += n;
      fill += n;
      if (fill == slot || chunk.items.size() == protocol::kWriteChunkItemsPerFrame) CKPT_RETURN_IF_ERROR(send_chunk());
    }
  }
  if (open && !chunk.items.empty()) CKPT_RETURN_IF_ERROR(send_chunk());
  return Status::Ok();
}

// Sends the seal and reads (acks included) until the response, then closes the connection
// and decodes the published result.
Result<LoadResult> Writer::Impl::SealAndWait(std::deque<uint64_t>& free_slots) {
  json seal{{"v", protocol::kProtocolVersion}, {"op", protocol::WriteSealRequest::kOp}};
  CKPT_RETURN_IF_ERROR(Sent(protocol::WriteFrame(fd.get(), seal)));
  bool got_response = false;
  for (;;) {
    CKPT_ASSIGN_OR_RETURN(json response, ReadUntilResponse(&free_slots, false, &got_response));
    if (got_response) {
      std::lock_guard<std::mutex> lock(fd_mu);
      fd.reset();
      return client::DecodePublic<LoadResult>(response);
    }
  }
}

Result<LoadResult> Writer::Impl::Commit() {
  if (aborted.load()) return Cancelled("the write was aborted");
  const RingShape shape = ShapeRing(total, options);
  std::unique_ptr<Ring> ring;
  if (total > 0) {
    CKPT_ASSIGN_OR_RETURN(ring, Ring::Create(shape.slot * shape.slots));
    if (options.on_ring_mapped) options.on_ring_mapped(ring->data(), ring->bytes());
  }
  struct Unmapping {
    const WriterOptions& options;
    Ring* ring;
    ~Unmapping() {
      if (ring != nullptr && options.on_ring_unmapping) options.on_ring_unmapping(ring->data(), ring->bytes());
    }
  } unmapping{options, ring.get()};

  CKPT_RETURN_IF_ERROR(Connect());
  if (aborted.load()) return Cancelled("the write was aborted");
  CKPT_RETURN_IF_ERROR(SendRequest(ring.get()));
  std::deque<uint64_t> free_slots;
  for (uint64_t s = 0; s < shape.slots; ++s) free_slots.push_back(s);
  CKPT_RETURN_IF_ERROR(StreamPieces(ring.get(), shape.slot, free_slots));
  return SealAndWait(free_slots);
}

}  // namespace ckpt
