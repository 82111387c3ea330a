#include "daemon/ownership.h"

#include <pwd.h>

#include <vector>

namespace ckpt::daemon {

Owner OwnerOf(uint32_t uid, bool admin) {
  Owner owner{uid, admin, ""};
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr) owner.user = pw.pw_name;
  return owner;
}

std::string Describe(const Owner& owner) {
  std::string text = "uid " + std::to_string(owner.uid);
  if (!owner.user.empty() || owner.admin) {
    text += " (" + owner.user + (owner.user.empty() || !owner.admin ? "" : ", ") + (owner.admin ? "admin" : "") + ")";
  }
  return text;
}

std::optional<uint32_t> ReservedFor(const std::string& name) {
  if (name.size() < 3 || name[0] != 'u') return std::nullopt;
  size_t i = 1;
  uint64_t uid = 0;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') {
    uid = uid * 10 + static_cast<uint64_t>(name[i] - '0');
    if (uid > 0xffffffffull) uid = 0x100000000ull;  // saturates: not a uid
    ++i;
  }
  const size_t digits = i - 1;
  if (digits == 0 || i >= name.size() || name[i] != '.') return std::nullopt;
  if ((digits > 1 && name[1] == '0') || uid >= kNoUid) return kNoUid;
  return static_cast<uint32_t>(uid);
}

Status MayAlter(const Owner& actor, const Owner& owner, const std::string& name, const std::string& verb) {
  if (actor.admin || actor.uid == owner.uid) return Status::Ok();
  return PermissionDenied(Describe(actor) + " may not " + verb + " checkpoint '" + name + "': it is owned by " +
                          Describe(owner) + "; only its owner or an admin may");
}

Status MayClaim(const Owner& actor, const std::string& name) {
  const std::optional<uint32_t> reserved = ReservedFor(name);
  if (!reserved || actor.admin || *reserved == actor.uid) return Status::Ok();
  if (*reserved == kNoUid) {
    return PermissionDenied("checkpoint name '" + name + "' is in a reserved name space ('u<uid>.' with a uid "
                            "written without leading zeros) that belongs to no user; only an admin may use it");
  }
  return PermissionDenied(Describe(actor) + " may not create checkpoint '" + name + "': names 'u" +
                          std::to_string(*reserved) + ".*' are reserved for uid " + std::to_string(*reserved) +
                          " (and admins)");
}

}  // namespace ckpt::daemon
