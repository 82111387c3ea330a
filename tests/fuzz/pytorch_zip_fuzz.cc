// libFuzzer target: a whole PyTorch zip checkpoint (zip directory, data.pkl through the
// unpickler, views against their storages), read from a memfd like a file.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "format/pytorch_zip.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = ::memfd_create("fuzz.pt", 0);
  if (fd < 0) return 0;
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  auto file = ckpt::OpenedFileFromFd(ckpt::UniqueFd(::dup(fd)), "fuzz.pt");
  if (!file.ok()) return 0;
  ckpt::format::LoadPlan plan;
  if (ckpt::format::PlanPyTorchZipFile(*file, &plan).ok()) {
    for (const auto& t : plan.tensors) {
      const uint64_t span = t.strides.empty() ? t.nbytes : t.source_bytes;
      if (t.nbytes > 0 && (t.file_offset > size || span > size - t.file_offset)) __builtin_trap();  // the contract
    }
  }
  return 0;
}
