// What a copy-engine worker's gather costs from a mapping it touches for the first time
// (issue 14; docs/benchmarks-archive-2026-12.md, "The merged engine on 4 KiB and huge pages"). Standalone,
// one thread, no GPU:
//   g++ -O2 -o /tmp/gather_micro tools/gather_micro.cc && /tmp/gather_micro [ROW PITCH [GIB]]
// Writes a GIB GiB file in /dev/shm (default 1), then copies ROW bytes of every PITCH bytes
// (default 2560 of 10240: a TP=4 row-parallel shard of a 2560-wide fp32 matrix) into a
// reused 2 MiB buffer, as the engine gathers into a bounce buffer: from a fresh read-only
// mapping (its page-table entries filled by the faults), then again from that mapping
// once faulted in. Run it with /dev/shm on 4 KiB and on huge pages to compare.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  const size_t row = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 2560;
  const size_t pitch = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 10240;
  const size_t total = static_cast<size_t>((argc > 3 ? std::atof(argv[3]) : 1.0) * (1 << 30)) / pitch * pitch;
  if (row == 0 || row > pitch || total == 0) return std::fprintf(stderr, "need 0 < ROW <= PITCH\n"), 2;
  const char* path = "/dev/shm/gather_micro";
  const int fd = ::open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(total)) != 0) return std::perror("/dev/shm"), 1;
  ::unlink(path);
  void* w = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (w == MAP_FAILED) return std::perror("mmap"), 1;
  std::memset(w, 1, total);
  ::munmap(w, total);
  std::vector<char> buf(2 << 20);
  const size_t rows_per_buf = buf.size() / row, rows = total / pitch;
  const auto* src = static_cast<const char*>(::mmap(nullptr, total, PROT_READ, MAP_SHARED, fd, 0));
  if (src == MAP_FAILED) return std::perror("mmap"), 1;
  for (const char* pass : {"fresh mapping", "faulted in"}) {
    const auto t0 = std::chrono::steady_clock::now();
    size_t copied = 0;
    for (size_t r0 = 0; r0 < rows; r0 += rows_per_buf) {
      const size_t n = std::min(rows_per_buf, rows - r0);
      for (size_t r = 0; r < n; ++r) std::memcpy(buf.data() + r * row, src + (r0 + r) * pitch, row);
      copied += n * row;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%zu of every %zu bytes, %s: %.2f GiB/s of copied bytes (%.3f s)\n", row, pitch, pass,
                copied / s / (1 << 30), s);
  }
  return 0;
}
