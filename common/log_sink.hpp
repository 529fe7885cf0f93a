// Where GPUBOX_LOG lines go instead of stderr (common/logging.hpp): the Python package hands
// them to Python's logging. Apart from logging.hpp so that only its users depend on it.
#pragma once

#include <functional>
#include <string>

#include "common/logging.hpp"

namespace gpubox {

// The sink gets each whole line ("I1128 09:10:00 file.cpp:12] text", no newline), on the
// logging thread, one line at a time (under the write lock: it must not log itself). An empty
// sink restores stderr.
using LogSink = std::function<void(LogLevel level, const std::string& line)>;
void set_log_sink(LogSink sink);

}  // namespace gpubox
