// The plan of a collective load (include/ckpt/collective.h), as a pure function of what
// every rank of the group needs, so that every rank computes the same plan by itself.
//
// Each rank describes its outputs by key (a hash of everything that determines the
// output's bytes: name, source tensors and their checksums, shard specs, dtype, transpose,
// and the node) and size. An output that several ranks need is "shared": one of them (its
// owner, chosen to balance the bytes each rank reads from host memory) copies it from the
// shared memory, and sends it to the others over NCCL. Shared outputs with the same holders
// and owner form a segment laid out identically on every holder, so one send per segment
// and receiver carries them all.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/collective.h"
#include "ckpt/status.h"

namespace ckpt::collective {

inline constexpr uint64_t kOutputAlignment = 256;  // device tensors start 256-byte aligned

struct OutputDescriptor {
  uint64_t key = 0;
  uint64_t bytes = 0;  // on the device
};

struct RankDescriptor {
  bool ok = true;           // false: this rank failed before it could say what it needs
  bool peer_access = true;  // this rank's GPU reaches the node's other GPUs directly
  // The rank's CollectiveOptions: every rank must pass the same (else every rank refuses).
  uint64_t mode = 0;
  uint64_t min_saved_bytes = 0;
  std::vector<OutputDescriptor> outputs;
};

using Mode = CollectiveOptions::Mode;

struct Transfer {
  int peer = 0;
  bool send = false;    // true: send to peer; false: receive from peer
  uint64_t offset = 0;  // bytes into this rank's device allocation
  uint64_t bytes = 0;
};

// One rank's part of the plan.
struct ExchangePlan {
  bool collective = false;
  std::string reason;                  // why the load is (not) collective, for logs and stats
  std::vector<uint64_t> offsets;       // per output of this rank: bytes into its allocation
  uint64_t allocation_bytes = 0;
  std::vector<size_t> from_host;       // outputs this rank copies from the shared memory
  std::vector<Transfer> transfers;     // sends and receives, in the same order on every rank
  uint64_t host_bytes = 0;             // device bytes of the outputs in from_host
  uint64_t received_bytes = 0;
  uint64_t sent_bytes = 0;
};

// Plans rank `me`'s part. In kAuto the load is collective only if sharing saves at least
// `min_saved_bytes` of host-to-device traffic across the group and every rank has peer
// access; otherwise (and in kIndependent) each rank copies all its outputs. InvalidArgument
// if `me` is out of range, a rank lists a key twice, or ranks disagree on a key's size.
Result<ExchangePlan> PlanExchange(const std::vector<RankDescriptor>& ranks, int me, Mode mode,
                                  uint64_t min_saved_bytes);

// Wire form of a RankDescriptor (little-endian fixed-width fields), for the all-gather.
std::string EncodeDescriptor(const RankDescriptor& d);
Result<RankDescriptor> DecodeDescriptor(const std::string& bytes);

}  // namespace ckpt::collective
