/* Libraries that are not a GPU plugin this build can use (tests/client/gpu_plugin_abi_test.cc),
 * built in C from the C interface header alone (which so is shown to be plain C):
 *   FAKE_ABI_VERSION unset: no entry symbol at all;
 *   FAKE_ABI_VERSION = n:   the entry symbol, with a table of interface version n whose
 *                           functions are all NULL (a host must never call into it). */
#include "ckpt/gpu_plugin_abi.h"

#ifdef FAKE_ABI_VERSION
static const ckpt_gpu_plugin table = {
    .abi_version = FAKE_ABI_VERSION, .struct_size = sizeof(ckpt_gpu_plugin), .build_version = "fake-9.9"};

__attribute__((visibility("default"))) const ckpt_gpu_plugin* ckpt_gpu_plugin_entry(void) { return &table; }
#else
__attribute__((visibility("default"))) int not_a_ckpt_gpu_plugin(void) { return 0; }
#endif
