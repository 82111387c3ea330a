// Ownership: who may alter a checkpoint name, and how much one user may hold
// (docs/operations.md, *Ownership and quotas*). The one place these rules are decided;
// the Catalog asks them for every reservation, replace and eviction.
//
// The rule is PostgreSQL's: an object's owner or a superuser alters it. Each name has an
// owner: the uid that loaded or published its current generation (an admin's load is
// that admin's), with whether it had the admin role then. Replacing, evicting (by request
// or for room) and reserving a name held by a load or write in progress is for the
// owner or an admin. A free name is taken by the first writer that publishes it; names
// "u<uid>.<rest>" are reserved for that uid (and admins), so a user's own names (the
// serving cache's entries) cannot be squatted.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ckpt/status.h"

namespace ckpt::daemon {

// Who created a generation or acts on a name.
struct Owner {
  uint32_t uid = 0;
  bool admin = false;     // had the admin role (root, the daemon's user, the admin group)
  std::string user;       // the uid's user name when it was recorded; "" if it has none
};

// `uid` with its user name looked up now (getpwuid_r; "" if the uid has none).
Owner OwnerOf(uint32_t uid, bool admin);
// "uid 1001 (alice)", "uid 0 (root, admin)": how refusals and logs name an owner.
std::string Describe(const Owner& owner);

// Per-uid limits for callers without the admin role (admins are exempt: only the memory
// budget bounds them). 0 means no limit.
struct Quotas {
  uint64_t shm_bytes = 0;   // bytes of published, retired and reserved segments
  uint64_t segments = 0;    // published, retired and reserved generations
  uint64_t writes = 0;      // concurrent writes (write sessions not yet finished)
};

// What one uid holds now.
struct Usage {
  uint64_t shm_bytes = 0;
  uint64_t segments = 0;
};

// The uid names "u<uid>.<rest>" are reserved for, or nullopt for a name outside every
// such space. A name "u<digits>." whose digits are not a canonical uid (leading zero,
// more than 32 bits) is reserved for nobody but admins: kNoUid.
inline constexpr uint32_t kNoUid = 0xffffffffu;
std::optional<uint32_t> ReservedFor(const std::string& name);

// OK if `actor` may `verb` ("replace", "evict", ...) checkpoint `name` owned by `owner`:
// the actor is an admin or the owner's uid. PermissionDenied naming the owner otherwise.
Status MayAlter(const Owner& actor, const Owner& owner, const std::string& name, const std::string& verb);
// OK if `actor` may create free name `name` (its reserved space, if any, is the actor's);
// PermissionDenied naming the uid the name is reserved for otherwise.
Status MayClaim(const Owner& actor, const std::string& name);

}  // namespace ckpt::daemon
