// A bounded load test against the real ckptd: client threads attach, read every byte,
// check it against the pattern the checkpoint announces, and detach, while an operator
// thread loads, replaces (--replace) and evicts (plain, --wait and --force) under a
// memory budget that forces LRU evictions. Bounded by count and time; prints figures.
// Expected: no wrong byte, no unexpected error, nothing left behind at the end.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "ckpt/client.h"
#include "integration/ops_helpers.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using testing::DaemonProcess;
using testing::ReadFile;
using testing::ScratchDir;

constexpr int kNames = 4, kVersions = 3, kReaders = 6;
constexpr uint64_t kRows = 1024;  // 1 MiB per checkpoint
constexpr double kSeconds = 20;
constexpr uint64_t kMaxAttachesPerReader = 3000;

TEST(LoadTest, ManyClientsWhileLoadingReplacingAndEvicting) {
  ScratchDir files;
  for (int n = 0; n < kNames; ++n) {
    for (int v = 1; v <= kVersions; ++v) {
      testing::WritePatternCheckpoint(files.File("c" + std::to_string(n) + "v" + std::to_string(v)), n + 1, v, kRows);
    }
  }
  // Room for about three of the four names: loads must evict unattached ones.
  DaemonProcess daemon({"--memory-budget", "7M", "--load-threads", "2"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> attaches{0}, not_found{0}, bytes_read{0}, wrong_bytes{0}, errors{0};
  std::atomic<uint64_t> loads{0}, replaces{0}, load_refused{0}, evicts{0}, evict_refused{0}, forced{0};
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(kSeconds);

  std::vector<std::thread> readers;
  for (int r = 0; r < kReaders; ++r) {
    readers.emplace_back([&, r] {
      std::mt19937 rng(100 + r);
      auto client = Client::Connect(daemon.socket());
      if (!client.ok()) {
        ++errors;
        return;
      }
      for (uint64_t i = 0; i < kMaxAttachesPerReader && !stop.load(); ++i) {
        const std::string name = "c" + std::to_string(rng() % kNames);
        auto ckpt = (*client)->Attach(name);
        if (!ckpt.ok()) {
          if (ckpt.status().code() == StatusCode::kNotFound) {
            ++not_found;  // evicted or not loaded yet: expected
          } else {
            ++errors;
            std::fprintf(stderr, "attach %s: %s\n", name.c_str(), ckpt.status().ToString().c_str());
          }
          continue;
        }
        ++attaches;
        auto meta = (*ckpt)->Tensor("meta");
        auto w = (*ckpt)->Tensor("w");
        if (!meta.ok() || !w.ok()) {
          ++errors;
          continue;
        }
        const auto* m = reinterpret_cast<const int64_t*>(meta->data);
        if (m[0] != std::stoi(name.substr(1)) + 1) ++wrong_bytes;  // another checkpoint's bytes
        wrong_bytes += testing::WrongFloats(m, reinterpret_cast<const float*>(w->data), w->info->nbytes / 4) * 4;
        bytes_read += w->info->nbytes;
        if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 20));  // hold a while
      }
    });
  }

  std::thread operator_thread([&] {
    std::mt19937 rng(7);
    auto client = Client::Connect(daemon.socket());
    if (!client.ok()) {
      ++errors;
      return;
    }
    while (std::chrono::steady_clock::now() < deadline) {
      const int n = static_cast<int>(rng() % kNames);
      const std::string name = "c" + std::to_string(n);
      const int action = static_cast<int>(rng() % 10);
      if (action < 6) {  // load or replace with a random version
        const std::string file = files.File(name + "v" + std::to_string(1 + rng() % kVersions));
        testing::CommandResult r = daemon.Ctl({"load", file, "--name", name, "--replace"});
        if (r.exit_code == 0) {
          ++loads;
        } else if (r.err.find("memory budget") != std::string::npos) {
          ++load_refused;  // everything else attached: documented refusal
        } else {
          ++errors;
          std::fprintf(stderr, "load: %s\n", r.err.c_str());
        }
      } else {
        std::vector<std::string> args = {"evict", name};
        if (action == 9) args.push_back("--force");
        if (action == 8) args.insert(args.end(), {"--wait", "0.2"});
        testing::CommandResult r = daemon.Ctl(args);
        if (r.exit_code == 0) {
          ++(action == 9 ? forced : evicts);
        } else if (r.err.find("attached") != std::string::npos || r.err.find("no checkpoint") != std::string::npos ||
                   r.err.find("still loading") != std::string::npos) {
          ++evict_refused;
        } else {
          ++errors;
          std::fprintf(stderr, "evict: %s\n", r.err.c_str());
        }
      }
      auto status = (*client)->GetStatus();
      if (!status.ok()) ++errors;
    }
    stop.store(true);
  });
  operator_thread.join();
  for (auto& t : readers) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // Every reader detached: at most one generation per name is left, and evicting all
  // leaves no segment behind.
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(testing::WaitFor([&] {
    auto s = (*client)->GetStatus();
    return s.ok() && s->attached == 0;
  }, 5000));
  auto list = (*client)->List();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(testing::SegmentCount(daemon.shm_prefix()), list->size()) << "retired generations were not freed";
  for (const auto& c : *list) EXPECT_TRUE((*client)->Evict(c.name).ok());
  EXPECT_EQ(testing::SegmentCount(daemon.shm_prefix()), 0u);

  std::printf(
      "load test: %.1f s, %d reader threads: %llu attaches (%llu not found while evicted), %.1f MiB read and checked; "
      "operator: %llu loads/replaces, %llu refused over budget, %llu evicts, %llu forced, %llu evicts refused; "
      "errors %llu, wrong bytes %llu\n",
      secs, kReaders, (unsigned long long)attaches.load(), (unsigned long long)not_found.load(),
      bytes_read.load() / 1048576.0, (unsigned long long)loads.load(), (unsigned long long)load_refused.load(),
      (unsigned long long)evicts.load(), (unsigned long long)forced.load(), (unsigned long long)evict_refused.load(),
      (unsigned long long)errors.load(), (unsigned long long)wrong_bytes.load());
  EXPECT_EQ(errors.load(), 0u);
  EXPECT_EQ(wrong_bytes.load(), 0u);
  EXPECT_GT(attaches.load(), 100u);
  EXPECT_GT(loads.load(), 10u);
  EXPECT_LT(secs, 60);
  EXPECT_TRUE(daemon.Running());
}

}  // namespace
}  // namespace ckpt
