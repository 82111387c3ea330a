#include "shm/segment_layout.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "common/checked_math.h"
#include "common/element_count.h"
#include "shm/segment_writer.h"

namespace ckpt::shm {
namespace {

// The tensors' names: checks every tensor's name, dims and byte size; their total length.
Result<uint64_t> CheckTensors(const std::vector<TensorInfo>& tensors) {
  CheckedSum names_sum;
  for (const TensorInfo& t : tensors) {
    if (t.name.empty() || t.name.size() > kMaxNameBytes) {
      return InvalidArgument("tensor name must be 1 to " + std::to_string(kMaxNameBytes) + " bytes");
    }
    if (t.shape.size() > kMaxDims) return InvalidArgument("tensor '" + t.name + "' has too many dims");
    auto numel = ElementCount(t.shape);
    if (!numel.ok()) return InvalidArgument("tensor '" + t.name + "': bad shape: " + numel.status().message());
    if (TensorBytes(t.dtype, *numel) != t.nbytes) {
      return InvalidArgument("tensor '" + t.name + "': byte size does not match shape and dtype");
    }
    names_sum.Add(t.name.size());
  }
  return names_sum.Get("the tensor names' size");
}

// The side files in their stored order: the folder's files, then the metadata as one
// JSON object (offsets not yet set).
Result<std::vector<SideFilePlacement>> CollectSides(const SegmentSpec& spec) {
  std::vector<SideFilePlacement> sides;
  std::set<std::string> side_names;
  for (const auto& [name, bytes] : spec.side_files) {
    if (name.empty() || name.size() > kMaxSideNameBytes || name == kMetadataName || !side_names.insert(name).second) {
      return InvalidArgument("side file name '" + name + "' is empty, too long, reserved or repeated");
    }
    sides.push_back({name, bytes, SideFileKind::kFile});
  }
  if (!spec.metadata.empty()) {
    nlohmann::json md = nlohmann::json::object();
    for (const auto& [k, v] : spec.metadata) md[k] = v;
    std::string text;
    try {
      text = md.dump();
    } catch (const std::exception& e) {  // a key or value that is not UTF-8
      return InvalidArgument(std::string("checkpoint metadata cannot be stored: ") + e.what());
    }
    sides.push_back({kMetadataName, std::move(text), SideFileKind::kMetadata});
  }
  if (sides.size() > kMaxSideFiles) return InvalidArgument("too many side files");
  return sides;
}

// Places the side-file section at the first 8-aligned offset from `strings_end`: entries,
// names, then each file's bytes 8-aligned. Sets layout.side_offset/side_bytes and every
// placement's offsets; returns the section's end (strings_end when there are none).
Result<uint64_t> PlaceSides(uint64_t strings_end, SegmentLayout& layout) {
  if (layout.sides.empty()) return strings_end;
  CheckedSum c(strings_end);
  c.AlignUp(8);
  CKPT_ASSIGN_OR_RETURN(layout.side_offset, c.Get("the side files' layout"));
  c.AddProduct(layout.sides.size(), sizeof(SideFileEntry));
  for (SideFilePlacement& side : layout.sides) {
    CKPT_ASSIGN_OR_RETURN(uint64_t at, c.Get("the side files' layout"));
    side.name_offset = at - layout.side_offset;
    c.Add(side.name.size());
  }
  for (SideFilePlacement& side : layout.sides) {
    c.AlignUp(8);
    CKPT_ASSIGN_OR_RETURN(side.data_offset, c.Get("the side files' layout"));
    c.Add(side.bytes.size());
  }
  CKPT_ASSIGN_OR_RETURN(const uint64_t end, c.Get("the side files' layout"));
  layout.side_bytes = end - layout.side_offset;
  return end;
}

// Places the tensors' data from layout.data_offset (aliases at their target's offset);
// sets tensor_offsets and data_end.
Status PlaceTensors(const SegmentSpec& spec, SegmentLayout& layout) {
  if (!spec.alias_of.empty() && spec.alias_of.size() != spec.tensors.size()) {
    return InvalidArgument("alias_of must be empty or have one entry per tensor");
  }
  CheckedSum cursor(layout.data_offset);
  std::vector<uint64_t>& offsets = layout.tensor_offsets;
  offsets.reserve(spec.tensors.size());
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const int64_t alias = spec.alias_of.empty() ? -1 : spec.alias_of[i];
    if (alias >= 0) {
      if (static_cast<size_t>(alias) >= i || spec.tensors[alias].nbytes != spec.tensors[i].nbytes) {
        return InvalidArgument("tensor '" + spec.tensors[i].name + "' aliases a tensor that is not an earlier one of its size");
      }
      offsets.push_back(offsets[alias]);
      continue;
    }
    CKPT_ASSIGN_OR_RETURN(uint64_t at, cursor.Get("the segment layout"));
    offsets.push_back(at);
    cursor.Add(spec.tensors[i].nbytes).AlignUp(kDataAlignment);
  }
  CKPT_ASSIGN_OR_RETURN(layout.data_end, cursor.Get("the segment's size"));
  return Status::Ok();
}

}  // namespace

Result<SegmentLayout> PlanSegmentLayout(const SegmentSpec& spec, uint64_t page_alignment) {
  SegmentLayout layout;
  CKPT_ASSIGN_OR_RETURN(layout.strings_bytes, CheckTensors(spec.tensors));
  layout.index_offset = kHeaderBytes;
  CKPT_ASSIGN_OR_RETURN(layout.strings_offset, CheckedSum(layout.index_offset)
                                                   .AddProduct(spec.tensors.size(), sizeof(TensorEntry))
                                                   .Get("the index"));
  CKPT_ASSIGN_OR_RETURN(const uint64_t strings_end,
                        CheckedSum(layout.strings_offset).Add(layout.strings_bytes).Get("the index"));
  CKPT_ASSIGN_OR_RETURN(layout.sides, CollectSides(spec));
  CKPT_ASSIGN_OR_RETURN(const uint64_t after_meta, PlaceSides(strings_end, layout));
  CKPT_ASSIGN_OR_RETURN(layout.data_offset, CheckedSum(after_meta).AlignUp(4096).Get("the index"));
  CKPT_RETURN_IF_ERROR(PlaceTensors(spec, layout));
  CKPT_ASSIGN_OR_RETURN(layout.segment_bytes, CheckedSum(std::max(layout.data_end, layout.data_offset + 1))
                                                  .AlignUp(page_alignment)
                                                  .Get("the segment's size"));
  return layout;
}

}  // namespace ckpt::shm
