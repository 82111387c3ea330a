// Start-time checks of ckptd's configuration as the daemon itself sees the system (inside
// the unit's sandbox), so that a configuration the daemon can never serve with stops it
// once, with a message naming the key, the cause and the fix, and an exit status the unit
// does not restart on (RestartPreventExitStatus=78 in ckptd.service).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ckpt/status.h"
#include "daemon/server.h"

namespace ckpt::daemon {

// Exit status of ckptd for a configuration error (sysexits.h's EX_CONFIG). Any other
// failure to start exits 1, which the unit's Restart=on-failure retries.
inline constexpr int kExitConfigError = 78;

// Parses permission bits written in octal ("0644", "640"): InvalidArgument naming `key`
// unless the whole text is octal digits and the value is at most 0777.
Result<uint32_t> ParseModeBits(const std::string& key, const std::string& text);

// Checks what the options name, as this process sees it: every model root exists, is a
// directory and is readable and searchable by this user; admin-group, reader-group and
// metrics-file-group exist; this process belongs to metrics-file-group (or is root) so
// it can give the file to it; the directories of the socket and of the metrics file
// exist and are writable.
// Returns FailedPrecondition (or NotFound for a group) whose message names the key, the
// cause (e.g. PrivateTmp= hiding /tmp, ProtectSystem=strict making a directory read-only)
// and the fix. Touches nothing. Thread-compatible (reads the group database).
Status CheckServiceConfig(const ServerOptions& options);

// One line per way `budget_bytes` exceeds what the node can hold: the size of the
// filesystem at `shm_dir` (statvfs) and the node's physical memory. Empty when the budget
// is 0 (none) or fits. The daemon logs them as warnings and starts anyway: a budget is an
// upper bound shared by nodes of different sizes, and a load that meets the smaller real
// limit fails cleanly (posix_fallocate reports ENOSPC) without publishing anything.
std::vector<std::string> MemoryBudgetWarnings(uint64_t budget_bytes, const std::string& shm_dir = "/dev/shm");

// True when a failure of Server::Create is the configuration's fault (invalid option,
// unknown group, missing model root), i.e. ckptd should exit kExitConfigError; false for
// failures a restart may cure (socket in use, I/O errors).
bool IsConfigurationError(const Status& status);

// The operator's message for CLI11's parse error `error` of `app` (whose --config option
// names the file): an unknown key names the key, the file and the closest known key; a bad
// value names the option and the file or command line it came from.
std::string DescribeParseError(const CLI::App& app, const CLI::ParseError& error);

// Writes "ckptd: configuration error: <message>" to stderr (the journal) and to systemd
// (STATUS=), and returns kExitConfigError for main() to return.
int ReportConfigError(const std::string& message);

}  // namespace ckpt::daemon
