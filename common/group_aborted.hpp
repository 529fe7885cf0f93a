// The error a communicator throws when its group was aborted (comm::CommGroup::abort). Its own
// header, below the communicators and run_on_cards that tell it apart (heterps/device may not
// depend on heterps/comm).
#pragma once

#include <string>
#include <utility>

#include "common/error.hpp"

namespace gpubox {

// A communicator's error when its group was aborted: `reason` is what the abort was given,
// verbatim. Whether it only tells of another card's failure is decided by who gave that reason
// (device::CardSet::run_on_cards marks a card told when the reason is one that another of its
// cards gave the group as it failed), never by the words of the message: an abort for a timeout,
// a mismatch or a lost peer is a failure of its own.
class GroupAborted : public Error {
 public:
  GroupAborted(const std::string& message, const std::string& where, std::string reason)
      : Error(where.empty() ? Error(message) : Error(message, where)), reason_(std::move(reason)) {}
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

namespace detail {
// GPUBOX_FAIL's GroupAborted: the location is file:line as for any Error.
[[noreturn]] void throw_group_aborted(const char* file, int line, const std::string& message,
                                      const std::string& reason);
}  // namespace detail
}  // namespace gpubox

// Throws the GroupAborted error of a group aborted for `reason` (its first abort's), the message
// made of the parts as GPUBOX_FAIL makes it.
#define GPUBOX_GROUP_ABORTED(reason, ...)                                                          \
  ::gpubox::detail::throw_group_aborted(__FILE__, __LINE__, ::gpubox::detail::concat(__VA_ARGS__), \
                                        (reason))
