#include "daemon/metrics.h"

#include <cstdio>
#include <functional>
#include <vector>

#include "daemon/connection_limits.h"

namespace ckpt::daemon {

namespace {

// What the table's rows read: one consistent snapshot of the catalog.
struct Snapshot {
  const DaemonContext& ctx;
  std::vector<CatalogEntry> entries;
  std::vector<CatalogEntry> retired;
  EvictionCounts evictions;
};

struct Sample {
  std::string labels;  // "" or {name="...",...}
  double value;
};

struct MetricRow {
  const char* name;
  const char* type;  // gauge or counter
  const char* help;
  std::function<std::vector<Sample>(const Snapshot&)> samples;
};

std::string LabelValue(const std::string& s) {  // Prometheus label escaping
  std::string e;
  for (char c : s) {
    if (c == '\\' || c == '"') e += '\\';
    if (c == '\n') {
      e += "\\n";
      continue;
    }
    e += c;
  }
  return e;
}

// One sample with no labels.
template <typename F>
std::function<std::vector<Sample>(const Snapshot&)> One(F f) {
  return [f](const Snapshot& s) { return std::vector<Sample>{{"", static_cast<double>(f(s))}}; };
}

// One sample per published generation, labelled by name and generation.
template <typename F>
std::function<std::vector<Sample>(const Snapshot&)> PerCheckpoint(F f) {
  return [f](const Snapshot& s) {
    std::vector<Sample> out;
    for (const auto& e : s.entries) {
      out.push_back({"{name=\"" + LabelValue(e.name) + "\",generation=\"" + std::to_string(e.generation) + "\"}",
                     static_cast<double>(f(e))});
    }
    return out;
  };
}

const std::vector<MetricRow>& Table() {
  static const std::vector<MetricRow> rows = {
      {"ckptd_up", "gauge", "1 while the daemon serves", One([](const Snapshot&) { return 1; })},
      {"ckptd_uptime_seconds", "gauge", "seconds since the daemon started",
       One([](const Snapshot& s) { return NowUnixSeconds() - s.ctx.started_unix_s; })},
      {"ckptd_memory_budget_bytes", "gauge", "configured memory budget (0: none)",
       One([](const Snapshot& s) { return s.ctx.catalog->budget_bytes(); })},
      {"ckptd_memory_used_bytes", "gauge", "shared memory of published, retired and loading segments",
       One([](const Snapshot& s) { return s.ctx.catalog->UsedBytes(); })},
      {"ckptd_checkpoints", "gauge", "published checkpoints", One([](const Snapshot& s) { return s.entries.size(); })},
      {"ckptd_retired_generations", "gauge", "replaced or force-evicted generations still attached",
       One([](const Snapshot& s) { return s.retired.size(); })},
      {"ckptd_loading", "gauge", "loads in progress", One([](const Snapshot& s) { return s.ctx.catalog->Loading().size(); })},
      {"ckptd_connections", "gauge", "open client connections",
       One([](const Snapshot& s) { return s.ctx.limits ? s.ctx.limits->total() : 0; })},
      {"ckptd_checkpoint_bytes", "gauge", "shared memory of one checkpoint generation",
       PerCheckpoint([](const CatalogEntry& e) { return e.segment_bytes; })},
      {"ckptd_checkpoint_attached", "gauge", "live attachments of one checkpoint generation",
       PerCheckpoint([](const CatalogEntry& e) { return e.attached; })},
      {"ckptd_checkpoint_load_seconds", "gauge", "time the load of one checkpoint generation took",
       PerCheckpoint([](const CatalogEntry& e) { return e.load_seconds; })},
      {"ckptd_requests_total", "counter", "requests served",
       One([](const Snapshot& s) { return s.ctx.counters->requests.load(); })},
      {"ckptd_request_errors_total", "counter", "requests answered with an error",
       One([](const Snapshot& s) { return s.ctx.counters->request_errors.load(); })},
      {"ckptd_requests_denied_total", "counter", "requests refused by access control",
       One([](const Snapshot& s) { return s.ctx.counters->denied.load(); })},
      {"ckptd_loads_total", "counter", "checkpoint generations loaded",
       One([](const Snapshot& s) { return s.ctx.counters->loads.load(); })},
      {"ckptd_load_failures_total", "counter", "loads that failed after they started",
       One([](const Snapshot& s) { return s.ctx.counters->load_failures.load(); })},
      {"ckptd_loads_cancelled_total", "counter", "loads cancelled by their client (cancel frame or hang-up)",
       One([](const Snapshot& s) { return s.ctx.counters->loads_cancelled.load(); })},
      {"ckptd_loaded_bytes_total", "counter", "tensor bytes loaded",
       One([](const Snapshot& s) { return s.ctx.counters->loaded_bytes.load(); })},
      {"ckptd_attaches_total", "counter", "attachments made",
       One([](const Snapshot& s) { return s.ctx.counters->attaches.load(); })},
      {"ckptd_evictions_total", "counter", "generations removed, by reason",
       [](const Snapshot& s) {
         return std::vector<Sample>{{"{reason=\"request\"}", static_cast<double>(s.evictions.by_request)},
                                    {"{reason=\"budget\"}", static_cast<double>(s.evictions.for_budget)},
                                    {"{reason=\"replaced\"}", static_cast<double>(s.evictions.replaced)}};
       }},
      {"ckptd_connections_total", "counter", "connections accepted",
       One([](const Snapshot& s) { return s.ctx.counters->connections_total.load(); })},
      {"ckptd_connections_refused_total", "counter", "connections refused at accept, by reason",
       [](const Snapshot& s) {
         const DaemonCounters& c = *s.ctx.counters;
         return std::vector<Sample>{{"{reason=\"limit\"}", static_cast<double>(c.connections_refused.load())},
                                    {"{reason=\"no_role\"}", static_cast<double>(c.connections_no_role.load())},
                                    {"{reason=\"thread\"}", static_cast<double>(c.thread_start_failures.load())}};
       }},
      {"ckptd_connections_idle_closed_total", "counter", "connections closed for idling without an attachment",
       One([](const Snapshot& s) { return s.ctx.counters->idle_closed.load(); })},
      {"ckptd_bad_frames_total", "counter", "malformed frames received",
       One([](const Snapshot& s) { return s.ctx.counters->bad_frames.load(); })},
      {"ckptd_frame_timeouts_total", "counter", "frames not completed within the frame deadline",
       One([](const Snapshot& s) { return s.ctx.counters->frame_timeouts.load(); })},
      {"ckptd_rendezvous_total", "counter", "rendezvous requests (published and awaited)",
       One([](const Snapshot& s) { return s.ctx.counters->rendezvous.load(); })},
  };
  return rows;
}

}  // namespace

std::string RenderMetrics(const DaemonContext& ctx) {
  Snapshot snapshot{ctx, ctx.catalog->List(), ctx.catalog->Retired(), ctx.catalog->evictions()};
  std::string out;
  for (const MetricRow& row : Table()) {
    out += std::string("# HELP ") + row.name + " " + row.help + "\n# TYPE " + row.name + " " + row.type + "\n";
    for (const Sample& sample : row.samples(snapshot)) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), " %.17g\n", sample.value);
      out += row.name + sample.labels + buf;
    }
  }
  return out;
}

}  // namespace ckpt::daemon
