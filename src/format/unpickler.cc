#include "format/unpickler.h"

#include <cstring>
#include <limits>
#include <unordered_map>
#include <unordered_set>

namespace ckpt::format {
namespace {

struct StorageRow {
  const char* name;
  DType dtype;
};
constexpr StorageRow kStorages[] = {
    {"DoubleStorage", DType::kF64},        {"FloatStorage", DType::kF32},
    {"HalfStorage", DType::kF16},          {"BFloat16Storage", DType::kBF16},
    {"LongStorage", DType::kI64},          {"IntStorage", DType::kI32},
    {"ShortStorage", DType::kI16},         {"CharStorage", DType::kI8},
    {"ByteStorage", DType::kU8},           {"BoolStorage", DType::kBool},
    {"ComplexFloatStorage", DType::kC64},  {"ComplexDoubleStorage", DType::kC128},
    {"UInt16Storage", DType::kU16},        {"UInt32Storage", DType::kU32},
    {"UInt64Storage", DType::kU64},        {"Float8_e5m2Storage", DType::kF8E5M2},
    {"Float8_e4m3fnStorage", DType::kF8E4M3}, {"Float8_e8m0fnuStorage", DType::kF8E8M0},
};
// torch.<dtype> globals (met in some pickles as plain values, never called).
constexpr StorageRow kDtypes[] = {
    {"float64", DType::kF64}, {"double", DType::kF64},   {"float32", DType::kF32},
    {"float", DType::kF32},   {"float16", DType::kF16},  {"half", DType::kF16},
    {"bfloat16", DType::kBF16}, {"int64", DType::kI64},  {"long", DType::kI64},
    {"int32", DType::kI32},   {"int", DType::kI32},      {"int16", DType::kI16},
    {"short", DType::kI16},   {"int8", DType::kI8},      {"uint8", DType::kU8},
    {"bool", DType::kBool},   {"complex64", DType::kC64}, {"cfloat", DType::kC64},
    {"complex128", DType::kC128}, {"cdouble", DType::kC128}, {"uint16", DType::kU16},
    {"uint32", DType::kU32},  {"uint64", DType::kU64},   {"float8_e5m2", DType::kF8E5M2},
    {"float8_e4m3fn", DType::kF8E4M3}, {"float8_e8m0fnu", DType::kF8E8M0},
};

enum class Kind : uint8_t { kNone, kBool, kInt, kFloat, kStr, kBytes, kTuple, kList, kDict, kGlobal, kStorage, kTensor };

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kStr: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kTuple: return "tuple";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kGlobal: return "global";
    case Kind::kStorage: return "storage";
    case Kind::kTensor: return "tensor";
  }
  return "?";
}

enum class Global : uint8_t {
  kOrderedDict, kRebuildTensorV2, kRebuildTensor, kRebuildParameter, kRebuildParameterWithState,
  kStorageType, kDtype,
};

// 16 bytes: the payload is an index into one of the side tables, or the scalar itself.
struct Value {
  Kind kind = Kind::kNone;
  uint8_t global = 0;  // Global, for kGlobal
  uint32_t ref = 0;    // strings_ / items_ / storages_ / tensors_ index, or a DType
  int64_t i = 0;       // int, bool, float bits
};

struct Storage {
  std::string key;
  DType dtype;
  uint64_t numel;
};

class Machine {
 public:
  Machine(std::string_view data, const UnpicklerLimits& limits) : p_(data), limits_(limits) {}

  Result<std::vector<PickledTensor>> Run();

 private:
  Status Step(uint8_t op, bool* stop);
  Status Fail(const std::string& what) const {
    return Corrupt("pickle at byte " + std::to_string(op_pos_) + ": " + what);
  }
  Status Read(size_t n, const char** out) {
    if (p_.size() - pos_ < n) return Corrupt("pickle is truncated at byte " + std::to_string(pos_));
    *out = p_.data() + pos_;
    pos_ += n;
    return Status::Ok();
  }
  Status ReadUint(size_t n, uint64_t* v) {
    const char* b = nullptr;
    CKPT_RETURN_IF_ERROR(Read(n, &b));
    *v = 0;
    for (size_t k = n; k-- > 0;) *v = (*v << 8) | static_cast<unsigned char>(b[k]);
    return Status::Ok();
  }
  Status ReadLine(std::string* out) {
    size_t nl = p_.find('\n', pos_);
    if (nl == std::string_view::npos) return Corrupt("pickle is truncated in a GLOBAL");
    if (nl - pos_ > 256) return Fail("GLOBAL name too long");
    out->assign(p_.substr(pos_, nl - pos_));
    pos_ = nl + 1;
    return Status::Ok();
  }

  Result<uint32_t> New(Value v) {
    if (values_.size() >= limits_.max_values) return ResourceExhausted("pickle creates more than " + std::to_string(limits_.max_values) + " objects");
    values_.push_back(v);
    return static_cast<uint32_t>(values_.size() - 1);
  }
  Status Push(uint32_t v) {
    if (stack_.size() + marks_.size() >= limits_.max_stack) return ResourceExhausted("pickle stack exceeds the limit");
    stack_.push_back(v);
    return Status::Ok();
  }
  Status PushNew(Value v) {
    CKPT_ASSIGN_OR_RETURN(uint32_t id, New(v));
    return Push(id);
  }
  Status Pop(uint32_t* v) {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) return Fail("stack underflow");
    *v = stack_.back();
    stack_.pop_back();
    return Status::Ok();
  }
  Status PopMark(std::vector<uint32_t>* items) {
    if (marks_.empty()) return Fail("no MARK on the stack");
    const size_t m = marks_.back();
    marks_.pop_back();
    items->assign(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return Status::Ok();
  }
  Status PushString(Kind kind, uint64_t len) {
    if (len > limits_.max_string_bytes) return ResourceExhausted("pickle string of " + std::to_string(len) + " bytes exceeds the limit");
    total_string_bytes_ += len;
    if (total_string_bytes_ > limits_.max_total_string_bytes) return ResourceExhausted("pickle strings exceed the limit");
    const char* b = nullptr;
    CKPT_RETURN_IF_ERROR(Read(len, &b));
    strings_.emplace_back(b, len);
    Value v;
    v.kind = kind;
    v.ref = static_cast<uint32_t>(strings_.size() - 1);
    return PushNew(v);
  }
  // Counts `n` more elements put into containers against the limit.
  Status AddItems(uint64_t n) {
    total_items_ += n;
    if (total_items_ > limits_.max_items) return ResourceExhausted("pickle containers hold more than " + std::to_string(limits_.max_items) + " elements");
    return Status::Ok();
  }
  Status PushContainer(Kind kind, std::vector<uint32_t> items) {
    CKPT_RETURN_IF_ERROR(AddItems(items.size()));
    items_.push_back(std::move(items));
    Value v;
    v.kind = kind;
    v.ref = static_cast<uint32_t>(items_.size() - 1);
    return PushNew(v);
  }
  Status Memo(uint64_t index) {
    if (stack_.empty()) return Fail("memoize with an empty stack");
    if (index >= limits_.max_memo) return ResourceExhausted("pickle memo index exceeds the limit");
    memo_[index] = stack_.back();
    if (memo_.size() > limits_.max_memo) return ResourceExhausted("pickle memo exceeds the limit");
    return Status::Ok();
  }
  Status Get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) return Fail("memo key " + std::to_string(index) + " was never stored");
    return Push(it->second);
  }
  const std::string& Str(uint32_t v) const { return strings_[values_[v].ref]; }
  Status GetInt(uint32_t v, const char* what, int64_t* out) const {
    if (values_[v].kind != Kind::kInt) return Fail(std::string(what) + " is a " + KindName(values_[v].kind) + ", not an int");
    *out = values_[v].i;
    return Status::Ok();
  }
  Status GetIntTuple(uint32_t v, const char* what, std::vector<int64_t>* out) const {
    const Value& val = values_[v];
    if (val.kind != Kind::kTuple && val.kind != Kind::kList) return Fail(std::string(what) + " is not a tuple");
    const auto& its = items_[val.ref];
    if (its.size() > limits_.max_dims) {
      return Unsupported("tensor with " + std::to_string(its.size()) + " dimensions, at most " + std::to_string(limits_.max_dims) + " supported");
    }
    out->clear();
    for (uint32_t x : its) {
      int64_t n;
      CKPT_RETURN_IF_ERROR(GetInt(x, what, &n));
      out->push_back(n);
    }
    return Status::Ok();
  }
  Status ResolveGlobal(const std::string& module, const std::string& name);
  Status Reduce();
  Status PersistentLoad();
  Status SetItems(uint32_t dict, const std::vector<uint32_t>& kv);

  std::string_view p_;
  size_t pos_ = 0, op_pos_ = 0;
  UnpicklerLimits limits_;
  std::vector<Value> values_;
  std::vector<std::string> strings_;
  std::vector<std::vector<uint32_t>> items_;
  std::vector<Storage> storages_;
  std::vector<PickledTensor> tensors_;
  std::unordered_map<std::string, uint32_t> storage_by_key_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, uint32_t> memo_;
  uint64_t total_string_bytes_ = 0;
  uint64_t total_items_ = 0;
};

Status Machine::ResolveGlobal(const std::string& module, const std::string& name) {
  Value v;
  v.kind = Kind::kGlobal;
  const std::string full = module + "." + name;
  if (full == "collections.OrderedDict") {
    v.global = static_cast<uint8_t>(Global::kOrderedDict);
  } else if (full == "torch._utils._rebuild_tensor_v2") {
    v.global = static_cast<uint8_t>(Global::kRebuildTensorV2);
  } else if (full == "torch._utils._rebuild_tensor") {
    v.global = static_cast<uint8_t>(Global::kRebuildTensor);
  } else if (full == "torch._utils._rebuild_parameter") {
    v.global = static_cast<uint8_t>(Global::kRebuildParameter);
  } else if (full == "torch._utils._rebuild_parameter_with_state") {
    v.global = static_cast<uint8_t>(Global::kRebuildParameterWithState);
  } else if (module == "torch" && DTypeFromTorchStorage(name)) {
    v.global = static_cast<uint8_t>(Global::kStorageType);
    v.ref = static_cast<uint32_t>(*DTypeFromTorchStorage(name));
  } else {
    bool found = false;
    if (module == "torch") {
      for (const auto& row : kDtypes) {
        if (name == row.name) {
          v.global = static_cast<uint8_t>(Global::kDtype);
          v.ref = static_cast<uint32_t>(row.dtype);
          found = true;
        }
      }
    }
    static const char* const kNoDtype[] = {"ComplexHalfStorage", "QInt8Storage", "QUInt8Storage", "QInt32Storage",
                                           "QUInt4x2Storage", "QUInt2x4Storage"};
    for (const char* s : kNoDtype) {
      if (!found && module == "torch" && name == s) {
        return Unsupported("tensors stored as torch." + name + " are not supported (no matching checkpoint dtype)");
      }
    }
    if (!found) {
      std::string shown = full.size() > 120 ? full.substr(0, 120) + "..." : full;
      for (char& c : shown) {
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
      }
      return Unsupported("pickle refers to the global '" + shown +
                         "', which is not allowed (only the globals of a PyTorch state dict are)");
    }
  }
  return PushNew(v);
}

Status Machine::PersistentLoad() {
  uint32_t pid = 0;
  CKPT_RETURN_IF_ERROR(Pop(&pid));
  const Value& t = values_[pid];
  if (t.kind != Kind::kTuple) return Unsupported("pickle has a persistent id that is a " + std::string(KindName(t.kind)) + ", not a storage tuple");
  const auto& f = items_[t.ref];
  if (f.size() != 5 || values_[f[0]].kind != Kind::kStr || Str(f[0]) != "storage") {
    return Unsupported("pickle has a persistent id that is not ('storage', type, key, location, numel)");
  }
  const Value& type = values_[f[1]];
  if (type.kind != Kind::kGlobal || type.global != static_cast<uint8_t>(Global::kStorageType)) {
    return Unsupported("persistent storage id whose type is not a torch storage type");
  }
  if (values_[f[2]].kind != Kind::kStr) return Fail("storage key is not a string");
  if (values_[f[3]].kind != Kind::kStr) return Fail("storage location is not a string");
  int64_t numel;
  CKPT_RETURN_IF_ERROR(GetInt(f[4], "storage numel", &numel));
  if (numel < 0) return Fail("negative storage size");
  const std::string& key = Str(f[2]);
  if (key.empty() || key.size() > 256 || key.find('/') != std::string::npos || key.find('\0') != std::string::npos) {
    return Fail("bad storage key");
  }
  const DType dtype = static_cast<DType>(type.ref);
  uint32_t index;
  auto it = storage_by_key_.find(key);
  if (it != storage_by_key_.end()) {
    index = it->second;
    if (storages_[index].dtype != dtype || storages_[index].numel != static_cast<uint64_t>(numel)) {
      return Unsupported("storage '" + key + "' is used with two different types or sizes");
    }
  } else {
    storages_.push_back({key, dtype, static_cast<uint64_t>(numel)});
    index = static_cast<uint32_t>(storages_.size() - 1);
    storage_by_key_.emplace(key, index);
  }
  Value v;
  v.kind = Kind::kStorage;
  v.ref = index;
  return PushNew(v);
}

Status Machine::Reduce() {
  uint32_t args_id = 0, fn_id = 0;
  CKPT_RETURN_IF_ERROR(Pop(&args_id));
  CKPT_RETURN_IF_ERROR(Pop(&fn_id));
  const Value fn = values_[fn_id];
  const Value args_v = values_[args_id];
  if (args_v.kind != Kind::kTuple) return Fail("REDUCE arguments are not a tuple");
  if (fn.kind != Kind::kGlobal) return Unsupported(std::string("pickle calls a ") + KindName(fn.kind) + ", which is not allowed");
  const std::vector<uint32_t> args = items_[args_v.ref];
  switch (static_cast<Global>(fn.global)) {
    case Global::kOrderedDict:
      if (!args.empty()) return Unsupported("OrderedDict called with arguments");
      return PushContainer(Kind::kDict, {});
    case Global::kRebuildTensorV2:
    case Global::kRebuildTensor: {
      const bool v2 = static_cast<Global>(fn.global) == Global::kRebuildTensorV2;
      if (v2 ? (args.size() < 6 || args.size() > 7) : args.size() != 4) return Fail("tensor rebuilt with the wrong number of arguments");
      if (values_[args[0]].kind != Kind::kStorage) return Fail("tensor rebuilt from something that is not a storage");
      const Storage& s = storages_[values_[args[0]].ref];
      PickledTensor t;
      t.storage_key = s.key;
      t.dtype = s.dtype;
      t.storage_numel = s.numel;
      int64_t offset;
      CKPT_RETURN_IF_ERROR(GetInt(args[1], "storage offset", &offset));
      CKPT_RETURN_IF_ERROR(GetIntTuple(args[2], "tensor size", &t.shape));
      CKPT_RETURN_IF_ERROR(GetIntTuple(args[3], "tensor stride", &t.strides));
      if (offset < 0) return Fail("negative storage offset");
      if (t.shape.size() != t.strides.size()) return Fail("tensor size and stride differ in length");
      t.storage_offset = static_cast<uint64_t>(offset);
      if (v2 && values_[args[4]].kind != Kind::kBool) return Fail("requires_grad is not a bool");
      tensors_.push_back(std::move(t));
      Value v;
      v.kind = Kind::kTensor;
      v.ref = static_cast<uint32_t>(tensors_.size() - 1);
      return PushNew(v);
    }
    case Global::kRebuildParameter:
    case Global::kRebuildParameterWithState:
      if (args.size() < 3 || args.size() > 4 || values_[args[0]].kind != Kind::kTensor) {
        return Fail("parameter rebuilt from something that is not a tensor");
      }
      return Push(args[0]);
    case Global::kStorageType:
    case Global::kDtype:
      break;
  }
  return Unsupported("pickle calls a torch type or dtype, which is not allowed");
}

Status Machine::SetItems(uint32_t dict, const std::vector<uint32_t>& kv) {
  if (values_[dict].kind != Kind::kDict) return Fail("SETITEM on a " + std::string(KindName(values_[dict].kind)));
  if (kv.size() % 2 != 0) return Fail("SETITEMS with an odd number of items");
  CKPT_RETURN_IF_ERROR(AddItems(kv.size()));
  auto& its = items_[values_[dict].ref];
  its.insert(its.end(), kv.begin(), kv.end());
  return Status::Ok();
}

Status Machine::Step(uint8_t op, bool* stop) {
  uint64_t n = 0;
  uint32_t a = 0, b = 0;
  std::vector<uint32_t> list;
  switch (op) {
    case 0x80:  // PROTO
      CKPT_RETURN_IF_ERROR(ReadUint(1, &n));
      if (n < 2 || n > 5) return Unsupported("pickle protocol " + std::to_string(n) + " (2 to 5 supported)");
      return Status::Ok();
    case 0x95:  // FRAME: a length hint only
      return ReadUint(8, &n);
    case '.':  // STOP
      *stop = true;
      return Status::Ok();
    case '(':  // MARK
      if (stack_.size() + marks_.size() >= limits_.max_stack) return ResourceExhausted("pickle stack exceeds the limit");
      marks_.push_back(stack_.size());
      return Status::Ok();
    case '0':  // POP
      if (!stack_.empty() && (marks_.empty() || stack_.size() > marks_.back())) return Pop(&a);
      return PopMark(&list);
    case '1':  // POP_MARK
      return PopMark(&list);
    case '2':  // DUP
      if (stack_.empty()) return Fail("DUP on an empty stack");
      return Push(stack_.back());
    case 'N':
      return PushNew({Kind::kNone, 0, 0, 0});
    case 0x88:  // NEWTRUE
      return PushNew({Kind::kBool, 0, 0, 1});
    case 0x89:  // NEWFALSE
      return PushNew({Kind::kBool, 0, 0, 0});
    case 'J':  // BININT
      CKPT_RETURN_IF_ERROR(ReadUint(4, &n));
      return PushNew({Kind::kInt, 0, 0, static_cast<int32_t>(static_cast<uint32_t>(n))});
    case 'K':  // BININT1
      CKPT_RETURN_IF_ERROR(ReadUint(1, &n));
      return PushNew({Kind::kInt, 0, 0, static_cast<int64_t>(n)});
    case 'M':  // BININT2
      CKPT_RETURN_IF_ERROR(ReadUint(2, &n));
      return PushNew({Kind::kInt, 0, 0, static_cast<int64_t>(n)});
    case 0x8a: {  // LONG1: little-endian two's complement, up to 8 bytes here
      CKPT_RETURN_IF_ERROR(ReadUint(1, &n));
      if (n > 8) return Unsupported("pickle integer of " + std::to_string(n) + " bytes (at most 8 supported)");
      uint64_t v = 0;
      CKPT_RETURN_IF_ERROR(ReadUint(n, &v));
      if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
      return PushNew({Kind::kInt, 0, 0, static_cast<int64_t>(v)});
    }
    case 'G': {  // BINFLOAT: big-endian double
      const char* bytes;
      CKPT_RETURN_IF_ERROR(Read(8, &bytes));
      uint64_t bits = 0;
      for (int k = 0; k < 8; ++k) bits = (bits << 8) | static_cast<unsigned char>(bytes[k]);
      return PushNew({Kind::kFloat, 0, 0, static_cast<int64_t>(bits)});
    }
    case 0x8c:  // SHORT_BINUNICODE
      CKPT_RETURN_IF_ERROR(ReadUint(1, &n));
      return PushString(Kind::kStr, n);
    case 'X':  // BINUNICODE
      CKPT_RETURN_IF_ERROR(ReadUint(4, &n));
      return PushString(Kind::kStr, n);
    case 0x8d:  // BINUNICODE8
      CKPT_RETURN_IF_ERROR(ReadUint(8, &n));
      return PushString(Kind::kStr, n);
    case 'C':  // SHORT_BINBYTES
      CKPT_RETURN_IF_ERROR(ReadUint(1, &n));
      return PushString(Kind::kBytes, n);
    case 'B':  // BINBYTES
      CKPT_RETURN_IF_ERROR(ReadUint(4, &n));
      return PushString(Kind::kBytes, n);
    case '}':  // EMPTY_DICT
      return PushContainer(Kind::kDict, {});
    case ']':  // EMPTY_LIST
      return PushContainer(Kind::kList, {});
    case ')':  // EMPTY_TUPLE
      return PushContainer(Kind::kTuple, {});
    case 'd':  // DICT
      CKPT_RETURN_IF_ERROR(PopMark(&list));
      if (list.size() % 2 != 0) return Fail("DICT with an odd number of items");
      return PushContainer(Kind::kDict, std::move(list));
    case 'l':  // LIST
      CKPT_RETURN_IF_ERROR(PopMark(&list));
      return PushContainer(Kind::kList, std::move(list));
    case 't':  // TUPLE
      CKPT_RETURN_IF_ERROR(PopMark(&list));
      return PushContainer(Kind::kTuple, std::move(list));
    case 0x85:  // TUPLE1
    case 0x86:  // TUPLE2
    case 0x87: {  // TUPLE3
      list.resize(op - 0x84);
      for (size_t k = list.size(); k-- > 0;) CKPT_RETURN_IF_ERROR(Pop(&list[k]));
      return PushContainer(Kind::kTuple, std::move(list));
    }
    case 'a':  // APPEND
      CKPT_RETURN_IF_ERROR(Pop(&a));
      CKPT_RETURN_IF_ERROR(Pop(&b));
      if (values_[b].kind != Kind::kList) return Fail("APPEND to a " + std::string(KindName(values_[b].kind)));
      CKPT_RETURN_IF_ERROR(AddItems(1));
      items_[values_[b].ref].push_back(a);
      return Push(b);
    case 'e':  // APPENDS
      CKPT_RETURN_IF_ERROR(PopMark(&list));
      if (stack_.empty()) return Fail("APPENDS without a list");
      b = stack_.back();
      if (values_[b].kind != Kind::kList) return Fail("APPENDS to a " + std::string(KindName(values_[b].kind)));
      CKPT_RETURN_IF_ERROR(AddItems(list.size()));
      items_[values_[b].ref].insert(items_[values_[b].ref].end(), list.begin(), list.end());
      return Status::Ok();
    case 's':  // SETITEM
      list.resize(2);
      CKPT_RETURN_IF_ERROR(Pop(&list[1]));
      CKPT_RETURN_IF_ERROR(Pop(&list[0]));
      if (stack_.empty()) return Fail("SETITEM without a dict");
      return SetItems(stack_.back(), list);
    case 'u':  // SETITEMS
      CKPT_RETURN_IF_ERROR(PopMark(&list));
      if (stack_.empty()) return Fail("SETITEMS without a dict");
      return SetItems(stack_.back(), list);
    case 'q':  // BINPUT
      CKPT_RETURN_IF_ERROR(ReadUint(1, &n));
      return Memo(n);
    case 'r':  // LONG_BINPUT
      CKPT_RETURN_IF_ERROR(ReadUint(4, &n));
      return Memo(n);
    case 0x94:  // MEMOIZE
      return Memo(memo_.size());
    case 'h':  // BINGET
      CKPT_RETURN_IF_ERROR(ReadUint(1, &n));
      return Get(n);
    case 'j':  // LONG_BINGET
      CKPT_RETURN_IF_ERROR(ReadUint(4, &n));
      return Get(n);
    case 'c': {  // GLOBAL module\nname\n
      std::string module, name;
      CKPT_RETURN_IF_ERROR(ReadLine(&module));
      CKPT_RETURN_IF_ERROR(ReadLine(&name));
      return ResolveGlobal(module, name);
    }
    case 0x93:  // STACK_GLOBAL
      CKPT_RETURN_IF_ERROR(Pop(&b));
      CKPT_RETURN_IF_ERROR(Pop(&a));
      if (values_[a].kind != Kind::kStr || values_[b].kind != Kind::kStr) return Fail("STACK_GLOBAL names are not strings");
      return ResolveGlobal(Str(a), Str(b));
    case 'R':  // REDUCE
      return Reduce();
    case 'b': {  // BUILD: state of an OrderedDict (its _metadata) or a tensor; ignored
      CKPT_RETURN_IF_ERROR(Pop(&a));
      if (stack_.empty()) return Fail("BUILD without an object");
      const Kind k = values_[stack_.back()].kind;
      if (k != Kind::kDict && k != Kind::kTensor) return Unsupported(std::string("pickle sets the state of a ") + KindName(k));
      return Status::Ok();
    }
    case 'Q':  // BINPERSID
      return PersistentLoad();
    default: {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02x", op);
      return Unsupported("pickle opcode " + std::string(hex) + " at byte " + std::to_string(op_pos_) +
                         " is not supported in a state dict");
    }
  }
}

Result<std::vector<PickledTensor>> Machine::Run() {
  bool stop = false;
  while (!stop) {
    if (pos_ >= p_.size()) return Corrupt("pickle ends without STOP");
    op_pos_ = pos_;
    const uint8_t op = static_cast<uint8_t>(p_[pos_++]);
    CKPT_RETURN_IF_ERROR(Step(op, &stop));
  }
  if (stack_.size() != 1 || !marks_.empty()) return Corrupt("pickle does not leave exactly one object");
  const Value& root = values_[stack_.back()];
  if (root.kind != Kind::kDict) {
    return Unsupported(std::string("the checkpoint holds a ") + KindName(root.kind) +
                       ", not a state dict (a mapping of names to tensors)");
  }
  const auto& kv = items_[root.ref];
  std::vector<PickledTensor> out;
  std::unordered_set<std::string> names;
  out.reserve(kv.size() / 2);
  for (size_t k = 0; k + 1 < kv.size(); k += 2) {
    const Value& key = values_[kv[k]];
    const Value& val = values_[kv[k + 1]];
    if (key.kind != Kind::kStr) return Unsupported(std::string("the checkpoint's mapping has a ") + KindName(key.kind) + " key; a state dict has string names");
    const std::string& name = Str(kv[k]);
    if (val.kind != Kind::kTensor) {
      return Unsupported("the checkpoint's entry '" + name.substr(0, 200) + "' is a " + KindName(val.kind) +
                         ", not a tensor: only flat state dicts (name -> tensor) are supported" +
                         (val.kind == Kind::kDict ? " (nested dicts such as {'state_dict': ...} are not)" : ""));
    }
    if (!names.insert(name).second) return Corrupt("the state dict names '" + name.substr(0, 200) + "' twice");
    PickledTensor t = tensors_[val.ref];
    t.name = name;
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

std::optional<DType> DTypeFromTorchStorage(const std::string& name) {
  for (const auto& row : kStorages) {
    if (name == row.name) return row.dtype;
  }
  return std::nullopt;
}

Result<std::vector<PickledTensor>> StateDictUnpickler::Parse(std::string_view pickle, const UnpicklerLimits& limits) {
  Machine m(pickle, limits);
  return m.Run();
}

}  // namespace ckpt::format
