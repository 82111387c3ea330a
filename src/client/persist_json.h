// The JSON form of a PersistResult: what `ckptctl persist --json` prints and what the
// Python module's Client.persist returns (as a dict), from this one encoder.
#pragma once

#include <nlohmann/json.hpp>

#include "ckpt/persist.h"

namespace ckpt {

// {"name", "generation", "dir", "files", "side_files", "tensor_count", "data_bytes",
//  "bytes_written", "seconds"}.
nlohmann::json EncodePersistResult(const PersistResult& r);

}  // namespace ckpt
