// Regex (src/common/regex.h, PCRE2) against Python's `re` as the reference: the same
// matches, groups and $n expansions for the plan patterns people write and for random
// ones. The expectations come from running Python (/usr/bin/python3, else python3) on the
// same patterns and names, so the reference is the real `re`, not a transcription of it.
#include "common/regex.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

namespace ckpt {
namespace {

const std::vector<std::string> kNames = {
    "transformer.wte.weight", "transformer.h.0.attn.attention.q_proj.weight",
    "transformer.h.11.attn.attention.out_proj.bias", "transformer.h.3.mlp.c_fc.weight", "lm_head.weight",
    "model.layers.31.self_attn.o_proj.weight", "model.embed_tokens.weight", "h.0.attn.c_attn.weight",
    "h.0.attn.c_attn.bias", "model.layers.0.mlp.gate_proj.weight", "ln_f.weight", "", "a", "qkv",
    "x.y_z-9", "transformer.h.0.self_attention.query_key_value.weight", "decoder.layers.7.fc1.bias",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab", "wte.weight.wte", "_._", "Q.K.V",
    "model.layers.1.block_sparse_moe.experts.7.w3.weight", "model.layers.2.mlp.experts.gate_up_proj",
    "gpt_neox.layers.0.mlp.dense_h_to_4h.bias", "model.layers.0.self_attn.sinks"};

const std::vector<std::string> kTemplates = {"$1qkv_proj.$3", "$0!", "$$1", "pre$2$1post", "${1}x", "$1mlp.experts.gate_up_proj"};

// Python's verdict on each (pattern, name): null if the pattern does not compile, else per
// name null (no match) or {"groups": [...], "subs": [...]} (None groups as "").
nlohmann::json PythonReference(const std::vector<std::string>& patterns) {
  // Names unique to this process and call: ctest runs the test cases in parallel.
  static int calls = 0;
  const std::string dir = ::testing::TempDir() + "/regex_ref_" + std::to_string(::getpid()) + "_" + std::to_string(++calls);
  const std::string in = dir + ".in.json", out = dir + ".out.json", script = dir + ".py";
  {
    std::ofstream f(in);
    f << nlohmann::json{{"patterns", patterns}, {"names", kNames}, {"templates", kTemplates}}.dump();
  }
  {
    std::ofstream f(script);
    f << R"PY(import json, re, sys
spec = json.load(open(sys.argv[1]))
def py_template(t):  # $n / ${n} / $$ -> re's \g<n> syntax
    out, i = '', 0
    while i < len(t):
        if t[i] == '$' and i + 1 < len(t) and t[i + 1] == '$': out += '$'; i += 2; continue
        if t[i] == '$' and i + 1 < len(t) and t[i + 1] == '{':
            j = t.index('}', i); out += '\\g<' + t[i + 2:j] + '>'; i = j + 1; continue
        if t[i] == '$':
            j = i + 1
            while j < len(t) and t[j].isdigit(): j += 1
            out += '\\g<' + t[i + 1:j] + '>'; i = j; continue
        out += t[i].replace('\\', '\\\\'); i += 1
    return out
result = []
for p in spec['patterns']:
    try:
        rx = re.compile(p)
    except re.error:
        result.append(None); continue
    per = []
    for n in spec['names']:
        m = rx.search(n)
        if not m: per.append(None); continue
        groups = [m.group(0)] + [g if g is not None else '' for g in m.groups()]
        subs = []
        for t in spec['templates']:
            try: subs.append(m.expand(py_template(t)))
            except (re.error, IndexError): subs.append(None)
        per.append({'groups': groups, 'subs': subs})
    result.append(per)
json.dump(result, open(sys.argv[2], 'w'))
)PY";
  }
  const char* python = std::ifstream("/usr/bin/python3").good() ? "/usr/bin/python3" : "python3";
  const std::string cmd = std::string(python) + " " + script + " " + in + " " + out;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  std::remove(in.c_str());
  std::remove(out.c_str());
  std::remove(script.c_str());
  return nlohmann::json::parse(ss.str());
}

void ExpectSameAsPython(const std::vector<std::string>& patterns) {
  const nlohmann::json ref = PythonReference(patterns);
  ASSERT_EQ(ref.size(), patterns.size());
  for (size_t i = 0; i < patterns.size(); ++i) {
    const std::string& pattern = patterns[i];
    SCOPED_TRACE("pattern /" + pattern + "/");
    auto compiled = Regex::Compile(pattern);
    if (ref[i].is_null()) {
      // Python refuses it. PCRE2 accepts a few things `re` does not (possessive a**?); a
      // plan pattern that Python refuses must at least not silently match differently,
      // so only the documented extensions may compile.
      if (compiled.ok()) {
        EXPECT_TRUE(pattern.find("**") != std::string::npos || pattern.find("+*") != std::string::npos ||
                    pattern.find("{,") != std::string::npos || pattern.find("(?") != std::string::npos)
            << "PCRE2 accepts what Python's re refuses";
      }
      continue;
    }
    ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
    for (size_t k = 0; k < kNames.size(); ++k) {
      const std::string& name = kNames[k];
      auto found = compiled->Search(name);
      ASSERT_TRUE(found.ok()) << found.status().ToString();
      const nlohmann::json& want = ref[i][k];
      ASSERT_EQ(!found->empty(), !want.is_null()) << "name '" << name << "'";
      if (want.is_null()) continue;
      const auto groups = want["groups"].get<std::vector<std::string>>();
      EXPECT_EQ(*found, groups) << "name '" << name << "'";
      for (size_t t = 0; t < kTemplates.size(); ++t) {
        auto sub = compiled->Substitute(name, kTemplates[t]);
        if (want["subs"][t].is_null()) {
          EXPECT_FALSE(sub.ok()) << "template " << kTemplates[t] << " on '" << name << "'";
        } else {
          ASSERT_TRUE(sub.ok()) << sub.status().ToString();
          EXPECT_EQ(*sub, want["subs"][t].get<std::string>()) << "template " << kTemplates[t] << " on '" << name << "'";
        }
      }
    }
  }
}

TEST(RegexTest, PlanPatternsMatchLikePythonRe) {
  ExpectSameAsPython({
      R"(attn\.attention\.[qkv]_proj\.weight$)", R"(attn\.attention\.out_proj\.weight$)",
      R"(mlp\.c_fc\.(weight|bias)$)", R"((^|\.)wte\.weight$)", R"(^lm_head\.weight$)",
      R"(^(.*\.)(q|k|v)_proj\.(weight|bias)$)", R"(^(.*)\.attn\.c_attn\.weight$)", R"(self_attn\.[qkv]_proj)",
      R"(layers\.\d+\.mlp\.(gate|up)_proj\.weight$)", R"(\.h\.[0-9]{1,2}\.)", R"(^model\.layers\.(\d+)\.)",
      R"(^(model\.layers\.\d+\.)block_sparse_moe\.experts\.(\d+)\.(w1|w3)\.weight$)",
      R"(^(model\.layers\.\d+\.mlp\.(?:shared_experts?\.)?)(gate|up)_proj\.(weight|bias)$)",
      R"(^model\.layers\.\d+\.mlp\.experts\.gate_up_proj$)", R"(^gpt_neox\.layers\.\d+\.mlp\.dense_h_to_4h\.[^.]+$)",
      R"(weight$)", R"(^$)", R"(.*)", R"(a*?b)", R"((a|ab)(c|bcd)?)", R"([^.]+$)", R"(\bh\b)", R"(\Bte)",
      R"((?:self_)?attn)", R"([\w-]+\.\d)", R"(x{2,})", R"(a{0,3}b)", R"(([a-z]+)\.\1)", R"((?=wte))", R"([z-a])",
      R"(()", R"([abc)", R"(\)", R"(a{2,1})", R"(x{1,2}?)", R"(\.)", R"([\.\-_])", R"((((a))))", R"((a)|(b))",
      R"(^(?:(a)|b)+$)", R"(\s|\S)", R"((?<=layers\.)\d+)", R"((?!lm_)\w+_head)", R"(^(?P<layer>\d+))"});
}

TEST(RegexTest, RandomPatternsMatchLikePythonRe) {
  std::mt19937 rng(7);
  const std::vector<std::string> atoms = {"a", "b", ".", "\\.", "\\d", "\\w", "[a-c]", "[^.]", "_", "h", "0",
                                          "(a|b)", "(?:ab)", "(\\d+)", "t", "e", "w", "(w[0-9])"};
  const std::vector<std::string> quants = {"", "", "", "*", "+", "?", "{1,2}", "*?", "+?", "{2}"};
  std::vector<std::string> patterns;
  for (int i = 0; i < 1500; ++i) {
    std::string p;
    if (rng() % 4 == 0) p += "^";
    const int n = 1 + rng() % 5;
    for (int k = 0; k < n; ++k) {
      p += atoms[rng() % atoms.size()];
      p += quants[rng() % quants.size()];
      if (rng() % 9 == 0) p += "|";
    }
    if (rng() % 4 == 0) p += "$";
    patterns.push_back(p);
  }
  ExpectSameAsPython(patterns);
}

TEST(RegexTest, PathologicalPatternsAndLongNamesAreErrorsNotSilentMisses) {
  auto p = Regex::Compile("^(\\w+\\s?)*$");
  ASSERT_TRUE(p.ok());
  auto slow = p->Search(std::string(40, 'a') + "!");
  ASSERT_FALSE(slow.ok());
  EXPECT_NE(slow.status().message().find("steps"), std::string::npos) << slow.status().ToString();
  auto dot = Regex::Compile("^(.*)\\.weight$");
  ASSERT_TRUE(dot.ok());
  auto longest = dot->Search(std::string(Regex::kMaxSubject - 7, 'x') + ".weight");
  ASSERT_TRUE(longest.ok()) << longest.status().ToString();
  EXPECT_EQ((*longest)[1].size(), Regex::kMaxSubject - 7);
  EXPECT_FALSE(dot->Search(std::string(Regex::kMaxSubject + 1, 'x')).ok());
  auto bad = Regex::Compile("(a");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("offset 2"), std::string::npos) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("(a"), std::string::npos) << bad.status().ToString();
}

TEST(RegexTest, TemplatesAreCheckedForGroupReferences) {
  EXPECT_EQ(*Regex::MaxGroupReferenced("$1qkv.$3"), 3u);
  EXPECT_EQ(*Regex::MaxGroupReferenced("${12}$$"), 12u);
  EXPECT_EQ(*Regex::MaxGroupReferenced("plain"), 0u);
  EXPECT_FALSE(Regex::MaxGroupReferenced("a$").ok());
  EXPECT_FALSE(Regex::MaxGroupReferenced("$x").ok());
  EXPECT_FALSE(Regex::MaxGroupReferenced("${1").ok());
  auto r = Regex::Compile("^(a)(b)?$");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r->Substitute("a", "[$1|$2]"), "[a|]");  // an unset group expands to ""
  EXPECT_FALSE(r->Substitute("zz", "$1").ok());        // no match: an error, not ""
  EXPECT_FALSE(r->Substitute("a", "$7").ok());         // no such group
}

}  // namespace
}  // namespace ckpt
