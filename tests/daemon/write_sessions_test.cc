// PlanWriteLayout and ForEachRun (daemon/write_sessions.h): the coverage rules of a
// multi-part write and where each piece's bytes land.
#include "daemon/write_sessions.h"

#include <gtest/gtest.h>

#include <numeric>

namespace ckpt::daemon {
namespace {

using protocol::WritePiece;

WritePiece Box(const std::string& key, std::vector<int64_t> global, std::vector<int64_t> offsets,
               std::vector<int64_t> shape, DType dtype = DType::kF32) {
  WritePiece p;
  p.key = key;
  p.dtype = dtype;
  p.global_shape = std::move(global);
  p.offsets = std::move(offsets);
  p.shape = std::move(shape);
  return p;
}

WritePiece Flat(const std::string& key, std::vector<int64_t> global, uint64_t start, uint64_t numel) {
  WritePiece p;
  p.key = key;
  p.dtype = DType::kF32;
  p.global_shape = std::move(global);
  p.flat = true;
  p.start = start;
  p.numel = numel;
  return p;
}

// Scatters every piece (filled with its global element indices) through its target and
// checks that each element lands at its own index exactly once.
void ExpectExactScatter(const std::vector<std::vector<WritePiece>>& parts, const WriteLayout& layout) {
  for (size_t t = 0; t < layout.tensors.size(); ++t) {
    const uint64_t numel = layout.tensors[t].nbytes / 4;
    std::vector<int> hits(numel, 0);
    std::vector<float> dst(numel, -1);
    for (size_t part = 0; part < parts.size(); ++part) {
      for (size_t i = 0; i < parts[part].size(); ++i) {
        const WritePiece& p = parts[part][i];
        const PieceTarget& target = layout.targets[part][i];
        if (target.tensor != t) continue;
        // The piece's own elements, row-major, holding their global flat index.
        std::vector<float> src;
        const auto& g = layout.tensors[t].shape;
        if (p.flat) {
          for (uint64_t e = 0; e < p.numel; ++e) src.push_back(static_cast<float>(p.start + e));
        } else {
          uint64_t count = 1;
          for (int64_t d : p.shape) count *= static_cast<uint64_t>(d);
          for (uint64_t e = 0; e < count; ++e) {
            uint64_t rem = e, flat = 0, stride = 1;
            std::vector<uint64_t> idx(g.size());
            for (size_t d = g.size(); d-- > 0;) {
              idx[d] = rem % static_cast<uint64_t>(p.shape[d]) + static_cast<uint64_t>(p.offsets[d]);
              rem /= static_cast<uint64_t>(p.shape[d]);
            }
            for (size_t d = g.size(); d-- > 0;) {
              flat += idx[d] * stride;
              stride *= static_cast<uint64_t>(g[d]);
            }
            src.push_back(static_cast<float>(flat));
          }
        }
        ASSERT_EQ(src.size() * 4, target.bytes);
        // In uneven chunks, as a ring would deliver them.
        for (uint64_t off = 0; off < target.bytes; off += 20) {
          const uint64_t n = std::min<uint64_t>(20, target.bytes - off);
          ForEachRun(target, off, n, [&](uint64_t tensor_byte, uint64_t piece_byte, uint64_t len) {
            std::memcpy(reinterpret_cast<char*>(dst.data()) + tensor_byte,
                        reinterpret_cast<const char*>(src.data()) + piece_byte, len);
            for (uint64_t b = tensor_byte; b < tensor_byte + len; b += 4) hits[b / 4]++;
          });
        }
      }
    }
    for (uint64_t e = 0; e < numel; ++e) {
      ASSERT_EQ(hits[e], 1) << layout.tensors[t].name << " element " << e;
      ASSERT_EQ(dst[e], static_cast<float>(e)) << layout.tensors[t].name << " element " << e;
    }
  }
}

TEST(PlanWriteLayoutTest, BoxesAlongEveryDimAndFlatRangesCoverExactly) {
  std::vector<std::vector<WritePiece>> parts(4);
  for (int p = 0; p < 4; ++p) {
    parts[p].push_back(Box("rows", {8, 6}, {p * 2, 0}, {2, 6}));
    parts[p].push_back(Box("cols", {8, 6, 3}, {0, 0, 0}, {8, 6, 3}));  // replaced below for p > 0
    parts[p].push_back(Flat("z", {10, 3}, static_cast<uint64_t>(p * 8), p == 3 ? 6 : 8));
  }
  // "cols": 2 x 2 boxes of a 3-D tensor, split along dims 0 and 1.
  for (int p = 0; p < 4; ++p) parts[p][1] = Box("cols", {8, 6, 3}, {(p / 2) * 4, (p % 2) * 3, 0}, {4, 3, 3});
  parts[0].push_back(Box("scalar", {}, {}, {}));
  auto layout = PlanWriteLayout(parts);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  ASSERT_EQ(layout->tensors.size(), 4u);
  EXPECT_EQ(layout->tensors[0].name, "rows");
  EXPECT_EQ(layout->data_bytes, (48 + 144 + 30 + 1) * 4u);
  ExpectExactScatter(parts, *layout);
}

TEST(PlanWriteLayoutTest, HolesOverlapsAndDisagreementsAreRefused) {
  auto refused = [](std::vector<std::vector<WritePiece>> parts, const std::string& words) {
    auto r = PlanWriteLayout(parts);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().ToString();
  };
  refused({{Box("w", {4, 4}, {0, 0}, {2, 4})}, {}}, "a hole");
  refused({{Box("w", {4, 4}, {0, 0}, {3, 4})}, {Box("w", {4, 4}, {2, 0}, {2, 4})}}, "overlap");
  // Same volume, but overlapping and leaving a hole: caught by the pairwise check.
  refused({{Box("w", {4, 4}, {0, 0}, {2, 4})}, {Box("w", {4, 4}, {1, 0}, {2, 4})}}, "overlap");
  refused({{Box("w", {4, 4}, {0, 0}, {2, 4})}, {Box("w", {4, 4}, {2, 0}, {2, 4}, DType::kF16)}}, "must agree");
  refused({{Box("w", {4, 4}, {0, 0}, {2, 4})}, {Box("w", {4, 5}, {2, 0}, {2, 4})}}, "must agree");
  refused({{Flat("z", {10}, 0, 5)}, {Flat("z", {10}, 6, 4)}}, "no part writes elements 5 to 6");
  refused({{Flat("z", {10}, 0, 6)}, {Flat("z", {10}, 5, 5)}}, "overlaps");
  refused({{Flat("z", {10}, 0, 5)}, {Flat("z", {10}, 5, 6)}}, "leaves the tensor");
  refused({{Box("w", {4, 4}, {0, 0}, {2, 4})}, {Flat("w", {4, 4}, 8, 8)}}, "written one way");
  refused({{Flat("z", {1ll << 62, 1ll << 62}, 0, 1)}}, "overflows");
  // The same piece twice from one part.
  refused({{Box("w", {4}, {0}, {4}), Box("w", {4}, {0}, {4})}}, "overlap");
}

}  // namespace
}  // namespace ckpt::daemon
