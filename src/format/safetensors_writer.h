// The one safetensors writer (the format: https://github.com/huggingface/safetensors#format):
// persist writes its files' first bytes with it and streams the tensors after them; tests
// and tools build whole files with it. Python's one writer is tools/make_checkpoint.py's
// write_safetensors (docs/formats.md, "Writing safetensors").
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/status.h"
#include "ckpt/tensor.h"

namespace ckpt::format {

// The bytes a safetensors file begins with: the 8-byte little-endian length N, then N
// bytes of JSON: "__metadata__" first (when `metadata` is not empty), then the tensors in
// the order given (name, dtype, shape; `nbytes` bytes of data each, their checksums not
// written), their data_offsets back to back from 0, padded with spaces to a
// multiple of 8 bytes (so the data that follows is 8-byte aligned). `*data_bytes` (if not
// null): the bytes of data that must follow. InvalidArgument for an empty name, a name
// given twice or "__metadata__", or sizes that overflow 64 bits; Corrupt if a name or a
// metadata string is not valid UTF-8. Thread-safe.
Result<std::string> SafetensorsPrefix(const std::vector<TensorInfo>& tensors,
                                      const std::map<std::string, std::string>& metadata, uint64_t* data_bytes);

// A whole file in memory: SafetensorsPrefix, then data[i] for every tensor, which must hold
// exactly tensors[i].nbytes bytes (InvalidArgument otherwise). For tests and tools.
Result<std::string> SafetensorsFileBytes(const std::vector<TensorInfo>& tensors,
                                         const std::vector<std::string_view>& data,
                                         const std::map<std::string, std::string>& metadata = {});

}  // namespace ckpt::format
