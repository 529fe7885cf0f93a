// What a program shows its user of an error, and how an error is raised again one level up:
// the user's line carries the message alone, the location (file:line, the failed expectation)
// goes to the log (common/error.hpp's Error keeps the two apart).
#pragma once

#include <exception>
#include <string>

#include "common/error.hpp"

namespace gpubox {

// The text a user is shown for any exception: an Error's message() (its location is for the
// log), any other's what().
std::string user_message(const std::exception& e);
// `e` raised again one level up with `context` before its message and its location kept, so
// the text names where it was raised once (an Error built from another's what() would carry
// the location in the middle of the user's line).
Error with_context(const std::string& context, const Error& e);
// Throws with_context(context, e) keeping what e's type tells: a FailureTold stays one, a
// GroupAborted keeps its reason (a card's thread wraps the errors of the work it ran; how the
// failure is classified must not depend on that).
[[noreturn]] void throw_with_context(const std::string& context, const Error& e);
// A program's top level: logs where `e` was raised (an Error's location) and prints
// "<tool>: <message>" on stderr.
void report_top_level(const char* tool, const std::exception& e);

}  // namespace gpubox
