/* libckptclient's C API, for languages other than C++.
 *
 * Every function that can fail returns 0 on success or a ckpt_status code (the values of
 * ckpt::StatusCode) and keeps a message for ckpt_last_error(). Handles are owned by the
 * caller and freed with the matching *_free / ckpt_detach. Tensor pointers stay valid until
 * the checkpoint handle is detached. A handle may be used from one thread at a time. */
#ifndef CKPT_CKPT_H_
#define CKPT_CKPT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ckpt_client ckpt_client;
typedef struct ckpt_checkpoint ckpt_checkpoint;

#define CKPT_MAX_DIMS 8

typedef struct {
  const char* name;      /* NUL-terminated */
  uint32_t dtype;        /* ckpt::DType value; ckpt_dtype_name() names it */
  uint32_t ndim;
  int64_t shape[CKPT_MAX_DIMS];
  uint64_t nbytes;
  uint64_t checksum;     /* XXH3-64 of the bytes */
  const void* data;      /* read-only, in shared memory */
} ckpt_tensor;

enum { CKPT_SHARD_REPLICATE = 0, CKPT_SHARD_SPLIT = 1 };

typedef struct {
  int kind;              /* CKPT_SHARD_* */
  int dim;
  int rank;
  int world;
  int fused_chunks;      /* 0 or 1: not fused */
  int allow_uneven;
} ckpt_shard_spec;

/* The message of the last error on this thread ("" if none). */
const char* ckpt_last_error(void);
/* "F32", "BF16", ...; "INVALID" for an unknown value. */
const char* ckpt_dtype_name(uint32_t dtype);

/* socket_path NULL: $CKPTD_SOCKET or the default path. */
int ckpt_connect(const char* socket_path, ckpt_client** out);
void ckpt_client_free(ckpt_client* client);
/* name NULL: derived from the file name. */
int ckpt_load(ckpt_client* client, const char* path, const char* name);
int ckpt_evict(ckpt_client* client, const char* name, int force);

int ckpt_attach(ckpt_client* client, const char* name, ckpt_checkpoint** out);
void ckpt_detach(ckpt_checkpoint* checkpoint);
uint64_t ckpt_generation(const ckpt_checkpoint* checkpoint);
size_t ckpt_tensor_count(const ckpt_checkpoint* checkpoint);
int ckpt_tensor_at(const ckpt_checkpoint* checkpoint, size_t index, ckpt_tensor* out);
int ckpt_tensor_find(const ckpt_checkpoint* checkpoint, const char* name, ckpt_tensor* out);

/* Shape (CKPT_MAX_DIMS entries) and byte size of a tensor's shard. */
int ckpt_shard_info(const ckpt_checkpoint* checkpoint, const char* tensor, const ckpt_shard_spec* spec,
                    uint32_t* ndim, int64_t* shape, uint64_t* nbytes);
/* Copies a tensor's shard into dst (dst_size >= its nbytes). */
int ckpt_copy_shard(const ckpt_checkpoint* checkpoint, const char* tensor, const ckpt_shard_spec* spec,
                    void* dst, uint64_t dst_size);

/* Side files the daemon kept from the checkpoint's folder (config.json, ...). */
size_t ckpt_side_file_count(const ckpt_checkpoint* checkpoint);
/* *name: the name of side file `index` (NUL-terminated, valid until detach). */
int ckpt_side_file_name(const ckpt_checkpoint* checkpoint, size_t index, const char** name);
/* *data, *size: the bytes of side file `name` in shared memory (read-only, not
 * NUL-terminated, valid until detach). The kNotFound code (ckpt::StatusCode) if it was
 * not kept. */
int ckpt_side_file(const ckpt_checkpoint* checkpoint, const char* name, const void** data, uint64_t* size);
/* The checkpoint's metadata (safetensors __metadata__): entries in key order. */
size_t ckpt_metadata_count(const ckpt_checkpoint* checkpoint);
/* *key, *value: entry `index` (NUL-terminated, valid until detach). */
int ckpt_metadata_at(const ckpt_checkpoint* checkpoint, size_t index, const char** key, const char** value);
/* *value: the value of `key` (valid until detach); kNotFound if absent. */
int ckpt_metadata_get(const ckpt_checkpoint* checkpoint, const char* key, const char** value);

/* ---- publishing (include/ckpt/writer.h; docs/write-path.md) ----
 * One writer per part (rank) of a generation. Pieces are declared with the address of
 * their contiguous row-major host bytes, read during ckpt_writer_commit (keep them valid
 * until it returns). Nothing is published unless every part commits. */
typedef struct ckpt_writer ckpt_writer;

typedef struct {
  const char* job;   /* shared by every part; NULL or "" only for one part */
  int64_t part;      /* in [0, parts) */
  int64_t parts;     /* 0 or 1: one part */
  int replace;       /* publish a new generation of an existing name */
  double timeout_s;  /* the whole write; 0: 600 s */
} ckpt_writer_options;

/* socket_path NULL: $CKPTD_SOCKET or the default path; options NULL: one part. */
int ckpt_writer_create(const char* socket_path, const char* name, const ckpt_writer_options* options,
                       ckpt_writer** out);
/* Frees the writer; one not committed is aborted (nothing is published). */
void ckpt_writer_free(ckpt_writer* writer);
/* A box of global tensor `key` (ndim dims of global_shape): `shape` elements from
 * `offsets` (either NULL: the whole tensor from 0), its bytes at `data`. */
int ckpt_writer_add(ckpt_writer* writer, const char* key, uint32_t dtype, uint32_t ndim, const int64_t* global_shape,
                    const int64_t* offsets, const int64_t* shape, const void* data);
/* Elements [start, start + numel) of the flattened global tensor `key` (a ZeRO partition). */
int ckpt_writer_add_flat(ckpt_writer* writer, const char* key, uint32_t dtype, uint32_t ndim,
                         const int64_t* global_shape, uint64_t start, uint64_t numel, const void* data);
/* A file stored with the generation (ckpt_side_file). */
int ckpt_writer_side_file(ckpt_writer* writer, const char* name, const void* data, uint64_t size);
/* Streams this part and waits until the generation is published (its generation in
 * *generation, if not NULL) or failed as a whole (the error; nothing published). */
int ckpt_writer_commit(ckpt_writer* writer, uint64_t* generation);

#ifdef __cplusplus
}
#endif

#endif /* CKPT_CKPT_H_ */
