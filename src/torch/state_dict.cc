// The libtorch adapter: every libtorch call is wrapped so no exception leaves this file.
#include "ckpt/torch.h"

#include <ATen/ATen.h>

#include <cstring>

namespace ckpt {

Result<int> TorchScalarType(DType dtype) {
  switch (dtype) {
    case DType::kBool: return static_cast<int>(at::kBool);
    case DType::kU8: return static_cast<int>(at::kByte);
    case DType::kI8: return static_cast<int>(at::kChar);
    case DType::kI16: return static_cast<int>(at::kShort);
    case DType::kI32: return static_cast<int>(at::kInt);
    case DType::kI64: return static_cast<int>(at::kLong);
    case DType::kF16: return static_cast<int>(at::kHalf);
    case DType::kBF16: return static_cast<int>(at::kBFloat16);
    case DType::kF32: return static_cast<int>(at::kFloat);
    case DType::kF64: return static_cast<int>(at::kDouble);
    case DType::kC64: return static_cast<int>(at::kComplexFloat);
    case DType::kC128: return static_cast<int>(at::kComplexDouble);
    default: return Unsupported(std::string("no libtorch dtype for ") + DTypeName(dtype) + " in this adapter");
  }
}

namespace {

Result<std::unordered_map<std::string, at::Tensor>> LoadCpu(std::shared_ptr<const Checkpoint> ckpt,
                                                             const std::vector<ShardOutput>& outputs,
                                                             const TorchLoadOptions& options) {
  std::unordered_map<std::string, at::Tensor> result;
  const auto& tensors = ckpt->tensors();
  for (const ShardOutput& out : outputs) {
    std::vector<TensorInfo> infos;
    for (const ShardPiece& p : out.pieces) {
      auto view = ckpt->Tensor(p.source);
      if (!view.ok()) return view.status();
      infos.push_back(*view->info);
    }
    auto layout = PlanOutput(out, infos);
    if (!layout.ok()) return layout.status();
    CKPT_ASSIGN_OR_RETURN(int st, TorchScalarType(layout->dtype));
    const auto opts = at::TensorOptions().dtype(static_cast<at::ScalarType>(st)).device(at::kCPU);
    at::Tensor t;
    const bool view = out.pieces.size() == 1 && !out.transpose && layout->pieces[0].contiguous();
    if (view) {
      // The copy-on-write view: writes stay private to this process (see PrivateTensorData).
      CKPT_ASSIGN_OR_RETURN(std::byte* data, ckpt->PrivateTensorData(out.pieces[0].source));
      const uint64_t off = layout->pieces[0].regions.empty() ? 0 : layout->pieces[0].regions[0].src_offset;
      auto keep = ckpt;  // the deleter holds the mapping
      t = at::from_blob(data + off, layout->shape,
                        [keep](void*) mutable { keep.reset(); }, opts);
    } else {
      // The plan engine's own CPU gather: pieces concatenated, transposed or viewed.
      t = at::empty(layout->shape, opts);
      std::vector<const std::byte*> sources;
      for (const ShardPiece& p : out.pieces) {
        CKPT_ASSIGN_OR_RETURN(const std::byte* data, ckpt->TensorData(p.source));
        sources.push_back(data);
      }
      CKPT_RETURN_IF_ERROR(GatherOutput(out, *layout, sources, t.data_ptr(), layout->nbytes));
    }
    if (options.gpu.float_dtype && t.is_floating_point()) {
      CKPT_ASSIGN_OR_RETURN(int to, TorchScalarType(*options.gpu.float_dtype));
      t = t.to(static_cast<at::ScalarType>(to));
    }
    result.emplace(out.name, std::move(t));
  }
  (void)tensors;
  return result;
}

Result<std::unordered_map<std::string, at::Tensor>> LoadGpu(std::shared_ptr<const Checkpoint> ckpt,
                                                             const std::vector<ShardOutput>& outputs,
                                                             const TorchLoadOptions& options) {
  CKPT_ASSIGN_OR_RETURN(auto loader, GpuLoader::Create(*ckpt, options.device, options.gpu));
  CKPT_ASSIGN_OR_RETURN(GpuStateDict dict, loader->Load(outputs));
  std::shared_ptr<void> alloc = dict.allocation();
  std::unordered_map<std::string, at::Tensor> result;
  for (const auto& [name, g] : dict.tensors()) {
    CKPT_ASSIGN_OR_RETURN(int st, TorchScalarType(g.dtype));
    auto opts = at::TensorOptions()
                    .dtype(static_cast<at::ScalarType>(st))
                    .device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(options.device)));
    auto keep = alloc;
    result.emplace(name, at::from_blob(g.data, g.shape, [keep](void*) mutable { keep.reset(); }, opts));
  }
  return result;
}

}  // namespace

Result<std::unordered_map<std::string, at::Tensor>> LoadStateDict(
    std::shared_ptr<const Checkpoint> checkpoint, const std::vector<ShardOutput>& outputs,
    const TorchLoadOptions& options) {
  if (!checkpoint) return InvalidArgument("null checkpoint");
  try {
    if (options.device < 0) return LoadCpu(std::move(checkpoint), outputs, options);
    return LoadGpu(std::move(checkpoint), outputs, options);
  } catch (const std::exception& e) {
    return Internal(std::string("libtorch: ") + e.what());
  }
}

}  // namespace ckpt
