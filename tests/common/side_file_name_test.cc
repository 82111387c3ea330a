#include "common/side_file_name.h"

#include <gtest/gtest.h>

#include <string>

namespace ckpt {
namespace {

TEST(SideFileNameTest, TheOneRuleForPublishAndPersist) {
  for (const std::string ok : {"config.json", "generation_config.json", "tokenizer.model", "dcp.metadata.json",
                               "dcp.metadata", "serving_cache.json", "merges.txt", "0.json", "a"}) {
    EXPECT_TRUE(CheckSideFileName(ok).ok()) << ok;
  }
  EXPECT_TRUE(CheckSideFileName(std::string(255, 'a')).ok());
  struct Case {
    std::string name;
    const char* why;
  } bad[] = {
      {"", "1 to 255 bytes"},
      {std::string(256, 'a'), "1 to 255 bytes"},
      {"model.safetensors", "checkpoint file's name"},
      {"model.safetensors.index.json", "checkpoint file's name"},
      {"model-00001-of-00003.safetensors", "checkpoint file's name"},
      {"pytorch_model.bin", "checkpoint file's name"},
      {"w.pt", "checkpoint file's name"},
      {"w.pth", "checkpoint file's name"},
      {"last.ckpt", "checkpoint file's name"},
      {"pytorch_model.bin.index.json", "checkpoint file's name"},
      {".hidden", "begin with a letter or digit"},
      {"-rf", "begin with a letter or digit"},
      {"_x", "begin with a letter or digit"},
      {"a/b", "only letters, digits"},
      {"a\nb", "only letters, digits"},
      {"a\x1b[2Jb", "only letters, digits"},
      {std::string("a\0b", 3), "only letters, digits"},
      {"caf\xc3\xa9.json", "only letters, digits"},
      {"a b", "only letters, digits"},
  };
  for (const Case& c : bad) {
    Status s = CheckSideFileName(c.name);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(s.message().find(c.why), std::string::npos) << s.message();
    for (char ch : s.message()) EXPECT_TRUE(ch >= 0x20 && ch < 0x7f) << "unescaped byte in: " << s.message();
  }
}

}  // namespace
}  // namespace ckpt
