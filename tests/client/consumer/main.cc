// ckpt-consumer SOCKET NAME: what a C++ user of the installed libckptclient does on a
// node without GPU libraries (tests/client/install_test.sh runs it under
// tests/support/without_gpu_libs.sh): attach, views, shards and partitions work; the GPU
// calls fail with an error naming what is missing. Prints one line per check: "ok ..." or
// "FAIL ..."; "gpu-error: ..." and "nccl-error: ..." carry the errors for the script to
// check; exits 0 only if every check passed.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/client.h"
#include "ckpt/collective.h"
#include "ckpt/gpu.h"
#include "ckpt/shard.h"
#include "ckpt/tp_plan.h"

namespace {
int failures = 0;
void Check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) ++failures;
}
bool GpuLibraryMapped() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("libcudart") != std::string::npos || line.find("libcuda.") != std::string::npos ||
        line.find("libnccl") != std::string::npos)
      return true;
  }
  return false;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: ckpt-consumer SOCKET NAME\n");
    return 2;
  }
  for (const char* lib : {"libcudart.so.13", "libcuda.so.1", "libnccl.so.2"}) {
    void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    Check(h == nullptr, std::string(lib) + " cannot be loaded here");
  }
  auto client = ckpt::Client::Connect(argv[1]);
  Check(client.ok(), "connect: " + client.status().ToString());
  if (!client.ok()) return 1;
  auto checkpoint = (*client)->Attach(argv[2]);
  Check(checkpoint.ok(), "attach: " + checkpoint.status().ToString());
  if (!checkpoint.ok()) return 1;
  const ckpt::Checkpoint& c = **checkpoint;
  Check(!c.tensors().empty(), "tensors listed");
  uint64_t viewed = 0;
  for (const ckpt::TensorInfo& t : c.tensors()) {
    auto view = c.Tensor(t.name);
    if (view.ok()) viewed += 1;
  }
  Check(viewed == c.tensors().size(), "every tensor viewed");
  auto split = c.PlanShard("wte.weight", ckpt::ShardSpec::Split(0, 1, 2));
  Check(split.ok() && split->nbytes * 2 == c.Tensor("wte.weight")->info->nbytes, "column shard of wte.weight");
  auto part = c.PlanShard("h.0.attn.qkv.bias", ckpt::ShardSpec::FlatPartition(2, 3));
  Check(part.ok(), "ZeRO-3 partition: " + part.status().ToString());
  auto plan = ckpt::TpPlan::BuiltIn("gpt-neo");
  Check(plan.ok(), "built-in plan");
  Check(!ckpt::GpuAvailable(), "GpuAvailable() is false");

  auto loader = ckpt::GpuLoader::Create(c, 0, {});
  Check(!loader.ok() && loader.status().code() == ckpt::StatusCode::kUnsupported, "GpuLoader::Create is Unsupported");
  std::printf("gpu-error: %s\n", loader.status().message().c_str());
  auto id = ckpt::NcclGroup::NewUniqueId();
  Check(!id.ok() && id.status().code() == ckpt::StatusCode::kUnsupported, "NcclGroup::NewUniqueId is Unsupported");
  std::printf("nccl-error: %s\n", id.status().message().c_str());
  // The daemon and the CPU paths are still there after the failed GPU calls.
  Check(c.Tensor("wte.weight").ok() && (*client)->List().ok(), "still serving after the GPU errors");
  Check(!GpuLibraryMapped(), "no CUDA or NCCL library mapped in the process");
  return failures == 0 ? 0 : 1;
}
