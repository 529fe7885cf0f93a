#include "common/error_report.hpp"

#include <cstdio>

#include "common/group_aborted.hpp"
#include "common/logging.hpp"

namespace gpubox {

std::string user_message(const std::exception& e) {
  if (const auto* error = dynamic_cast<const Error*>(&e)) return error->message();
  return e.what();
}

Error with_context(const std::string& context, const Error& e) {
  if (e.where().empty()) return Error(context + e.message());
  return Error(context + e.message(), e.where());
}

void throw_with_context(const std::string& context, const Error& e) {
  if (const auto* aborted = dynamic_cast<const GroupAborted*>(&e)) {
    throw GroupAborted(context + e.message(), e.where(), aborted->reason());
  }
  if (dynamic_cast<const FailureTold*>(&e) != nullptr) {
    if (e.where().empty()) throw FailureTold(context + e.message());
    throw FailureTold(context + e.message(), e.where());
  }
  throw with_context(context, e);
}

void report_top_level(const char* tool, const std::exception& e) {
  if (const auto* error = dynamic_cast<const Error*>(&e); error && !error->where().empty()) {
    GPUBOX_LOG(INFO) << "the error below was raised at " << error->where();
  }
  std::fprintf(stderr, "%s: %s\n", tool, user_message(e).c_str());
}

}  // namespace gpubox
