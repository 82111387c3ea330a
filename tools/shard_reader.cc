// ckpt-shard-reader: an example client and test driver. Attaches to a checkpoint, takes
// this rank's tensor-parallel shard of every tensor by reading it in place (zero copy),
// prints a summary line, then stays attached until its standard input closes; each line
// it reads there meanwhile makes it read its shard again and print the line again (so a
// test can show that an attachment keeps working, e.g. across a daemon restart).
//
//   ckpt-shard-reader SOCKET NAME RANK WORLD [--whole]
//
// Rule: a tensor of 2+ dims is split along its first dimension divisible by WORLD, else
// replicated; --whole reads every tensor whole (used to show that pages are shared).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ckpt/client.h"

namespace {
// Reads rank `rank`'s shard of every tensor of `checkpoint` in place and prints the summary
// line (the time since `start`). False, with a message on stderr, if a tensor cannot be read.
bool ReadShards(const ckpt::Checkpoint& checkpoint, const std::string& name, int rank, int world, bool whole,
                std::chrono::steady_clock::time_point start) {
  uint64_t shard_bytes = 0, sum = 0;
  for (const ckpt::TensorInfo& t : checkpoint.tensors()) {
    ckpt::ShardSpec spec = ckpt::ShardSpec::Replicate();
    if (!whole && t.shape.size() >= 2) {
      for (size_t d = 0; d < t.shape.size(); ++d) {
        if (t.shape[d] % world == 0) {
          spec = ckpt::ShardSpec::Split(static_cast<int>(d), rank, world);
          break;
        }
      }
    }
    auto layout = checkpoint.PlanShard(t.name, spec);
    auto data = checkpoint.TensorData(t.name);
    if (!layout.ok() || !data.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, (layout.ok() ? data.status() : layout.status()).ToString().c_str());
      return false;
    }
    // Read the shard where it lies: every byte is touched, nothing is copied.
    for (const ckpt::CopyRegion& r : layout->regions) {
      for (uint64_t row = 0; row < r.rows; ++row) {
        const unsigned char* p = reinterpret_cast<const unsigned char*>(*data) + r.src_offset + row * r.src_pitch;
        for (uint64_t i = 0; i < r.row_bytes; ++i) sum = sum * 31 + p[i];
      }
    }
    shard_bytes += layout->nbytes;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("rank %d/%d: attached '%s' generation %llu, read %llu shard bytes of %zu tensors in %.3f s (sum %016llx)\n",
              rank, world, name.c_str(), static_cast<unsigned long long>(checkpoint.generation()),
              static_cast<unsigned long long>(shard_bytes), checkpoint.tensors().size(), secs,
              static_cast<unsigned long long>(sum));
  std::fflush(stdout);
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s SOCKET NAME RANK WORLD [--whole]\n", argv[0]);
    return 2;
  }
  const std::string socket = argv[1], name = argv[2];
  const int rank = std::atoi(argv[3]), world = std::atoi(argv[4]);
  const bool whole = argc > 5 && std::strcmp(argv[5], "--whole") == 0;

  const auto start = std::chrono::steady_clock::now();
  auto client = ckpt::Client::Connect(socket);
  if (!client.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, client.status().ToString().c_str());
    return 1;
  }
  auto checkpoint = (*client)->Attach(name);
  if (!checkpoint.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, checkpoint.status().ToString().c_str());
    return 1;
  }
  if (!ReadShards(**checkpoint, name, rank, world, whole, start)) return 1;
  // Stay attached until the parent closes our stdin; read the shards again at each line.
  char line[256];
  while (std::fgets(line, sizeof(line), stdin) != nullptr) {
    if (std::strchr(line, '\n') == nullptr) continue;  // the rest of a long line comes next
    if (!ReadShards(**checkpoint, name, rank, world, whole, std::chrono::steady_clock::now())) return 1;
  }
  return 0;
}
