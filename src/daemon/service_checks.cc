#include "daemon/service_checks.h"

#include <pwd.h>
#include <systemd/sd-daemon.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/byte_size.h"
#include "common/suggest.h"
#include "daemon/access_policy.h"

namespace ckpt::daemon {

namespace {

std::string UserName() {
  const uid_t uid = ::geteuid();
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
    return std::string("user '") + found->pw_name + "'";
  }
  return "uid " + std::to_string(uid);
}

bool Beneath(const std::string& path, const std::string& dir) {
  return path == dir || path.compare(0, dir.size() + 1, dir + "/") == 0;
}

// Why the unit's sandbox may hide or lock `path`, or "" when it does not.
std::string SandboxHint(const std::string& path) {
  if (Beneath(path, "/tmp") || Beneath(path, "/var/tmp")) {
    return " (under the ckptd unit, PrivateTmp=yes gives the daemon its own empty /tmp and /var/tmp, so "
           "nothing in the host's /tmp or /var/tmp is visible to it: move the models, e.g. to /srv/models)";
  }
  return "";
}

bool InGroup(gid_t gid) {
  if (::getegid() == gid) return true;
  const int n = ::getgroups(0, nullptr);
  if (n <= 0) return false;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  const int got = ::getgroups(n, groups.data());
  return got > 0 && std::find(groups.begin(), groups.begin() + got, gid) != groups.begin() + got;
}

// The long option names of `app` ("memory-budget", ...), in declaration order.
std::vector<std::string> LongNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& name : option->get_lnames()) names.push_back(name);
  }
  return names;
}

// The operator's message for arguments the command line has that ckptd does not know
// (`extras`, as typed): the first unknown option with the closest known ones, else the
// first stray word.
std::string DescribeExtras(const CLI::App& app, const std::vector<std::string>& extras) {
  for (const std::string& arg : extras) {
    if (arg.size() < 2 || arg[0] != '-') continue;
    const std::string option = arg.substr(0, arg.find('='));
    std::vector<std::string> suggestions;
    if (option.compare(0, 2, "--") == 0) {
      for (const std::string& name : Suggest(option.substr(2), LongNames(app))) suggestions.push_back("--" + name);
    }
    return "unknown option '" + option + "'" + DidYouMean(suggestions) + ": ckptd has no option of that name "
           "(see ckptd --help)";
  }
  return "unexpected argument '" + (extras.empty() ? std::string() : extras.front()) +
         "': ckptd takes options only (see ckptd --help)";
}

Status CheckModelRoot(const std::string& root) {
  const std::string key = "model-root '" + root + "'";
  if (root.empty() || root[0] != '/') {
    return FailedPrecondition(key + " is not an absolute path: write it as /path/to/models");
  }
  struct stat st{};
  if (::stat(root.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return FailedPrecondition(key + " does not exist as ckptd sees it" + SandboxHint(root) +
                                ": create it, or remove it from model-root");
    }
    if (err == EACCES) {
      return FailedPrecondition(key + " cannot be reached by ckptd (" + UserName() +
                                "): permission denied on the path: make it and every parent "
                                "directory searchable (x) for that user, or its group");
    }
    return FailedPrecondition(key + ": " + std::strerror(err));
  }
  if (!S_ISDIR(st.st_mode)) return FailedPrecondition(key + " is not a directory: name the directory that holds the checkpoints");
  if (::access(root.c_str(), R_OK | X_OK) != 0) {
    return FailedPrecondition(key + " is not readable by ckptd (" + UserName() + "): " + std::strerror(errno) +
                              ": give that user (or its group) read and search permission (chmod o+rx, or g+rx)");
  }
  return Status::Ok();
}

Status CheckGroup(const std::string& key, const std::string& name) {
  if (name.empty()) return Status::Ok();
  auto gid = ResolveGroup(name);
  if (!gid.ok()) {
    return NotFound(key + " '" + name + "' does not exist on this node: create it (the package's "
                    "/usr/lib/sysusers.d/ckptd.conf creates ckpt-admin and ckpt-readers: run systemd-sysusers), "
                    "or change " + key);
  }
  return Status::Ok();
}

// The directory of `file` (named by option `key`) must exist and be writable for ckptd,
// which creates `file` there. `hint` is added to the message when it does not exist.
Status CheckDirectoryOf(const std::string& key, const std::string& file, const std::string& hint) {
  const size_t slash = file.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : file.substr(0, std::max<size_t>(slash, 1));
  if (::access(dir.c_str(), W_OK | X_OK) == 0) return Status::Ok();
  const int err = errno;
  const std::string what = key + " '" + file + "': its directory " + dir;
  if (err == EROFS) {
    return FailedPrecondition(what + " is read-only for ckptd (the unit's ProtectSystem=strict mounts "
                              "everything read-only): add ReadWritePaths=" + dir +
                              " with a drop-in (systemctl edit ckptd)");
  }
  if (err == ENOENT || err == ENOTDIR) {
    return FailedPrecondition(what + " does not exist as ckptd sees it" + SandboxHint(dir) + hint +
                              ": create it, or change " + key);
  }
  return FailedPrecondition(what + " is not writable by ckptd (" + UserName() + "): " + std::strerror(err) +
                            ": give that user write permission on it");
}

Status CheckMetricsFile(const ServerOptions& o) {
  if (o.metrics_file.empty()) {
    if (!o.metrics_file_group.empty()) {
      return FailedPrecondition("metrics-file-group is set but metrics-file is not: set metrics-file too");
    }
    return Status::Ok();
  }
  const std::string& file = o.metrics_file;
  if (file[0] != '/') return FailedPrecondition("metrics-file '" + file + "' is not an absolute path");
  if (!o.metrics_file_group.empty()) {
    auto gid = ResolveGroup(o.metrics_file_group);
    if (gid.ok() && *gid && ::geteuid() != 0 && !InGroup(**gid)) {
      return FailedPrecondition("metrics-file-group '" + o.metrics_file_group + "': ckptd (" + UserName() +
                                ") is not a member of it, so it cannot give the file to that group: add "
                                "SupplementaryGroups=" + o.metrics_file_group +
                                " with a drop-in (systemctl edit ckptd), or leave metrics-file-group unset "
                                "(the file is then the daemon's group, mode metrics-file-mode)");
    }
  }
  return CheckDirectoryOf("metrics-file", file, "");
}

Status CheckSocket(const ServerOptions& o) {
  const std::string& path = o.socket_path;
  if (path.empty()) return FailedPrecondition("socket is empty: name the control socket's path");
  return CheckDirectoryOf("socket", path,
                          Beneath(path, "/run") ? " (the unit's RuntimeDirectory=ckptd creates /run/ckptd: keep the "
                                                  "socket there)"
                                                : "");
}
}  // namespace

Result<uint32_t> ParseModeBits(const std::string& key, const std::string& text) {
  const bool octal = !text.empty() && text.size() <= 4 &&
                     std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '7'; });
  const uint32_t value = octal ? static_cast<uint32_t>(std::stoul(text, nullptr, 8)) : 0;
  if (!octal || value > 0777) {
    return InvalidArgument(key + " = '" + text + "' is not a permission mode: write octal bits such as 0644");
  }
  return value;
}

Status CheckServiceConfig(const ServerOptions& options) {
  for (const std::string& root : options.model_roots) CKPT_RETURN_IF_ERROR(CheckModelRoot(root));
  CKPT_RETURN_IF_ERROR(CheckGroup("admin-group", options.admin_group));
  CKPT_RETURN_IF_ERROR(CheckGroup("reader-group", options.reader_group));
  CKPT_RETURN_IF_ERROR(CheckGroup("writer-group", options.writer_group));
  CKPT_RETURN_IF_ERROR(CheckGroup("metrics-file-group", options.metrics_file_group));
  CKPT_RETURN_IF_ERROR(CheckSocket(options));
  return CheckMetricsFile(options);
}

std::vector<std::string> MemoryBudgetWarnings(uint64_t budget_bytes, const std::string& shm_dir) {
  std::vector<std::string> out;
  if (budget_bytes == 0) return out;
  struct statvfs vfs{};
  uint64_t shm_bytes = 0;
  if (::statvfs(shm_dir.c_str(), &vfs) == 0 && !__builtin_mul_overflow(static_cast<uint64_t>(vfs.f_blocks),
                                                                        static_cast<uint64_t>(vfs.f_frsize), &shm_bytes) &&
      budget_bytes > shm_bytes) {
    out.push_back("memory-budget " + BytesText(budget_bytes) + " is larger than " + shm_dir + ", " +
                  BytesText(shm_bytes) + ": loads will fail with 'no space' before the budget evicts anything; "
                  "lower memory-budget to at most " + HumanBytes(shm_bytes) + ", or enlarge " + shm_dir +
                  " (mount -o remount,size=...)");
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_size = ::sysconf(_SC_PAGE_SIZE);
  uint64_t physical = 0;
  if (pages > 0 && page_size > 0 &&
      !__builtin_mul_overflow(static_cast<uint64_t>(pages), static_cast<uint64_t>(page_size), &physical) &&
      budget_bytes > physical) {
    out.push_back("memory-budget " + BytesText(budget_bytes) + " is larger than this node's physical memory, " +
                  BytesText(physical) + ": checkpoints that big would push everything else out of memory; lower "
                  "memory-budget below " + HumanBytes(physical));
  }
  return out;
}

std::string DescribeParseError(const CLI::App& app, const CLI::ParseError& error) {
  const CLI::Option* config = app.get_config_ptr();
  std::string file = "the configuration file";
  if (config != nullptr && !config->results().empty()) file = config->results().front();
  else if (config != nullptr && !config->get_default_str().empty()) file = config->get_default_str();
  const std::string what = error.what();
  const std::string unknown = "INI was not able to parse ";
  if (dynamic_cast<const CLI::ConfigError*>(&error) != nullptr && what.compare(0, unknown.size(), unknown) == 0) {
    const std::string key = what.substr(unknown.size());
    // A TOML/INI table opens with the item "<table>.++".
    if (key.size() > 3 && key.compare(key.size() - 3, 3, ".++") == 0) {
      return "unknown table [" + key.substr(0, key.size() - 3) + "] in " + file +
             ": ckptd's keys have no table; write them at the top of the file, before any [table]";
    }
    return "unknown key '" + key + "' in " + file + ": ckptd has no option of that name" +
           DidYouMean(Suggest(key, LongNames(app))) +
           "; remove or correct it (the keys are the long options of ckptd --help)";
  }
  const std::string not_configurable = ": This option is not allowed in a configuration file";
  if (dynamic_cast<const CLI::ConfigError*>(&error) != nullptr && what.size() > not_configurable.size() &&
      what.compare(what.size() - not_configurable.size(), not_configurable.size(), not_configurable) == 0) {
    return "key '" + what.substr(0, what.size() - not_configurable.size()) + "' in " + file +
           " is a command-line option only: remove it from " + file;
  }
  if (dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr) return DescribeExtras(app, app.remaining());
  if (dynamic_cast<const CLI::FileError*>(&error) != nullptr) {
    return what + ": name an existing configuration file with --config";
  }
  return what + " (from " + file + " or the command line): correct the value (see ckptd --help)";
}

int ReportConfigError(const std::string& message) {
  std::fprintf(stderr, "ckptd: configuration error: %s\n", message.c_str());
  std::fprintf(stderr, "ckptd: exiting with status %d (EX_CONFIG); the unit does not restart ckptd until "
               "the configuration is fixed (then: systemctl restart ckptd)\n", kExitConfigError);
  sd_notifyf(0, "STATUS=configuration error: %s", message.c_str());
  return kExitConfigError;
}

bool IsConfigurationError(const Status& status) {
  // A bad option, a missing root or group, a segment or state directory that is not
  // ckptd's own, a corrupt generation file: none of these heals by restarting.
  return status.code() == StatusCode::kInvalidArgument || status.code() == StatusCode::kNotFound ||
         status.code() == StatusCode::kFailedPrecondition || status.code() == StatusCode::kCorrupt;
}

}  // namespace ckpt::daemon
