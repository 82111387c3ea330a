// Collective loads (issue 7) with the real daemon, one process per rank and GPU, as jobs
// run them: every rank's tensors after LoadCollective equal, byte for byte, what the
// independent GpuLoader::Load gives (itself checked against host reference slices in
// gpu_loader_test) and, for replicated tensors, the checkpoint's bytes. A rank that never
// joins or dies makes the others fail within the timeout. Label gpu: skips without GPUs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "ckpt/client.h"
#include "ckpt/collective.h"
#include "ckpt/gpu.h"
#include "ckpt/tp_plan.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using Clock = std::chrono::steady_clock;

// GPUs present, counted in a child so that this process never initialises CUDA (the rank
// processes are forked from it).
int GpuCount() {
  pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(std::min(n, 100));
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

// Runs body(rank) in `world` forked processes; returns their exit codes. A body reports a
// failure on stderr and returns nonzero.
std::vector<int> RunRanks(int world, const std::function<int(int)>& body) {
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int rc = 1;
      try {
        rc = body(r);
      } catch (...) {
      }
      std::fflush(nullptr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

int Fail(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  return 1;
}

std::vector<char> ToHost(const GpuTensor& t) {
  std::vector<char> out(t.nbytes);
  if (t.nbytes && cudaMemcpy(out.data(), t.data, t.nbytes, cudaMemcpyDeviceToHost) != cudaSuccess) out.clear();
  return out;
}

constexpr const char* kTpPlan = R"({"default": "replicate", "rules": [
  {"pattern": "qkv\\.(weight|bias)$", "rule": "fused_qkv"},
  {"pattern": "out_proj\\.weight$", "rule": "row", "transpose": true},
  {"pattern": "c_fc\\.weight$", "rule": "column"},
  {"pattern": "c_proj\\.weight$", "rule": "row"},
  {"pattern": "^wte\\.weight$", "rule": "vocab"}]})";

class CollectiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gpus_ = GpuCount();
    if (gpus_ < 1) GTEST_SKIP() << "no CUDA device";
    ASSERT_NO_FATAL_FAILURE(
        testing::MakeCheckpoint({files_.File("model.safetensors"), "--mib", "24", "--layers", "3"}));
    ASSERT_TRUE(daemon_.Start());
    auto load = daemon_.Ctl({"load", files_.File("model.safetensors"), "--name", "model"});
    ASSERT_EQ(load.exit_code, 0) << load.err;
  }

  // One rank: joins `job`, loads its outputs collectively and independently, compares.
  int LoadAndCompare(int rank, int world, int tp_rank, int tp_world, const std::string& job,
                     CollectiveOptions::Mode mode, bool expect_shared) {
    auto client = Client::Connect(daemon_.socket());
    if (!client.ok()) return Fail(rank, client.status().ToString());
    auto ckpt = (*client)->Attach("model");
    if (!ckpt.ok()) return Fail(rank, ckpt.status().ToString());
    auto group = NcclGroup::Join(**client, job, rank, world, rank, {60});
    if (!group.ok()) return Fail(rank, group.status().ToString());
    auto plan = TpPlan::FromJson(kTpPlan);
    if (!plan.ok()) return Fail(rank, plan.status().ToString());
    auto outs = plan->Resolve((*ckpt)->tensors(), tp_rank, tp_world);
    if (!outs.ok()) return Fail(rank, outs.status().ToString());
    auto loader = GpuLoader::Create(**ckpt, rank, {});
    if (!loader.ok()) return Fail(rank, loader.status().ToString());
    CollectiveOptions options;
    options.mode = mode;
    auto shared = (*loader)->LoadCollective(*outs, **group, options);
    if (!shared.ok()) return Fail(rank, "LoadCollective: " + shared.status().ToString());
    if (shared->stats().collective != expect_shared) return Fail(rank, "collective flag differs from the expectation");
    if (expect_shared && world > 1 && shared->stats().received_bytes + shared->stats().sent_bytes == 0)
      return Fail(rank, "a collective load that moved nothing between ranks");
    auto alone = (*loader)->Load(*outs);
    if (!alone.ok()) return Fail(rank, "Load: " + alone.status().ToString());
    if (shared->tensors().size() != outs->size()) return Fail(rank, "missing outputs");
    for (const ShardOutput& out : *outs) {
      const GpuTensor& a = shared->at(out.name);
      const GpuTensor& b = alone->at(out.name);
      if (a.dtype != b.dtype || a.shape != b.shape || ToHost(a) != ToHost(b))
        return Fail(rank, "output '" + out.name + "' differs from the independent load");
      if (out.pieces.size() == 1 && out.pieces[0].spec.kind == ShardSpec::Kind::kReplicate) {
        auto view = (*ckpt)->Tensor(out.name);
        std::vector<char> host = ToHost(a);
        if (!view.ok() || host.size() != view->info->nbytes ||
            std::memcmp(host.data(), view->data, host.size()) != 0)
          return Fail(rank, "replicated output '" + out.name + "' differs from the checkpoint's bytes");
      }
    }
    return 0;
  }

  int gpus_ = 0;
  testing::ScratchDir files_;
  testing::DaemonProcess daemon_;
};

TEST_F(CollectiveTest, WholeReplicasOnEveryRankEqualTheCheckpoint) {
  if (gpus_ < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus_;
  const int world = std::min(gpus_, 4);
  const std::string job = "replicas-" + std::to_string(getpid());
  auto codes = RunRanks(world, [&](int r) {
    return LoadAndCompare(r, world, 0, 1, job, CollectiveOptions::Mode::kCollective, true);
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST_F(CollectiveTest, TensorParallelShardsWithReplicatedTensorsShared) {
  if (gpus_ < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus_;
  const int world = 2;
  const std::string job = "tp-" + std::to_string(getpid());
  auto codes = RunRanks(world, [&](int r) {
    return LoadAndCompare(r, world, r, world, job, CollectiveOptions::Mode::kCollective, true);
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST_F(CollectiveTest, TwoDataParallelReplicasOfTensorParallelShards) {
  if (gpus_ < 4) GTEST_SKIP() << "needs 4 GPUs, found " << gpus_;
  const std::string job = "tpdp-" + std::to_string(getpid());
  auto codes = RunRanks(4, [&](int r) {
    return LoadAndCompare(r, 4, r % 2, 2, job, CollectiveOptions::Mode::kCollective, true);
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST_F(CollectiveTest, AutoModeFallsBackToIndependentCopiesForSmallSharedBytes) {
  if (gpus_ < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus_;
  // The replicated tensors of this checkpoint are far below the 64 MiB default.
  const std::string job = "auto-" + std::to_string(getpid());
  auto codes = RunRanks(2, [&](int r) {
    return LoadAndCompare(r, 2, r, 2, job, CollectiveOptions::Mode::kAuto, false);
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST_F(CollectiveTest, ARankThatNeverJoinsIsDeadlineExceededWithinTheTimeout) {
  const std::string job = "absent-" + std::to_string(getpid());
  auto codes = RunRanks(1, [&](int r) {
    auto client = Client::Connect(daemon_.socket());
    if (!client.ok()) return Fail(r, client.status().ToString());
    const auto t0 = Clock::now();
    auto group = NcclGroup::Join(**client, job, 0, 2, 0, {3.0});
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (group.ok()) return Fail(r, "joined a group whose other rank never came");
    if (group.status().code() != StatusCode::kDeadlineExceeded) return Fail(r, group.status().ToString());
    if (group.status().message().find("join") == std::string::npos) return Fail(r, group.status().ToString());
    if (s < 2.9 || s > 15) return Fail(r, "failed after " + std::to_string(s) + " s, not about 3 s");
    return 0;
  });
  EXPECT_EQ(codes[0], 0);
}

TEST_F(CollectiveTest, ARankThatDiesBeforeLoadingMakesTheOthersFailWithinTheTimeout) {
  if (gpus_ < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus_;
  const std::string job = "dies-" + std::to_string(getpid());
  auto codes = RunRanks(2, [&](int r) {
    auto client = Client::Connect(daemon_.socket());
    if (!client.ok()) return Fail(r, client.status().ToString());
    auto ckpt = (*client)->Attach("model");
    if (!ckpt.ok()) return Fail(r, ckpt.status().ToString());
    auto group = NcclGroup::Join(**client, job, r, 2, r, {4.0});
    if (!group.ok()) return Fail(r, group.status().ToString());
    if (r == 1) _exit(0);  // dies without a word
    auto outs = TpPlan::FromJson(R"({"default": "replicate", "rules": []})")->Resolve((*ckpt)->tensors(), 0, 1);
    auto loader = GpuLoader::Create(**ckpt, r, {});
    if (!loader.ok()) return Fail(r, loader.status().ToString());
    const auto t0 = Clock::now();
    auto dict = (*loader)->LoadCollective(*outs, **group, {});
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (dict.ok()) return Fail(r, "loaded although the other rank died");
    const StatusCode code = dict.status().code();
    if (code != StatusCode::kDeadlineExceeded && code != StatusCode::kUnavailable) return Fail(r, dict.status().ToString());
    if (s > 20) return Fail(r, "failed only after " + std::to_string(s) + " s");
    if (!(*group)->broken()) return Fail(r, "the group is not marked broken");
    auto again = (*loader)->LoadCollective(*outs, **group, {});
    if (again.status().code() != StatusCode::kFailedPrecondition) return Fail(r, "a broken group was used again");
    std::fprintf(stderr, "rank 0 failed as expected after %.2f s: %s\n", s, dict.status().ToString().c_str());
    return 0;
  });
  EXPECT_EQ(codes[0], 0);
}

}  // namespace
}  // namespace ckpt
