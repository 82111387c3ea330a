// Host-path experiment behind the copy engine's defaults (issue 4; docs/benchmarks-archive-2026-12.md,
// "Host path: small pinned bounce buffers on every thread"). Standalone, needs only the CUDA toolkit and one GPU:
//   tools/gpu/host_path_micro.sh [GIB...]      (builds with nvcc, runs on 4 KiB then huge pages)
// On a fresh read-only mapping of a /dev/shm file of GIB GiB it times:
//   1. making 256 MiB of pinned memory: cudaMallocHost vs THP mmap + cudaHostRegister;
//   2. register-then-DMA, bounce (memcpy into pinned buffers + DMA), and both at once
//      meeting in the middle (registration from the front, bounce threads from the back);
//   3. bounce with 8/16/24 threads x 1/2/4/16 MiB buffers (two per thread).
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using Clock = std::chrono::steady_clock;
static double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } } while (0)

static const char* kPath = "/dev/shm/micro-host-path";
static size_t g_bytes;
static char* g_dev;
static size_t kChunk = 16ull << 20; static const size_t kGroup = 64ull << 20;

static char* MapFresh() {
  int fd = open(kPath, O_RDONLY);
  void* p = mmap(nullptr, g_bytes, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) { perror("mmap"); std::exit(1); }
  return static_cast<char*>(p);
}
static long PmdMapped() {
  FILE* f = fopen("/proc/meminfo", "r"); char line[256]; long v = -1;
  while (fgets(line, sizeof line, f)) if (!strncmp(line, "ShmemPmdMapped:", 15)) v = atol(line + 15);
  fclose(f); return v;
}

struct Bouncer {
  cudaStream_t st; char* pin[2]; cudaEvent_t ev[2]; int which = 0;
  Bouncer() {
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int k = 0; k < 2; ++k) { CK(cudaHostAlloc((void**)&pin[k], kChunk, 0)); CK(cudaEventCreateWithFlags(&ev[k], cudaEventDisableTiming)); CK(cudaEventRecord(ev[k], st)); }
  }
  void Copy(const char* src, size_t off, size_t n) {
    CK(cudaEventSynchronize(ev[which]));
    std::memcpy(pin[which], src, n);
    CK(cudaMemcpyAsync(g_dev + off, pin[which], n, cudaMemcpyHostToDevice, st));
    CK(cudaEventRecord(ev[which], st));
    which ^= 1;
  }
};

// Work over [0, bytes) in kChunk pieces: register side from the front (registrar in kGroup
// groups + `rstreams` DMA streams), bounce side (`bthreads`) from the back.
struct Result { double total, reg_s, reg_GiB, bounce_GiB; };
static Result Run(char* base, size_t bytes, int regthreads, int rstreams, int bthreads, std::vector<Bouncer>& bouncers) {
  const size_t nchunks = (bytes + kChunk - 1) / kChunk;
  std::mutex mu; std::condition_variable cv;
  size_t front = 0, back = nchunks;  // claimed [0, front) by register side, [back, n) by bounce
  size_t reg_done_chunks = 0;        // chunks [0, reg_done_chunks) registered
  bool reg_finished = regthreads == 0;
  std::vector<void*> regs;
  double reg_s = 0;
  size_t bounce_chunks = 0;
  auto t0 = Clock::now();
  std::vector<std::thread> th;
  if (regthreads > 0) {
    th.emplace_back([&] {
      auto r0 = Clock::now();
      for (;;) {
        size_t a, b;
        {
          std::lock_guard<std::mutex> l(mu);
          if (front >= back) break;
          a = front; b = std::min(back, front + kGroup / kChunk); front = b;
        }
        void* p = base + a * kChunk; size_t n = std::min(bytes, b * kChunk) - a * kChunk;
        CK(cudaHostRegister(p, n, cudaHostRegisterReadOnly));
        std::lock_guard<std::mutex> l(mu);
        regs.push_back(p); reg_done_chunks = b; cv.notify_all();
      }
      std::lock_guard<std::mutex> l(mu);
      reg_finished = true; reg_s = Since(r0); cv.notify_all();
    });
    std::atomic<size_t> next{0};
    for (int s = 0; s < rstreams; ++s) th.emplace_back([&] {
      cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      for (;;) {
        size_t i = next++;
        {
          std::unique_lock<std::mutex> l(mu);
          cv.wait(l, [&] { return i < reg_done_chunks || (reg_finished && i >= front); });
          if (i >= reg_done_chunks) break;
        }
        size_t n = std::min(bytes, (i + 1) * kChunk) - i * kChunk;
        CK(cudaMemcpyAsync(g_dev + i * kChunk, base + i * kChunk, n, cudaMemcpyHostToDevice, st));
      }
      CK(cudaStreamSynchronize(st)); cudaStreamDestroy(st);
    });
  }
  for (int b = 0; b < bthreads; ++b) th.emplace_back([&, b] {
    for (;;) {
      size_t i;
      {
        std::lock_guard<std::mutex> l(mu);
        if (back <= front) break;
        i = --back; ++bounce_chunks;
      }
      size_t n = std::min(bytes, (i + 1) * kChunk) - i * kChunk;
      bouncers[b].Copy(base + i * kChunk, i * kChunk, n);
    }
    CK(cudaStreamSynchronize(bouncers[b].st));
  });
  for (auto& t : th) t.join();
  Result r{Since(t0), reg_s, 0, 0};
  r.reg_GiB = double(front) * kChunk / (1 << 30);
  r.bounce_GiB = double(bounce_chunks) * kChunk / (1 << 30);
  for (void* p : regs) CK(cudaHostUnregister(p));
  return r;
}

int main(int argc, char** argv) {
  double gib = argc > 1 ? atof(argv[1]) : 8;
  g_bytes = size_t(gib * (1ull << 30));
  CK(cudaSetDevice(0)); CK(cudaFree(nullptr));
  { int fd = open(kPath, O_RDWR | O_CREAT | O_TRUNC, 0600); if (ftruncate(fd, g_bytes)) return 1;
    char* p = (char*)mmap(nullptr, g_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0); close(fd);
    auto t = Clock::now(); std::memset(p, 7, g_bytes); std::printf("fill %.2f GiB %.2f s\n", gib, Since(t)); munmap(p, g_bytes); }
  CK(cudaMalloc((void**)&g_dev, g_bytes));
  { char* m = MapFresh(); auto t = Clock::now(); madvise(m, g_bytes, 22 /*MADV_POPULATE_READ*/); std::printf("populate (fresh map) %.3f s  %.1f GiB/s  PmdMapped %ld kB  addr %% 2M = %lu\n", Since(t), gib / Since(t), PmdMapped(), (unsigned long)((uintptr_t)m % (2u << 20))); munmap(m, g_bytes); }
  // 1. Pinned allocation methods, 256 MiB.
  for (int rep = 0; rep < 2; ++rep) {
    const size_t n = 256ull << 20;
    auto t = Clock::now(); void* a; CK(cudaHostAlloc(&a, n, 0)); double ha = Since(t);
    t = Clock::now(); void* b = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(b, n, MADV_HUGEPAGE); int pw = madvise(b, n, 23 /*MADV_POPULATE_WRITE*/); double pop = Since(t);
    CK(cudaHostRegister(b, n, 0)); double hb = Since(t);
    t = Clock::now(); void* c = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CK(cudaHostRegister(c, n, 0)); double hc = Since(t);
    std::printf("alloc 256 MiB pinned: cudaHostAlloc %.4f s; THP mmap+populate(%d) %.4f + register = %.4f s; 4K mmap+register %.4f s\n", ha, pw, pop, hb, hc);
    cudaFreeHost(a); cudaHostUnregister(b); munmap(b, n); cudaHostUnregister(c); munmap(c, n);
  }
  // 2. Register vs bounce vs both at once, 16 MiB chunks.
  struct Cfg { const char* name; int reg, rs, bt; };
  const Cfg cfgs[] = {{"register 1 thread, 4 streams", 1, 4, 0}, {"bounce 8", 0, 0, 8}, {"bounce 16", 0, 0, 16},
                      {"register + bounce 4", 1, 4, 4}, {"register + bounce 8", 1, 4, 8}};
  for (int rep = 0; rep < 2; ++rep)
    for (const Cfg& c : cfgs) {
      std::vector<Bouncer> bs(c.bt);
      char* m = MapFresh();
      Result r = Run(m, g_bytes, c.reg, c.rs, c.bt, bs);
      std::printf("%-30s %.2f GiB: %.3f s  %5.1f GiB/s   registered %.2f GiB in %.3f s, bounced %.2f GiB\n", c.name, gib,
                  r.total, gib / r.total, r.reg_GiB, r.reg_s, r.bounce_GiB);
      munmap(m, g_bytes);
      for (auto& b : bs) { cudaFreeHost(b.pin[0]); cudaFreeHost(b.pin[1]); }
    }
  // 3. Bounce: threads x buffer size.
  for (int rep = 0; rep < 2; ++rep)
    for (size_t chunk_mib : {1, 2, 4, 16})
      for (int bt : {8, 16, 24}) {
        kChunk = chunk_mib << 20;
        std::vector<Bouncer> bs(bt);
        char* m = MapFresh();
        Result r = Run(m, g_bytes, 0, 0, bt, bs);
        std::printf("bounce %2d x %2zu MiB  %.2f GiB: %.3f s  %5.1f GiB/s\n", bt, chunk_mib, gib, r.total, gib / r.total);
        munmap(m, g_bytes);
        for (auto& b : bs) { cudaFreeHost(b.pin[0]); cudaFreeHost(b.pin[1]); }
      }
  unlink(kPath);
}
