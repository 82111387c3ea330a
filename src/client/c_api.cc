#include "ckpt/ckpt.h"

#include <cstring>
#include <string>

#include "ckpt/client.h"
#include "ckpt/writer.h"
#include "common/element_count.h"

struct ckpt_client {
  std::unique_ptr<ckpt::Client> client;
};
struct ckpt_checkpoint {
  std::unique_ptr<ckpt::Checkpoint> checkpoint;
  std::vector<std::string> side_names;  // checkpoint->side_files(), kept for stable pointers
};

namespace {

thread_local std::string last_error;

int Fail(const ckpt::Status& status) {
  last_error = status.ToString();
  return static_cast<int>(status.code());
}

int Report(const ckpt::Status& status) {
  if (status.ok()) return 0;
  return Fail(status);
}

int FillTensor(const ckpt::TensorView& view, ckpt_tensor* out) {
  if (out == nullptr) return Fail(ckpt::InvalidArgument("out is NULL"));
  out->name = view.info->name.c_str();
  out->dtype = static_cast<uint32_t>(view.info->dtype);
  out->ndim = static_cast<uint32_t>(view.info->shape.size());
  for (size_t i = 0; i < CKPT_MAX_DIMS; ++i) out->shape[i] = i < view.info->shape.size() ? view.info->shape[i] : 0;
  out->nbytes = view.info->nbytes;
  out->checksum = view.info->checksum;
  out->data = view.data;
  return 0;
}

ckpt::Result<ckpt::ShardSpec> ToSpec(const ckpt_shard_spec* spec) {
  if (spec == nullptr) return ckpt::InvalidArgument("shard spec is NULL");
  if (spec->kind == CKPT_SHARD_REPLICATE) return ckpt::ShardSpec::Replicate();
  if (spec->kind != CKPT_SHARD_SPLIT) return ckpt::InvalidArgument("unknown shard kind");
  return ckpt::ShardSpec::Split(spec->dim, spec->rank, spec->world,
                                spec->fused_chunks <= 0 ? 1 : spec->fused_chunks, spec->allow_uneven != 0);
}

}  // namespace

extern "C" {

const char* ckpt_last_error(void) { return last_error.c_str(); }
const char* ckpt_dtype_name(uint32_t dtype) { return ckpt::DTypeName(static_cast<ckpt::DType>(dtype)); }

int ckpt_connect(const char* socket_path, ckpt_client** out) {
  if (out == nullptr) return Fail(ckpt::InvalidArgument("out is NULL"));
  auto client = ckpt::Client::Connect(socket_path ? socket_path : ckpt::Client::DefaultSocketPath());
  if (!client.ok()) return Fail(client.status());
  *out = new ckpt_client{std::move(client).value()};
  return 0;
}

void ckpt_client_free(ckpt_client* client) { delete client; }

int ckpt_load(ckpt_client* client, const char* path, const char* name) {
  if (client == nullptr || path == nullptr) return Fail(ckpt::InvalidArgument("client and path are required"));
  return Report(client->client->Load(path, name ? name : "").status());
}

int ckpt_ensure(ckpt_client* client, const char* path, const char* name, uint64_t* generation_out, int* loaded_out) {
  if (client == nullptr || path == nullptr) return Fail(ckpt::InvalidArgument("client and path are required"));
  ckpt::EnsureOptions options;
  options.name = name ? name : "";
  auto result = client->client->Ensure(path, options);
  if (!result.ok()) return Fail(result.status());
  if (generation_out != nullptr) *generation_out = result->checkpoint.generation;
  if (loaded_out != nullptr) *loaded_out = (result->action == "loaded" || result->action == "reloaded") ? 1 : 0;
  return 0;
}

int ckpt_evict(ckpt_client* client, const char* name, int force) {
  if (client == nullptr || name == nullptr) return Fail(ckpt::InvalidArgument("client and name are required"));
  return Report(client->client->Evict(name, force != 0));
}

int ckpt_attach(ckpt_client* client, const char* name, ckpt_checkpoint** out) {
  if (client == nullptr || name == nullptr || out == nullptr) {
    return Fail(ckpt::InvalidArgument("client, name and out are required"));
  }
  auto checkpoint = client->client->Attach(name);
  if (!checkpoint.ok()) return Fail(checkpoint.status());
  *out = new ckpt_checkpoint{std::move(checkpoint).value(), {}};
  (*out)->side_names = (*out)->checkpoint->side_files();
  return 0;
}

void ckpt_detach(ckpt_checkpoint* checkpoint) { delete checkpoint; }

uint64_t ckpt_generation(const ckpt_checkpoint* c) { return c ? c->checkpoint->generation() : 0; }

size_t ckpt_tensor_count(const ckpt_checkpoint* c) { return c ? c->checkpoint->tensors().size() : 0; }

int ckpt_tensor_at(const ckpt_checkpoint* c, size_t index, ckpt_tensor* out) {
  if (c == nullptr || index >= c->checkpoint->tensors().size()) {
    return Fail(ckpt::InvalidArgument("tensor index out of range"));
  }
  auto view = c->checkpoint->Tensor(c->checkpoint->tensors()[index].name);
  if (!view.ok()) return Fail(view.status());
  return FillTensor(*view, out);
}

int ckpt_tensor_find(const ckpt_checkpoint* c, const char* name, ckpt_tensor* out) {
  if (c == nullptr || name == nullptr) return Fail(ckpt::InvalidArgument("checkpoint and name are required"));
  auto view = c->checkpoint->Tensor(name);
  if (!view.ok()) return Fail(view.status());
  return FillTensor(*view, out);
}

int ckpt_shard_info(const ckpt_checkpoint* c, const char* tensor, const ckpt_shard_spec* spec,
                    uint32_t* ndim, int64_t* shape, uint64_t* nbytes) {
  if (c == nullptr || tensor == nullptr) return Fail(ckpt::InvalidArgument("checkpoint and tensor are required"));
  auto s = ToSpec(spec);
  if (!s.ok()) return Fail(s.status());
  auto layout = c->checkpoint->PlanShard(tensor, *s);
  if (!layout.ok()) return Fail(layout.status());
  if (ndim) *ndim = static_cast<uint32_t>(layout->shape.size());
  if (shape) {
    for (size_t i = 0; i < CKPT_MAX_DIMS; ++i) shape[i] = i < layout->shape.size() ? layout->shape[i] : 0;
  }
  if (nbytes) *nbytes = layout->nbytes;
  return 0;
}

int ckpt_copy_shard(const ckpt_checkpoint* c, const char* tensor, const ckpt_shard_spec* spec, void* dst,
                    uint64_t dst_size) {
  if (c == nullptr || tensor == nullptr || dst == nullptr) {
    return Fail(ckpt::InvalidArgument("checkpoint, tensor and dst are required"));
  }
  auto s = ToSpec(spec);
  if (!s.ok()) return Fail(s.status());
  return Report(c->checkpoint->CopyShard(tensor, *s, dst, dst_size));
}


size_t ckpt_side_file_count(const ckpt_checkpoint* c) { return c ? c->side_names.size() : 0; }

int ckpt_side_file_name(const ckpt_checkpoint* c, size_t index, const char** name) {
  if (c == nullptr || name == nullptr || index >= c->side_names.size()) {
    return Fail(ckpt::InvalidArgument("side file index out of range"));
  }
  *name = c->side_names[index].c_str();
  return 0;
}

int ckpt_side_file(const ckpt_checkpoint* c, const char* name, const void** data, uint64_t* size) {
  if (c == nullptr || name == nullptr || data == nullptr || size == nullptr) {
    return Fail(ckpt::InvalidArgument("checkpoint, name, data and size are required"));
  }
  auto bytes = c->checkpoint->SideFile(name);
  if (!bytes.ok()) return Fail(bytes.status());
  *data = bytes->data();
  *size = bytes->size();
  return 0;
}

size_t ckpt_metadata_count(const ckpt_checkpoint* c) { return c ? c->checkpoint->metadata().size() : 0; }

int ckpt_metadata_at(const ckpt_checkpoint* c, size_t index, const char** key, const char** value) {
  if (c == nullptr || key == nullptr || value == nullptr || index >= c->checkpoint->metadata().size()) {
    return Fail(ckpt::InvalidArgument("metadata index out of range"));
  }
  auto it = c->checkpoint->metadata().begin();
  std::advance(it, static_cast<std::ptrdiff_t>(index));
  *key = it->first.c_str();
  *value = it->second.c_str();
  return 0;
}

int ckpt_metadata_get(const ckpt_checkpoint* c, const char* key, const char** value) {
  if (c == nullptr || key == nullptr || value == nullptr) return Fail(ckpt::InvalidArgument("checkpoint, key and value are required"));
  auto it = c->checkpoint->metadata().find(key);
  if (it == c->checkpoint->metadata().end()) return Fail(ckpt::NotFound(std::string("no metadata key '") + key + "'"));
  *value = it->second.c_str();
  return 0;
}
}  // extern "C"

struct ckpt_writer {
  std::unique_ptr<ckpt::Writer> writer;
};

namespace {
ckpt::Result<std::vector<int64_t>> Dims(uint32_t ndim, const int64_t* dims, const char* what) {
  if (ndim > CKPT_MAX_DIMS) return ckpt::InvalidArgument(std::string(what) + ": more than 8 dims");
  if (ndim > 0 && dims == nullptr) return ckpt::InvalidArgument(std::string(what) + " is NULL");
  return std::vector<int64_t>(dims, dims + ndim);
}
ckpt::PieceSource FromHost(const void* data) {
  const auto* base = static_cast<const std::byte*>(data);
  return [base](uint64_t offset, void* dst, uint64_t size) {
    std::memcpy(dst, base + offset, size);
    return ckpt::Status::Ok();
  };
}
}  // namespace

extern "C" {

int ckpt_writer_create(const char* socket_path, const char* name, const ckpt_writer_options* options,
                       ckpt_writer** out) {
  if (out == nullptr || name == nullptr) return Fail(ckpt::InvalidArgument("name or out is NULL"));
  ckpt::WriterOptions o;
  if (options != nullptr) {
    o.job = options->job ? options->job : "";
    o.part = options->part;
    o.parts = options->parts <= 0 ? 1 : options->parts;
    o.replace = options->replace != 0;
    o.timeout_s = options->timeout_s > 0 ? options->timeout_s : 600;
  }
  auto w = ckpt::Writer::Create(socket_path ? socket_path : ckpt::Client::DefaultSocketPath(), name, o);
  if (!w.ok()) return Fail(w.status());
  *out = new ckpt_writer{std::move(w).value()};
  return 0;
}

void ckpt_writer_free(ckpt_writer* writer) { delete writer; }

int ckpt_writer_add(ckpt_writer* writer, const char* key, uint32_t dtype, uint32_t ndim, const int64_t* global_shape,
                    const int64_t* offsets, const int64_t* shape, const void* data) {
  if (writer == nullptr || key == nullptr) return Fail(ckpt::InvalidArgument("writer or key is NULL"));
  if (!ckpt::IsValidDType(dtype)) return Fail(ckpt::InvalidArgument("unknown dtype value"));
  auto global = Dims(ndim, global_shape, "global_shape");
  if (!global.ok()) return Fail(global.status());
  std::vector<int64_t> offs, box = *global;
  if (offsets != nullptr) offs.assign(offsets, offsets + ndim);
  if (shape != nullptr) box.assign(shape, shape + ndim);
  if (data == nullptr) {
    // A box of no elements needs no data; a bad shape is AddBox's to report.
    auto n = ckpt::ElementCount(box);
    if (n.ok() && *n != 0) return Fail(ckpt::InvalidArgument("data is NULL"));
  }
  return Report(writer->writer->AddBox(key, static_cast<ckpt::DType>(dtype), *global, offs, box, FromHost(data)));
}

int ckpt_writer_add_flat(ckpt_writer* writer, const char* key, uint32_t dtype, uint32_t ndim,
                         const int64_t* global_shape, uint64_t start, uint64_t numel, const void* data) {
  if (writer == nullptr || key == nullptr) return Fail(ckpt::InvalidArgument("writer or key is NULL"));
  if (!ckpt::IsValidDType(dtype)) return Fail(ckpt::InvalidArgument("unknown dtype value"));
  if (data == nullptr && numel != 0) return Fail(ckpt::InvalidArgument("data is NULL"));
  auto global = Dims(ndim, global_shape, "global_shape");
  if (!global.ok()) return Fail(global.status());
  return Report(writer->writer->AddFlat(key, static_cast<ckpt::DType>(dtype), *global, start, numel, FromHost(data)));
}

int ckpt_writer_side_file(ckpt_writer* writer, const char* name, const void* data, uint64_t size) {
  if (writer == nullptr || name == nullptr || (data == nullptr && size != 0)) {
    return Fail(ckpt::InvalidArgument("writer, name or data is NULL"));
  }
  return Report(writer->writer->AddSideFile(name, std::string(static_cast<const char*>(data), size)));
}

int ckpt_writer_commit(ckpt_writer* writer, uint64_t* generation) {
  if (writer == nullptr) return Fail(ckpt::InvalidArgument("writer is NULL"));
  auto r = writer->writer->Commit();
  if (!r.ok()) return Fail(r.status());
  if (generation != nullptr) *generation = r->checkpoint.generation;
  return 0;
}

}  // extern "C"
