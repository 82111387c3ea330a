// The daemon's metrics in the Prometheus text format, rendered from one table of
// {name, type, help, samples} (metrics.cc): adding a metric is adding a row.
#pragma once

#include <string>

#include "daemon/ops.h"

namespace ckpt::daemon {

// Every metric of the table, with its HELP and TYPE lines.
std::string RenderMetrics(const DaemonContext& ctx);

}  // namespace ckpt::daemon
