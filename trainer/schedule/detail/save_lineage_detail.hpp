// What checkpoint.cpp (saves and their restore) and save_recovery.cpp (going back to a save
// after a server restart) both ask of a host tier and of a run's start. Private to
// trainer/schedule.
#pragma once

#include <string>

#include "table/host_tier.hpp"
#include "table/server/remote_host_tier.hpp"

namespace gpubox::trainer::detail {

// The host tier as servers, or nullptr for an in-process tier.
inline table::server::RemoteHostTier* as_remote(table::HostTier& host) {
  return dynamic_cast<table::server::RemoteHostTier*>(&host);
}

// Where a run starts when no save of it is resumed: "from scratch" or "from --load <origin>".
inline std::string describe_start(const std::string& origin) {
  return origin.empty() ? "from scratch" : "from --load " + origin;
}

}  // namespace gpubox::trainer::detail
