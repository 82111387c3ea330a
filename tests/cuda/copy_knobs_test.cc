// The copy engine's knob table (pure host code, runs without a GPU): a set knob is read,
// a value it does not accept is ignored with a note saying so, and an unset one keeps the
// default.
#include "cuda/copy_knobs.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <set>
#include <string>

namespace ckpt::cuda {
namespace {

// A getenv over a map.
auto Env(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(CopyKnobsTest, UnsetKnobsAreTheDefaultsAndNothingIsNoted) {
  std::vector<std::string> notes;
  const CopyKnobs k = ParseCopyKnobs(Env({}), &notes);
  const CopyKnobs d;
  EXPECT_EQ(k.buffers, 2);
  EXPECT_EQ(k.order, TaskMix::kAddress);
  EXPECT_TRUE(k.spans);
  EXPECT_TRUE(k.early);
  EXPECT_FALSE(k.trace);
  EXPECT_EQ(k.buffers, d.buffers);
  EXPECT_TRUE(notes.empty());
  // empty counts as unset
  EXPECT_EQ(ParseCopyKnobs(Env({{"CKPT_COPY_BUFFERS", ""}}), &notes).buffers, 2);
  EXPECT_TRUE(notes.empty());
}

TEST(CopyKnobsTest, EverySetKnobIsReadAndNoted) {
  std::vector<std::string> notes;
  const CopyKnobs k = ParseCopyKnobs(Env({{"CKPT_COPY_BUFFERS", "4"},
                                          {"CKPT_COPY_ORDER", "spread"},
                                          {"CKPT_COPY_SPANS", "0"},
                                          {"CKPT_COPY_EARLY", "0"},
                                          {"CKPT_COPY_TRACE", "1"}}),
                                     &notes);
  EXPECT_EQ(k.buffers, 4);
  EXPECT_EQ(k.order, TaskMix::kSpread);
  EXPECT_FALSE(k.spans);
  EXPECT_FALSE(k.early);
  EXPECT_TRUE(k.trace);
  ASSERT_EQ(notes.size(), 5u);
  EXPECT_EQ(notes[0], R"({"what":"copy_knob","name":"CKPT_COPY_BUFFERS","value":"4","default":"2","used":"4"})");
  EXPECT_EQ(notes[1], R"({"what":"copy_knob","name":"CKPT_COPY_ORDER","value":"spread","default":"address","used":"spread"})");
  EXPECT_EQ(ParseCopyKnobs(Env({{"CKPT_COPY_BUFFERS", "8"}}), nullptr).buffers, kMaxBuffers);
  EXPECT_EQ(ParseCopyKnobs(Env({{"CKPT_COPY_BUFFERS", "1"}}), nullptr).buffers, 1);
}

TEST(CopyKnobsTest, AValueAKnobDoesNotAcceptIsIgnoredAndSaysSo) {
  for (const auto& [name, value] : std::map<std::string, std::string>{{"CKPT_COPY_BUFFERS", "9"},
                                                                      {"CKPT_COPY_ORDER", "random"},
                                                                      {"CKPT_COPY_SPANS", "no"},
                                                                      {"CKPT_COPY_EARLY", "2"},
                                                                      {"CKPT_COPY_TRACE", "yes"}}) {
    std::vector<std::string> notes;
    const CopyKnobs k = ParseCopyKnobs(Env({{name, value}}), &notes);
    const CopyKnobs d;
    EXPECT_EQ(k.buffers, d.buffers) << name;
    EXPECT_EQ(k.order, d.order) << name;
    EXPECT_EQ(k.spans, d.spans) << name;
    EXPECT_EQ(k.early, d.early) << name;
    EXPECT_EQ(k.trace, d.trace) << name;
    ASSERT_EQ(notes.size(), 1u) << name;
    EXPECT_NE(notes[0].find("\"ignored\":\"accepts "), std::string::npos) << notes[0];
    EXPECT_NE(notes[0].find("\"value\":\"" + value + "\""), std::string::npos) << notes[0];
  }
  std::vector<std::string> notes;
  for (const char* bad : {"0", "-1", "2x", " 3x", "99999999999999999999"}) {
    EXPECT_EQ(ParseCopyKnobs(Env({{"CKPT_COPY_BUFFERS", bad}}), &notes).buffers, 2) << bad;
  }
  EXPECT_EQ(notes.back(),
            R"({"what":"copy_knob","name":"CKPT_COPY_BUFFERS","value":"99999999999999999999","default":"2","used":"2","ignored":"accepts 1 to 8"})");
  notes.clear();
  ParseCopyKnobs(Env({{"CKPT_COPY_ORDER", "a\"b\n"}}), &notes);  // quoted: the note stays one JSON line
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find(R"("value":"a\"b\u000a")"), std::string::npos) << notes[0];
}

// The table is the one declaration: every knob once, each with its default, what it
// accepts and a meaning; its default text parses to the struct's default.
TEST(CopyKnobsTest, TheTableDeclaresEachKnobOnceAndItsDefaultIsTheDefault) {
  std::set<std::string> names;
  for (const CopyKnob& knob : CopyKnobTable()) {
    EXPECT_TRUE(names.insert(knob.name).second) << knob.name;
    EXPECT_EQ(std::string(knob.name).rfind("CKPT_COPY_", 0), 0u) << knob.name;
    EXPECT_NE(std::string(knob.meaning), "") << knob.name;
    CopyKnobs k;
    EXPECT_TRUE(knob.apply(knob.default_value, k)) << knob.name;
    const CopyKnobs d;
    EXPECT_TRUE(k.buffers == d.buffers && k.order == d.order && k.spans == d.spans && k.early == d.early &&
                k.trace == d.trace)
        << knob.name;
  }
  EXPECT_EQ(names.size(), 5u);
}

// CurrentCopyKnobs reads the process's environment at every call.
TEST(CopyKnobsTest, CurrentKnobsFollowTheEnvironment) {
  setenv("CKPT_COPY_BUFFERS", "3", 1);
  EXPECT_EQ(CurrentCopyKnobs().buffers, 3);
  setenv("CKPT_COPY_BUFFERS", "5", 1);
  EXPECT_EQ(CurrentCopyKnobs().buffers, 5);
  unsetenv("CKPT_COPY_BUFFERS");
  EXPECT_EQ(CurrentCopyKnobs().buffers, 2);
}

}  // namespace
}  // namespace ckpt::cuda
