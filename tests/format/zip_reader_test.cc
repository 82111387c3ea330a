#include "format/zip_reader.h"

#include <gtest/gtest.h>

#include <cstring>

namespace ckpt::format {
namespace {

void Put16(std::string* s, uint16_t v) {
  s->push_back(static_cast<char>(v & 0xff));
  s->push_back(static_cast<char>(v >> 8));
}
void Put32(std::string* s, uint32_t v) {
  Put16(s, v & 0xffff);
  Put16(s, v >> 16);
}
void Put64(std::string* s, uint64_t v) {
  Put32(s, static_cast<uint32_t>(v));
  Put32(s, static_cast<uint32_t>(v >> 32));
}

struct Item {
  std::string name, data;
  uint16_t method = 0;
  uint16_t flags = 0;
};

// A zip image as torch writes it (STORED, data 64-byte aligned through local extra
// padding); with `zip64`, sizes and offsets go through ZIP64 extra fields and records.
std::string BuildZip(const std::vector<Item>& items, bool zip64) {
  std::string out, dir;
  for (const Item& it : items) {
    const uint64_t local = out.size();
    const size_t pad = (64 - (out.size() + 30 + it.name.size() + 4) % 64) % 64;
    Put32(&out, 0x04034b50);
    Put16(&out, 20); Put16(&out, it.flags); Put16(&out, it.method); Put16(&out, 0); Put16(&out, 0);
    Put32(&out, 0); Put32(&out, static_cast<uint32_t>(it.data.size())); Put32(&out, static_cast<uint32_t>(it.data.size()));
    Put16(&out, static_cast<uint16_t>(it.name.size())); Put16(&out, static_cast<uint16_t>(4 + pad));
    out += it.name;
    Put16(&out, 0x4246); Put16(&out, static_cast<uint16_t>(pad)); out += std::string(pad, 'Z');
    EXPECT_EQ(out.size() % 64, 0u);
    out += it.data;

    Put32(&dir, 0x02014b50);
    Put16(&dir, 45); Put16(&dir, 45); Put16(&dir, it.flags); Put16(&dir, it.method); Put16(&dir, 0); Put16(&dir, 0);
    Put32(&dir, 0);
    Put32(&dir, zip64 ? 0xffffffff : static_cast<uint32_t>(it.data.size()));
    Put32(&dir, zip64 ? 0xffffffff : static_cast<uint32_t>(it.data.size()));
    Put16(&dir, static_cast<uint16_t>(it.name.size())); Put16(&dir, zip64 ? 28 : 0); Put16(&dir, 0);
    Put16(&dir, 0); Put16(&dir, 0); Put32(&dir, 0);
    Put32(&dir, zip64 ? 0xffffffff : static_cast<uint32_t>(local));
    dir += it.name;
    if (zip64) {
      Put16(&dir, 1); Put16(&dir, 24);
      Put64(&dir, it.data.size()); Put64(&dir, it.data.size()); Put64(&dir, local);
    }
  }
  const uint64_t dir_offset = out.size();
  out += dir;
  if (zip64) {
    const uint64_t rec = out.size();
    Put32(&out, 0x06064b50); Put64(&out, 44); Put16(&out, 45); Put16(&out, 45); Put32(&out, 0); Put32(&out, 0);
    Put64(&out, items.size()); Put64(&out, items.size()); Put64(&out, dir.size()); Put64(&out, dir_offset);
    Put32(&out, 0x07064b50); Put32(&out, 0); Put64(&out, rec); Put32(&out, 1);
  }
  Put32(&out, 0x06054b50); Put16(&out, 0); Put16(&out, 0);
  Put16(&out, zip64 ? 0xffff : static_cast<uint16_t>(items.size()));
  Put16(&out, zip64 ? 0xffff : static_cast<uint16_t>(items.size()));
  Put32(&out, zip64 ? 0xffffffff : static_cast<uint32_t>(dir.size()));
  Put32(&out, zip64 ? 0xffffffff : static_cast<uint32_t>(dir_offset));
  Put16(&out, 0);
  return out;
}

Result<std::unique_ptr<ZipReader>> Open(const std::string& image) {
  auto read = [&](void* buf, size_t n, uint64_t off) -> Status {
    if (off > image.size() || n > image.size() - off) return Corrupt("past the end");
    std::memcpy(buf, image.data() + off, n);
    return Status::Ok();
  };
  return ZipReader::Create(read, image.size(), "test.zip");
}

class ZipReaderTest : public ::testing::TestWithParam<bool> {};

TEST_P(ZipReaderTest, FindsStoredEntriesAndTheirBytes) {
  const std::string image = BuildZip({{"a/data.pkl", "PICKLE"}, {"a/data/0", std::string(100, 'x')}, {"a/version", "3\n"}},
                                     GetParam());
  auto zip = Open(image);
  ASSERT_TRUE(zip.ok()) << zip.status().ToString();
  ASSERT_EQ((*zip)->entries().size(), 3u);
  const ZipEntry* e = (*zip)->Find("a/data/0");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->size, 100u);
  EXPECT_EQ(e->data_offset % 64, 0u);
  EXPECT_EQ(image.substr(e->data_offset, e->size), std::string(100, 'x'));
  EXPECT_EQ(image.substr((*zip)->Find("a/data.pkl")->data_offset, 6), "PICKLE");
  EXPECT_EQ((*zip)->Find("nope"), nullptr);
}

INSTANTIATE_TEST_SUITE_P(PlainAndZip64, ZipReaderTest, ::testing::Bool());

TEST(ZipReaderBadTest, CompressedAndEncryptedEntriesAreListedButNotStored) {
  auto z = Open(BuildZip({{"a/data.pkl", "x", /*method=*/8}, {"a/k", "y", 0, /*flags=*/1}, {"a/s", "z"}}, false));
  ASSERT_TRUE(z.ok()) << z.status().ToString();
  EXPECT_FALSE((*z)->Find("a/data.pkl")->stored());
  EXPECT_EQ((*z)->Find("a/data.pkl")->method, 8);
  EXPECT_FALSE((*z)->Find("a/k")->stored());
  EXPECT_TRUE((*z)->Find("a/k")->encrypted);
  EXPECT_TRUE((*z)->Find("a/s")->stored());
}

TEST(ZipReaderBadTest, TruncatedOrGarbageRefusedWithoutCrash) {
  const std::string good = BuildZip({{"a/data.pkl", "PICKLE"}, {"a/data/0", "0123456789"}}, true);
  for (size_t cut = 0; cut < good.size(); ++cut) {
    auto z = Open(good.substr(0, cut));
    EXPECT_FALSE(z.ok() && (*z)->entries().size() == 2) << cut;
  }
  // Every single-byte corruption either parses or is refused; never crashes.
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0xff);
    (void)Open(bad);
  }
  auto z = Open(std::string(100, '\0'));
  ASSERT_FALSE(z.ok());
  EXPECT_EQ(z.status().code(), StatusCode::kCorrupt);
}

TEST(ZipReaderBadTest, DuplicateNamesRefused) {
  auto z = Open(BuildZip({{"a/x", "1"}, {"a/x", "2"}}, false));
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.status().message().find("duplicate"), std::string::npos);
}

}  // namespace
}  // namespace ckpt::format
