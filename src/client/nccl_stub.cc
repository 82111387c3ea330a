// NcclGroup in builds without NCCL (or without CUDA): every factory reports Unsupported.
#include "ckpt/client.h"
#include "ckpt/collective.h"

namespace ckpt {
namespace {
Status NoNccl() { return Unsupported("libckptclient was built without NCCL: collective loads are not available"); }
}  // namespace

NcclGroup::~NcclGroup() = default;
Result<std::string> NcclGroup::NewUniqueId() { return NoNccl(); }
Result<std::unique_ptr<NcclGroup>> NcclGroup::Create(const std::string&, int, int, int, const NcclGroupOptions&) {
  return NoNccl();
}
Result<std::unique_ptr<NcclGroup>> NcclGroup::Join(Client&, const std::string&, int, int, int, const NcclGroupOptions&) {
  return NoNccl();
}
Result<std::unique_ptr<NcclGroup>> NcclGroup::Borrow(void*, int, const NcclGroupOptions&) { return NoNccl(); }

}  // namespace ckpt
