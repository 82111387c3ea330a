#include "daemon/policy.h"

#include <gtest/gtest.h>

namespace ckpt::daemon {
namespace {

TEST(PolicyTest, NamesBeginWithALetterOrDigit) {
  for (const char* ok : {"gpt", "7b", "Llama-3.1_8B", "a.b-c_d"}) EXPECT_TRUE(ValidateCheckpointName(ok).ok()) << ok;
  for (const char* bad : {"-rf", "--help", "_x", ".x", "-", "", "a/b", "a b"}) {
    Status s = ValidateCheckpointName(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ValidateCheckpointName("-rf").message().find("begin with a letter or digit"), std::string::npos);
  EXPECT_FALSE(ValidateCheckpointName(std::string(101, 'a')).ok());
  // Segments published before the rule keep their names at start-up; nothing else changes.
  EXPECT_TRUE(ValidateAdoptedName("_tmp").ok());
  EXPECT_TRUE(ValidateAdoptedName("-old").ok());
  EXPECT_FALSE(ValidateAdoptedName(".hidden").ok());
  EXPECT_FALSE(ValidateAdoptedName("_a/b").ok());
  // Default names drop what a name may not begin with.
  EXPECT_EQ(DefaultCheckpointName("/m/-rf.safetensors"), "rf");
  EXPECT_EQ(DefaultCheckpointName("/m/__x.bin"), "x");
  EXPECT_EQ(DefaultCheckpointName("/m/---.bin"), "checkpoint");
}

}  // namespace
}  // namespace ckpt::daemon
