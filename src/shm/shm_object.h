// POSIX shared-memory objects and their mappings (Boost.Interprocess underneath).
// Boost exceptions are caught here and returned as Status.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/status.h"
#include "common/unique_fd.h"

namespace ckpt::shm {

// A mapping of a whole shared-memory object. Move-only; unmaps on destruction.
class ShmMapping {
 public:
  // Creates object `name` (fails with AlreadyExists if it exists) of `size` bytes with
  // permission bits `mode`, reserves its pages (ResourceExhausted if /dev/shm is too
  // small, so later writes cannot fault), and maps it read-write.
  static Result<std::unique_ptr<ShmMapping>> Create(const std::string& name, uint64_t size,
                                                    uint32_t mode);
  // Maps an existing object read-only. NotFound if it does not exist.
  static Result<std::unique_ptr<ShmMapping>> OpenReadOnly(const std::string& name);
  // Maps the whole object open at `fd` read-only (a descriptor the daemon passed over
  // the socket); `name` is for messages only. The descriptor may be closed afterwards.
  // Corrupt if it is empty, IoError if it cannot be sized or mapped.
  static Result<std::unique_ptr<ShmMapping>> FromFd(int fd, const std::string& name);

  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  const std::string& name() const { return name_; }
  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool writable() const { return writable_; }

 private:
  ShmMapping(std::string name, std::byte* data, uint64_t size, bool writable)
      : name_(std::move(name)), data_(data), size_(size), writable_(writable) {}
  std::string name_;
  std::byte* data_;
  uint64_t size_;
  bool writable_;
};

// Opens object `name` read-only (O_RDONLY, close-on-exec): the descriptor ckptd passes
// to clients. NotFound if it does not exist.
Result<UniqueFd> OpenShmReadOnlyFd(const std::string& name);
// Unlinks object `name`; existing mappings stay valid. OK if it did not exist.
Status RemoveShmObject(const std::string& name);
// Names of the shared-memory objects whose names start with `prefix`.
std::vector<std::string> ListShmObjects(const std::string& prefix);

}  // namespace ckpt::shm
