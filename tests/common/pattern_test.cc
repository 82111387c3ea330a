// Pattern (src/common/pattern.h) against std::regex (ECMAScript) as the reference: the
// same matches and groups for the plan patterns people write and for random ones.
#include "common/pattern.h"

#include <gtest/gtest.h>

#include <random>
#include <regex>

namespace ckpt {
namespace {

const std::vector<std::string> kNames = {
    "transformer.wte.weight", "transformer.h.0.attn.attention.q_proj.weight",
    "transformer.h.11.attn.attention.out_proj.bias", "transformer.h.3.mlp.c_fc.weight", "lm_head.weight",
    "model.layers.31.self_attn.o_proj.weight", "model.embed_tokens.weight", "h.0.attn.c_attn.weight",
    "h.0.attn.c_attn.bias", "model.layers.0.mlp.gate_proj.weight", "ln_f.weight", "", "a", "qkv",
    "x.y_z-9", "transformer.h.0.self_attention.query_key_value.weight", "decoder.layers.7.fc1.bias",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab", "wte.weight.wte", "_._", "Q.K.V"};

void ExpectSame(const std::string& pattern) {
  SCOPED_TRACE("pattern /" + pattern + "/");
  std::regex reference;
  bool reference_ok = true;
  try {
    reference = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error&) {
    reference_ok = false;
  }
  auto compiled = Pattern::Compile(pattern);
  if (!reference_ok) {
    EXPECT_FALSE(compiled.ok()) << "std::regex refuses it";
    return;
  }
  if (!compiled.ok()) {
    // Only the documented unsupported constructs may be refused.
    const std::string why = compiled.status().message();
    EXPECT_TRUE(why.find("not supported") != std::string::npos || why.find("unsupported") != std::string::npos ||
                why.find("nothing to repeat") != std::string::npos)  // std::regex accepts a** (ECMAScript does not)
        << compiled.status().ToString();
    return;
  }
  EXPECT_EQ(compiled->groups(), reference.mark_count());
  for (const std::string& name : kNames) {
    std::smatch m;
    const bool want = std::regex_search(name, m, reference);
    auto found = compiled->Search(name);
    ASSERT_TRUE(found.ok()) << found.status().ToString();
    std::vector<std::string> got = *found;
    ASSERT_EQ(!got.empty(), want) << "name '" << name << "'";
    if (!want) continue;
    ASSERT_EQ(got.size(), m.size());
    for (size_t g = 0; g < m.size(); ++g) EXPECT_EQ(got[g], m[g].str()) << "name '" << name << "' group " << g;
    for (const char* format : {"$1qkv_proj.$3", "$&!", "$$1", "pre$2$1post", "$9$"})
      EXPECT_EQ(Pattern::Expand(format, got), m.format(format)) << "format " << format;
  }
}

TEST(PatternTest, PlanPatternsMatchLikeStdRegex) {
  for (const char* p : {
           R"(attn\.attention\.[qkv]_proj\.weight$)", R"(attn\.attention\.out_proj\.weight$)",
           R"(mlp\.c_fc\.(weight|bias)$)", R"((^|\.)wte\.weight$)", R"(^lm_head\.weight$)",
           R"(^(.*\.)(q|k|v)_proj\.(weight|bias)$)", R"(^(.*)\.attn\.c_attn\.weight$)", R"(self_attn\.[qkv]_proj)",
           R"(layers\.\d+\.mlp\.(gate|up)_proj\.weight$)", R"(\.h\.[0-9]{1,2}\.)", R"(^model\.layers\.(\d+)\.)",
           R"(weight$)", R"(^$)", R"(.*)", R"(a*?b)", R"((a|ab)(c|bcd)?)", R"([^.]+$)", R"(\bh\b)", R"(\Bte)",
           R"((?:self_)?attn)", R"([\w-]+\.\d)", R"(x{2,})", R"(a{0,3}b)", R"(([a-z]+)\.\1)", R"((?=wte))", R"([z-a])",
           R"(a**)", R"(()", R"([abc)", R"(\)", R"(a{2,1})", R"({)", R"(a{)", R"(x{1,2}?)", R"(\.)", R"([\.\-_])",
           R"((((a))))", R"((a)|(b))", R"(^(?:(a)|b)+$)", R"([])", R"([^])", R"(\s|\S)"}) {
    ExpectSame(p);
  }
}

TEST(PatternTest, ExpandTakesTwoDigitsOnlyForAGroupThatExists) {
  const std::vector<std::string> groups = {"all", "g1", "g2", "", "", "", "", "", "", "", "", "g11"};
  EXPECT_EQ(Pattern::Expand("$11|$1|$10|$2x|$$|$&|$", groups), "g11|g1||g2x|$|all|$");
  EXPECT_EQ(Pattern::Expand("$1$12", {"m", "a"}), "aa2");
}

TEST(PatternTest, RandomPatternsMatchLikeStdRegex) {
  std::mt19937 rng(7);
  const std::vector<std::string> atoms = {"a", "b", ".", "\\.", "\\d", "\\w", "[a-c]", "[^.]", "_", "h", "0",
                                          "(a|b)", "(?:ab)", "(\\d+)", "t", "e", "w"};
  const std::vector<std::string> quants = {"", "", "", "*", "+", "?", "{1,2}", "*?", "+?", "{2}"};
  for (int i = 0; i < 3000; ++i) {
    std::string p;
    if (rng() % 4 == 0) p += "^";
    const int n = 1 + rng() % 5;
    for (int k = 0; k < n; ++k) {
      p += atoms[rng() % atoms.size()];
      p += quants[rng() % quants.size()];
      if (rng() % 9 == 0) p += "|";
    }
    if (rng() % 4 == 0) p += "$";
    ExpectSame(p);
    if (::testing::Test::HasFailure()) break;
  }
}

TEST(PatternTest, PathologicalPatternsAndLongNamesAreErrorsNotSilentMisses) {
  auto p = Pattern::Compile("(a*)*(a*)*(a*)*b");
  ASSERT_TRUE(p.ok());
  auto slow = p->Search(std::string(40, 'a'));
  ASSERT_FALSE(slow.ok());
  EXPECT_NE(slow.status().message().find("backtracking steps"), std::string::npos) << slow.status().ToString();
  auto dot = Pattern::Compile("^(.*)\\.weight$");
  ASSERT_TRUE(dot.ok());
  // The longest name the segment format allows matches (deep recursion, no crash)...
  auto longest = dot->Search(std::string(Pattern::kMaxSubject - 7, 'x') + ".weight");
  ASSERT_TRUE(longest.ok()) << longest.status().ToString();
  EXPECT_EQ((*longest)[1].size(), Pattern::kMaxSubject - 7);
  // ...and a longer one is refused.
  EXPECT_FALSE(dot->Search(std::string(Pattern::kMaxSubject + 1, 'x')).ok());
  EXPECT_FALSE(Pattern::Compile("a{1001}").ok());
  auto bad = Pattern::Compile("(a");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("missing ')'"), std::string::npos) << bad.status().ToString();
}

}  // namespace
}  // namespace ckpt
