#include "cuda/copy_knobs.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

namespace ckpt::cuda {
namespace {

bool ApplyBuffers(std::string_view v, CopyKnobs& k) {
  const std::string text(v);
  char* end = nullptr;
  const long n = std::strtol(text.c_str(), &end, 10);
  if (*end != '\0' || n < 1 || n > kMaxBuffers) return false;
  k.buffers = static_cast<int>(n);
  return true;
}

bool ApplyOrder(std::string_view v, CopyKnobs& k) {
  if (v == "address") k.order = TaskMix::kAddress;
  else if (v == "spread") k.order = TaskMix::kSpread;
  else return false;
  return true;
}

// A 0|1 knob: sets `field`.
template <bool CopyKnobs::*field>
bool ApplyFlag(std::string_view v, CopyKnobs& k) {
  if (v != "0" && v != "1") return false;
  k.*field = v == "1";
  return true;
}

// The value as a JSON string's contents (the knob's text came from the environment).
std::string Quoted(std::string_view v) {
  std::string out;
  for (unsigned char c : v) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace

const std::vector<CopyKnob>& CopyKnobTable() {
  static const std::vector<CopyKnob> table = {
      {"CKPT_COPY_BUFFERS", "2", "1 to 8",
       "pinned bounce buffers per worker on the bounce path (each chunk_bytes, 2 MiB by default)", &ApplyBuffers},
      {"CKPT_COPY_ORDER", "address", "address or spread",
       "order of the tasks that are not whole-job tasks: by source address, or gather tasks spread among the "
       "others (measured no faster)",
       &ApplyOrder},
      {"CKPT_COPY_SPANS", "1", "0 or 1",
       "1: on the bounce path, packed destinations are filled in full-size span tasks; 0: one task per "
       "rectangle of a region",
       &ApplyFlag<&CopyKnobs::spans>},
      {"CKPT_COPY_EARLY", "1", "0 or 1",
       "1: workers start gathering before the outputs' device memory is allocated; 0: it is allocated first",
       &ApplyFlag<&CopyKnobs::early>},
      {"CKPT_COPY_TRACE", "0", "0 or 1",
       "1: every load writes its phases' timestamps to stderr, one JSON object per line (tools/bench_gpu.sh)",
       &ApplyFlag<&CopyKnobs::trace>},
  };
  return table;
}

CopyKnobs ParseCopyKnobs(const std::function<const char*(const char*)>& lookup, std::vector<std::string>* notes) {
  CopyKnobs knobs;
  for (const CopyKnob& knob : CopyKnobTable()) {
    const char* value = lookup(knob.name);
    if (value == nullptr || *value == '\0') continue;
    const bool accepted = knob.apply(value, knobs);
    if (notes == nullptr) continue;
    std::string note = std::string("{\"what\":\"copy_knob\",\"name\":\"") + knob.name + "\",\"value\":\"" +
                       Quoted(value) + "\",\"default\":\"" + knob.default_value + "\",\"used\":\"" +
                       (accepted ? Quoted(value) : knob.default_value) + "\"";
    if (!accepted) note += std::string(",\"ignored\":\"accepts ") + knob.accepts + "\"";
    notes->push_back(note + "}");
  }
  return knobs;
}

CopyKnobs CurrentCopyKnobs() {
  std::vector<std::string> notes;
  const CopyKnobs knobs = ParseCopyKnobs([](const char* name) { return secure_getenv(name); }, &notes);
  if (!notes.empty()) {
    // Never destroyed: a load may run while the process exits.
    static std::mutex* mu = new std::mutex;
    static std::set<std::string>* written = new std::set<std::string>;
    std::lock_guard<std::mutex> lock(*mu);
    for (const std::string& note : notes) {
      if (written->insert(note).second) std::fprintf(stderr, "%s\n", note.c_str());
    }
  }
  return knobs;
}

}  // namespace ckpt::cuda
