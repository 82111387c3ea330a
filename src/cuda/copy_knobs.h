// The copy engine's experiment knobs: environment variables the GPU benchmarks set to
// compare variants of the engine (docs/benchmarks.md), declared once in one table (name,
// default, accepted values, meaning) and read by one function. They are not an interface:
// the defaults are the measured best, and docs/operations.md lists them for operators who
// find one set. Pure host code (no CUDA), tested without a GPU.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/copy_tasks.h"

namespace ckpt::cuda {

// The most pinned bounce buffers one worker may have (CKPT_COPY_BUFFERS).
inline constexpr int kMaxBuffers = 8;

// What the knobs say, defaults where unset.
struct CopyKnobs {
  int buffers = 2;                      // CKPT_COPY_BUFFERS
  TaskMix order = TaskMix::kAddress;    // CKPT_COPY_ORDER
  bool spans = true;                    // CKPT_COPY_SPANS
  bool early = true;                    // CKPT_COPY_EARLY
  bool trace = false;                   // CKPT_COPY_TRACE
};

// One knob: its variable, its default (as text), what it accepts, what it changes, and
// how a value is applied (false: not a value it accepts; `knobs` is then unchanged).
struct CopyKnob {
  const char* name;
  const char* default_value;
  const char* accepts;
  const char* meaning;
  bool (*apply)(std::string_view value, CopyKnobs& knobs);
};

// Every knob, in the order docs/operations.md lists them.
const std::vector<CopyKnob>& CopyKnobTable();

// The knobs as `lookup` (a getenv: the value of a variable, or null when unset) gives
// them. An unset or empty variable keeps the default. For every knob that is set,
// `notes` (if not null) gets one line, a JSON object like the engine's trace lines:
//   {"what":"copy_knob","name":"CKPT_COPY_BUFFERS","value":"4","default":"2","used":"4"}
// or, for a value the knob does not accept (ignored, the default used),
//   {"what":"copy_knob","name":...,"value":"x","default":"2","used":"2","ignored":"accepts 1 to 8"}.
CopyKnobs ParseCopyKnobs(const std::function<const char*(const char*)>& lookup, std::vector<std::string>* notes);

// The process's knobs: ParseCopyKnobs(secure_getenv), read again at every call (a
// benchmark or a test changes them between runs; a set-user-ID program ignores them). Each
// distinct note is written to stderr once per process. Thread-safe.
CopyKnobs CurrentCopyKnobs();

}  // namespace ckpt::cuda
