// The one "did you mean" (ckptctl, ckptd, the client): edit distance and the choice of suggestions.
#include "common/suggest.h"

#include <gtest/gtest.h>

namespace ckpt {
namespace {

TEST(SuggestTest, EditDistanceCountsSwapsAsOneEdit) {
  EXPECT_EQ(EditDistance("", ""), 0u);
  EXPECT_EQ(EditDistance("list", "list"), 0u);
  EXPECT_EQ(EditDistance("lsit", "list"), 1u);
  EXPECT_EQ(EditDistance("gpt-neox", "gpt-neo"), 1u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
  EXPECT_EQ(EditDistance("", "abc"), 3u);
  EXPECT_EQ(EditDistance("abc", ""), 3u);
}

TEST(SuggestTest, SuggestsCloseNamesNearestFirstAndNothingFar) {
  const std::vector<std::string> commands = {"load", "ensure", "evict", "list", "info", "status", "metrics", "verify"};
  EXPECT_EQ(Suggest("lsit", commands), std::vector<std::string>{"list"});
  EXPECT_EQ(Suggest("evcit", commands), std::vector<std::string>{"evict"});
  EXPECT_EQ(Suggest("ensrue", commands), std::vector<std::string>{"ensure"});
  EXPECT_TRUE(Suggest("frobnicate", commands).empty());
  EXPECT_TRUE(Suggest("list", commands).empty()) << "never the name itself";
  const std::vector<std::string> names = {"gpt-neo", "gpt-neo-2", "llama-7b"};
  EXPECT_EQ(Suggest("gpt-neox", names), (std::vector<std::string>{"gpt-neo", "gpt-neo-2"}));
  EXPECT_EQ(Suggest("llama", names), std::vector<std::string>{"llama-7b"}) << "a prefix";
  EXPECT_EQ(Suggest("a", {"b", "c", "d", "e"}, 2).size(), 2u) << "at most `limit`";
}

TEST(SuggestTest, DidYouMeanListsTheNames) {
  EXPECT_EQ(DidYouMean({}), "");
  EXPECT_EQ(DidYouMean({"a"}), " (did you mean 'a'?)");
  EXPECT_EQ(DidYouMean({"a", "b", "c"}), " (did you mean 'a', 'b' or 'c'?)");
}

}  // namespace
}  // namespace ckpt
