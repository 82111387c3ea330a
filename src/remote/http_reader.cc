#include "remote/http_reader.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>

#include <unistd.h>

#include "common/pause_point.h"
#include "common/thread_pool.h"

namespace ckpt::remote {
namespace {

using Clock = std::chrono::steady_clock;

constexpr long kReceiveBuffer = 256L << 10;  // per transfer; libcurl's most is 512 KiB (7.88)

// One op's transfer, reused across its attempts.
struct Transfer {
  size_t op = 0;
  const loader::ReadOp* read = nullptr;
  const RemoteFile* file = nullptr;
  const RemoteClient* client = nullptr;
  uint64_t got = 0;       // bytes of the op in place (from earlier attempts and this one)
  uint64_t at = 0;        // this attempt's first byte (file offset)
  uint64_t want = 0;      // this attempt's length
  int attempt = 0;
  bool checked = false;   // this attempt's response passed CheckResponse
  bool overflow = false;  // more body than the range
  Status refused;         // CheckResponse's verdict, when it failed
  Status landing;         // Land's error, when the bytes could not be put in the segment
  ResponseHead head;
  std::string error_body;
  Clock::time_point due;  // a retry starts no earlier
  CURL* h = nullptr;
  curl_slist* headers = nullptr;
  ~Transfer() {
    if (h) curl_easy_cleanup(h);
    if (headers) curl_slist_free_all(headers);
  }
};

std::string RangeText(const Transfer& t) {
  return "bytes " + std::to_string(t.read->offset) + "-" + std::to_string(t.read->offset + t.read->length - 1);
}

// The error for a range whose shared-memory pages cannot be had (errno `err`).
Status NoRoom(const Transfer& t, int err) {
  return ResourceExhausted("no room in shared memory for " + t.file->ref.display + " (" + RangeText(t) +
                           (err == ENOMEM ? "): out of memory" : "): file system full"));
}

// Populates the op's pages, for stores through op.dst: one system call for the range, not
// one fault per 4 KiB inside the copy, and a full tmpfs is an error here instead of a
// SIGBUS there.
Status PopulateRange(const Transfer& t) {
  const int err = loader::PopulateForWrite(t.read->dst, t.read->length);
  if (err == EFAULT || err == ENOMEM || err == ENOSPC) return NoRoom(t, err);
  return Status::Ok();  // 0, or EINVAL (an old kernel: the copy takes the faults)
}

// Puts body bytes at the op's byte t->got: pwrite to the segment's descriptor where it has
// one (tmpfs allocates the pages as they are written, without zero-filling them first),
// else stores through the mapping, populated when the transfer began.
Status Land(Transfer* t, const char* data, size_t bytes) {
  if (t->read->dst_fd < 0) {
    std::memcpy(t->read->dst + t->got, data, bytes);
    t->got += bytes;
    return Status::Ok();
  }
  while (bytes > 0) {
    const ssize_t w = ::pwrite(t->read->dst_fd, data, bytes, static_cast<off_t>(t->read->dst_offset + t->got));
    if (w > 0) {
      t->got += static_cast<uint64_t>(w);
      data += w;
      bytes -= static_cast<size_t>(w);
      continue;
    }
    const int err = w < 0 ? errno : EIO;
    if (err == EINTR) continue;
    if (err == ENOSPC || err == ENOMEM || err == EFBIG) return NoRoom(*t, err);
    return ErrnoError("writing " + t->file->ref.display + " (" + RangeText(*t) + ") into the segment", err);
  }
  return Status::Ok();
}

size_t WriteBody(char* data, size_t size, size_t n, void* userdata) {
  auto* t = static_cast<Transfer*>(userdata);
  const size_t bytes = size * n;
  if (t->head.status != 206 && t->head.status != 200) {  // an error document: keep its start
    if (t->error_body.size() < 4096) t->error_body.append(data, std::min<size_t>(bytes, 4096 - t->error_body.size()));
    return bytes;
  }
  if (!t->checked) {
    ObjectIdentity pinned = t->file->identity;
    t->refused = t->client->CheckResponse(t->file->ref, t->at, t->want, t->head, &pinned, false);
    if (!t->refused.ok()) return 0;
    t->checked = true;
  }
  if (bytes > t->read->length - t->got) {
    t->overflow = true;
    return 0;
  }
  t->landing = Land(t, data, bytes);
  return t->landing.ok() ? bytes : 0;
}

}  // namespace

Result<std::unique_ptr<HttpReader>> HttpReader::Create(std::shared_ptr<const RemoteClient> client,
                                                       std::vector<RemoteFile> files,
                                                       const loader::ReaderOptions& options) {
  if (!client) return InvalidArgument("no remote client");
  if (options.threads < 1 || options.queue_depth < 1) return InvalidArgument("remote reader: threads and depth >= 1");
  return std::unique_ptr<HttpReader>(new HttpReader(std::move(client), std::move(files), options));
}

std::string HttpReader::Describe() const {
  return "ranged GETs, " + std::to_string(options_.threads) + " threads x " + std::to_string(options_.queue_depth) +
         " in flight";
}

Status HttpReader::ReadAll(const std::vector<loader::SourceFile>& files, const std::vector<loader::ReadOp>& ops,
                           const std::function<void(size_t)>& on_done, const std::function<void()>& tick) {
  if (files.size() != files_.size()) return Internal("remote reader: the plan's files and the objects differ");
  for (const loader::ReadOp& op : ops) {
    if (op.length > options_.chunk_bytes || op.file >= files_.size() || op.length == 0) {
      return InvalidArgument("read op out of bounds");
    }
    if (op.mode != loader::ReadMode::kBuffered) {
      return InvalidArgument("remote reads land in place: no O_DIRECT");
    }
  }
  const RemoteOptions& ro = client_->options();
  const auto start = Clock::now();
  std::atomic<size_t> next{0};
  const int threads = static_cast<int>(std::min<size_t>(options_.threads, std::max<size_t>(ops.size(), 1)));
  return RunWorkers(
      threads,
      [&](int, const std::atomic<bool>& stop) -> Status {
        CURLM* multi = curl_multi_init();
        if (!multi) return ResourceExhausted("curl_multi_init failed");
        struct MultiCleanup {
          CURLM* m;
          ~MultiCleanup() { curl_multi_cleanup(m); }
        } cleanup{multi};
        std::deque<std::unique_ptr<Transfer>> waiting;  // retries, by due time (roughly)
        std::vector<std::unique_ptr<Transfer>> active;
        const size_t depth = static_cast<size_t>(options_.queue_depth);
        Status result;
        auto remove = [&](Transfer* t) -> std::unique_ptr<Transfer> {
          curl_multi_remove_handle(multi, t->h);
          for (auto it = active.begin(); it != active.end(); ++it) {
            if (it->get() == t) {
              std::unique_ptr<Transfer> own = std::move(*it);
              active.erase(it);
              return own;
            }
          }
          return nullptr;
        };
        auto begin = [&](std::unique_ptr<Transfer> t) -> Status {
          if (!t->h) t->h = curl_easy_init();
          if (!t->h) return ResourceExhausted("curl_easy_init failed");
          if (t->headers) {
            curl_slist_free_all(t->headers);
            t->headers = nullptr;
          }
          if (t->attempt == 0 && t->read->dst_fd < 0) {
            // Stores through the mapping: the range populated first, whether or not
            // op.populate asks (most of a loopback load's CPU time otherwise).
            CKPT_RETURN_IF_ERROR(PopulateRange(*t));
          }
          ++t->attempt;
          t->at = t->read->offset + t->got;
          t->want = t->read->length - t->got;
          t->checked = false;
          t->overflow = false;
          t->refused = Status::Ok();
          t->landing = Status::Ok();
          t->head.Clear();
          t->error_body.clear();
          CKPT_RETURN_IF_ERROR(client_->Configure(t->h, t->file->ref, t->at, t->want, &t->file->identity, &t->headers));
          curl_easy_setopt(t->h, CURLOPT_HEADERDATA, &t->head);
          curl_easy_setopt(t->h, CURLOPT_WRITEFUNCTION, &WriteBody);
          // Bigger reads than libcurl's 16 KiB: fewer recv calls and callbacks per range.
          curl_easy_setopt(t->h, CURLOPT_BUFFERSIZE, kReceiveBuffer);
          curl_easy_setopt(t->h, CURLOPT_WRITEDATA, t.get());
          curl_easy_setopt(t->h, CURLOPT_PRIVATE, t.get());
          if (curl_multi_add_handle(multi, t->h) != CURLM_OK) return Internal("curl_multi_add_handle failed");
          active.push_back(std::move(t));
          return Status::Ok();
        };
        // The end of an attempt: done, retried later, or the load's error.
        auto finished = [&](Transfer* raw, CURLcode rc) -> Status {
          std::unique_ptr<Transfer> t = remove(raw);
          curl_easy_getinfo(t->h, CURLINFO_RESPONSE_CODE, &t->head.status);
          const std::string where = t->file->ref.display + " (" + RangeText(*t) + ")";
          if (!t->landing.ok()) return t->landing;
          if (!t->refused.ok()) return t->refused.WithContext(RangeText(*t));
          if (t->overflow) return Corrupt(where + ": the server sent more bytes than the range asked for");
          std::string why;
          bool retry = false;
          if (rc == CURLE_OK && (t->head.status == 206 || t->head.status == 200)) {
            if (!t->checked) {  // an empty body where bytes were due: CheckResponse never ran
              ObjectIdentity pinned = t->file->identity;
              CKPT_RETURN_IF_ERROR(client_->CheckResponse(t->file->ref, t->at, t->want, t->head, &pinned, false)
                                       .WithContext(RangeText(*t)));
            }
            if (t->got == t->read->length) {
              // Tests stop here, the first range of the load in place, the next not yet
              // asked for (with one connection), and replace the object.
              PausePoint("remote-first-range");
              on_done(t->op);
              return Status::Ok();
            }
            why = "short body (" + std::to_string(t->got) + " of " + std::to_string(t->read->length) + " bytes)";
            retry = true;
          } else {
            t->head.error_body = t->error_body;
            retry = RemoteClient::Classify(rc, t->head, &why) == FailureKind::kRetry;
            if (!retry) {
              if (rc != CURLE_OK) return IoError(where + ": " + why);
              return client_->FatalError(t->file->ref, why, t->head).WithContext(RangeText(*t));
            }
            // Bytes that landed before a reset passed CheckResponse: they stay, and the
            // retry asks only for the rest.
          }
          const double secs = std::chrono::duration<double>(Clock::now() - start).count();
          if (t->attempt >= ro.max_attempts || secs >= ro.timeout_s) {
            return Unavailable(where + ": giving up after " + std::to_string(t->attempt) + " attempts (load fetching for " +
                               std::to_string(static_cast<int>(secs * 1000)) + " ms): " + why);
          }
          t->due = Clock::now() + client_->Backoff(t->attempt + 1);
          waiting.push_back(std::move(t));
          return Status::Ok();
        };
        for (;;) {
          if (stop.load(std::memory_order_relaxed)) break;
          if (options_.cancel && options_.cancel->load()) {
            result = FailedPrecondition("load cancelled");
            break;
          }
          // Fill the free slots: due retries first, then new ops.
          const auto now = Clock::now();
          for (size_t w = 0; w < waiting.size() && active.size() < depth;) {
            if (waiting[w]->due <= now) {
              std::unique_ptr<Transfer> t = std::move(waiting[w]);
              waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(w));
              result = begin(std::move(t));
              if (!result.ok()) break;
            } else {
              ++w;
            }
          }
          if (!result.ok()) break;
          while (active.size() + waiting.size() < depth) {
            const size_t i = next.fetch_add(1);
            if (i >= ops.size()) break;
            auto t = std::make_unique<Transfer>();
            t->op = i;
            t->read = &ops[i];
            t->file = &files_[ops[i].file];
            t->client = client_.get();
            result = begin(std::move(t));
            if (!result.ok()) break;
          }
          if (!result.ok()) break;
          if (active.empty() && waiting.empty()) break;  // every op of this thread done
          int running = 0;
          curl_multi_perform(multi, &running);
          int left = 0;
          bool freed = false;  // a transfer ended: its slot is refilled before any wait
          while (CURLMsg* msg = curl_multi_info_read(multi, &left)) {
            if (msg->msg != CURLMSG_DONE) continue;
            freed = true;
            Transfer* t = nullptr;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, reinterpret_cast<char**>(&t));
            const CURLcode rc = msg->data.result;
            result = finished(t, rc);
            if (!result.ok()) break;
          }
          if (!result.ok()) break;
          // Waiting now would leave the freed slot idle until other traffic or the timeout
          // (100 ms per range with one connection): fill it first.
          if (freed) continue;
          int wait_ms = 100;
          if (!waiting.empty()) {
            auto soonest = waiting.front()->due;
            for (const auto& t : waiting) soonest = std::min(soonest, t->due);
            const auto until = std::chrono::duration_cast<std::chrono::milliseconds>(soonest - Clock::now()).count();
            wait_ms = static_cast<int>(std::clamp<int64_t>(until, 0, 100));
          }
          if (!active.empty()) {
            curl_multi_poll(multi, nullptr, 0, wait_ms, nullptr);
          } else if (wait_ms > 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
          }
        }
        for (auto& t : active) curl_multi_remove_handle(multi, t->h);
        active.clear();
        return result;
      },
      tick);
}

}  // namespace ckpt::remote
