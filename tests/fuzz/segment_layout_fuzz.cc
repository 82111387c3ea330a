// libFuzzer target: the whole path from file bytes to a laid-out segment. The input is a
// checkpoint file (safetensors or PyTorch zip, told apart as the daemon does), read from a
// memfd through its descriptor: planned, validated (ValidatePlan, CheckExpansion with the
// daemon's default), loaded into a real segment (a private segment directory under /dev/shm) by the real loader
// (strided gathers included), then opened and validated by SegmentReader and every
// tensor checksum verified. Any crash, out-of-bounds write (ASan) or a published segment
// that does not validate is a bug.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "format/load_plan.h"
#include "format/pytorch_zip.h"
#include "format/safetensors.h"
#include "loader/checkpoint_loader.h"
#include "shm/segment_reader.h"
#include "shm/segment_directory.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = ::memfd_create("fuzz.ckpt", 0);
  if (fd < 0) return 0;
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  auto file = ckpt::OpenedFileFromFd(ckpt::UniqueFd(::dup(fd)), "fuzz.ckpt");
  if (!file.ok()) return 0;
  ckpt::format::LoadPlan plan;
  const bool zip = size >= 4 && std::memcmp(data, "PK\x03\x04", 4) == 0;
  ckpt::Status st = zip ? ckpt::format::PlanPyTorchZipFile(*file, &plan) : ckpt::format::PlanSafetensorsFile(*file, &plan);
  if (!st.ok() || !ckpt::format::ValidatePlan(plan).ok()) return 0;
  if (!ckpt::format::CheckExpansion(plan, ckpt::format::kDefaultMaxExpansion).ok()) return 0;
  if (plan.TotalBytes() > (256ull << 20)) return 0;  // within the fuzzer's memory limit
  plan.metadata["fuzz"] = "1";
  plan.side_files.push_back({"config.json", std::string(reinterpret_cast<const char*>(data), std::min<size_t>(size, 64))});

  static const auto segments =
      ckpt::shm::SegmentDirectory::Open(std::string(ckpt::shm::kShmRoot) + "/ckptfuzz-" + std::to_string(::getpid()));
  if (!segments.ok()) __builtin_trap();  // cannot test anything without a place for segments
  ckpt::shm::SegmentSpec spec;
  spec.directory = segments->get();
  spec.checkpoint_name = "fuzz";
  spec.generation = 1;
  spec.mode = 0600;
  ckpt::loader::LoadOptions options;
  options.threads = 1;
  options.direct_io = ckpt::loader::DirectIo::kNever;
  auto loaded = ckpt::loader::LoadIntoSegment(plan, spec, options);
  if (!loaded.ok()) return 0;  // a clear error, and the segment is gone
  auto reader = ckpt::shm::SegmentReader::FromFd(loaded->fd.get(), loaded->file_name);
  if (!reader.ok() || !(*reader)->VerifyChecksums().ok() || (*reader)->tensors().size() != plan.tensors.size() ||
      (*reader)->metadata().count("fuzz") != 1 || !(*reader)->SideFile("config.json").ok()) {
    __builtin_trap();  // the loader published a segment that does not read back
  }
  reader->reset();
  if (!(*segments)->Remove(loaded->file_name).ok()) __builtin_trap();
  return 0;
}
