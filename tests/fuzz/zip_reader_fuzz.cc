// libFuzzer target: the zip central-directory reader over an in-memory archive.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "format/zip_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto read = [&](void* buf, size_t n, uint64_t off) -> ckpt::Status {
    if (off > size || n > size - off) return ckpt::Corrupt("past the end");
    if (n > 0) std::memcpy(buf, data + off, n);
    return ckpt::Status::Ok();
  };
  auto zip = ckpt::format::ZipReader::Create(read, size, "fuzz.zip");
  if (zip.ok()) {
    for (const auto& e : (*zip)->entries()) {
      if (e.data_offset > size || e.size > size - e.data_offset) __builtin_trap();  // the contract
    }
  }
  return 0;
}
