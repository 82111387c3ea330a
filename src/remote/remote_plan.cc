#include "remote/remote_plan.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>

#include "common/io.h"
#include "format/safetensors.h"
#include "format/sharded_index.h"

namespace ckpt::remote {
namespace {

// The first bytes fetched of a safetensors file: most headers fit (one request).
constexpr uint64_t kHeadBytes = 256 << 10;

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A sealed memfd of `size` bytes holding `prefix` at offset 0 (the rest a hole), opened
// as an OpenedFile named `label`.
Result<std::shared_ptr<const OpenedFile>> StandIn(const std::string& label, const std::string& prefix, uint64_t size) {
  UniqueFd fd(::memfd_create("ckpt-remote", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoError("memfd_create for " + label, errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) return ErrnoError("ftruncate of a stand-in for " + label, errno);
  for (size_t at = 0; at < prefix.size();) {
    const ssize_t n = ::pwrite(fd.get(), prefix.data() + at, prefix.size() - at, static_cast<off_t>(at));
    if (n <= 0) return ErrnoError("writing a stand-in for " + label, errno);
    at += static_cast<size_t>(n);
  }
  (void)::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL);
  return OpenedFileFromFd(std::move(fd), label);
}

class Planner {
 public:
  Planner(const RemoteUrl& url, std::shared_ptr<const RemoteClient> client,
          const std::function<bool(const std::string&)>& allowed)
      : url_(url), client_(std::move(client)), allowed_(allowed) {}

  Result<RemotePlan> Run() {
    std::string folder;  // key of the folder whose side files are kept ("" for none)
    if (url_.folder) {
      folder = url_.key;
      CKPT_RETURN_IF_ERROR(PlanFolder());
    } else {
      const size_t slash = url_.key.rfind('/');
      folder = url_.key.substr(0, slash + 1);
      CKPT_RETURN_IF_ERROR(PlanFile(url_.key));
    }
    CKPT_RETURN_IF_ERROR(SideFiles(folder));
    CKPT_RETURN_IF_ERROR(format::ValidatePlan(out_.plan));
    for (const auto& f : out_.plan.files) {
      auto it = objects_.find(f.get());
      if (it == objects_.end()) return Internal("remote plan: a file without its object");
      out_.files.push_back(it->second);
    }
    out_.client = client_;
    return std::move(out_);
  }

 private:
  // The text of member `key` of the source's bucket or host, as --remote-allow sees it.
  std::string TextOf(const std::string& key) const {
    if (url_.scheme == RemoteUrl::Scheme::kS3) return "s3://" + url_.bucket + "/" + key;
    return (url_.scheme == RemoteUrl::Scheme::kHttps ? "https://" : "http://") + url_.authority + key;
  }

  Status PlanFolder() {
    const std::string index = url_.key + "model.safetensors.index.json";
    Status st = PlanFile(index);
    if (st.code() != StatusCode::kNotFound || st.message().find(TextOf(index) + ": no such") == std::string::npos) return st;
    const std::string single = url_.key + "model.safetensors";
    st = PlanFile(single);
    if (st.code() != StatusCode::kNotFound || st.message().find(TextOf(single) + ": no such") == std::string::npos) return st;
    std::string looked = "model.safetensors.index.json, model.safetensors";
    if (url_.scheme == RemoteUrl::Scheme::kS3) {
      CKPT_ASSIGN_OR_RETURN(std::vector<std::string> keys, List(url_.key));
      std::vector<std::string> indexes, files;
      for (const std::string& k : keys) {
        const std::string rest = k.substr(url_.key.size());
        if (rest.find('/') != std::string::npos) continue;  // deeper folders are not this checkpoint
        if (EndsWith(rest, ".safetensors.index.json")) indexes.push_back(k);
        else if (EndsWith(rest, ".safetensors")) files.push_back(k);
      }
      if (indexes.size() == 1) return PlanFile(indexes[0]);
      if (indexes.empty() && files.size() == 1) return PlanFile(files[0]);
      looked += "; the listing holds " + std::to_string(indexes.size()) + " *.safetensors.index.json and " +
                std::to_string(files.size()) + " *.safetensors (one index, or one file alone, is needed)";
    }
    return NotFound(url_.text + " is a folder without a checkpoint: looked for " + looked);
  }

  // ListObjectsV2 of `prefix`: every key, all pages.
  Result<std::vector<std::string>> List(const std::string& prefix) {
    std::vector<std::string> keys;
    std::string token;
    for (int page = 0; page < 100; ++page) {
      CKPT_ASSIGN_OR_RETURN(std::string xml, client_->FetchSmall(client_->Listing(url_, prefix, token), 16 << 20));
      for (size_t at = xml.find("<Key>"); at != std::string::npos; at = xml.find("<Key>", at + 5)) {
        const size_t end = xml.find("</Key>", at);
        if (end == std::string::npos) break;
        keys.push_back(xml.substr(at + 5, end - at - 5));
      }
      const size_t t = xml.find("<NextContinuationToken>");
      if (xml.find("<IsTruncated>true</IsTruncated>") == std::string::npos || t == std::string::npos) return keys;
      const size_t te = xml.find("</NextContinuationToken>", t);
      if (te == std::string::npos) return keys;
      token = xml.substr(t + 23, te - t - 23);
    }
    return keys;
  }

  // A file: an index (by its name) or a safetensors file (by its content).
  Status PlanFile(const std::string& key) {
    if (EndsWith(key, ".json")) return PlanIndex(key);
    return PlanSafetensors(key, &out_.plan);
  }

  Status PlanIndex(const std::string& key) {
    const ObjectRef ref = client_->Object(url_, key);
    ObjectIdentity identity;
    CKPT_ASSIGN_OR_RETURN(std::string text, client_->FetchSmall(ref, format::kMaxIndexJsonBytes, &identity));
    CKPT_ASSIGN_OR_RETURN(auto index, StandIn(ref.display, text, text.size()));
    const std::string dir = key.substr(0, key.rfind('/') + 1);
    CKPT_RETURN_IF_ERROR(format::PlanShardedCheckpoint(
        *index,
        [&](const std::string& shard, format::LoadPlan* p) -> Status {
          const std::string text_of = TextOf(dir + shard);
          if (!allowed_(text_of)) return PermissionDenied(text_of + " is not beneath a --remote-allow prefix");
          return PlanSafetensors(dir + shard, p).WithContext("shard " + shard);
        },
        &out_.plan));
    out_.plan.format += "-sharded";
    return Status::Ok();
  }

  Status PlanSafetensors(const std::string& key, format::LoadPlan* plan) {
    const ObjectRef ref = client_->Object(url_, key);
    ObjectIdentity identity;
    CKPT_ASSIGN_OR_RETURN(std::string head, client_->Fetch(ref, 0, kHeadBytes, &identity, true));
    if (head.size() >= 4 && std::memcmp(head.data(), "PK\x03\x04", 4) == 0) {
      return Unsupported(ref.display + ": a PyTorch zip checkpoint; remote sources are fetched as safetensors only "
                                       "(convert it, or copy it to a model root)");
    }
    if (head.size() >= 9 && head[8] != '{') {
      return Unsupported(ref.display + ": not a safetensors file (remote sources are safetensors only)");
    }
    if (head.size() >= 8) {
      uint64_t header_len = 0;
      for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(head[i]);
      // Lengths the parser would refuse are left to it (it says why).
      if (header_len <= format::kMaxSafetensorsHeaderBytes && header_len <= identity.size - 8 &&
          8 + header_len > head.size()) {
        CKPT_ASSIGN_OR_RETURN(std::string rest, client_->Fetch(ref, head.size(), 8 + header_len - head.size(), &identity, false));
        head += rest;
      }
    }
    CKPT_ASSIGN_OR_RETURN(auto stand_in, StandIn(ref.display, head, identity.size));
    objects_[stand_in.get()] = RemoteFile{ref, identity};
    return format::PlanSafetensorsFile(stand_in, plan);
  }

  Status SideFiles(const std::string& folder) {
    for (const char* name : format::kSideFileNames) {
      const std::string key = folder + name;
      if (!allowed_(TextOf(key))) continue;
      ObjectIdentity identity;
      auto bytes = client_->FetchSmall(client_->Object(url_, key), format::kMaxSideFileBytes, &identity);
      if (!bytes.ok()) {
        if (bytes.status().code() == StatusCode::kNotFound) continue;
        if (bytes.status().code() == StatusCode::kResourceExhausted) {
          out_.plan.notes.push_back(std::string("side file ") + name + " skipped: more than the limit of " +
                                    std::to_string(format::kMaxSideFileBytes) + " bytes");
          continue;
        }
        return bytes.status();
      }
      out_.plan.side_files.push_back({name, std::move(*bytes)});
    }
    return Status::Ok();
  }

  const RemoteUrl& url_;
  std::shared_ptr<const RemoteClient> client_;
  const std::function<bool(const std::string&)>& allowed_;
  RemotePlan out_;
  std::map<const OpenedFile*, RemoteFile> objects_;
};

}  // namespace

std::string RemotePlan::Identity() const {
  std::string text;
  for (const RemoteFile& f : files) text += f.ref.display + " " + f.identity.Fingerprint() + "\n";
  return text;
}

Result<RemotePlan> PlanRemoteCheckpoint(const RemoteUrl& url, std::shared_ptr<const RemoteClient> client,
                                        const std::function<bool(const std::string&)>& allowed) {
  Planner planner(url, std::move(client), allowed);
  return planner.Run();
}

}  // namespace ckpt::remote
