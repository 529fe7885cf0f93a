// run_parallel: the table's one parallel loop (OpenMP), with errors as Status. Exceptions
// (bad_alloc, a failed GPUBOX_EXPECTS) thrown by a task are caught inside the parallel region
// and become Status, since they must not escape an OpenMP region.
#pragma once

#include <cstddef>
#include <functional>

#include "common/status.hpp"

namespace gpubox::table {

// Runs task(i) for i in [0, count) on up to `threads` threads (0: OpenMP's default, 1: inline,
// in order). Returns the error of the lowest failing i, or OK.
Status run_parallel(std::size_t count, int threads, const std::function<Status(std::size_t)>& task);

}  // namespace gpubox::table
