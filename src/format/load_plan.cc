#include "format/load_plan.h"

#include <cstdio>
#include <limits>
#include <unordered_set>

#include "common/byte_size.h"
#include "common/checked_math.h"
#include "common/element_count.h"
#include "common/hex.h"
#include "shm/segment_format.h"

namespace ckpt::format {

Result<uint64_t> LoadPlan::StoredBytes() const {
  CheckedSum total;
  for (const auto& t : tensors) {
    if (t.alias_of < 0) total.Add(t.nbytes);
  }
  return total.Get("the checkpoint's total tensor size");
}

uint64_t LoadPlan::TotalBytes() const {
  auto s = StoredBytes();
  return s.ok() ? *s : std::numeric_limits<uint64_t>::max();
}

uint64_t LoadPlan::FileBytes() const {
  CheckedSum total;
  for (const auto& f : files) total.Add(f ? f->identity.size : 0);
  auto v = total.Get("file bytes");
  return v.ok() ? *v : std::numeric_limits<uint64_t>::max();
}

bool IsValidUtf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
      cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;  // continuation byte, overlong lead (0xc0, 0xc1) or past U+10FFFF
    }
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += len;
  }
  return true;
}

std::string EscapedName(const std::string& name) { return EscapedForMessage(name, 200); }

Status ValidatePlan(const LoadPlan& plan) {
  std::unordered_set<std::string> names;
  names.reserve(plan.tensors.size());
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const PlannedTensor& t = plan.tensors[i];
    const std::string where = "tensor '" + EscapedName(t.name) + "'";
    if (t.name.empty() || t.name.size() > shm::kMaxNameBytes) {
      return InvalidArgument(where + ": a tensor name must be 1 to " + std::to_string(shm::kMaxNameBytes) +
                             " bytes, not " + std::to_string(t.name.size()));
    }
    if (!IsValidUtf8(t.name)) return InvalidArgument(where + ": tensor name is not valid UTF-8");
    if (t.name.find('\0') != std::string::npos) return InvalidArgument(where + ": tensor name contains a NUL byte");
    if (!names.insert(t.name).second) return InvalidArgument("duplicate tensor name '" + EscapedName(t.name) + "'");
    if (t.file_index >= plan.files.size()) return Internal(where + ": plan names a file it does not list");
    if (t.alias_of >= static_cast<int64_t>(i)) return Internal(where + ": alias of a later tensor");
    if (t.shape.size() > shm::kMaxDims) return InvalidArgument(where + ": too many dimensions");
    // Element count and byte size, checked.
    auto counted = ElementCount(t.shape);
    if (!counted.ok()) return InvalidArgument(where + ": " + counted.status().message());
    const uint64_t numel = *counted;
    auto bytes = TensorBytes(t.dtype, numel);
    if (!bytes) return InvalidArgument(where + ": byte size overflows 64 bits (or is not whole bytes)");
    if (*bytes != t.nbytes) return InvalidArgument(where + ": byte size does not match shape and dtype");
    if (!t.strides.empty()) {
      if (t.strides.size() != t.shape.size()) return InvalidArgument(where + ": strides do not match shape");
      if (numel > 0) {
        // Highest element reached, checked: sum((size_d - 1) * stride_d), then bytes.
        CheckedSum last;
        for (size_t d = 0; d < t.shape.size(); ++d) {
          if (t.strides[d] < 0) return InvalidArgument(where + ": negative stride");
          last.AddProduct(static_cast<uint64_t>(t.shape[d] - 1), static_cast<uint64_t>(t.strides[d]));
        }
        last.Add(1);
        CKPT_ASSIGN_OR_RETURN(uint64_t elements, last.Get(where + ": view extent"));
        auto span = CheckedMul(elements, DTypeSize(t.dtype));
        if (!span || *span > t.source_bytes) return InvalidArgument(where + ": view reaches beyond its source bytes");
      }
    }
  }
  return plan.StoredBytes().status();
}

Status CheckExpansion(const LoadPlan& plan, double max_expansion) {
  if (max_expansion <= 0) return Status::Ok();
  CKPT_ASSIGN_OR_RETURN(uint64_t stored, plan.StoredBytes());
  const uint64_t file_bytes = plan.FileBytes();
  const long double limit = static_cast<long double>(file_bytes) * max_expansion;
  const bool beyond_slack = file_bytes > std::numeric_limits<uint64_t>::max() - kExpansionSlackBytes ||
                            stored > file_bytes + kExpansionSlackBytes;
  if (static_cast<long double>(stored) > limit && beyond_slack) {
    char ratio[32];
    std::snprintf(ratio, sizeof(ratio), "%.1f", file_bytes ? static_cast<double>(stored) / file_bytes : 0.0);
    return InvalidArgument("checkpoint expands from " + BytesText(file_bytes) + " of file to " +
                           BytesText(stored) + " in shared memory (" + ratio +
                           "x, limit " + std::to_string(static_cast<int>(max_expansion)) +
                           "x: repeated strided views); refused unless an admin allows it "
                           "(ckptctl load --allow-expansion, or ckptd --max-expansion)");
  }
  return Status::Ok();
}

}  // namespace ckpt::format
