/* The C interface between libckptclient (and the Python module _ckpt) and its GPU plugin,
 * libckptclient-cuda.so.0 (src/gpu_plugin/: the CUDA copy engine and the NCCL group).
 * libckptclient links no CUDA or NCCL library: it dlopens the plugin on the first GPU call
 * (src/client/gpu_plugin.h) and reaches the engine only through the table below.
 *
 * Only C types cross it: fixed-width integers, doubles, pointers, and C structs; no C++ type
 * of ckpt or of the standard library, no exception. So a plugin from another build (another
 * compiler, standard library or ckpt version) works as long as it speaks the same interface
 * version, and one that does not is refused when it is opened, by its version, with an error
 * naming both versions; it never runs.
 *
 * Errors: every function that can fail returns a ckpt::StatusCode value (0: ok; 1
 * invalid_argument ... 13 cancelled, include/ckpt/status.h) and, when it is not 0, writes a
 * NUL-terminated message (cut to fit) into the caller's ckpt_gpu_error buffer.
 *
 * Version rules: CKPT_GPU_PLUGIN_ABI_VERSION is bumped on any change of a struct, a function
 * or a meaning below. The first three fields of ckpt_gpu_plugin (abi_version, struct_size,
 * build_version) are frozen for every version, so a host can always read them. */
#ifndef CKPT_GPU_PLUGIN_ABI_H
#define CKPT_GPU_PLUGIN_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 was the C++ table of ckpt 0.1 (symbol ckpt_gpu_plugin_v1), refused as such. */
#define CKPT_GPU_PLUGIN_ABI_VERSION 4u
/* The soname the host looks for, beside itself and then on the library path. */
#define CKPT_GPU_PLUGIN_SONAME "libckptclient-cuda.so.0"
/* The plugin's one exported symbol, a function of type ckpt_gpu_plugin_entry_fn. */
#define CKPT_GPU_PLUGIN_ENTRY "ckpt_gpu_plugin_entry"

typedef struct ckpt_gpu_error {
  char* message;     /* the caller's buffer */
  uint64_t capacity; /* its size in bytes, NUL included (0: no message wanted) */
} ckpt_gpu_error;

/* A tensor of the attached checkpoint (ckpt::TensorInfo). */
typedef struct ckpt_gpu_tensor_info {
  const char* name;
  uint64_t name_len;
  uint32_t dtype; /* a ckpt::DType value */
  uint32_t ndim;
  const int64_t* shape;
  uint64_t nbytes;
  uint64_t checksum;
} ckpt_gpu_tensor_info;

/* The checkpoint a loader reads: its tensors (copied by create_loader) and where each
 * one's bytes start in read-only host memory that stays mapped while the loader lives. */
typedef struct ckpt_gpu_source {
  uint32_t struct_size; /* sizeof(ckpt_gpu_source) */
  uint32_t reserved;
  const ckpt_gpu_tensor_info* tensors;
  uint64_t tensor_count;
  void* context;
  /* The first byte of tensor `index`, or NULL if it cannot be read. Thread-safe. */
  const void* (*tensor_data)(void* context, uint64_t index);
} ckpt_gpu_source;

/* ckpt::GpuLoadOptions. */
typedef struct ckpt_gpu_load_options {
  uint32_t struct_size;  /* sizeof(ckpt_gpu_load_options) */
  uint32_t host_path;    /* 0 register, 1 bounce, 2 pageable */
  int32_t streams;
  int32_t register_threads;
  uint64_t chunk_bytes;
  uint64_t register_group_bytes;
  uint32_t float_dtype;  /* a ckpt::DType value; 0: keep each tensor's own */
  uint32_t allow_overflow;
} ckpt_gpu_load_options;

/* ckpt::ShardPiece: a source tensor's shard (ckpt::ShardSpec) inside an output. */
typedef struct ckpt_gpu_piece {
  const char* source;
  uint64_t source_len;
  uint32_t kind; /* 0 replicate, 1 split, 2 flat partition */
  int32_t dim;
  int32_t rank;
  int32_t world;
  int32_t fused_chunks;
  uint8_t allow_uneven;
  uint8_t ceil_parts;
  uint8_t flat_rows; /* the rows: of the source as 2-d [numel / last dim, last dim] */
  uint8_t reserved;
  int64_t row_begin;
  int64_t row_count;
  int64_t row_step;
} ckpt_gpu_piece;

/* ckpt::ShardOutput: one tensor of the rank's state dict. */
typedef struct ckpt_gpu_output {
  const char* name;
  uint64_t name_len;
  const ckpt_gpu_piece* pieces;
  uint64_t piece_count;
  const int64_t* shape; /* the view; ndim 0: the concatenation's own shape */
  uint64_t ndim;
  uint32_t transpose;
  uint32_t reserved;
} ckpt_gpu_output;

/* ckpt::GpuLoadStats. */
typedef struct ckpt_gpu_stats {
  double setup_seconds;
  double register_seconds;
  double total_seconds;
  double unregister_seconds;
  uint64_t registered_bytes;
  uint64_t copied_bytes;
  uint64_t received_bytes;
  uint64_t sent_bytes;
  double exchange_seconds;
  uint32_t collective;
  uint32_t reserved;
} ckpt_gpu_stats;

/* One tensor of a loaded state dict, in device memory. */
typedef struct ckpt_gpu_tensor {
  const char* name;
  uint64_t name_len;
  uint32_t dtype;
  uint32_t ndim;
  const int64_t* shape;
  void* data;
  uint64_t nbytes;
} ckpt_gpu_tensor;

/* A loaded state dict as the plugin describes it: every pointer stays valid, and the device
 * memory allocated, until release_state_dict of its handle. */
typedef struct ckpt_gpu_state_dict {
  uint32_t struct_size; /* set by the caller: sizeof(ckpt_gpu_state_dict) */
  int32_t device;
  const ckpt_gpu_tensor* tensors;
  uint64_t tensor_count;
  void* allocation; /* the device allocation holding every tensor */
  ckpt_gpu_stats stats;
} ckpt_gpu_state_dict;

/* ckpt::CollectiveOptions. */
typedef struct ckpt_gpu_collective_options {
  uint32_t struct_size;
  uint32_t mode; /* 0 auto, 1 collective, 2 independent */
  uint64_t min_saved_bytes;
} ckpt_gpu_collective_options;

/* ckpt::NcclGroupOptions. */
typedef struct ckpt_gpu_group_options {
  uint32_t struct_size;
  uint32_t reserved;
  double timeout_s;
} ckpt_gpu_group_options;

typedef struct ckpt_gpu_loader ckpt_gpu_loader;         /* opaque: a ckpt::GpuLoader */
typedef struct ckpt_gpu_group ckpt_gpu_group;           /* opaque: a ckpt::NcclGroup */
typedef struct ckpt_gpu_dict_handle ckpt_gpu_dict_handle; /* opaque: a loaded state dict */

/* What the plugin offers. Every function is thread-safe to call; each does what the public
 * function of the same name in include/ckpt/gpu.h or collective.h documents. The table and
 * its code live until the process exits (the plugin is never unloaded). */
typedef struct ckpt_gpu_plugin {
  /* Frozen for every version: */
  uint32_t abi_version;      /* the plugin's CKPT_GPU_PLUGIN_ABI_VERSION */
  uint32_t struct_size;      /* the plugin's sizeof(ckpt_gpu_plugin) */
  const char* build_version; /* the plugin's ckpt version (for messages), never NULL */

  /* Unsupported naming what is missing (the NVIDIA driver libcuda.so.1) when the copy
   * engine cannot run on this machine; 0 otherwise (a device may still be absent). */
  int32_t (*check_driver)(ckpt_gpu_error* error);
  /* 1 if a CUDA device is usable, else 0. */
  int32_t (*gpu_available)(void);

  int32_t (*create_loader)(const ckpt_gpu_source* source, int32_t device, const ckpt_gpu_load_options* options,
                           ckpt_gpu_loader** loader, ckpt_gpu_error* error);
  void (*destroy_loader)(ckpt_gpu_loader* loader);
  /* On success *handle owns the device memory *dict describes. */
  int32_t (*load)(ckpt_gpu_loader* loader, const ckpt_gpu_output* outputs, uint64_t output_count,
                  ckpt_gpu_state_dict* dict, ckpt_gpu_dict_handle** handle, ckpt_gpu_error* error);
  int32_t (*load_collective)(ckpt_gpu_loader* loader, const ckpt_gpu_output* outputs, uint64_t output_count,
                             ckpt_gpu_group* group, const ckpt_gpu_collective_options* options,
                             ckpt_gpu_state_dict* dict, ckpt_gpu_dict_handle** handle, ckpt_gpu_error* error);
  /* Frees the device memory. */
  void (*release_state_dict)(ckpt_gpu_dict_handle* handle);

  /* 1 if the plugin was built with NCCL's header; else 0 and the nccl_* entries are NULL.
   * Each of them opens libnccl.so.2 first and fails with Unsupported naming it when it is
   * missing or too old. */
  uint32_t has_nccl;
  uint32_t reserved;
  int32_t (*nccl_check_membership)(int32_t rank, int32_t size, int32_t device, const ckpt_gpu_group_options* options,
                                   ckpt_gpu_error* error);
  /* Writes the id's bytes into id[0, *length); Internal if capacity is too small. */
  int32_t (*nccl_new_unique_id)(uint8_t* id, uint64_t capacity, uint64_t* length, ckpt_gpu_error* error);
  int32_t (*nccl_create)(const uint8_t* id, uint64_t id_length, int32_t rank, int32_t size, int32_t device,
                         const ckpt_gpu_group_options* options, ckpt_gpu_group** group, ckpt_gpu_error* error);
  int32_t (*nccl_borrow)(void* nccl_comm, int32_t device, const ckpt_gpu_group_options* options,
                         ckpt_gpu_group** group, ckpt_gpu_error* error);
  /* rank, size and device never change; broken: 1 once the group is broken. */
  void (*group_info)(const ckpt_gpu_group* group, int32_t* rank, int32_t* size, int32_t* device, int32_t* broken);
  void (*destroy_group)(ckpt_gpu_group* group);
} ckpt_gpu_plugin;

/* The plugin's entry point (CKPT_GPU_PLUGIN_ENTRY): its table, static storage, never NULL. */
typedef const ckpt_gpu_plugin* (*ckpt_gpu_plugin_entry_fn)(void);
const ckpt_gpu_plugin* ckpt_gpu_plugin_entry(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* CKPT_GPU_PLUGIN_ABI_H */
