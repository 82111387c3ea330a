#include "plan/gpu_abi_codec.h"

#include <algorithm>
#include <cstring>

namespace ckpt {
namespace {

// A (pointer, length) text; InvalidArgument for a null pointer with a length.
Result<std::string> Text(const char* p, uint64_t len, const char* what) {
  if (len == 0) return std::string();
  if (!p) return InvalidArgument(std::string("GPU plugin interface: null ") + what);
  return std::string(p, len);
}

Result<std::vector<int64_t>> Shape(const int64_t* p, uint64_t ndim, const char* what) {
  if (ndim == 0) return std::vector<int64_t>();
  if (!p) return InvalidArgument(std::string("GPU plugin interface: null shape of ") + what);
  return std::vector<int64_t>(p, p + ndim);
}

Result<DType> DTypeOf(uint32_t value, const std::string& what) {
  if (!IsValidDType(value))
    return InvalidArgument("GPU plugin interface: dtype " + std::to_string(value) + " of " + what + " is not one");
  return static_cast<DType>(value);
}

Status CheckSize(uint32_t size, size_t want, const char* what) {
  if (size < want)
    return InvalidArgument(std::string("GPU plugin interface: ") + what + " of " + std::to_string(size) +
                           " bytes, " + std::to_string(want) + " expected");
  return Status::Ok();
}

}  // namespace

Result<GpuStateDict> GpuStateDictBuilder::FromC(const ckpt_gpu_state_dict& c, std::shared_ptr<void> allocation) {
  if (c.tensor_count > 0 && !c.tensors) return InvalidArgument("GPU plugin interface: null state dict tensors");
  GpuStateDict dict;
  dict.device_ = c.device;
  for (uint64_t i = 0; i < c.tensor_count; ++i) {
    const ckpt_gpu_tensor& t = c.tensors[i];
    CKPT_ASSIGN_OR_RETURN(std::string name, Text(t.name, t.name_len, "tensor name"));
    GpuTensor g;
    CKPT_ASSIGN_OR_RETURN(g.dtype, DTypeOf(t.dtype, "tensor '" + name + "'"));
    CKPT_ASSIGN_OR_RETURN(g.shape, Shape(t.shape, t.ndim, "a state dict tensor"));
    g.data = t.data;
    g.nbytes = t.nbytes;
    if (!dict.tensors_.emplace(std::move(name), std::move(g)).second)
      return InvalidArgument("GPU plugin interface: a state dict names a tensor twice");
  }
  dict.stats_ = gpu_abi::FromC(c.stats);
  dict.allocation_ = std::move(allocation);
  return dict;
}

namespace gpu_abi {

int32_t ToC(const Status& status, ckpt_gpu_error* error) {
  if (!status.ok() && error && error->message && error->capacity > 0) {
    const size_t n = std::min<uint64_t>(status.message().size(), error->capacity - 1);
    std::memcpy(error->message, status.message().data(), n);
    error->message[n] = '\0';
  }
  return static_cast<int32_t>(status.code());
}

Status FromC(int32_t code, const char* message) {
  if (code == 0) return Status::Ok();
  std::string text = message ? message : "";
  if (code < 0 || code > static_cast<int32_t>(StatusCode::kCancelled))
    return Internal("the GPU plugin failed with unknown code " + std::to_string(code) + ": " + text);
  return Status(static_cast<StatusCode>(code), std::move(text));
}

COutputs ToC(const std::vector<ShardOutput>& outputs) {
  COutputs c;
  size_t pieces = 0;
  for (const ShardOutput& o : outputs) pieces += o.pieces.size();
  c.pieces.reserve(pieces);  // no reallocation below: outputs point into it
  for (const ShardOutput& o : outputs) {
    ckpt_gpu_output out{};
    out.name = o.name.data();
    out.name_len = o.name.size();
    out.pieces = c.pieces.data() + c.pieces.size();
    out.piece_count = o.pieces.size();
    out.shape = o.shape.data();
    out.ndim = o.shape.size();
    out.transpose = o.transpose ? 1 : 0;
    for (const ShardPiece& p : o.pieces) {
      ckpt_gpu_piece piece{};
      piece.source = p.source.data();
      piece.source_len = p.source.size();
      piece.kind = static_cast<uint32_t>(p.spec.kind);
      piece.dim = p.spec.dim;
      piece.rank = p.spec.rank;
      piece.world = p.spec.world;
      piece.fused_chunks = p.spec.fused_chunks;
      piece.allow_uneven = p.spec.allow_uneven ? 1 : 0;
      piece.ceil_parts = p.spec.ceil_parts ? 1 : 0;
      piece.row_begin = p.row_begin;
      piece.row_count = p.row_count;
      piece.row_step = p.row_step;
      piece.flat_rows = p.flat_rows ? 1 : 0;
      c.pieces.push_back(piece);
    }
    c.outputs.push_back(out);
  }
  return c;
}

Result<std::vector<ShardOutput>> FromC(const ckpt_gpu_output* outputs, uint64_t count) {
  if (count > 0 && !outputs) return InvalidArgument("GPU plugin interface: null outputs");
  std::vector<ShardOutput> result(count);
  for (uint64_t i = 0; i < count; ++i) {
    const ckpt_gpu_output& c = outputs[i];
    ShardOutput& o = result[i];
    CKPT_ASSIGN_OR_RETURN(o.name, Text(c.name, c.name_len, "output name"));
    CKPT_ASSIGN_OR_RETURN(o.shape, Shape(c.shape, c.ndim, "an output"));
    o.transpose = c.transpose != 0;
    if (c.piece_count > 0 && !c.pieces) return InvalidArgument("GPU plugin interface: null pieces of '" + o.name + "'");
    for (uint64_t k = 0; k < c.piece_count; ++k) {
      const ckpt_gpu_piece& p = c.pieces[k];
      if (p.kind > static_cast<uint32_t>(ShardSpec::Kind::kFlatPartition))
        return InvalidArgument("GPU plugin interface: shard kind " + std::to_string(p.kind) + " in '" + o.name + "'");
      ShardPiece piece;
      CKPT_ASSIGN_OR_RETURN(piece.source, Text(p.source, p.source_len, "piece source"));
      piece.spec.kind = static_cast<ShardSpec::Kind>(p.kind);
      piece.spec.dim = p.dim;
      piece.spec.rank = p.rank;
      piece.spec.world = p.world;
      piece.spec.fused_chunks = p.fused_chunks;
      piece.spec.allow_uneven = p.allow_uneven != 0;
      piece.spec.ceil_parts = p.ceil_parts != 0;
      piece.row_begin = p.row_begin;
      piece.row_count = p.row_count;
      piece.row_step = p.row_step;
      piece.flat_rows = p.flat_rows != 0;
      o.pieces.push_back(std::move(piece));
    }
  }
  return result;
}

std::vector<ckpt_gpu_tensor_info> ToC(const std::vector<TensorInfo>& tensors) {
  std::vector<ckpt_gpu_tensor_info> c;
  c.reserve(tensors.size());
  for (const TensorInfo& t : tensors) {
    ckpt_gpu_tensor_info info{};
    info.name = t.name.data();
    info.name_len = t.name.size();
    info.dtype = static_cast<uint32_t>(t.dtype);
    info.ndim = static_cast<uint32_t>(t.shape.size());
    info.shape = t.shape.data();
    info.nbytes = t.nbytes;
    info.checksum = t.checksum;
    c.push_back(info);
  }
  return c;
}

Result<std::vector<TensorInfo>> FromC(const ckpt_gpu_tensor_info* tensors, uint64_t count) {
  if (count > 0 && !tensors) return InvalidArgument("GPU plugin interface: null tensors");
  std::vector<TensorInfo> result(count);
  for (uint64_t i = 0; i < count; ++i) {
    const ckpt_gpu_tensor_info& c = tensors[i];
    TensorInfo& t = result[i];
    CKPT_ASSIGN_OR_RETURN(t.name, Text(c.name, c.name_len, "tensor name"));
    CKPT_ASSIGN_OR_RETURN(t.dtype, DTypeOf(c.dtype, "tensor '" + t.name + "'"));
    CKPT_ASSIGN_OR_RETURN(t.shape, Shape(c.shape, c.ndim, "a tensor"));
    t.nbytes = c.nbytes;
    t.checksum = c.checksum;
  }
  return result;
}

ckpt_gpu_load_options ToC(const GpuLoadOptions& o) {
  ckpt_gpu_load_options c{};
  c.struct_size = sizeof(c);
  c.host_path = static_cast<uint32_t>(o.path);
  c.streams = o.streams;
  c.register_threads = o.register_threads;
  c.chunk_bytes = o.chunk_bytes;
  c.register_group_bytes = o.register_group_bytes;
  c.float_dtype = o.float_dtype ? static_cast<uint32_t>(*o.float_dtype) : 0;
  c.allow_overflow = o.allow_overflow ? 1 : 0;
  return c;
}

Result<GpuLoadOptions> FromC(const ckpt_gpu_load_options* c) {
  if (!c) return InvalidArgument("GPU plugin interface: null load options");
  CKPT_RETURN_IF_ERROR(CheckSize(c->struct_size, sizeof(*c), "load options"));
  if (c->host_path > static_cast<uint32_t>(HostPath::kPageable))
    return InvalidArgument("GPU plugin interface: host path " + std::to_string(c->host_path));
  GpuLoadOptions o;
  o.path = static_cast<HostPath>(c->host_path);
  o.streams = c->streams;
  o.register_threads = c->register_threads;
  o.chunk_bytes = c->chunk_bytes;
  o.register_group_bytes = c->register_group_bytes;
  if (c->float_dtype != 0) {
    CKPT_ASSIGN_OR_RETURN(DType d, DTypeOf(c->float_dtype, "float_dtype"));
    o.float_dtype = d;
  }
  o.allow_overflow = c->allow_overflow != 0;
  return o;
}

ckpt_gpu_group_options ToC(const NcclGroupOptions& o) {
  ckpt_gpu_group_options c{};
  c.struct_size = sizeof(c);
  c.timeout_s = o.timeout_s;
  return c;
}

Result<NcclGroupOptions> FromC(const ckpt_gpu_group_options* c) {
  if (!c) return InvalidArgument("GPU plugin interface: null group options");
  CKPT_RETURN_IF_ERROR(CheckSize(c->struct_size, sizeof(*c), "group options"));
  NcclGroupOptions o;
  o.timeout_s = c->timeout_s;
  return o;
}

ckpt_gpu_collective_options ToC(const CollectiveOptions& o) {
  ckpt_gpu_collective_options c{};
  c.struct_size = sizeof(c);
  c.mode = static_cast<uint32_t>(o.mode);
  c.min_saved_bytes = o.min_saved_bytes;
  return c;
}

Result<CollectiveOptions> FromC(const ckpt_gpu_collective_options* c) {
  if (!c) return InvalidArgument("GPU plugin interface: null collective options");
  CKPT_RETURN_IF_ERROR(CheckSize(c->struct_size, sizeof(*c), "collective options"));
  if (c->mode > static_cast<uint32_t>(CollectiveOptions::Mode::kIndependent))
    return InvalidArgument("GPU plugin interface: collective mode " + std::to_string(c->mode));
  CollectiveOptions o;
  o.mode = static_cast<CollectiveOptions::Mode>(c->mode);
  o.min_saved_bytes = c->min_saved_bytes;
  return o;
}

ckpt_gpu_stats ToC(const GpuLoadStats& s) {
  ckpt_gpu_stats c{};
  c.setup_seconds = s.setup_seconds;
  c.register_seconds = s.register_seconds;
  c.total_seconds = s.total_seconds;
  c.unregister_seconds = s.unregister_seconds;
  c.registered_bytes = s.registered_bytes;
  c.copied_bytes = s.copied_bytes;
  c.received_bytes = s.received_bytes;
  c.sent_bytes = s.sent_bytes;
  c.exchange_seconds = s.exchange_seconds;
  c.collective = s.collective ? 1 : 0;
  return c;
}

GpuLoadStats FromC(const ckpt_gpu_stats& c) {
  GpuLoadStats s;
  s.setup_seconds = c.setup_seconds;
  s.register_seconds = c.register_seconds;
  s.total_seconds = c.total_seconds;
  s.unregister_seconds = c.unregister_seconds;
  s.registered_bytes = c.registered_bytes;
  s.copied_bytes = c.copied_bytes;
  s.received_bytes = c.received_bytes;
  s.sent_bytes = c.sent_bytes;
  s.exchange_seconds = c.exchange_seconds;
  s.collective = c.collective != 0;
  return s;
}

Status Describe(const GpuStateDict& dict, std::vector<ckpt_gpu_tensor>* storage, ckpt_gpu_state_dict* out) {
  if (!out) return InvalidArgument("GPU plugin interface: null state dict");
  CKPT_RETURN_IF_ERROR(CheckSize(out->struct_size, sizeof(*out), "state dict"));
  storage->clear();
  storage->reserve(dict.tensors().size());
  for (const auto& [name, t] : dict.tensors()) {
    ckpt_gpu_tensor c{};
    c.name = name.data();
    c.name_len = name.size();
    c.dtype = static_cast<uint32_t>(t.dtype);
    c.ndim = static_cast<uint32_t>(t.shape.size());
    c.shape = t.shape.data();
    c.data = t.data;
    c.nbytes = t.nbytes;
    storage->push_back(c);
  }
  out->device = dict.device();
  out->tensors = storage->data();
  out->tensor_count = storage->size();
  out->allocation = dict.allocation().get();
  out->stats = ToC(dict.stats());
  return Status::Ok();
}

}  // namespace gpu_abi
}  // namespace ckpt
