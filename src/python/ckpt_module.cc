// _ckpt: the pybind11 extension under the `ckpt` Python package (python/ckpt/).
//
// It wraps libckptclient without linking libtorch: tensors reach PyTorch as copy-on-write
// buffers (torch.frombuffer, zero copy; Checkpoint::PrivateTensorData) or are gathered into memory that PyTorch owns
// (a data pointer from tensor.data_ptr()). Status errors become ckpt.CkptError subclasses
// carrying the daemon's message.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <memory>

#include "ckpt/client.h"
#include "ckpt/collective.h"
#include "ckpt/gpu.h"
#include "ckpt/launcher.h"
#include "ckpt/persist.h"
#include "client/persist_json.h"
#include "common/element_count.h"
#include "plan/hf_plans.h"
#include "ckpt/tp_plan.h"
#include "ckpt/writer.h"
#include "client/wire_mapping.h"
#include "protocol/messages.h"

namespace py = pybind11;

namespace {

PyObject* g_errors[16] = {};  // indexed by StatusCode
static_assert(static_cast<int>(ckpt::StatusCode::kCancelled) < 16, "g_errors must hold every StatusCode");

[[noreturn]] void Raise(const ckpt::Status& status) {
  int code = static_cast<int>(status.code());
  PyObject* type = (code >= 0 && code < 16 && g_errors[code]) ? g_errors[code] : g_errors[0];
  PyErr_SetString(type, status.message().c_str());
  throw py::error_already_set();
}

template <typename T>
T Unwrap(ckpt::Result<T> result) {
  if (!result.ok()) Raise(result.status());
  return std::move(result).value();
}

void Check(const ckpt::Status& status) {
  if (!status.ok()) Raise(status);
}

// A message as a Python dict with exactly the fields of its wire encoding
// (protocol/messages.cc, through client/wire_mapping.h), so the module has no field list
// of its own to keep in step.
template <typename T>
py::object MessageDict(const T& message) {
  // No static py::object: it would be destroyed after the interpreter finalized.
  return py::module_::import("json").attr("loads")(ckpt::client::EncodePublic(message).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

py::dict TensorDict(const ckpt::TensorInfo& t) {
  py::dict d;
  d["name"] = t.name;
  d["dtype"] = ckpt::DTypeName(t.dtype);
  d["shape"] = py::tuple(py::cast(t.shape));
  d["nbytes"] = t.nbytes;
  d["checksum"] = t.checksum;
  return d;
}

// kind: "replicate", "split" or "partition" (ZeRO-3 flat partition).
ckpt::ShardSpec MakeSpec(const std::string& kind, int dim, int rank, int world, int fused_chunks,
                         bool allow_uneven) {
  if (kind == "replicate") return ckpt::ShardSpec::Replicate();
  if (kind == "split") return ckpt::ShardSpec::Split(dim, rank, world, fused_chunks, allow_uneven);
  if (kind == "partition") return ckpt::ShardSpec::FlatPartition(rank, world);
  Raise(ckpt::InvalidArgument("unknown shard kind '" + kind + "' (replicate, split, partition)"));
}

// The Python-side owner of an attached checkpoint; buffers handed out keep it alive.
using CheckpointPtr = std::shared_ptr<ckpt::Checkpoint>;

// The deleter of every CheckpointPtr: destroying a Checkpoint unmaps the segment and then
// closes its lease (the detach), and the unmap of a large mapping takes a while (0.13 s for
// 9.88 GiB of faulted-in 4 KiB pages), so the GIL is released around it when this thread
// holds it (the last reference usually goes in a Python dealloc; CPython's own io releases
// the GIL in close() the same way): other Python threads run meanwhile, and a detach on a
// background thread (ckpt.transformers.load_model) does not stall the main one. Not while
// the interpreter finalizes (no thread may take the GIL back then), and not on a daemon
// thread (or one Python did not start): the main thread may begin finalizing while the
// GIL is out, and CPython < 3.14 then ends such a thread inside PyEval_RestoreThread with
// pthread_exit, whose unwinding through this noexcept deleter aborts the process
// ("terminate called without an active exception"). Finalization waits for the others.
bool MayReleaseGilToDestroy() {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  if (!Py_IsInitialized() || finalizing || !PyGILState_Check()) return false;
  // Which thread this is, read without running Python code (code would let the GIL go at
  // its eval breaker, with the same ending): threading._active[get_ident()]._daemonic.
  py::error_scope keep_pending_error;  // a dealloc may run while an exception is set
  PyObject* threading = PyImport_GetModule(py::str("threading").ptr());  // never imports
  PyObject* active = threading != nullptr ? PyObject_GetAttrString(threading, "_active") : nullptr;
  PyObject* ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
  PyObject* thread = active != nullptr && ident != nullptr && PyDict_Check(active)
                         ? PyDict_GetItemWithError(active, ident)  // borrowed
                         : nullptr;
  PyObject* daemonic = thread != nullptr ? PyObject_GetAttrString(thread, "_daemonic") : nullptr;
  const bool daemon = daemonic == nullptr || PyObject_IsTrue(daemonic) != 0;  // unknown: as a daemon
  Py_XDECREF(daemonic);
  Py_XDECREF(ident);
  Py_XDECREF(active);
  Py_XDECREF(threading);
  PyErr_Clear();
  return !daemon;
}

void DestroyCheckpoint(ckpt::Checkpoint* checkpoint) {
  if (MayReleaseGilToDestroy()) {
    py::gil_scoped_release release;
    delete checkpoint;
  } else {
    delete checkpoint;
  }
}

// Bytes of one tensor in the checkpoint's copy-on-write view (Checkpoint::PrivateTensorData),
// exposed writable through the buffer protocol: writes stay private to this process.
struct TensorBuffer {
  CheckpointPtr owner;
  std::byte* data;
  uint64_t size;
};

// DLPack (https://dmlc.github.io/dlpack): how GPU tensors reach PyTorch without linking
// libtorch. These mirror dlpack.h's stable ABI (the "dltensor" capsule protocol).
struct DLDevice {
  int32_t device_type;  // kDLCUDA = 2
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // null: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

// Owns one exported tensor: its shape array and a share of the device allocation.
struct ExportedTensor {
  DLManagedTensor managed;
  std::vector<int64_t> shape;
  std::shared_ptr<void> allocation;
};

ckpt::Result<DLDataType> DlpackType(ckpt::DType dtype) {
  using ckpt::DType;
  switch (dtype) {
    case DType::kBool: return DLDataType{6, 8, 1};
    case DType::kU8: return DLDataType{1, 8, 1};
    case DType::kI8: return DLDataType{0, 8, 1};
    case DType::kI16: return DLDataType{0, 16, 1};
    case DType::kU16: return DLDataType{1, 16, 1};
    case DType::kI32: return DLDataType{0, 32, 1};
    case DType::kU32: return DLDataType{1, 32, 1};
    case DType::kI64: return DLDataType{0, 64, 1};
    case DType::kU64: return DLDataType{1, 64, 1};
    case DType::kF16: return DLDataType{2, 16, 1};
    case DType::kBF16: return DLDataType{4, 16, 1};
    case DType::kF32: return DLDataType{2, 32, 1};
    case DType::kF64: return DLDataType{2, 64, 1};
    case DType::kC64: return DLDataType{5, 64, 1};
    case DType::kC128: return DLDataType{5, 128, 1};
    default: return ckpt::Unsupported(std::string("no DLPack type for ") + ckpt::DTypeName(dtype));
  }
}

py::object ToCapsule(const ckpt::GpuTensor& t, int device, std::shared_ptr<void> allocation) {
  const DLDataType type = Unwrap(DlpackType(t.dtype));  // before anything is allocated
  auto* e = new ExportedTensor();
  e->shape = t.shape;
  e->allocation = std::move(allocation);
  DLTensor& dl = e->managed.dl_tensor;
  dl.data = t.data;
  dl.device = {2, device};
  dl.ndim = static_cast<int32_t>(t.shape.size());
  dl.dtype = type;
  dl.shape = e->shape.data();
  dl.strides = nullptr;
  dl.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = [](DLManagedTensor* self) { delete static_cast<ExportedTensor*>(self->manager_ctx); };
  // A capsule nobody consumed still owns its tensor; a consumer renames it "used_dltensor".
  PyObject* capsule = PyCapsule_New(&e->managed, "dltensor", [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      m->deleter(m);
    }
  });
  if (capsule == nullptr) {
    delete e;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

ckpt::TpPlan::Options PlanOptions(const std::string& convention, const std::string& config, bool fuse_qkv,
                                  bool fuse_gate_up, bool transpose_conv1d, bool expert_parallel, bool fuse_experts) {
  ckpt::TpPlan::Options o;
  o.convention = Unwrap(ckpt::ParseConvention(convention));
  o.config_json = config;
  o.fuse_qkv = fuse_qkv;
  o.fuse_gate_up = fuse_gate_up;
  o.transpose_conv1d = transpose_conv1d;
  o.expert_parallel = expert_parallel;
  o.fuse_experts = fuse_experts;
  return o;
}

// TensorInfo from a Python dict {"name", "dtype", "shape"} (what Checkpoint.tensors() gives).
ckpt::TensorInfo InfoFromDict(const py::dict& d) {
  ckpt::TensorInfo t;
  t.name = py::cast<std::string>(d["name"]);
  const std::string dtype = py::cast<std::string>(d["dtype"]);
  auto dt = ckpt::DTypeFromName(dtype);
  if (!dt) Raise(ckpt::InvalidArgument("unknown dtype '" + dtype + "' for tensor '" + t.name + "'"));
  t.dtype = *dt;
  t.shape = py::cast<std::vector<int64_t>>(d["shape"]);
  auto numel = ckpt::ElementCount(t.shape);
  if (!numel.ok()) Raise(ckpt::InvalidArgument("tensor '" + t.name + "': " + numel.status().message()));
  auto bytes = ckpt::TensorBytes(t.dtype, *numel);
  t.nbytes = bytes ? *bytes : 0;
  return t;
}

py::dict PieceDict(const ckpt::ShardPiece& p) {
  py::dict d;
  d["source"] = p.source;
  const char* kind = p.spec.kind == ckpt::ShardSpec::Kind::kReplicate ? "replicate"
                     : p.spec.kind == ckpt::ShardSpec::Kind::kSplit   ? "split"
                                                                        : "partition";
  d["kind"] = kind;
  d["dim"] = p.spec.dim;
  d["rank"] = p.spec.rank;
  d["world"] = p.spec.world;
  d["chunks"] = p.spec.fused_chunks;
  d["uneven"] = p.spec.allow_uneven ? (p.spec.ceil_parts ? "chunk" : "tensor_split") : "no";
  d["row_begin"] = p.row_begin;
  d["row_count"] = p.row_count;
  d["row_step"] = p.row_step;
  d["flat_rows"] = p.flat_rows;
  return d;
}

// The infos of an output's source tensors (for PlanOutput) from an attached checkpoint.
std::vector<ckpt::TensorInfo> SourceInfos(const ckpt::Checkpoint& c, const ckpt::ShardOutput& out) {
  std::vector<ckpt::TensorInfo> infos;
  for (const ckpt::ShardPiece& p : out.pieces) {
    bool seen = false;
    for (const auto& i : infos) seen = seen || i.name == p.source;
    if (seen) continue;
    ckpt::TensorView v = Unwrap(c.Tensor(p.source));
    infos.push_back(*v.info);
  }
  return infos;
}

py::tuple LaunchTuple(const ckpt::Launch& l) {
  return py::make_tuple(l.rank, l.world, l.local_rank, l.local_world, l.source);
}
// One part of a write driven from Python (ckpt/writer.py): pieces are filled by Python
// callables fill(offset, ring_offset, size) that copy into the ring (a buffer Python
// wraps once, from on_ring(address, nbytes)); the first exception a callable raises fails
// the write and is re-raised by commit().
struct PyWriter {
  std::unique_ptr<ckpt::Writer> writer;
  std::shared_ptr<std::byte*> ring_base = std::make_shared<std::byte*>(nullptr);
  std::shared_ptr<py::object> error = std::make_shared<py::object>();  // a pending exception (its value)
  std::shared_ptr<bool> failed = std::make_shared<bool>(false);
  std::vector<py::object> keep;  // the callables

  ckpt::PieceSource Source(py::function fill) {
    keep.push_back(fill);
    auto base = ring_base;
    auto err = error;
    auto flag = failed;
    PyObject* f = fill.ptr();
    return [base, err, flag, f](uint64_t offset, void* dst, uint64_t size) -> ckpt::Status {
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() != 0) {
        *flag = true;
        *err = py::reinterpret_steal<py::object>(PyErr_GetRaisedExceptionCompat());
        return ckpt::Cancelled("interrupted");
      }
      try {
        py::handle{f}(offset, static_cast<uint64_t>(static_cast<std::byte*>(dst) - *base), size);
      } catch (py::error_already_set& e) {
        *flag = true;
        *err = e.value();
        return ckpt::Cancelled(std::string("a tensor could not be staged: ") + e.what());
      }
      return ckpt::Status::Ok();
    };
  }

  static PyObject* PyErr_GetRaisedExceptionCompat() {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != nullptr && value != nullptr) PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
  }
};


// The progress callback of a C++ call made with the GIL released (load, ensure, persist):
// each tick takes the GIL, runs pending signal handlers (Ctrl-C raises KeyboardInterrupt
// there) and calls `progress` (None: not called); an exception from either cancels the
// call (the callback returns false) and stays pending in this thread: raised() tells, and
// the caller re-raises it (throw py::error_already_set()). Must outlive the call.
class PyProgress {
 public:
  explicit PyProgress(py::object progress) : progress_(std::move(progress)) {}
  std::function<bool(uint64_t, uint64_t)> Callback() {
    return [this](uint64_t done, uint64_t total) {
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() != 0) {
        raised_ = true;  // the handler's exception is set
        return false;
      }
      if (progress_.is_none()) return true;
      try {
        progress_(done, total);
      } catch (py::error_already_set& e) {
        e.restore();
        raised_ = true;
        return false;
      }
      return true;
    };
  }
  bool raised() const { return raised_; }

 private:
  py::object progress_;
  bool raised_ = false;
};

// Client.load (the binding's comment says what it does).
py::object ClientLoad(ckpt::Client& c, const std::string& path, const std::string& name, py::object progress,
                      bool replace, bool allow_expansion) {
  ckpt::LoadOptions options;
  options.name = name;
  options.replace = replace;
  options.allow_expansion = allow_expansion;
  PyProgress ticks(progress);
  options.progress = ticks.Callback();
  ckpt::Result<ckpt::LoadResult> r = ckpt::Internal("unreached");
  {
    py::gil_scoped_release release;
    r = c.Load(path, options);
  }
  if (ticks.raised()) {
    if (r.ok()) {
      // Published before the cancel reached the daemon: say so with the exception.
      PyErr_WarnEx(PyExc_RuntimeWarning,
                   ("ckpt: the load of '" + r->checkpoint.name + "' was published before it could be cancelled")
                       .c_str(), 1);
    }
    throw py::error_already_set();
  }
  ckpt::LoadResult loaded = Unwrap(std::move(r));
  py::object out = MessageDict(loaded.checkpoint);
  out["evicted"] = py::cast(loaded.evicted);  // what the budget evicted to make room
  return out;
}

// Client.ensure (the binding's comment says what it does).
py::object ClientEnsure(ckpt::Client& c, const std::string& path, const std::string& name, py::object progress,
                        bool allow_expansion) {
  ckpt::EnsureOptions options;
  options.name = name;
  options.allow_expansion = allow_expansion;
  PyProgress ticks(progress);
  options.progress = ticks.Callback();
  ckpt::Result<ckpt::EnsureResult> r = ckpt::Internal("unreached");
  {
    py::gil_scoped_release release;
    r = c.Ensure(path, options);
  }
  if (ticks.raised()) throw py::error_already_set();
  ckpt::EnsureResult ensured = Unwrap(std::move(r));
  py::object out = MessageDict(ensured.checkpoint);
  out["evicted"] = py::cast(ensured.evicted);
  out["action"] = ensured.action;
  return out;
}

// Checkpoint.load_gpu (the binding's comment says what it does).
py::dict CheckpointLoadGpu(const CheckpointPtr& c, const std::vector<ckpt::ShardOutput>& outputs, int device,
                           const std::string& float_dtype, const std::string& host_path, int streams,
                           bool allow_overflow, std::shared_ptr<ckpt::NcclGroup> group, const std::string& collective) {
  ckpt::GpuLoadOptions options;
  if (streams != 0) options.streams = streams;  // 0: the library's default
  options.allow_overflow = allow_overflow;
  if (!float_dtype.empty()) {
    auto dt = ckpt::DTypeFromName(float_dtype);
    if (!dt) Raise(ckpt::InvalidArgument("unknown dtype '" + float_dtype + "'"));
    options.float_dtype = *dt;
  }
  if (host_path == "register") options.path = ckpt::HostPath::kRegister;
  else if (host_path == "pageable") options.path = ckpt::HostPath::kPageable;
  else if (host_path == "bounce" || host_path.empty()) options.path = ckpt::HostPath::kBounce;
  else Raise(ckpt::InvalidArgument("host path must be bounce, register or pageable"));
  ckpt::CollectiveOptions shared;
  if (collective == "always") shared.mode = ckpt::CollectiveOptions::Mode::kCollective;
  else if (collective == "never") shared.mode = ckpt::CollectiveOptions::Mode::kIndependent;
  else if (collective != "auto") Raise(ckpt::InvalidArgument("collective must be auto, always or never"));
  ckpt::Result<ckpt::GpuStateDict> loaded = ckpt::Internal("unreached");
  {
    py::gil_scoped_release release;
    auto loader = ckpt::GpuLoader::Create(*c, device, options);
    if (!loader.ok()) loaded = loader.status();
    else if (group) loaded = (*loader)->LoadCollective(outputs, *group, shared);
    else loaded = (*loader)->Load(outputs);
  }
  ckpt::GpuStateDict dict = Unwrap(std::move(loaded));
  py::dict out;
  for (const auto& [name, tensor] : dict.tensors()) {
    out[py::str(name)] = ToCapsule(tensor, dict.device(), dict.allocation());
  }
  return out;
}

// ckpt.CkptError and one subclass per StatusCode (g_errors: what Raise throws).
void BindErrors(py::module_& m) {
  static py::exception<std::runtime_error> base(m, "CkptError");
  g_errors[0] = base.ptr();
  auto sub = [&](const char* name, ckpt::StatusCode code, PyObject* extra = nullptr) {
    PyObject* bases = extra ? PyTuple_Pack(2, base.ptr(), extra) : PyTuple_Pack(1, base.ptr());
    std::string qualified = std::string("ckpt._ckpt.") + name;
    PyObject* type = PyErr_NewException(qualified.c_str(), bases, nullptr);
    Py_DECREF(bases);
    m.add_object(name, py::handle(type));
    g_errors[static_cast<int>(code)] = type;
  };
  sub("InvalidArgument", ckpt::StatusCode::kInvalidArgument, PyExc_ValueError);
  sub("NotFound", ckpt::StatusCode::kNotFound, PyExc_KeyError);
  sub("AlreadyExists", ckpt::StatusCode::kAlreadyExists);
  sub("Corrupt", ckpt::StatusCode::kCorrupt);
  sub("Unsupported", ckpt::StatusCode::kUnsupported);
  sub("ResourceExhausted", ckpt::StatusCode::kResourceExhausted, PyExc_MemoryError);
  sub("FailedPrecondition", ckpt::StatusCode::kFailedPrecondition);
  sub("Unavailable", ckpt::StatusCode::kUnavailable, PyExc_ConnectionError);
  sub("IoError", ckpt::StatusCode::kIoError, PyExc_OSError);
  sub("Internal", ckpt::StatusCode::kInternal);
  sub("PermissionDenied", ckpt::StatusCode::kPermissionDenied, PyExc_PermissionError);
  sub("DeadlineExceeded", ckpt::StatusCode::kDeadlineExceeded, PyExc_TimeoutError);
  sub("Cancelled", ckpt::StatusCode::kCancelled);
}

// The module-level helpers: socket path, GPU and plan families, launcher environment.
void BindModuleFunctions(py::module_& m) {
  m.def("default_socket_path", &ckpt::Client::DefaultSocketPath);
  m.def("gpu_available", &ckpt::GpuAvailable, "True if the CUDA copy engine is built in and a GPU is usable");
  m.def("plan_families", &ckpt::TpPlan::Families);
  // include/ckpt/launcher.h: (rank, world, local_rank, local_world, source) from `env`
  // (a dict; the caller passes os.environ), and ResolveLaunch for rank/world left None.
  m.def("launcher_env", [](const std::map<std::string, std::string>& env) {
    return LaunchTuple(Unwrap(ckpt::LauncherEnvFrom(env)));
  });
  m.def(
      "resolve_launch",
      [](std::optional<int> rank, std::optional<int> world, const std::map<std::string, std::string>& env) {
        return LaunchTuple(Unwrap(ckpt::ResolveLaunch(rank, world, &env)));
      },
      py::arg("rank"), py::arg("world"), py::arg("env"));
}

// ShardOutput and TpPlan (ckpt.plans).
void BindPlans(py::module_& m) {
  // One tensor of a rank's state dict under a plan (include/ckpt/tp_plan.h ShardOutput).
  py::class_<ckpt::ShardOutput>(m, "ShardOutput")
      .def_property_readonly("name", [](const ckpt::ShardOutput& o) { return o.name; })
      .def_property_readonly("transpose", [](const ckpt::ShardOutput& o) { return o.transpose; })
      .def_property_readonly("view", [](const ckpt::ShardOutput& o) { return py::tuple(py::cast(o.shape)); })
      .def_property_readonly("pieces",
                             [](const ckpt::ShardOutput& o) {
                               py::list l;
                               for (const auto& p : o.pieces) l.append(PieceDict(p));
                               return l;
                             })
      .def("__repr__", [](const ckpt::ShardOutput& o) {
        return "<ShardOutput " + o.name + ": " + std::to_string(o.pieces.size()) + " piece(s)" +
               (o.transpose ? ", transposed" : "") + ">";
      });

  // The plan engine (include/ckpt/tp_plan.h), for ckpt.plans.
  py::class_<ckpt::TpPlan>(m, "TpPlan")
      .def_static(
          "builtin",
          [](const std::string& family, const std::string& convention, const std::string& config, bool fuse_qkv,
             bool fuse_gate_up, bool transpose_conv1d, bool expert_parallel, bool fuse_experts) {
            return Unwrap(ckpt::TpPlan::BuiltIn(
                family, PlanOptions(convention, config, fuse_qkv, fuse_gate_up, transpose_conv1d, expert_parallel,
                                    fuse_experts)));
          },
          py::arg("family"), py::arg("convention") = "megatron", py::arg("config") = "", py::arg("fuse_qkv") = false,
          py::arg("fuse_gate_up") = false, py::arg("transpose_conv1d") = false, py::arg("expert_parallel") = false,
          py::arg("fuse_experts") = false)
      .def_static(
          "for_config",
          [](const std::string& config, const std::string& convention, bool fuse_qkv, bool fuse_gate_up,
             bool transpose_conv1d, bool expert_parallel, bool fuse_experts) {
            return Unwrap(ckpt::TpPlan::ForConfig(
                config, PlanOptions(convention, config, fuse_qkv, fuse_gate_up, transpose_conv1d, expert_parallel,
                                    fuse_experts)));
          },
          py::arg("config"), py::arg("convention") = "megatron", py::arg("fuse_qkv") = false,
          py::arg("fuse_gate_up") = false, py::arg("transpose_conv1d") = false, py::arg("expert_parallel") = false,
          py::arg("fuse_experts") = false)
      .def_static("family_of", [](const std::string& config) { return Unwrap(ckpt::TpPlan::FamilyOf(config)); })
      .def_static("from_json", [](const std::string& text) { return Unwrap(ckpt::TpPlan::FromJson(text)); })
      .def_static("from_file", [](const std::string& path) { return Unwrap(ckpt::TpPlan::FromJsonFile(path)); })
      .def_static("families", &ckpt::TpPlan::Families)
      // transformers' plans as data (src/plan/hf_plans.h): the model types, their version,
      // one entry, and a plan from an entry (the embedded one or a live transformers').
      .def_static("hf_model_types", [] { return ckpt::hf_plans::ModelTypes(); })
      .def_static("hf_plans_version", [] { return ckpt::hf_plans::TransformersVersion(); })
      .def_static("hf_entry", [](const std::string& t) { return Unwrap(ckpt::hf_plans::EntryJson(t)); })
      .def_static(
          "from_hf_entry",
          [](const std::string& model_type, const std::string& entry, const std::string& config,
             const std::string& source) { return Unwrap(ckpt::TpPlan::FromHfEntry(model_type, entry, config, source)); },
          py::arg("model_type"), py::arg("entry"), py::arg("config") = "", py::arg("source") = "a live transformers")
      .def_property_readonly("json", &ckpt::TpPlan::json)
      .def_property_readonly("family", &ckpt::TpPlan::family)
      .def_property_readonly("convention", [](const ckpt::TpPlan& p) { return ckpt::ConventionName(p.convention()); })
      // tensors: [{"name", "dtype", "shape"}, ...] (Checkpoint.tensors()).
      .def(
          "resolve",
          [](const ckpt::TpPlan& p, const py::list& tensors, int rank, int world) {
            std::vector<ckpt::TensorInfo> infos;
            for (const auto& t : tensors) infos.push_back(InfoFromDict(py::cast<py::dict>(t)));
            return Unwrap(p.Resolve(infos, rank, world));
          },
          py::arg("tensors"), py::arg("rank"), py::arg("world"));
}

// Client: the control calls (include/ckpt/client.h).
void BindClient(py::module_& m) {
  py::class_<ckpt::Client>(m, "Client")
      .def_static(
          "connect",
          [](const std::string& socket) {
            return Unwrap(ckpt::Client::Connect(socket.empty() ? ckpt::Client::DefaultSocketPath() : socket));
          },
          py::arg("socket") = "")
      // Loads with the GIL released. Every progress tick (about 100 ms) takes the GIL,
      // runs pending signal handlers (Ctrl-C raises KeyboardInterrupt there) and calls
      // `progress`; an exception from either cancels the load (the daemon publishes
      // nothing), the connection is brought back in step, and the exception is raised.
      .def("load", &ClientLoad, py::arg("path"), py::arg("name") = "", py::arg("progress") = py::none(),
           py::arg("replace") = false, py::arg("allow_expansion") = false)
      // Ensure (see ckpt::Client::Ensure): the summary with "action" ("loaded", "reloaded",
      // "joined", "current") and "evicted". The GIL is released while it waits; progress
      // and Ctrl-C as for load (an exception withdraws this caller only).
      .def("ensure", &ClientEnsure, py::arg("path"), py::arg("name") = "", py::arg("progress") = py::none(),
           py::arg("allow_expansion") = false)
      .def(
          "evict",
          [](ckpt::Client& c, const std::string& name, bool force, double wait) {
            ckpt::EvictOptions options;
            options.force = force;
            options.wait_s = wait;
            ckpt::Result<ckpt::CheckpointSummary> r = ckpt::Internal("unreached");
            {
              py::gil_scoped_release release;
              r = c.Evict(name, options);
            }
            return MessageDict(Unwrap(std::move(r)));
          },
          py::arg("name"), py::arg("force") = false, py::arg("wait") = 0.0)
      .def("list",
           [](ckpt::Client& c) {
             py::list out;
             for (const auto& s : Unwrap(c.List())) out.append(MessageDict(s));
             return out;
           })
      .def("verify",
           [](ckpt::Client& c, const std::string& name) {
             ckpt::Result<ckpt::VerifyResult> r = ckpt::Internal("unreached");
             {
               py::gil_scoped_release release;
               r = c.Verify(name);
             }
             return MessageDict(Unwrap(std::move(r)));
           })
      .def("metrics", [](ckpt::Client& c) { return Unwrap(c.Metrics()); })
      .def("info",
           [](ckpt::Client& c, const std::string& name) {
             py::list out;
             for (const auto& t : Unwrap(c.Info(name))) out.append(TensorDict(t));
             return out;
           })
      .def("status", [](ckpt::Client& c) { return MessageDict(Unwrap(c.GetStatus())); })
      .def_property_readonly("socket_path", &ckpt::Client::socket_path)
      .def("attach", [](ckpt::Client& c, const std::string& name) {
        return CheckpointPtr(Unwrap(c.Attach(name)).release(), DestroyCheckpoint);
      })
      // Rank 0 publishes `value`; the other ranks wait (the GIL released) for it.
      .def(
          "rendezvous",
          [](ckpt::Client& c, const std::string& job, int rank, int world, const py::bytes& value,
             double timeout) {
            const std::string blob = value;
            ckpt::Result<std::string> r = ckpt::Internal("unreached");
            {
              py::gil_scoped_release release;
              r = c.Rendezvous(job, rank, world, blob, timeout);
            }
            return py::bytes(Unwrap(std::move(r)));
          },
          py::arg("job"), py::arg("rank"), py::arg("world"), py::arg("value") = py::bytes(),
          py::arg("timeout") = 60.0);
}

// NcclGroup (include/ckpt/collective.h).
void BindNcclGroup(py::module_& m) {
  // An NCCL communicator for collective loads (include/ckpt/collective.h). Joining waits
  // (GIL released) for the other ranks, at most `timeout` seconds.
  using GroupPtr = std::shared_ptr<ckpt::NcclGroup>;
  py::class_<ckpt::NcclGroup, GroupPtr>(m, "NcclGroup")
      .def_static("unique_id", [] { return py::bytes(Unwrap(ckpt::NcclGroup::NewUniqueId())); })
      .def_static(
          "create",
          [](const py::bytes& unique_id, int rank, int size, int device, double timeout) {
            const std::string id = unique_id;
            ckpt::Result<std::unique_ptr<ckpt::NcclGroup>> g = ckpt::Internal("unreached");
            {
              py::gil_scoped_release release;
              g = ckpt::NcclGroup::Create(id, rank, size, device, {timeout});
            }
            return GroupPtr(Unwrap(std::move(g)));
          },
          py::arg("unique_id"), py::arg("rank"), py::arg("size"), py::arg("device"), py::arg("timeout") = 300.0)
      .def_static(
          "join",
          [](ckpt::Client& client, const std::string& job, int rank, int size, int device, double timeout) {
            ckpt::Result<std::unique_ptr<ckpt::NcclGroup>> g = ckpt::Internal("unreached");
            {
              py::gil_scoped_release release;
              g = ckpt::NcclGroup::Join(client, job, rank, size, device, {timeout});
            }
            return GroupPtr(Unwrap(std::move(g)));
          },
          py::arg("client"), py::arg("job"), py::arg("rank"), py::arg("size"), py::arg("device"),
          py::arg("timeout") = 300.0)
      .def_property_readonly("rank", &ckpt::NcclGroup::rank)
      .def_property_readonly("size", &ckpt::NcclGroup::size)
      .def_property_readonly("device", &ckpt::NcclGroup::device)
      .def_property_readonly("broken", &ckpt::NcclGroup::broken);
}

void BindCheckpointCopies(py::class_<ckpt::Checkpoint, CheckpointPtr>& cls);

// TensorBuffer and Checkpoint: an attached generation, its tensors, shards and copies.
void BindCheckpoint(py::module_& m) {
  py::class_<TensorBuffer>(m, "TensorBuffer", py::buffer_protocol())
      .def_buffer([](TensorBuffer& b) {
        return py::buffer_info(b.data, 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size)}, {1}, /*readonly=*/false);
      })
      .def("__len__", [](const TensorBuffer& b) { return b.size; });

  py::class_<ckpt::Checkpoint, CheckpointPtr> cls(m, "Checkpoint");
  cls
      .def_property_readonly("name", &ckpt::Checkpoint::name)
      .def_property_readonly("generation", &ckpt::Checkpoint::generation)
      // The owner the daemon recorded in the segment header (see ckpt::Checkpoint::owner_uid).
      .def_property_readonly("owner_uid", &ckpt::Checkpoint::owner_uid)
      .def_property_readonly("owner_admin", &ckpt::Checkpoint::owner_admin)
      .def_property_readonly("mapped_bytes", &ckpt::Checkpoint::mapped_bytes)
      .def_property_readonly("private_bytes", [](const ckpt::Checkpoint& c) { return Unwrap(c.PrivateBytes()); })
      .def("tensors",
           [](const ckpt::Checkpoint& c) {
             py::list out;
             for (const auto& t : c.tensors()) out.append(TensorDict(t));
             return out;
           })
      .def("verify", [](const ckpt::Checkpoint& c) { Check(c.Verify()); })
      // Side files kept from the checkpoint's folder (config.json, ...) and its metadata,
      // read from the attachment (the files themselves are never opened).
      .def("side_file",
           [](const ckpt::Checkpoint& c, const std::string& name) {
             auto bytes = c.SideFile(name);
             Check(bytes.status());
             return py::bytes(bytes->data(), bytes->size());
           })
      .def_property_readonly("side_files", &ckpt::Checkpoint::side_files)
      .def_property_readonly("metadata",
                             [](const ckpt::Checkpoint& c) {
                               py::dict out;
                               for (const auto& [k, v] : c.metadata()) out[py::str(k)] = py::str(v);
                               return out;
                             })
      // This rank's outputs under `plan` (the plan engine, include/ckpt/tp_plan.h).
      .def(
          "resolve",
          [](const CheckpointPtr& c, const ckpt::TpPlan& plan, int rank, int world) {
            return Unwrap(plan.Resolve(c->tensors(), rank, world));
          },
          py::arg("plan"), py::arg("rank"), py::arg("world"));
  BindCheckpointCopies(cls);
}

// Checkpoint: its outputs' layouts, and copies of outputs and shards to host memory and GPUs.
void BindCheckpointCopies(py::class_<ckpt::Checkpoint, CheckpointPtr>& cls) {
  cls
      // (shape, dtype, nbytes, offset): an output's dense layout; offset >= 0 when the output
      // is one contiguous run of its source tensor (a zero-copy view at that byte offset).
      .def("output_layout",
           [](const CheckpointPtr& c, const ckpt::ShardOutput& out) {
             ckpt::OutputLayout l = Unwrap(ckpt::PlanOutput(out, SourceInfos(*c, out)));
             int64_t offset = -1;
             if (out.pieces.size() == 1 && !out.transpose && l.pieces[0].contiguous() && l.nbytes > 0)
               offset = static_cast<int64_t>(l.pieces[0].regions[0].src_offset);
             return py::make_tuple(py::tuple(py::cast(l.shape)), ckpt::DTypeName(l.dtype), l.nbytes, offset);
           })
      // Writes an output into host memory at address `dst` (e.g. a CPU tensor's data_ptr()):
      // pieces gathered, concatenated, transposed on the CPU (GIL released).
      .def(
          "copy_output",
          [](const CheckpointPtr& c, const ckpt::ShardOutput& out, uintptr_t dst, uint64_t dst_size) {
            ckpt::OutputLayout l = Unwrap(ckpt::PlanOutput(out, SourceInfos(*c, out)));
            std::vector<const std::byte*> sources;
            for (const auto& p : out.pieces) sources.push_back(Unwrap(c->TensorData(p.source)));
            ckpt::Status st;
            {
              py::gil_scoped_release release;
              st = ckpt::GatherOutput(out, l, sources, reinterpret_cast<void*>(dst), dst_size);
            }
            Check(st);
          },
          py::arg("output"), py::arg("dst"), py::arg("dst_size"))
      // Outputs (from resolve) on `device` through the CUDA copy engine, as
      // {name: DLPack capsule}. float_dtype: "" (keep) or F16/BF16/F32/F64.
      .def("load_gpu", &CheckpointLoadGpu, py::arg("outputs"), py::arg("device"),
          py::arg("float_dtype") = "", py::arg("host_path") = "bounce", py::arg("streams") = 0,
          py::arg("allow_overflow") = false, py::arg("group") = nullptr, py::arg("collective") = "auto")
      // A writable, copy-on-write buffer (buffer protocol) over a whole tensor's bytes: reads
      // share the checkpoint's one copy, a write copies the pages written into this process
      // (Checkpoint::PrivateTensorData). It keeps the mapping alive for as long as it, or
      // anything viewing it, lives.
      .def("buffer",
           [](const CheckpointPtr& c, const std::string& name) {
             ckpt::TensorView view = Unwrap(c->Tensor(name));
             return TensorBuffer{c, Unwrap(c->PrivateTensorData(name)), view.info->nbytes};
           })
      // (shape, nbytes, contiguous, source offset of a contiguous shard) of a shard.
      .def(
          "shard_info",
          [](const ckpt::Checkpoint& c, const std::string& name, const std::string& kind, int dim, int rank,
             int world, int fused_chunks, bool allow_uneven) {
            ckpt::ShardLayout layout =
                Unwrap(c.PlanShard(name, MakeSpec(kind, dim, rank, world, fused_chunks, allow_uneven)));
            uint64_t offset = layout.regions.empty() ? 0 : layout.regions[0].src_offset;
            return py::make_tuple(py::tuple(py::cast(layout.shape)), layout.nbytes, layout.contiguous(), offset);
          },
          py::arg("name"), py::arg("kind") = "replicate", py::arg("dim") = 0, py::arg("rank") = 0,
          py::arg("world") = 1, py::arg("fused_chunks") = 1, py::arg("allow_uneven") = false)
      // Gathers a shard into host memory at address `dst` (e.g. a CPU tensor's data_ptr()).
      .def(
          "copy_shard",
          [](const ckpt::Checkpoint& c, const std::string& name, uintptr_t dst, uint64_t dst_size,
             const std::string& kind, int dim, int rank, int world, int fused_chunks, bool allow_uneven) {
            ckpt::ShardSpec spec = MakeSpec(kind, dim, rank, world, fused_chunks, allow_uneven);
            ckpt::Status st;
            {
              py::gil_scoped_release release;
              st = c.CopyShard(name, spec, reinterpret_cast<void*>(dst), dst_size);
            }
            Check(st);
          },
          py::arg("name"), py::arg("dst"), py::arg("dst_size"), py::arg("kind") = "replicate", py::arg("dim") = 0,
          py::arg("rank") = 0, py::arg("world") = 1, py::arg("fused_chunks") = 1, py::arg("allow_uneven") = false);
}

// persist and parse_byte_size.
void BindPersist(py::module_& m) {
  // Client.persist (python/ckpt/__init__.py): ckpt::Persist with the GIL released; progress
  // ticks take the GIL, run signal handlers (Ctrl-C) and call `progress`; an exception from
  // either cancels (nothing is left behind) and is raised.
  m.def(
      "persist",
      [](ckpt::Client& c, const std::string& name, const std::string& dir, uint64_t max_shard_bytes, bool replace,
         uint64_t generation, py::object progress) {
        ckpt::PersistOptions options;
        options.max_shard_bytes = max_shard_bytes;
        options.replace = replace;
        options.expected_generation = generation;
        PyProgress ticks(progress);
        options.progress = ticks.Callback();
        ckpt::Result<ckpt::PersistResult> r = ckpt::Internal("unreached");
        {
          py::gil_scoped_release release;
          r = ckpt::Persist(c, name, dir, options);
        }
        if (ticks.raised()) throw py::error_already_set();
        const ckpt::PersistResult result = Unwrap(std::move(r));
        return py::module_::import("json").attr("loads")(ckpt::EncodePersistResult(result).dump());
      },
      py::arg("client"), py::arg("name"), py::arg("dir"), py::arg("max_shard_bytes"), py::arg("replace"),
      py::arg("generation"), py::arg("progress"));
  m.def("parse_byte_size", [](const std::string& text) { return Unwrap(ckpt::ParseByteSize(text)); });
}

// Writer: the write path.
void BindWriter(py::module_& m) {
  // The write path (include/ckpt/writer.h; the Python API is ckpt/writer.py).
  py::class_<PyWriter>(m, "Writer")
      .def_static(
          "create",
          [](const std::string& socket, const std::string& name, const std::string& job, int64_t part, int64_t parts,
             bool replace, double timeout, uint64_t slots, uint64_t slot_bytes, py::object on_ring,
             py::object off_ring) {
            auto w = std::make_unique<PyWriter>();
            ckpt::WriterOptions o;
            o.job = job;
            o.part = part;
            o.parts = parts;
            o.replace = replace;
            o.timeout_s = timeout;
            o.ring_slots = slots;
            o.slot_bytes = slot_bytes;
            auto base = w->ring_base;
            w->keep.push_back(on_ring);
            w->keep.push_back(off_ring);
            PyObject* on = on_ring.ptr();
            PyObject* off = off_ring.ptr();
            o.on_ring_mapped = [base, on](void* data, uint64_t bytes) {
              *base = static_cast<std::byte*>(data);
              py::gil_scoped_acquire gil;
              py::handle{on}(reinterpret_cast<uintptr_t>(data), bytes);
            };
            o.on_ring_unmapping = [off](void* data, uint64_t bytes) {
              py::gil_scoped_acquire gil;
              try {
                py::handle{off}(reinterpret_cast<uintptr_t>(data), bytes);
              } catch (py::error_already_set& e) {
                e.discard_as_unraisable("ckpt: releasing the write ring");
              }
            };
            w->writer = Unwrap(ckpt::Writer::Create(socket.empty() ? ckpt::Client::DefaultSocketPath() : socket,
                                                    name, o));
            return w;
          },
          py::arg("socket"), py::arg("name"), py::arg("job"), py::arg("part"), py::arg("parts"), py::arg("replace"),
          py::arg("timeout"), py::arg("slots"), py::arg("slot_bytes"), py::arg("on_ring"), py::arg("off_ring"))
      .def(
          "add_box",
          [](PyWriter& w, const std::string& key, const std::string& dtype, const std::vector<int64_t>& global_shape,
             const std::vector<int64_t>& offsets, const std::vector<int64_t>& shape, py::function fill) {
            auto dt = ckpt::DTypeFromName(dtype);
            if (!dt) Raise(ckpt::InvalidArgument("unknown dtype '" + dtype + "' for tensor '" + key + "'"));
            Check(w.writer->AddBox(key, *dt, global_shape, offsets, shape, w.Source(std::move(fill))));
          })
      .def(
          "add_flat",
          [](PyWriter& w, const std::string& key, const std::string& dtype, const std::vector<int64_t>& global_shape,
             uint64_t start, uint64_t numel, py::function fill) {
            auto dt = ckpt::DTypeFromName(dtype);
            if (!dt) Raise(ckpt::InvalidArgument("unknown dtype '" + dtype + "' for tensor '" + key + "'"));
            Check(w.writer->AddFlat(key, *dt, global_shape, start, numel, w.Source(std::move(fill))));
          })
      .def("side_file",
           [](PyWriter& w, const std::string& name, const py::bytes& data) {
             Check(w.writer->AddSideFile(name, std::string(data)));
           })
      .def("commit",
           [](PyWriter& w) {
             ckpt::Result<ckpt::LoadResult> r = ckpt::Internal("unreached");
             {
               py::gil_scoped_release release;
               r = w.writer->Commit();
             }
             if (*w.failed && w.error->ptr() != nullptr) {
               PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(w.error->ptr())), w.error->ptr());
               throw py::error_already_set();
             }
             return MessageDict(Unwrap(std::move(r)).checkpoint);
           })
      .def("abort", [](PyWriter& w) { w.writer->Abort(); })
      .def_property_readonly("nbytes", [](const PyWriter& w) { return w.writer->declared_bytes(); })
      .def_property_readonly("pieces", [](const PyWriter& w) { return w.writer->piece_count(); });
}

}  // namespace

PYBIND11_MODULE(_ckpt, m) {
  m.doc() = "Low-level bindings of libckptclient; use the `ckpt` package instead.";
  m.attr("__version__") = CKPT_VERSION;  // CMake's project(VERSION): ckpt.__version__

  BindErrors(m);
  BindModuleFunctions(m);
  BindPlans(m);
  BindClient(m);
  BindNcclGroup(m);
  BindCheckpoint(m);
  BindPersist(m);
  BindWriter(m);
}
