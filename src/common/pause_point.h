// Pause points: named places where a test stops a process, acts (swaps a file, kills a
// peer), and lets it go on, so a race the test must win is forced instead of timed.
//
// Off, and free, unless the process was started with CKPT_PAUSE_DIR naming a directory
// (read once; secure_getenv, so a set-user-ID program never takes it from its caller). A
// point pauses only while the test has made its FIFOs there (tests/support/test_env.h,
// PausePointControl):
//   <dir>/<name>.reached  the paused thread writes one byte to it (open blocks until the
//                         test opens it for reading);
//   <dir>/<name>.resume   then reads it until end of file (blocks until the test opens it
//                         for writing and closes it).
// Only the threads that reach the point wait. A test keeps its reading end of .reached open
// until it disarms the point (unlinks both FIFOs, then lets them go), so a second thread that
// reaches it stops too and goes on with the first. The points are listed in CONTRIBUTING.md.
#pragma once

namespace ckpt {

// Pauses the calling thread at point `name` as described above; returns at once when
// pause points are off or the test made no FIFOs for `name`. Never fails: a FIFO that
// cannot be used is skipped.
void PausePoint(const char* name);

}  // namespace ckpt
