// Naming and policy: which names the daemon accepts, the default name of a checkpoint,
// and the refusal of a role that may not run an op. The protocol (protocol/messages.h) checks types and
// ranges; this file decides what is allowed.
#pragma once

#include <cstddef>
#include <string>

#include "ckpt/status.h"
#include "daemon/access_policy.h"

namespace ckpt::daemon {

// Checks a checkpoint name: 1 to 100 bytes of [A-Za-z0-9_.-], the first a letter or digit
// (never an option like '-rf' or a hidden name like '.x'); InvalidArgument naming it otherwise.
Status ValidateCheckpointName(const std::string& name);
// The name check for segments found at start-up: ValidateCheckpointName, but a name that
// begins with '_' or '-' (allowed before issue 23) is still adopted rather than removed;
// new loads and writes cannot create one.
Status ValidateAdoptedName(const std::string& name);
// Checks a rendezvous job name: 1 to 200 bytes of [A-Za-z0-9_.:-].
Status ValidateJobName(const std::string& job);
// The longest rendezvous value, in hex characters (4096 bytes).
inline constexpr size_t kMaxRendezvousHexChars = 8192;
// The default name for a checkpoint at `path`: its file name without the extension, or
// the folder's name for a model folder or a file that names one (*.index.json,
// model.safetensors, pytorch_model.bin), with characters outside the allowed set
// replaced by '_' and leading characters other than letters and digits dropped.
std::string DefaultCheckpointName(const std::string& path);
// `base` made a valid name the way DefaultCheckpointName does (other characters become
// '_', leading non-alphanumerics dropped, at most 100 bytes, "checkpoint" if empty).
std::string SanitizedCheckpointName(std::string base);

// OK if `role` may run `op`, which needs `needed` (the table of operations in
// daemon/request_handler.cc says which); else PermissionDenied naming the role needed and
// the caller's uid.
Status CheckRole(Role role, Role needed, const PeerCredentials& peer, const std::string& op);
// The one error frame a caller with no role gets at connect.
Status NoRoleRefusal(const PeerCredentials& peer);

}  // namespace ckpt::daemon
