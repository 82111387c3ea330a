/* Exercises the C API against a daemon that has checkpoint "gpt" loaded (written by
 * tools/make_checkpoint.py with --slices REF_DIR --world 4). Returns 0 or 1 with a reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"

#define CHECK(cond, ...)                              \
  do {                                                \
    if (!(cond)) {                                    \
      snprintf(error, error_size, __VA_ARGS__);       \
      goto fail;                                      \
    }                                                 \
  } while (0)

static char* read_file(const char* path, long* size) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  *size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* buf = malloc(*size > 0 ? (size_t)*size : 1);
  if (fread(buf, 1, (size_t)*size, f) != (size_t)*size) *size = -1;
  fclose(f);
  return buf;
}

int ckpt_c_api_check(const char* socket, const char* ref_dir, char* error, size_t error_size) {
  ckpt_client* client = NULL;
  ckpt_checkpoint* ckpt = NULL;
  char* ref = NULL;
  void* got = NULL;
  int rc = ckpt_connect(socket, &client);
  CHECK(rc == 0, "connect: %s", ckpt_last_error());
  rc = ckpt_attach(client, "no-such-checkpoint", &ckpt);
  CHECK(rc == 2 /* not_found */ && strstr(ckpt_last_error(), "no-such-checkpoint"), "attach unknown: %d %s", rc,
        ckpt_last_error());
  rc = ckpt_attach(client, "gpt", &ckpt);
  CHECK(rc == 0, "attach: %s", ckpt_last_error());
  CHECK(ckpt_tensor_count(ckpt) > 10, "too few tensors");

  ckpt_tensor t;
  rc = ckpt_tensor_find(ckpt, "h.1.attn.qkv.weight", &t);
  CHECK(rc == 0, "find: %s", ckpt_last_error());
  CHECK(strcmp(ckpt_dtype_name(t.dtype), "F32") == 0 && t.ndim == 2, "qkv metadata");

  /* Column-parallel slice of the fused QKV weight, rank 2 of 4, against PyTorch's. */
  ckpt_shard_spec spec = {CKPT_SHARD_SPLIT, 1, 2, 4, 1, 0};
  uint64_t nbytes = 0;
  int64_t shape[CKPT_MAX_DIMS];
  uint32_t ndim = 0;
  rc = ckpt_shard_info(ckpt, "h.1.attn.qkv.weight", &spec, &ndim, shape, &nbytes);
  CHECK(rc == 0 && ndim == 2 && shape[0] == t.shape[0] && shape[1] == t.shape[1] / 4, "shard info");
  char path[4096];
  snprintf(path, sizeof(path), "%s/h.1.attn.qkv.weight.1.2-of-4.bin", ref_dir);
  long ref_size = 0;
  ref = read_file(path, &ref_size);
  CHECK(ref && ref_size == (long)nbytes, "reference %s", path);
  got = malloc(nbytes);
  rc = ckpt_copy_shard(ckpt, "h.1.attn.qkv.weight", &spec, got, nbytes);
  CHECK(rc == 0, "copy: %s", ckpt_last_error());
  CHECK(memcmp(got, ref, nbytes) == 0, "slice differs from PyTorch's");
  rc = ckpt_copy_shard(ckpt, "h.1.attn.qkv.weight", &spec, got, nbytes - 1);
  CHECK(rc == 1 /* invalid_argument */, "short destination accepted");
  spec.rank = 4;
  rc = ckpt_copy_shard(ckpt, "h.1.attn.qkv.weight", &spec, got, nbytes);
  CHECK(rc == 1 && strstr(ckpt_last_error(), "rank"), "rank out of range accepted: %s", ckpt_last_error());

  free(ref);
  free(got);
  ckpt_detach(ckpt);
  ckpt_client_free(client);
  return 0;
fail:
  free(ref);
  free(got);
  ckpt_detach(ckpt);
  ckpt_client_free(client);
  return 1;
}
