// TensorHasher: streaming XXH3-64 per tensor equals the one-shot hash of the same bytes,
// whatever the range sizes and however many tensors stream at once from several threads;
// an empty stream is XXH3 of no bytes; destroying it with work queued neither hangs nor
// crashes, and the memory it was given stays alive until its threads ended.
#include "daemon/tensor_hasher.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstddef>
#include <random>
#include <thread>
#include <vector>

namespace ckpt::daemon {
namespace {

std::vector<std::byte> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

TEST(TensorHasherTest, StreamedRangesHashLikeTheWholeTensor) {
  std::vector<std::vector<std::byte>> tensors;
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{240}, size_t{4096 + 3}, size_t{3u << 20}}) {
    tensors.push_back(Random(n, static_cast<uint32_t>(n) + 7));
  }
  auto keep = std::make_shared<int>(0);
  auto h = TensorHasher::Create(tensors.size(), 3, keep);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  // Each tensor on its own thread, in ranges of odd sizes (1 byte to about 300 KiB).
  std::vector<std::thread> adders;
  for (size_t t = 0; t < tensors.size(); ++t) {
    adders.emplace_back([&, t] {
      std::mt19937 rng(static_cast<uint32_t>(t));
      const auto& v = tensors[t];
      for (size_t at = 0; at < v.size();) {
        const size_t n = std::min<size_t>(v.size() - at, 1 + rng() % 300000);
        (*h)->Add(t, v.data() + at, n);
        at += n;
      }
    });
  }
  for (auto& a : adders) a.join();
  const std::vector<uint64_t> got = (*h)->Finish();
  ASSERT_EQ(got.size(), tensors.size());
  uint64_t total = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    EXPECT_EQ(got[t], XXH3_64bits(tensors[t].data(), tensors[t].size())) << "tensor " << t;
    total += tensors[t].size();
  }
  EXPECT_EQ((*h)->hashed_bytes(), total);
  EXPECT_EQ(got[0], XXH3_64bits(nullptr, 0));
}

TEST(TensorHasherTest, DestroyedWithWorkQueuedEndsAndReleasesWhatItKeptLast) {
  auto data = std::make_shared<std::vector<std::byte>>(Random(8u << 20, 1));
  std::weak_ptr<std::vector<std::byte>> alive = data;
  {
    auto h = TensorHasher::Create(2, 1, data);
    ASSERT_TRUE(h.ok());
    for (int i = 0; i < 64; ++i) (*h)->Add(i % 2, data->data(), data->size());
    data.reset();
    EXPECT_FALSE(alive.expired()) << "the hasher keeps the memory its ranges point into";
  }
  EXPECT_TRUE(alive.expired());
}

}  // namespace
}  // namespace ckpt::daemon
