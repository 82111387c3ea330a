#include "daemon/segment_adoption.h"

#include <dirent.h>
#include <unistd.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "daemon/ops.h"
#include "loader/segment_verifier.h"
#include "shm/segment_format.h"
#include "shm/segment_name.h"
#include "shm/segment_reader.h"

namespace ckpt::daemon {

namespace {

struct Candidate {
  std::string file;
  shm::SegmentName name;
  UniqueFd fd;
  CatalogEntry identity;  // only dev and ino: the file's identity
  std::unique_ptr<shm::SegmentReader> reader;
};

class Adopter {
 public:
  Adopter(const shm::SegmentDirectory& dir, const AdoptionOptions& options, AdoptionReport* report)
      : dir_(dir), options_(options), report_(report) {}

  void Remove(const std::string& file, const std::string& why) {
    spdlog::warn("removing segment {}: {}", dir_.PathOf(file), why);
    Status st = dir_.Remove(file);
    if (st.ok()) {
      ++report_->removed;
    } else {
      ++report_->remove_failures;
      spdlog::error("cannot remove {}: {}", dir_.PathOf(file), st.ToString());
    }
  }

  // The entry as a candidate, or nullopt (then it was removed).
  std::unique_ptr<Candidate> Examine(const shm::DirectoryEntry& e) {
    // Not a regular file by its directory entry: removed without being opened.
    if (e.type != DT_REG && e.type != DT_UNKNOWN) {
      Remove(e.name, e.type == DT_LNK   ? "a symbolic link (never followed)"
                     : e.type == DT_DIR ? "a directory, not a regular file"
                                        : "not a regular file (never opened)");
      return nullptr;
    }
    auto parsed = shm::SegmentName::Parse(e.name);
    if (!parsed) {
      Remove(e.name, "not a segment file name (never opened)");
      return nullptr;
    }
    if (options_.validate_name) {
      if (Status st = options_.validate_name(parsed->checkpoint); !st.ok()) {
        Remove(e.name, "bad checkpoint name (never opened): " + st.message());
        return nullptr;
      }
    }
    auto c = std::make_unique<Candidate>();
    c->file = e.name;
    c->name = *parsed;
    auto fd = dir_.OpenOwned(e.name, options_.segment_mode, sizeof(shm::SegmentHeader));
    if (!fd.ok()) {
      if (fd.status().code() == StatusCode::kResourceExhausted) {
        // Out of descriptors says nothing about the segment: left as it is, not removed.
        spdlog::error("cannot examine segment {}: {}", dir_.PathOf(e.name), fd.status().ToString());
        ++report_->remove_failures;
      } else if (fd.status().code() != StatusCode::kNotFound) {
        Remove(e.name, fd.status().message());
      }
      return nullptr;
    }
    c->fd = std::move(fd).value();
    if (Status identified = RecordSegmentIdentity(c->fd.get(), &c->identity); !identified.ok()) {
      Remove(e.name, identified.message());
      return nullptr;
    }
    auto reader = shm::SegmentReader::FromFd(c->fd.get(), dir_.PathOf(e.name));
    c->fd.reset();  // the reader keeps its mapping; no descriptor is held per candidate
    if (!reader.ok()) {
      Remove(e.name, reader.status().code() == StatusCode::kFailedPrecondition
                         ? "incomplete (a load was interrupted)"
                         : reader.status().ToString());
      return nullptr;
    }
    c->reader = std::move(reader).value();
    const shm::SegmentReader& r = *c->reader;
    if (r.checkpoint_name() != c->name.checkpoint || r.generation() != c->name.generation ||
        r.segment_id() != c->name.id) {
      Remove(e.name, "its header (checkpoint '" + r.checkpoint_name() + "', generation " +
                         std::to_string(r.generation()) + ", id " + shm::SegmentIdHex(r.segment_id()) +
                         ") does not match its file name");
      return nullptr;
    }
    return c;
  }

  // Re-hashes the data; true if every tensor matches.
  Result<bool> VerifyData(const Candidate& c) {
    CKPT_ASSIGN_OR_RETURN(loader::VerifyReport v,
                          loader::VerifySegment(*c.reader, std::max(1, options_.verify_threads), options_.cancel));
    report_->verified_bytes += v.bytes;
    report_->verify_seconds += v.seconds;
    if (v.ok()) return true;
    Remove(c.file, std::to_string(v.mismatch_count) + " of " + std::to_string(v.tensors) +
                       " tensors no longer match their checksums (first: '" + v.mismatched.front() + "')");
    return false;
  }

 private:
  const shm::SegmentDirectory& dir_;
  const AdoptionOptions& options_;
  AdoptionReport* report_;
};

// Counts (never opens) "<prefix>.*" objects directly under /dev/shm; directories (the
// segment directories /dev/shm/<prefix>.<random>) are not such objects.
uint64_t CountLegacyObjects(const std::string& prefix) {
  uint64_t n = 0;
  DIR* d = ::opendir(shm::kShmRoot);
  if (d == nullptr) return 0;
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_type != DT_DIR && std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) ++n;
  }
  ::closedir(d);
  return n;
}

}  // namespace

Result<AdoptionReport> AdoptSegments(const shm::SegmentDirectory& directory, const AdoptionOptions& options,
                                     Catalog* catalog) {
  AdoptionReport report;
  if (!options.legacy_prefix.empty()) {
    report.legacy_ignored = CountLegacyObjects(options.legacy_prefix);
    if (report.legacy_ignored > 0) {
      spdlog::warn("ignoring {} object(s) /dev/shm/{}* named like segments of an older ckptd: they are never opened "
                   "or adopted (segments now live in {}); remove them by hand once no client uses them",
                   report.legacy_ignored, options.legacy_prefix, directory.path());
    }
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<shm::DirectoryEntry> entries, directory.List());
  Adopter adopter(directory, options, &report);
  std::map<std::string, std::vector<std::unique_ptr<Candidate>>> by_name;
  for (const auto& e : entries) {
    if (auto c = adopter.Examine(e)) by_name[c->name.checkpoint].push_back(std::move(c));
  }
  for (auto& [name, candidates] : by_name) {
    // Newest first: the first whose data verifies wins, every other one goes.
    std::sort(candidates.begin(), candidates.end(),
              [](const auto& a, const auto& b) { return a->name.generation > b->name.generation; });
    bool adopted = false;
    for (auto& c : candidates) {
      if (options.cancel && options.cancel->load()) return FailedPrecondition("adoption cancelled");
      if (adopted) {
        adopter.Remove(c->file, "superseded by a newer generation of '" + name + "'");
        continue;
      }
      CKPT_ASSIGN_OR_RETURN(bool intact, adopter.VerifyData(*c));
      if (!intact) continue;
      const shm::SegmentReader& r = *c->reader;
      CatalogEntry entry;
      entry.name = name;
      entry.generation = r.generation();
      entry.shm_name = c->file;
      entry.segment_id = shm::SegmentIdHex(r.segment_id());
      entry.source_path = r.source_path();
      entry.format = "adopted";
      entry.segment_bytes = r.segment_bytes();
      // Sized for the directory's pages if it is a multiple of them; how the kernel maps it
      // is not measured here (that would fault the whole segment in).
      entry.page_bytes = r.segment_bytes() % directory.pages().segment_alignment() == 0
                             ? directory.pages().segment_alignment() : shm::kSmallPageBytes;
      for (const auto& t : r.tensors()) entry.data_bytes += t.nbytes;
      entry.load_seconds = r.header().load_nanos / 1e9;
      entry.loaded_unix_s = static_cast<int64_t>(r.header().created_unix_ns / 1000000000ull);
      entry.tensors = std::make_shared<const std::vector<TensorInfo>>(r.tensors());
      // The owner the daemon recorded in the header; a segment of an older ckptd recorded
      // none: it is then the daemon's, an admin's (only admins may alter it).
      const uint32_t flags = r.header().owner_flags;
      entry.owner = (flags & shm::kOwnerRecorded) != 0 ? OwnerOf(r.header().owner_uid, (flags & shm::kOwnerAdmin) != 0)
                                                       : OwnerOf(static_cast<uint32_t>(::geteuid()), true);
      entry.dev = c->identity.dev;  // no descriptor is kept per segment (attach opens it again)
      entry.ino = c->identity.ino;
      const std::string owner_text = Describe(entry.owner);
      Status st = catalog->Adopt(std::move(entry));
      if (!st.ok()) {
        adopter.Remove(c->file, st.message());
        continue;
      }
      adopted = true;
      ++report.adopted;
      spdlog::info("adopted '{}' generation {} ({} tensors, {} bytes, owned by {}) from {}", name, r.generation(),
                   r.tensors().size(), r.segment_bytes(), owner_text,
                   directory.PathOf(c->file));
    }
  }
  if (report.verified_bytes > 0 || report.adopted > 0) {
    spdlog::info("start-up verification: {} bytes of tensor data re-hashed in {:.3f} s ({:.2f} GiB/s, {} threads); "
                 "{} segment(s) adopted, {} removed",
                 report.verified_bytes, report.verify_seconds,
                 report.verified_bytes / std::max(report.verify_seconds, 1e-9) / (1 << 30),
                 std::max(1, options.verify_threads), report.adopted, report.removed);
  }
  return report;
}

}  // namespace ckpt::daemon
