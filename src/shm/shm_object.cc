#include "shm/shm_object.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>

namespace ckpt::shm {
namespace bip = boost::interprocess;

namespace {
Status FromBoost(const bip::interprocess_exception& e, const std::string& what) {
  switch (e.get_error_code()) {
    case bip::already_exists_error:
      return AlreadyExists(what + ": already exists");
    case bip::not_found_error:
      return NotFound(what + ": no such shared-memory object");
    case bip::security_error:
      return PermissionDenied(what + ": " + e.what());
    default:
      return IoError(what + ": " + e.what());
  }
}
}  // namespace

Result<std::unique_ptr<ShmMapping>> ShmMapping::Create(const std::string& name, uint64_t size,
                                                       uint32_t mode) {
  if (size == 0) return InvalidArgument("a shared-memory object needs at least one byte");
  try {
    bip::permissions perm;
    perm.set_permissions(static_cast<int>(mode));
    bip::shared_memory_object obj(bip::create_only, name.c_str(), bip::read_write, perm);
    int fd = obj.get_mapping_handle().handle;
    // Remove the object again unless everything below succeeds.
    struct Remover {
      const std::string& name;
      bool armed = true;
      ~Remover() {
        if (armed) bip::shared_memory_object::remove(name.c_str());
      }
    } remover{name};
    if (::fchmod(fd, mode) != 0) return ErrnoError("chmod of shm object " + name, errno);
    if (int err = ::posix_fallocate(fd, 0, static_cast<off_t>(size)); err != 0) {
      if (err == ENOSPC) {
        return ResourceExhausted("not enough room in /dev/shm for " + std::to_string(size) +
                                 " bytes");
      }
      return ErrnoError("reserving " + std::to_string(size) + " bytes of shared memory", err);
    }
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return ErrnoError("mmap of shm object " + name, errno);
    remover.armed = false;
    return std::unique_ptr<ShmMapping>(
        new ShmMapping(name, static_cast<std::byte*>(p), size, /*writable=*/true));
  } catch (const bip::interprocess_exception& e) {
    return FromBoost(e, "creating shm object " + name);
  }
}

Result<std::unique_ptr<ShmMapping>> ShmMapping::OpenReadOnly(const std::string& name) {
  try {
    bip::shared_memory_object obj(bip::open_only, name.c_str(), bip::read_only);
    bip::offset_t size = 0;
    if (!obj.get_size(size)) return IoError("cannot size shm object " + name);
    if (size <= 0) return Corrupt("shm object " + name + " is empty");
    void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED,
                     obj.get_mapping_handle().handle, 0);
    if (p == MAP_FAILED) return ErrnoError("mmap of shm object " + name, errno);
    return std::unique_ptr<ShmMapping>(new ShmMapping(name, static_cast<std::byte*>(p),
                                                      static_cast<uint64_t>(size), false));
  } catch (const bip::interprocess_exception& e) {
    return FromBoost(e, "opening shm object " + name);
  }
}

Result<std::unique_ptr<ShmMapping>> ShmMapping::FromFd(int fd, const std::string& name) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("fstat of shm object " + name, errno);
  if (st.st_size <= 0) return Corrupt("shm object " + name + " is empty");
  void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ErrnoError("mmap of shm object " + name, errno);
  return std::unique_ptr<ShmMapping>(
      new ShmMapping(name, static_cast<std::byte*>(p), static_cast<uint64_t>(st.st_size), false));
}

Result<UniqueFd> OpenShmReadOnlyFd(const std::string& name) {
  UniqueFd fd(::shm_open(("/" + name).c_str(), O_RDONLY | O_CLOEXEC, 0));
  if (!fd.valid()) {
    if (errno == ENOENT) return NotFound("no shared-memory object " + name);
    return ErrnoError("opening shm object " + name, errno);
  }
  return fd;
}

ShmMapping::~ShmMapping() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

Status RemoveShmObject(const std::string& name) {
  try {
    bip::shared_memory_object::remove(name.c_str());
  } catch (const bip::interprocess_exception& e) {
    return FromBoost(e, "removing shm object " + name);
  }
  return Status::Ok();
}

std::vector<std::string> ListShmObjects(const std::string& prefix) {
  std::vector<std::string> names;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return names;
  while (struct dirent* e = ::readdir(dir)) {
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) names.emplace_back(e->d_name);
  }
  ::closedir(dir);
  return names;
}

}  // namespace ckpt::shm
