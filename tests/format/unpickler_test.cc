#include "format/unpickler.h"

#include <gtest/gtest.h>

namespace ckpt::format {
namespace {

using namespace std::string_literals;

std::string Str(const std::string& s) {  // BINUNICODE
  std::string out = "X";
  uint32_t n = static_cast<uint32_t>(s.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + s;
}
std::string Int(uint8_t v) { return std::string("K") + static_cast<char>(v); }

// {name: _rebuild_tensor_v2(storage('0', FloatStorage, numel 6), 0, (2, 3), (3, 1), False, OrderedDict())}
std::string OneTensor(const std::string& name, const std::string& storage_global = "torch\nFloatStorage\n") {
  std::string p = "\x80\x02}";
  p += Str(name);
  p += "ctorch._utils\n_rebuild_tensor_v2\nq\x01";
  p += "((" + Str("storage") + "c" + storage_global + Str("0") + Str("cpu") + Int(6) + "tQ";
  p += Int(0) + Int(2) + Int(3) + "\x86" + Int(3) + Int(1) + "\x86";
  p += "\x89" "ccollections\nOrderedDict\n)R";
  p += "tRs.";
  return p;
}

TEST(UnpicklerTest, ParsesAHandWrittenStateDict) {
  auto r = StateDictUnpickler::Parse(OneTensor("w"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 1u);
  const PickledTensor& t = (*r)[0];
  EXPECT_EQ(t.name, "w");
  EXPECT_EQ(t.storage_key, "0");
  EXPECT_EQ(t.dtype, DType::kF32);
  EXPECT_EQ(t.storage_numel, 6u);
  EXPECT_EQ(t.storage_offset, 0u);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.strides, (std::vector<int64_t>{3, 1}));
}

TEST(UnpicklerTest, StorageTypesMapToDTypes) {
  auto r = StateDictUnpickler::Parse(OneTensor("w", "torch\nBFloat16Storage\n"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[0].dtype, DType::kBF16);
  EXPECT_EQ(DTypeFromTorchStorage("ComplexDoubleStorage"), DType::kC128);
  // Storages of newer PyTorch versions (not writable by the 1.13 used in these tests).
  EXPECT_EQ(DTypeFromTorchStorage("Float8_e4m3fnStorage"), DType::kF8E4M3);
  EXPECT_EQ(DTypeFromTorchStorage("Float8_e5m2Storage"), DType::kF8E5M2);
  EXPECT_EQ(DTypeFromTorchStorage("Float8_e8m0fnuStorage"), DType::kF8E8M0);
  EXPECT_EQ(DTypeFromTorchStorage("UInt16Storage"), DType::kU16);
  EXPECT_EQ(DTypeFromTorchStorage("UInt32Storage"), DType::kU32);
  EXPECT_EQ(DTypeFromTorchStorage("UInt64Storage"), DType::kU64);
  EXPECT_EQ(DTypeFromTorchStorage("QInt8Storage"), std::nullopt);
  auto q = StateDictUnpickler::Parse(OneTensor("w", "torch\nQInt8Storage\n"));
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("torch.QInt8Storage are not supported"), std::string::npos) << q.status().message();
}

void ExpectRefused(const std::string& pickle, StatusCode code, const std::string& needle) {
  auto r = StateDictUnpickler::Parse(pickle);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(UnpicklerTest, DisallowedGlobalsAreRefusedByName) {
  ExpectRefused("\x80\x02" "cos\nsystem\nX\x02\x00\x00\x00ls\x85R."s, StatusCode::kUnsupported, "'os.system'");
  ExpectRefused("\x80\x02" "cposix\nsystem\n.", StatusCode::kUnsupported, "'posix.system'");
  // STACK_GLOBAL (protocol 4) goes through the same allow-list.
  ExpectRefused("\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x08" "builtins\x8c\x04" "eval\x93."s,
                StatusCode::kUnsupported, "'builtins.eval'");
  ExpectRefused("\x80\x02" "ctorch\nload\n.", StatusCode::kUnsupported, "'torch.load'");
  // Allowed globals cannot be called unless they are constructors of state-dict parts.
  ExpectRefused("\x80\x02" "ctorch\nFloatStorage\n)R.", StatusCode::kUnsupported, "not allowed");
}

TEST(UnpicklerTest, NotAFlatStateDictSaysWhatItIs) {
  ExpectRefused("\x80\x02]." , StatusCode::kUnsupported, "holds a list");
  ExpectRefused("\x80\x02}" + Str("state_dict") + "}s.", StatusCode::kUnsupported, "nested dicts");
  ExpectRefused("\x80\x02}" + Str("epoch") + Int(3) + "s.", StatusCode::kUnsupported, "'epoch' is a int");
  ExpectRefused("\x80\x02}(" + Str("a") + "}" + Str("b") + "}u.", StatusCode::kUnsupported, "nested");
}

TEST(UnpicklerTest, MalformedPicklesAreCorruptNeverACrash) {
  const std::string good = OneTensor("weight");
  for (size_t cut = 0; cut < good.size(); ++cut) {
    EXPECT_FALSE(StateDictUnpickler::Parse(good.substr(0, cut)).ok()) << cut;
  }
  for (size_t i = 0; i < good.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      (void)StateDictUnpickler::Parse(bad);
    }
  }
  ExpectRefused("\x80\x02h\x05.", StatusCode::kCorrupt, "memo key 5");
  ExpectRefused("\x80\x02s.", StatusCode::kCorrupt, "stack underflow");
  ExpectRefused("\x80\x02}", StatusCode::kCorrupt, "without STOP");
  ExpectRefused("\x80\x02\x8a\x09\x01\x02\x03\x04\x05\x06\x07\x08\x09.", StatusCode::kUnsupported, "9 bytes");
  ExpectRefused("\x80\x02\xff.", StatusCode::kUnsupported, "opcode 0xff");
  ExpectRefused("\x80\x01}.", StatusCode::kUnsupported, "protocol 1");
  ExpectRefused("\x80\x02X\xff\xff\xff\x7f", StatusCode::kResourceExhausted, "string");
}

TEST(UnpicklerTest, HostileSizesHitLimitsNotMemory) {
  UnpicklerLimits small;
  small.max_values = 1000;
  small.max_stack = 1000;
  small.max_memo = 100;
  std::string many = "\x80\x02" + std::string(5000, 'N') + ".";
  auto r = StateDictUnpickler::Parse(many, small);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  std::string marks = "\x80\x02" + std::string(5000, '(') + ".";
  EXPECT_EQ(StateDictUnpickler::Parse(marks, small).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(StateDictUnpickler::Parse("\x80\x02Nr\xff\xff\xff\x7f.", small).status().code(),
            StatusCode::kResourceExhausted);
  // The same memo entry appended again and again creates no objects but fills containers.
  UnpicklerLimits items;
  items.max_items = 5000;
  std::string appends = "\x80\x02]q\x00"s;
  for (int round = 0; round < 10; ++round) {
    appends += "(";
    for (int i = 0; i < 1000; ++i) appends += "h\x00"s;  // BINGET 0
    appends += "e";                                      // APPENDS
  }
  appends += ".";
  EXPECT_EQ(StateDictUnpickler::Parse(appends, items).status().code(), StatusCode::kResourceExhausted);
  // A list that contains itself: no recursion, no hang.
  auto cyc = StateDictUnpickler::Parse("\x80\x02]q\x00h\x00" "a."s);
  EXPECT_EQ(cyc.status().code(), StatusCode::kUnsupported);
  // A deep chain of nested lists is flat in memory and refused as not a state dict.
  std::string deep = "\x80\x02]";
  for (int i = 0; i < 100000; ++i) deep += "]";
  for (int i = 0; i < 100000; ++i) deep += "a";
  deep += ".";
  EXPECT_EQ(StateDictUnpickler::Parse(deep).status().code(), StatusCode::kUnsupported);
}

}  // namespace
}  // namespace ckpt::format
