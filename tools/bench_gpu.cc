// ckpt-bench-gpu: measures loading a rank's shards into its GPU (issue 4), without a
// daemon: the segment is written by the loader library and attached through SegmentReader,
// the same read-only mapping a Client::Attach gives.
//
// SHM_NAME names a segment directory /dev/shm/SHM_NAME that holds the one segment.
//   ckpt-bench-gpu segment FILE.safetensors SHM_NAME      write a segment, print seconds
//   ckpt-bench-gpu limit DEVICE [GiB] [START_AT]           pinned/pageable H2D bandwidth
//   ckpt-bench-gpu load SHM_NAME RANK WORLD DEVICE PATH FAMILY [DTYPE|-] [START_AT] [STREAMS] [CHUNK_MIB] [REG_THREADS]
//   ckpt-bench-gpu collective SHM_NAME RANK WORLD DEVICE replica|tp independent|collective|auto ID_FILE [START_AT] [STREAMS] [CHUNK_MIB]
//   ckpt-bench-gpu unlink SHM_NAME
//   ckpt-bench-gpu sweep SHM_NAME DEVICE REPS "WORLDS" CONFIG...  (CONFIG: PATH:STREAMS:CHUNK_MIB:BUFFERS)
// sweep: an experiment in one process (not the benchmark's figures, which take one
// process per rank): for each repetition, configuration (CKPT_COPY_BUFFERS=BUFFERS), TP
// degree W and rank, the same span as `load` (attach -> all shards on the GPU, with a
// fresh mapping and loader), then a second Load with the same loader (its resources
// reused); then each configuration's slowest rank per W, median over the repetitions,
// against the pinned limit measured first.
// collective: WORLD processes (one per GPU) each load a whole replica (replica) or their
// gpt-neo TP shards (tp); "independent" is GpuLoader::Load, the others LoadCollective in
// that mode. Rank 0 writes the NCCL unique id to ID_FILE, the others wait for it; the group
// is formed before START_AT, like the CUDA context.
// START_AT: a CLOCK_REALTIME second at which to start (after CUDA context creation), so
// several processes start together. Output: one JSON object per line.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fstream>
#include <sstream>

#include "ckpt/collective.h"
#include "ckpt/gpu.h"
#include "ckpt/tp_plan.h"
#include "cuda/copy_engine.h"
#include "cuda/copy_knobs.h"
#include "cuda/gpu_loader_impl.h"
#include "format/safetensors.h"
#include "loader/checkpoint_loader.h"
#include "shm/segment_directory.h"
#include "shm/segment_reader.h"

using namespace ckpt;
using Clock = std::chrono::steady_clock;

static double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
static void WaitUntil(double start_at) {
  if (start_at <= 0) return;
  for (;;) {
    double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    if (now >= start_at) return;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}
static int Die(const std::string& what, const Status& s) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}
#define CHECK_CUDA(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)

static Result<std::unique_ptr<shm::SegmentDirectory>> Directory(const std::string& shm) {
  return shm::SegmentDirectory::Open(std::string(shm::kShmRoot) + "/" + shm, {std::nullopt, /*lock=*/false});
}

// The one segment in directory `shm`, mapped read-only (as an attach maps it).
static Result<std::unique_ptr<shm::SegmentReader>> OpenSegment(const std::string& shm) {
  CKPT_ASSIGN_OR_RETURN(auto dir, Directory(shm));
  CKPT_ASSIGN_OR_RETURN(auto entries, dir->List());
  if (entries.size() != 1) return NotFound(dir->path() + " does not hold exactly one segment");
  UniqueFd fd(::openat(dir->fd(), entries[0].name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return ErrnoError("opening " + dir->PathOf(entries[0].name), errno);
  return shm::SegmentReader::FromFd(fd.get(), dir->PathOf(entries[0].name));
}

// Removes directory `shm` and its segments.
static int Unlink(const std::string& shm) {
  auto dir = Directory(shm);
  if (!dir.ok()) return Die("unlink", dir.status());
  auto entries = (*dir)->List();
  if (!entries.ok()) return Die("unlink", entries.status());
  for (const auto& e : *entries) {
    if (Status st = (*dir)->Remove(e.name); !st.ok()) return Die("unlink", st);
  }
  return ::rmdir((*dir)->path().c_str()) == 0 ? 0 : 1;
}

static int Segment(const std::string& file, const std::string& shm) {
  format::LoadPlan plan;
  Status s = format::PlanSafetensorsFile(file, &plan);
  if (!s.ok()) return Die("plan", s);
  auto dir = Directory(shm);
  if (!dir.ok()) return Die("segment directory", dir.status());
  shm::SegmentSpec spec;
  spec.directory = dir->get();
  spec.checkpoint_name = "bench";
  spec.source_path = file;
  spec.generation = 1;
  loader::LoadOptions lo;
  lo.threads = 16;
  auto t0 = Clock::now();
  auto seg = loader::LoadIntoSegment(plan, spec, lo);
  if (!seg.ok()) return Die("load", seg.status());
  std::printf("{\"what\":\"segment\",\"tensors\":%zu,\"GiB\":%.3f,\"seconds\":%.3f}\n", seg->tensors.size(),
              seg->data_bytes / 1073741824.0, Since(t0));
  return 0;
}

static int Limit(int device, double gib, double start_at) {
  CHECK_CUDA(cudaSetDevice(device));
  const size_t bytes = static_cast<size_t>(gib * 1073741824.0);
  void *pinned, *dev;
  CHECK_CUDA(cudaMallocHost(&pinned, bytes));
  CHECK_CUDA(cudaMalloc(&dev, bytes));
  std::memset(pinned, 1, bytes);
  std::vector<char> pageable(bytes, 2);
  cudaStream_t st;
  CHECK_CUDA(cudaStreamCreate(&st));
  CHECK_CUDA(cudaMemcpyAsync(dev, pinned, bytes, cudaMemcpyHostToDevice, st));
  CHECK_CUDA(cudaStreamSynchronize(st));
  WaitUntil(start_at);
  double best_pinned = 1e9, best_pageable = 1e9;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    CHECK_CUDA(cudaMemcpyAsync(dev, pinned, bytes, cudaMemcpyHostToDevice, st));
    CHECK_CUDA(cudaStreamSynchronize(st));
    best_pinned = std::min(best_pinned, Since(t0));
  }
  for (int i = 0; i < 2; ++i) {
    auto t0 = Clock::now();
    CHECK_CUDA(cudaMemcpy(dev, pageable.data(), bytes, cudaMemcpyHostToDevice));
    best_pageable = std::min(best_pageable, Since(t0));
  }
  std::printf("{\"what\":\"limit\",\"device\":%d,\"GiB\":%.2f,\"pinned_GiBps\":%.2f,\"pageable_GiBps\":%.2f}\n", device,
              gib, gib / best_pinned, gib / best_pageable);
  return 0;
}

static int Load(int argc, char** argv) {
  const std::string shm = argv[2];
  const int rank = std::atoi(argv[3]), world = std::atoi(argv[4]), device = std::atoi(argv[5]);
  const std::string path_name = argv[6], family = argv[7];
  const std::string dtype = argc > 8 ? argv[8] : "-";
  const double start_at = argc > 9 ? std::atof(argv[9]) : 0;
  GpuLoadOptions o;
  if (argc > 10) o.streams = std::atoi(argv[10]);
  if (argc > 11) o.chunk_bytes = static_cast<uint64_t>(std::atof(argv[11]) * 1048576.0);
  if (argc > 12) o.register_threads = std::atoi(argv[12]);
  o.path = path_name == "bounce" ? HostPath::kBounce : path_name == "pageable" ? HostPath::kPageable : HostPath::kRegister;
  if (dtype != "-") {
    auto d = DTypeFromName(dtype);
    if (!d) return Die("dtype", InvalidArgument(dtype));
    o.float_dtype = *d;
  }
  auto c0 = Clock::now();
  CHECK_CUDA(cudaSetDevice(device));
  CHECK_CUDA(cudaFree(nullptr));
  const double context_s = Since(c0);
  auto plan = TpPlan::BuiltIn(family);
  if (!plan.ok()) return Die("plan", plan.status());
  WaitUntil(start_at);

  auto t0 = Clock::now();
  auto reader = OpenSegment(shm);  // attach
  if (!reader.ok()) return Die("attach", reader.status());
  const double attach_s = Since(t0);
  const shm::SegmentReader* r = reader->get();
  // The loader first: it starts its copy workers in the background while the plan resolves.
  const auto l0 = Clock::now();
  auto loader = GpuLoaderImpl::Create(TensorSource{&r->tensors(), [r](size_t i) { return r->tensor_data(i); }}, device, o);
  if (!loader.ok()) return Die("loader", loader.status());
  const double create_s = Since(l0);
  const auto p0 = Clock::now();
  auto outs = plan->Resolve(r->tensors(), rank, world);
  if (!outs.ok()) return Die("resolve", outs.status());
  const double resolve_s = Since(p0);
  auto dict = (*loader)->Load(*outs);
  if (!dict.ok()) return Die("load", dict.status());
  const double total_s = Since(t0);
  uint64_t out_bytes = 0;
  for (const auto& [n, t] : dict->tensors()) out_bytes += t.nbytes;
  const auto& st = dict->stats();
  std::printf("{\"what\":\"load\",\"path\":\"%s\",\"rank\":%d,\"world\":%d,\"device\":%d,\"dtype\":\"%s\",\"streams\":%d,"
              "\"chunk_MiB\":%g,\"buffers\":%d,\"reg_threads\":%d,\"context_s\":%.3f,\"attach_s\":%.4f,\"create_s\":%.4f,\"resolve_s\":%.4f,\"seconds\":%.4f,\"load_s\":%.4f,\"setup_s\":%.4f,"
              "\"register_s\":%.4f,\"registered_GiB\":%.3f,\"unregister_s\":%.4f,\"copied_GiB\":%.3f,\"out_GiB\":%.3f,"
              "\"GiBps\":%.2f,\"tensors\":%zu}\n",
              path_name.c_str(), rank, world, device, dtype.c_str(), o.streams,
              cuda::ChunkBytes(o) / 1048576.0, cuda::CurrentCopyKnobs().buffers, o.register_threads, context_s, attach_s, create_s, resolve_s, total_s, st.total_seconds, st.setup_seconds,
              st.register_seconds, st.registered_bytes / 1073741824.0, st.unregister_seconds,
              st.copied_bytes / 1073741824.0, out_bytes / 1073741824.0, st.copied_bytes / 1073741824.0 / total_s,
              dict->tensors().size());
  return 0;
}

// Rank 0 writes a new NCCL unique id to `file` (atomically); the others wait for it.
static Result<std::string> ShareUniqueId(int rank, const std::string& file) {
  if (rank == 0) {
    CKPT_ASSIGN_OR_RETURN(std::string id, NcclGroup::NewUniqueId());
    std::ofstream(file + ".tmp", std::ios::binary) << id;
    if (std::rename((file + ".tmp").c_str(), file.c_str()) != 0) return IoError("rename " + file);
    return id;
  }
  for (int i = 0; i < 60000; ++i) {
    std::ifstream in(file, std::ios::binary);
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      if (ss.str().size() == 128) return ss.str();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return DeadlineExceeded("no unique id in " + file);
}

static int Collective(int argc, char** argv) {
  const std::string shm = argv[2];
  const int rank = std::atoi(argv[3]), world = std::atoi(argv[4]), device = std::atoi(argv[5]);
  const std::string kind = argv[6], mode = argv[7], id_file = argv[8];
  const double start_at = argc > 9 ? std::atof(argv[9]) : 0;
  GpuLoadOptions o;
  if (argc > 10) o.streams = std::atoi(argv[10]);
  if (argc > 11) o.chunk_bytes = static_cast<uint64_t>(std::atof(argv[11]) * 1048576.0);
  CHECK_CUDA(cudaSetDevice(device));
  CHECK_CUDA(cudaFree(nullptr));
  std::unique_ptr<NcclGroup> group;
  if (mode != "independent") {
    auto id = ShareUniqueId(rank, id_file);
    if (!id.ok()) return Die("unique id", id.status());
    auto g = NcclGroup::Create(*id, rank, world, device, {120});
    if (!g.ok()) return Die("group", g.status());
    group = std::move(*g);
  }
  auto plan = TpPlan::BuiltIn("gpt-neo");
  if (!plan.ok()) return Die("plan", plan.status());
  WaitUntil(start_at);

  auto t0 = Clock::now();
  auto reader = OpenSegment(shm);
  if (!reader.ok()) return Die("attach", reader.status());
  const shm::SegmentReader* r = reader->get();
  auto outs = kind == "tp" ? plan->Resolve(r->tensors(), rank, world) : plan->Resolve(r->tensors(), 0, 1);
  if (!outs.ok()) return Die("resolve", outs.status());
  auto loader = GpuLoaderImpl::Create(TensorSource{&r->tensors(), [r](size_t i) { return r->tensor_data(i); }}, device, o);
  if (!loader.ok()) return Die("loader", loader.status());
  CollectiveOptions co;
  co.mode = mode == "collective" ? CollectiveOptions::Mode::kCollective : CollectiveOptions::Mode::kAuto;
  auto dict = group ? (*loader)->LoadCollective(*outs, *group, co) : (*loader)->Load(*outs);
  if (!dict.ok()) return Die("load", dict.status());
  const double total_s = Since(t0);
  uint64_t out_bytes = 0;
  for (const auto& [n, t] : dict->tensors()) out_bytes += t.nbytes;
  const auto& st = dict->stats();
  std::printf("{\"what\":\"collective\",\"kind\":\"%s\",\"mode\":\"%s\",\"rank\":%d,\"world\":%d,\"streams\":%d,"
              "\"seconds\":%.4f,\"exchange_s\":%.4f,\"shared\":%s,\"host_GiB\":%.3f,\"received_GiB\":%.3f,"
              "\"sent_GiB\":%.3f,\"out_GiB\":%.3f}\n",
              kind.c_str(), mode.c_str(), rank, world, o.streams, total_s, st.exchange_seconds,
              st.collective ? "true" : "false", st.copied_bytes / 1073741824.0, st.received_bytes / 1073741824.0,
              st.sent_bytes / 1073741824.0, out_bytes / 1073741824.0);
  return 0;
}

static double PinnedLimit(int device, double gib) {
  if (cudaSetDevice(device) != cudaSuccess) return 0;
  const size_t bytes = static_cast<size_t>(gib * 1073741824.0);
  void *pinned = nullptr, *dev = nullptr;
  cudaStream_t st;
  if (cudaMallocHost(&pinned, bytes) != cudaSuccess || cudaMalloc(&dev, bytes) != cudaSuccess ||
      cudaStreamCreate(&st) != cudaSuccess)
    return 0;
  std::memset(pinned, 1, bytes);
  double best = 1e9;
  for (int i = 0; i < 6; ++i) {
    auto t0 = Clock::now();
    cudaMemcpyAsync(dev, pinned, bytes, cudaMemcpyHostToDevice, st);
    cudaStreamSynchronize(st);
    if (i > 0) best = std::min(best, Since(t0));
  }
  cudaStreamDestroy(st);
  cudaFree(dev);
  cudaFreeHost(pinned);
  return gib / best;
}

// The DMA side alone: `threads` threads, each with a stream, copy `gib` GiB from one pinned
// buffer to the device in `chunk` pieces, waiting (like the engine) for the copy made
// `buffers` copies before the next, or (buffers 0) never: GiB/s.
static double DmaOnly(double gib, uint64_t chunk, int threads, int buffers) {
  const size_t bytes = static_cast<size_t>(gib * 1073741824.0) / chunk * chunk;
  static void *pinned = nullptr, *dev = nullptr;  // made once: 2 GiB of pinned memory takes ~1 s
  static size_t have = 0;
  if (have < bytes) {
    if (have) {
      cudaFree(dev);
      cudaFreeHost(pinned);
    }
    if (cudaMallocHost(&pinned, bytes) != cudaSuccess || cudaMalloc(&dev, bytes) != cudaSuccess) return 0;
    std::memset(pinned, 3, bytes);
    have = bytes;
  }
  std::vector<cudaStream_t> st(threads);
  std::vector<std::vector<cudaEvent_t>> ev(threads, std::vector<cudaEvent_t>(std::max(1, buffers)));
  for (int t = 0; t < threads; ++t) {
    cudaStreamCreateWithFlags(&st[t], cudaStreamNonBlocking);
    for (auto& e : ev[t]) cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  }
  double best = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    std::atomic<size_t> next{0};
    const size_t n = bytes / chunk;
    auto t0 = Clock::now();
    std::vector<std::thread> th;
    for (int t = 0; t < threads; ++t) {
      th.emplace_back([&, t] {
        int k = 0;
        for (size_t i = next++; i < n; i = next++) {
          if (buffers > 0) cudaEventSynchronize(ev[t][k]);
          cudaMemcpyAsync(static_cast<char*>(dev) + i * chunk, static_cast<char*>(pinned) + i * chunk, chunk,
                          cudaMemcpyHostToDevice, st[t]);
          if (buffers > 0) {
            cudaEventRecord(ev[t][k], st[t]);
            k = (k + 1) % buffers;
          }
        }
        cudaStreamSynchronize(st[t]);
      });
    }
    for (auto& x : th) x.join();
    best = std::min(best, Since(t0));
  }
  for (int t = 0; t < threads; ++t) {
    for (auto& e : ev[t]) cudaEventDestroy(e);
    cudaStreamDestroy(st[t]);
  }
  return bytes / 1073741824.0 / best;
}

static int Sweep(int argc, char** argv) {
  const std::string shm = argv[2];
  const int device = std::atoi(argv[3]), reps = std::atoi(argv[4]);
  std::vector<int> worlds;
  {
    std::istringstream in(argv[5]);
    for (int w; in >> w;) worlds.push_back(w);
  }
  struct Config {
    std::string name, path;
    int streams = 16, buffers = 2;
    double chunk_mib = 0;
  };
  std::vector<Config> configs;
  for (int a = 6; a < argc; ++a) {
    Config c;
    c.name = argv[a];
    std::string f[4];
    std::istringstream in(c.name);
    for (auto& x : f) std::getline(in, x, ':');
    c.path = f[0];
    if (!f[1].empty()) c.streams = std::atoi(f[1].c_str());
    if (!f[2].empty()) c.chunk_mib = std::atof(f[2].c_str());
    if (!f[3].empty()) c.buffers = std::atoi(f[3].c_str());
    configs.push_back(c);
  }
  CHECK_CUDA(cudaSetDevice(device));
  CHECK_CUDA(cudaFree(nullptr));
  const double limit = PinnedLimit(device, 2.0);
  std::printf("{\"what\":\"sweep_limit\",\"device\":%d,\"pinned_GiBps\":%.2f}\n", device, limit);
  if (std::getenv("SWEEP_DMA")) {
    for (double mib : {1.0, 2.0, 4.0})
      for (int threads : {8, 16})
        for (int buffers : {0, 2}) {
          const double g = DmaOnly(2.0, static_cast<uint64_t>(mib * 1048576), threads, buffers);
          std::printf("{\"what\":\"sweep_dma\",\"chunk_MiB\":%g,\"threads\":%d,\"buffers\":%d,\"GiBps\":%.2f,"
                      "\"pct_of_limit\":%.1f}\n", mib, threads, buffers, g, 100 * g / limit);
          std::fflush(stdout);
        }
  }
  auto plan = TpPlan::BuiltIn("gpt-neo");
  if (!plan.ok()) return Die("plan", plan.status());
  // [config][world index][rep] = slowest rank's seconds
  std::vector<std::vector<std::vector<double>>> worst(configs.size(), std::vector<std::vector<double>>(worlds.size()));
  std::vector<std::vector<std::vector<double>>> worst_reuse = worst;
  std::vector<std::vector<double>> gib(configs.size(), std::vector<double>(worlds.size()));
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t ci = 0; ci < configs.size(); ++ci) {
      const Config& c = configs[ci];
      setenv("CKPT_COPY_BUFFERS", std::to_string(c.buffers).c_str(), 1);
      GpuLoadOptions o;
      o.streams = c.streams;
      o.chunk_bytes = static_cast<uint64_t>(c.chunk_mib * 1048576.0);
      o.path = c.path == "bounce" ? HostPath::kBounce : c.path == "pageable" ? HostPath::kPageable : HostPath::kRegister;
      for (size_t wi = 0; wi < worlds.size(); ++wi) {
        const int world = worlds[wi];
        double slowest = 0, slowest_reuse = 0;
        for (int rank = 0; rank < world; ++rank) {
          auto t0 = Clock::now();
          auto reader = OpenSegment(shm);
          if (!reader.ok()) return Die("attach", reader.status());
          const shm::SegmentReader* r = reader->get();
          auto outs = plan->Resolve(r->tensors(), rank, world);
          if (!outs.ok()) return Die("resolve", outs.status());
          auto loader =
              GpuLoaderImpl::Create(TensorSource{&r->tensors(), [r](size_t i) { return r->tensor_data(i); }}, device, o);
          if (!loader.ok()) return Die("loader", loader.status());
          double total_s, load_s, setup_s, reuse_s;
          uint64_t copied;
          {
            auto dict = (*loader)->Load(*outs);
            if (!dict.ok()) return Die("load", dict.status());
            total_s = Since(t0);
            load_s = dict->stats().total_seconds;
            setup_s = dict->stats().setup_seconds;
            copied = dict->stats().copied_bytes;
          }
          {
            auto dict = (*loader)->Load(*outs);  // the same loader again: its resources reused
            if (!dict.ok()) return Die("load again", dict.status());
            reuse_s = dict->stats().total_seconds;
          }
          slowest = std::max(slowest, total_s);
          slowest_reuse = std::max(slowest_reuse, reuse_s);
          gib[ci][wi] = copied / 1073741824.0;
          std::printf("{\"what\":\"sweep\",\"rep\":%d,\"config\":\"%s\",\"world\":%d,\"rank\":%d,\"seconds\":%.4f,"
                      "\"load_s\":%.4f,\"setup_s\":%.4f,\"again_s\":%.4f,\"GiB\":%.3f,\"GiBps\":%.2f}\n",
                      rep, c.name.c_str(), world, rank, total_s, load_s, setup_s, reuse_s, copied / 1073741824.0,
                      copied / 1073741824.0 / total_s);
          std::fflush(stdout);
        }
        worst[ci][wi].push_back(slowest);
        worst_reuse[ci][wi].push_back(slowest_reuse);
      }
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    for (size_t wi = 0; wi < worlds.size(); ++wi) {
      const double m = median(worst[ci][wi]), mr = median(worst_reuse[ci][wi]);
      const double mx = *std::max_element(worst[ci][wi].begin(), worst[ci][wi].end());
      std::printf("{\"what\":\"sweep_summary\",\"config\":\"%s\",\"world\":%d,\"median_slowest_s\":%.4f,"
                  "\"max_slowest_s\":%.4f,\"pct_of_limit\":%.1f,\"again_median_s\":%.4f,\"again_pct\":%.1f}\n",
                  configs[ci].name.c_str(), worlds[wi], m, mx, 100.0 * gib[ci][wi] / m / limit, mr,
                  100.0 * gib[ci][wi] / mr / limit);
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "segment" && argc == 4) return Segment(argv[2], argv[3]);
  if (mode == "limit" && argc >= 3) return Limit(std::atoi(argv[2]), argc > 3 ? std::atof(argv[3]) : 2.0, argc > 4 ? std::atof(argv[4]) : 0);
  if (mode == "load" && argc >= 8) return Load(argc, argv);
  if (mode == "collective" && argc >= 9) return Collective(argc, argv);
  if (mode == "unlink" && argc == 3) return Unlink(argv[2]);
  if (mode == "sweep" && argc >= 7) return Sweep(argc, argv);
  std::fprintf(stderr, "usage: see the comment at the top of tools/bench_gpu.cc\n");
  return 2;
}
