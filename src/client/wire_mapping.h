// The one place where the wire's structs (protocol/messages.h) and the public ones
// (include/ckpt/client.h, ckpt/tensor.h) meet: the Client decodes a response and maps it
// to what it returns; ckptctl --json and the Python module map a public struct back to
// its wire form to print it exactly as the daemon sent it.
//
// Each pair of corresponding fields is listed once, in the struct's WireOf<...>::Pairs,
// which serves both directions. Header-only; thread-safe (no state).
#pragma once

#include <nlohmann/json.hpp>
#include <type_traits>
#include <vector>

#include "ckpt/client.h"
#include "ckpt/status.h"
#include "ckpt/tensor.h"
#include "protocol/messages.h"

namespace ckpt::client {

// WireOf<P>::type is the wire struct of public struct P; Pairs(p, w, f) calls f(p.x, w.x)
// for each field (p and w const or not, as the direction needs).
template <typename P>
struct WireOf;

template <>
struct WireOf<CheckpointSummary> {
  using type = protocol::WireSummary;
  template <typename A, typename B, typename F>
  static void Pairs(A& p, B& w, F f) {
    f(p.name, w.name);
    f(p.generation, w.generation);
    f(p.shm_name, w.shm_name);
    f(p.segment_id, w.segment_id);
    f(p.source, w.source);
    f(p.format, w.format);
    f(p.segment_bytes, w.segment_bytes);
    f(p.data_bytes, w.data_bytes);
    f(p.tensor_count, w.tensor_count);
    f(p.load_seconds, w.load_seconds);
    f(p.loaded_unix_s, w.loaded_unix_s);
    f(p.attached, w.attached);
    f(p.attached_pids, w.attached_pids);
    f(p.page_bytes, w.page_bytes);
    f(p.huge_bytes, w.huge_bytes);
    f(p.source_fingerprint, w.source_fingerprint);
    f(p.owner_uid, w.owner_uid);
    f(p.owner_user, w.owner_user);
    f(p.owner_admin, w.owner_admin);
  }
};

template <>
struct WireOf<TensorInfo> {
  using type = protocol::WireTensor;
  template <typename A, typename B, typename F>
  static void Pairs(A& p, B& w, F f) {
    f(p.name, w.name);
    f(p.dtype, w.dtype);
    f(p.shape, w.shape);
    f(p.nbytes, w.nbytes);
    f(p.checksum, w.checksum);
  }
};

template <>
struct WireOf<SideFileInfo> {
  using type = protocol::WireSideFile;
  template <typename A, typename B, typename F>
  static void Pairs(A& p, B& w, F f) {
    f(p.name, w.name);
    f(p.bytes, w.bytes);
  }
};

template <>
struct WireOf<EvictionCounters> {
  using type = protocol::WireEvictions;
  template <typename A, typename B, typename F>
  static void Pairs(A& p, B& w, F f) {
    f(p.by_request, w.by_request);
    f(p.for_budget, w.for_budget);
    f(p.replaced, w.replaced);
  }
};

template <>
struct WireOf<CheckpointList> {
  using type = protocol::ListResponse;
  template <typename A, typename B, typename F>
  static void Pairs(A& p, B& w, F f) {
    f(p.checkpoints, w.checkpoints);
    f(p.loading, w.loading);
  }
};

template <>
struct WireOf<CheckpointInfo> {
  using type = protocol::InfoResponse;
  template <typename A, typename B, typename F>
  static void Pairs(A& p, B& w, F f) {
    f(p.checkpoint, w.checkpoint);
    f(p.tensors, w.tensors);
    f(p.side_files, w.side_files);
  }
};

template <>
struct WireOf<LoadResult> {
  using type = protocol::LoadResponse;
  template <typename A, typename B, typename F>
  static void Pairs(A& p, B& w, F f) {
    f(p.checkpoint, w.checkpoint);
    f(p.evicted, w.evicted);
  }
};

template <>
struct WireOf<EnsureResult> {
  using type = protocol::EnsureResponse;
  template <typename A, typename B, typename F>
  static void Pairs(A& p, B& w, F f) {
    f(p.checkpoint, w.checkpoint);
    f(p.evicted, w.evicted);
    f(p.action, w.action);
  }
};

template <>
struct WireOf<VerifyResult> {
  using type = protocol::VerifyResponse;
  template <typename A, typename B, typename F>
  static void Pairs(A& p, B& w, F f) {
    f(p.name, w.name);
    f(p.generation, w.generation);
    f(p.passed, w.passed);
    f(p.tensors, w.tensors);
    f(p.bytes, w.bytes);
    f(p.seconds, w.seconds);
    f(p.mismatch_count, w.mismatch_count);
    f(p.mismatched, w.mismatched);
  }
};

template <>
struct WireOf<DaemonStatus> {
  using type = protocol::StatusResponse;
  template <typename A, typename B, typename F>
  static void Pairs(A& p, B& w, F f) {
    f(p.version, w.version);
    f(p.protocol, w.protocol);
    f(p.pid, w.pid);
    f(p.uptime_s, w.uptime_s);
    f(p.socket, w.socket);
    f(p.shm_prefix, w.shm_prefix);
    f(p.segment_dir, w.segment_dir);
    f(p.checkpoints, w.checkpoints);
    f(p.loading, w.loading);
    f(p.shm_bytes, w.shm_bytes);
    f(p.memory_budget_bytes, w.memory_budget_bytes);
    f(p.memory_used_bytes, w.memory_used_bytes);
    f(p.attached, w.attached);
    f(p.connections, w.connections);
    f(p.max_connections, w.max_connections);
    f(p.max_connections_per_uid, w.max_connections_per_uid);
    f(p.admin_reserved_connections, w.admin_reserved_connections);
    f(p.model_roots, w.model_roots);
    f(p.evictions, w.evictions);
    f(p.your_role, w.your_role);
    f(p.your_uid, w.your_uid);
    f(p.your_shm_bytes, w.your_shm_bytes);
    f(p.your_segments, w.your_segments);
    f(p.your_writes, w.your_writes);
    f(p.max_shm_bytes_per_uid, w.max_shm_bytes_per_uid);
    f(p.max_segments_per_uid, w.max_segments_per_uid);
    f(p.max_writes_per_uid, w.max_writes_per_uid);
    f(p.checkpoint_list, w.checkpoint_list);
    f(p.retired, w.retired);
    f(p.segment_pages, w.segment_pages);
    f(p.segment_page_bytes, w.segment_page_bytes);
  }
};

template <typename P>
using WireType = typename WireOf<P>::type;

template <typename P>
P FromWire(const WireType<P>& w);
template <typename P>
WireType<P> ToWire(const P& p);

namespace mapping_detail {
template <typename T, typename = void>
struct IsPublic : std::false_type {};
template <typename T>
struct IsPublic<T, std::void_t<typename WireOf<T>::type>> : std::true_type {};

// to = from: equal types copy, structs map, vectors map item by item.
template <typename From, typename To>
void Assign(const From& from, To& to) {
  if constexpr (std::is_same_v<From, To>) {
    to = from;
  } else if constexpr (IsPublic<From>::value) {
    to = ToWire(from);
  } else if constexpr (IsPublic<To>::value) {
    to = FromWire<To>(from);
  } else {
    to.clear();
    to.reserve(from.size());
    for (const auto& item : from) {
      to.emplace_back();
      Assign(item, to.back());
    }
  }
}
}  // namespace mapping_detail

// The public struct of wire struct `w` (FromWire<CheckpointSummary>(summary)).
template <typename P>
P FromWire(const WireType<P>& w) {
  P p;
  WireOf<P>::Pairs(p, w, [](auto& to, const auto& from) { mapping_detail::Assign(from, to); });
  return p;
}

// The wire struct of public struct `p`.
template <typename P>
WireType<P> ToWire(const P& p) {
  WireType<P> w;
  WireOf<P>::Pairs(p, w, [](const auto& from, auto& to) { mapping_detail::Assign(from, to); });
  return w;
}

// Decodes response `j` as P's wire struct, then maps it (the errors of protocol::Decode).
template <typename P>
Result<P> DecodePublic(const nlohmann::json& j) {
  auto wire = protocol::DecodeAs<WireType<P>>(j);
  if (!wire.ok()) return wire.status();
  return FromWire<P>(*wire);
}

// The JSON of public struct `p`: exactly its wire encoding.
template <typename P>
nlohmann::json EncodePublic(const P& p) {
  return protocol::Encode(ToWire(p));
}

}  // namespace ckpt::client
