// ckpt-bench-load: load throughput of the real loader (LoadIntoSegment into a POSIX shm
// segment) against baselines measured in the same run on the same file:
//   cold: `dd if=FILE of=/dev/null bs=16M iflag=direct`, after dropping the page cache
//         before every measurement (echo 3 > /proc/sys/vm/drop_caches, or
//         posix_fadvise(DONTNEED) on the file when that is not permitted);
//   warm: a plain single-threaded copy, read() of 16 MiB pieces into one buffer
//         (what `cat FILE > /dev/null` does), with the file in the page cache.
// Each configuration (engine x threads x I/O mode) runs --runs times, interleaved with
// the baseline so that noise hits both; the best and median are printed.
//
//   warm also: `cp FILE` into the segment root (one thread, what an operator would try).
//
//   ckpt-bench-load FILE [--mode cold|warm|both] [--runs N] [--configs LIST]
//                   [--segment-root DIR] [--tag TAG]
//   LIST: comma-separated ENGINE:THREADS[:qdN][:buffered][:fallocate|:parallel|:deferred][:nocrc],
//         e.g. pread:4,io_uring:2:qd8,pread:16:fallocate (how the segment's pages are
//         allocated, see shm::PagePopulate; default: the loader's default); nocrc drops the
//         plan's zip CRC-32 checks (PyTorch files: what checking them costs, same run)
//   --segment-root: where the per-run segment directories go (default /dev/shm; a tmpfs
//         mounted with huge=within_size measures huge-page segments)
//   --tag: printed in the machine-readable "RESULT tag mode label threads GiB/s" lines
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/aligned_buffer.h"
#include "format/checkpoint_formats.h"
#include "loader/checkpoint_loader.h"
#include "shm/segment_directory.h"

namespace {

using Clock = std::chrono::steady_clock;
using ckpt::loader::DirectIo;
using ckpt::loader::ReadEngine;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

struct Config {
  std::string label;
  ReadEngine engine = ReadEngine::kPread;
  int threads = 4;
  int queue_depth = 4;
  bool buffered = false;
  bool no_crc = false;  // the plan's CRC-32 checks dropped (measurement only)
  std::optional<ckpt::shm::PagePopulate> populate;
};

std::string g_segment_root = "/dev/shm";
std::string g_tag = "-";

std::vector<Config> ParseConfigs(const std::string& list) {
  std::vector<Config> configs;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    Config c;
    c.label = item;
    std::stringstream parts(item);
    std::string part;
    int k = 0;
    while (std::getline(parts, part, ':')) {
      if (k == 0) {
        auto e = ckpt::loader::ParseReadEngine(part);
        if (!e.ok()) {
          std::fprintf(stderr, "%s\n", e.status().message().c_str());
          std::exit(2);
        }
        c.engine = *e;
      } else if (k == 1) {
        c.threads = std::atoi(part.c_str());
      } else if (part.rfind("qd", 0) == 0) {
        c.queue_depth = std::atoi(part.c_str() + 2);
      } else if (part == "buffered") {
        c.buffered = true;
      } else if (part == "fallocate") {
        c.populate = ckpt::shm::PagePopulate::kFallocate;
      } else if (part == "parallel") {
        c.populate = ckpt::shm::PagePopulate::kParallel;
      } else if (part == "deferred") {
        c.populate = ckpt::shm::PagePopulate::kDeferred;
      } else if (part == "nocrc") {
        c.no_crc = true;
      } else {
        std::fprintf(stderr, "unknown config part '%s' in '%s'\n", part.c_str(), item.c_str());
        std::exit(2);
      }
      ++k;
    }
    configs.push_back(c);
  }
  return configs;
}

// Empties the page cache of `path`; returns how ("drop_caches" or "fadvise").
std::string DropCache(const std::string& path) {
  ::sync();
  int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY);
  if (fd >= 0) {
    bool ok = ::write(fd, "3", 1) == 1;
    ::close(fd);
    if (ok) return "drop_caches";
  }
  fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  return "fadvise";
}

double CachedFraction(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return 0;
  off_t size = ::lseek(fd, 0, SEEK_END);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return 0;
  std::vector<unsigned char> v((size + 4095) / 4096);
  size_t n = 0;
  if (::mincore(p, size, v.data()) == 0) {
    for (auto c : v) n += c & 1;
  }
  ::munmap(p, size);
  return static_cast<double>(n) / v.size();
}

// read() of the whole file in 16 MiB pieces into one buffer; returns bytes/s.
double SingleThreadRead(const std::string& path, uint64_t* bytes) {
  int fd = ::open(path.c_str(), O_RDONLY);
  std::vector<char> buf(16 << 20);
  const auto start = Clock::now();
  uint64_t total = 0;
  for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) total += n;
  const double s = Seconds(start);
  ::close(fd);
  *bytes = total;
  return total / s;
}

// read() of the whole file in 16 MiB pieces straight into a fresh shared-memory object of
// the file's size, reserved with posix_fallocate as the daemon's segments are: the same
// destination work as one loader thread, without checksums. Returns bytes/s.
double SingleThreadReadIntoShm(const std::string& path) {
  const std::string name = g_segment_root + "/ckpt-bench-copy-" + std::to_string(::getpid());
  int fd = ::open(path.c_str(), O_RDONLY);
  const off_t size = ::lseek(fd, 0, SEEK_SET) == 0 ? ::lseek(fd, 0, SEEK_END) : 0;
  const auto start = Clock::now();
  int shm = ::open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (shm < 0 || ::ftruncate(shm, size) != 0 || ::posix_fallocate(shm, 0, size) != 0) {
    if (shm >= 0) ::close(shm);
    ::unlink(name.c_str());
    ::close(fd);
    return 0;
  }
  char* dst = static_cast<char*>(::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0));
  ::close(shm);
  uint64_t total = 0;
  for (ssize_t n; (n = ::pread(fd, dst + total, std::min<uint64_t>(16 << 20, size - total), total)) > 0;) total += n;
  const double s = Seconds(start);
  ::munmap(dst, size);
  ::unlink(name.c_str());
  ::close(fd);
  return total / s;
}

// `cp FILE` into the segment root, timed with the wall clock (one thread); bytes/s.
double CpIntoShm(const std::string& path, uint64_t bytes) {
  const std::string dst = g_segment_root + "/ckpt-bench-cp-" + std::to_string(::getpid());
  const std::string cmd = "cp '" + path + "' '" + dst + "'";
  const auto start = Clock::now();
  const int rc = std::system(cmd.c_str());
  const double s = Seconds(start);
  ::unlink(dst.c_str());
  return rc == 0 ? bytes / s : 0;
}

// Runs dd with O_DIRECT and returns bytes/s from its own byte count and our wall clock.
double DdDirect(const std::string& path) {
  const std::string cmd = "dd if='" + path + "' of=/dev/null bs=16M iflag=direct 2>&1";
  const auto start = Clock::now();
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return 0;
  char line[512];
  unsigned long long bytes = 0;
  while (std::fgets(line, sizeof(line), p)) {
    unsigned long long b;
    if (std::sscanf(line, "%llu bytes", &b) == 1) bytes = b;
  }
  const int rc = ::pclose(p);
  const double s = Seconds(start);
  return rc == 0 ? bytes / s : 0;
}

// Loads `plan` into a fresh segment with `c`; returns bytes/s (0 on failure) and the I/O summary.
double Load(const ckpt::format::LoadPlan& full_plan, const Config& c, std::string* io) {
  static int n = 0;
  const ckpt::format::LoadPlan* chosen = &full_plan;
  ckpt::format::LoadPlan unchecked;
  if (c.no_crc && !full_plan.crc_checks.empty()) {
    unchecked = full_plan;
    unchecked.crc_checks.clear();
    chosen = &unchecked;
  }
  const ckpt::format::LoadPlan& plan = *chosen;
  ckpt::shm::SegmentSpec spec;
  // A private segment directory per run, removed with the segment.
  auto dir = ckpt::shm::SegmentDirectory::Open(
      g_segment_root + "/ckpt-bench-" + std::to_string(::getpid()) + "-" + std::to_string(++n));
  if (!dir.ok()) {
    std::fprintf(stderr, "segment directory: %s\n", dir.status().ToString().c_str());
    return 0;
  }
  struct DirRemover {
    const ckpt::shm::SegmentDirectory& d;
    ~DirRemover() { (void)::rmdir(d.path().c_str()); }
  } remove_dir{**dir};
  spec.directory = dir->get();
  spec.checkpoint_name = "bench";
  spec.source_path = plan.files.empty() ? "" : plan.files[0]->path;
  spec.generation = n;
  ckpt::loader::LoadOptions options;
  options.engine = c.engine;
  options.threads = c.threads;
  options.queue_depth = c.queue_depth;
  options.direct_io = c.buffered ? DirectIo::kNever : DirectIo::kAuto;
  if (c.populate) options.populate = *c.populate;
  auto loaded = ckpt::loader::LoadIntoSegment(plan, spec, options);
  if (!loaded.ok()) {
    std::fprintf(stderr, "load failed: %s\n", loaded.status().ToString().c_str());
    return 0;
  }
  if (ckpt::Status st = (*dir)->Remove(loaded->file_name); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
  }
  char pages[160];
  std::snprintf(pages, sizeof(pages), "; %s pages, %.2f of %.2f GiB huge-mapped, %s",
                ckpt::shm::PageSizeName(loaded->page_bytes).c_str(), loaded->huge_bytes / 1073741824.0,
                loaded->segment_bytes / 1073741824.0, loaded->populate_summary.c_str());
  *io = loaded->io_summary + pages;
  return loaded->data_bytes / loaded->seconds;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2);
}

void Report(const char* mode, const std::string& baseline_name, const std::vector<double>& baseline,
            const std::vector<Config>& configs, const std::map<std::string, std::vector<double>>& results,
            const std::map<std::string, std::vector<double>>& ratios, const std::map<std::string, std::string>& io) {
  const double gib = 1024.0 * 1024 * 1024;
  std::printf("\n== %s: %zu runs each; GiB/s (best / median); ratio = loader / baseline of the same run\n", mode,
              baseline.size());
  std::printf("%-28s %8.3f / %8.3f GiB/s\n", baseline_name.c_str(), *std::max_element(baseline.begin(), baseline.end()) / gib,
              Median(baseline) / gib);
  for (const Config& c : configs) {
    const auto& r = results.at(c.label);
    const auto& q = ratios.at(c.label);
    std::printf("%-28s %8.3f / %8.3f GiB/s   ratio %5.2f / %5.2f   [%s]\n", c.label.c_str(),
                *std::max_element(r.begin(), r.end()) / gib, Median(r) / gib, *std::max_element(q.begin(), q.end()),
                Median(q), io.at(c.label).c_str());
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE [--mode cold|warm|both] [--runs N] [--configs LIST]\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  std::string mode = "both";
  int runs = 3;
  std::string cold_list = "pread:2,pread:4,pread:8,pread:4:buffered,io_uring:1:qd4,io_uring:1:qd8,io_uring:1:qd16,io_uring:2:qd8";
  std::string warm_list = "pread:1,pread:2,pread:4,io_uring:1:qd4,io_uring:2:qd4";
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--mode") mode = argv[i + 1];
    else if (flag == "--runs") runs = std::atoi(argv[i + 1]);
    else if (flag == "--configs") cold_list = warm_list = argv[i + 1];
    else if (flag == "--cold-configs") cold_list = argv[i + 1];
    else if (flag == "--warm-configs") warm_list = argv[i + 1];
    else if (flag == "--segment-root") g_segment_root = argv[i + 1];
    else if (flag == "--tag") g_tag = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown option %s\n", flag.c_str());
      return 2;
    }
  }
  auto plan = ckpt::format::PlanCheckpoint(path);
  if (!plan.ok()) {
    std::fprintf(stderr, "%s\n", plan.status().ToString().c_str());
    return 1;
  }
  std::printf("file %s: %zu tensors, %.3f GiB of tensor data\n", path.c_str(), plan->tensors.size(),
              plan->TotalBytes() / 1073741824.0);

  if (mode == "cold" || mode == "both") {
    auto configs = ParseConfigs(cold_list);
    std::vector<double> baseline;
    std::map<std::string, std::vector<double>> results, ratios;
    std::map<std::string, std::string> io;
    for (int run = 0; run < runs; ++run) {
      std::string how = DropCache(path);
      std::printf("cold run %d: cache dropped with %s (%.1f%% of the file cached)\n", run + 1, how.c_str(),
                  100 * CachedFraction(path));
      const double dd = DdDirect(path);
      baseline.push_back(dd);
      std::printf("  %-26s %.3f GiB/s\n", "dd bs=16M iflag=direct", dd / 1073741824.0);
      std::printf("RESULT %s cold dd 1 %.4f\n", g_tag.c_str(), dd / 1073741824.0);
      for (const Config& c : configs) {
        DropCache(path);
        std::string summary;
        const double r = Load(*plan, c, &summary);
        results[c.label].push_back(r);
        ratios[c.label].push_back(dd > 0 ? r / dd : 0);
        io[c.label] = summary;
        std::printf("  %-26s %.3f GiB/s (%.2f x dd) [%s]\n", c.label.c_str(), r / 1073741824.0, dd > 0 ? r / dd : 0,
                    summary.c_str());
        std::printf("RESULT %s cold %s %d %.4f\n", g_tag.c_str(), c.label.c_str(), c.threads, r / 1073741824.0);
        std::fflush(stdout);
      }
    }
    Report("cold cache", "dd bs=16M iflag=direct", baseline, configs, results, ratios, io);
  }
  if (mode == "warm" || mode == "both") {
    auto configs = ParseConfigs(warm_list);
    std::vector<double> baseline;
    std::map<std::string, std::vector<double>> results, ratios;
    std::map<std::string, std::string> io;
    std::vector<double> shm_baseline;
    uint64_t bytes = 0;
    SingleThreadRead(path, &bytes);  // brings the file into the page cache
    for (int run = 0; run < runs; ++run) {
      std::printf("warm run %d: %.1f%% of the file cached\n", run + 1, 100 * CachedFraction(path));
      const double base = SingleThreadRead(path, &bytes);
      baseline.push_back(base);
      std::printf("  %-26s %.3f GiB/s\n", "1-thread read() 16 MiB", base / 1073741824.0);
      const double into_shm = SingleThreadReadIntoShm(path);
      shm_baseline.push_back(into_shm);
      std::printf("  %-26s %.3f GiB/s\n", "1-thread read() into shm", into_shm / 1073741824.0);
      const double cp = CpIntoShm(path, bytes);
      std::printf("  %-26s %.3f GiB/s\n", "cp into the segment root", cp / 1073741824.0);
      std::printf("RESULT %s warm read 1 %.4f\nRESULT %s warm read-into-shm 1 %.4f\nRESULT %s warm cp 1 %.4f\n",
                  g_tag.c_str(), base / 1073741824.0, g_tag.c_str(), into_shm / 1073741824.0, g_tag.c_str(),
                  cp / 1073741824.0);
      for (const Config& c : configs) {
        std::string summary;
        const double r = Load(*plan, c, &summary);
        results[c.label].push_back(r);
        ratios[c.label].push_back(base > 0 ? r / base : 0);
        io[c.label] = summary;
        std::printf("  %-26s %.3f GiB/s (%.2f x read) [%s]\n", c.label.c_str(), r / 1073741824.0,
                    base > 0 ? r / base : 0, summary.c_str());
        std::printf("RESULT %s warm %s %d %.4f\n", g_tag.c_str(), c.label.c_str(), c.threads, r / 1073741824.0);
        std::fflush(stdout);
      }
    }
    Report("page cache (warm)", "1-thread read() 16 MiB", baseline, configs, results, ratios, io);
    std::printf("%-28s %8.3f / %8.3f GiB/s   (fresh fallocated shm destination, like a segment)\n",
                "1-thread read() into shm", *std::max_element(shm_baseline.begin(), shm_baseline.end()) / 1073741824.0,
                Median(shm_baseline) / 1073741824.0);
  }
  return 0;
}
