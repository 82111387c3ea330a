#include "ckpt/client.h"
#include "protocol/daemon_connection.h"
#include "shm/segment_reader.h"

namespace ckpt {

Checkpoint::Checkpoint(std::string name, std::unique_ptr<protocol::DaemonConnection> lease,
                       std::unique_ptr<shm::SegmentReader> segment)
    : name_(std::move(name)), lease_(std::move(lease)), segment_(std::move(segment)) {}

// Unmaps first, then closes the lease, so the daemon never sees a detach while mapped.
Checkpoint::~Checkpoint() {
  segment_.reset();
  lease_.reset();
}

const std::string& Checkpoint::name() const { return name_; }
uint64_t Checkpoint::generation() const { return segment_->generation(); }
uint64_t Checkpoint::mapped_bytes() const { return segment_->segment_bytes(); }
const std::vector<TensorInfo>& Checkpoint::tensors() const { return segment_->tensors(); }

Result<TensorView> Checkpoint::Tensor(const std::string& name) const {
  int64_t i = segment_->Find(name);
  if (i < 0) return NotFound("checkpoint '" + name_ + "' has no tensor '" + name + "'");
  return TensorView{&segment_->tensors()[i], segment_->tensor_data(i)};
}

Result<const std::byte*> Checkpoint::TensorData(const std::string& name) const {
  CKPT_ASSIGN_OR_RETURN(TensorView view, Tensor(name));
  return view.data;
}

Result<ShardLayout> Checkpoint::PlanShard(const std::string& name, const ShardSpec& spec) const {
  CKPT_ASSIGN_OR_RETURN(TensorView view, Tensor(name));
  auto layout = ckpt::PlanShard(view.info->dtype, view.info->shape, spec);
  if (!layout.ok()) return layout.status().WithContext("tensor '" + name + "'");
  return layout;
}

Status Checkpoint::CopyShard(const std::string& name, const ShardSpec& spec, void* dst,
                             size_t dst_size) const {
  CKPT_ASSIGN_OR_RETURN(TensorView view, Tensor(name));
  CKPT_ASSIGN_OR_RETURN(ShardLayout layout, PlanShard(name, spec));
  return GatherShard(layout, view.data, dst, dst_size);
}

Status Checkpoint::Verify() const { return segment_->VerifyChecksums(); }

}  // namespace ckpt
