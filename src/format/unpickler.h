// StateDictUnpickler: a restricted pickle reader for the data.pkl of a PyTorch zip
// checkpoint. It executes nothing: it understands the opcodes that pickled state dicts
// use (protocols 2 to 5) and only an allow-list of globals (collections.OrderedDict,
// torch._utils._rebuild_tensor(_v2), torch._utils._rebuild_parameter, torch.*Storage,
// torch dtypes). Any other global, opcode or persistent id is refused with an error that
// names it. Every resource it uses is bounded (values, memo, stack, strings).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/status.h"

namespace ckpt::format {

// One tensor of the state dict, as torch described it: a view into a storage.
struct PickledTensor {
  std::string name;
  std::string storage_key;       // the storage's record: <archive>/data/<storage_key>
  DType dtype = DType::kU8;      // from the storage type (torch.FloatStorage, ...)
  uint64_t storage_numel = 0;    // elements in the whole storage
  uint64_t storage_offset = 0;   // in elements
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements, same length as shape
};

struct UnpicklerLimits {
  uint64_t max_values = 4u << 20;      // objects created (ints, strings, tuples, ...)
  uint64_t max_memo = 1u << 20;        // memo entries
  uint64_t max_stack = 1u << 20;       // stack depth plus marks
  uint64_t max_string_bytes = 1u << 20;
  uint64_t max_total_string_bytes = 128ull << 20;
  uint64_t max_items = 16u << 20;      // elements put into tuples, lists and dicts, in total
  uint32_t max_dims = 8;
};

class StateDictUnpickler {
 public:
  // Parses `pickle` (the bytes of data.pkl) whose top-level object must be a mapping
  // (dict or OrderedDict) of string names to tensors. Returns the tensors in pickle
  // order. Errors: Unsupported naming a disallowed global or opcode, or saying what the
  // top-level object is when it is not a mapping of names to tensors; Corrupt for a
  // malformed or truncated pickle; ResourceExhausted when a limit is exceeded.
  static Result<std::vector<PickledTensor>> Parse(std::string_view pickle,
                                                  const UnpicklerLimits& limits = UnpicklerLimits());
};

// Maps a torch typed-storage class name ("FloatStorage", "BFloat16Storage", ...) to its
// dtype; nullopt for storages with no safetensors dtype (quantized, ComplexHalf, ...).
std::optional<DType> DTypeFromTorchStorage(const std::string& name);

}  // namespace ckpt::format
