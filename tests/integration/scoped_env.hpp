// An environment variable set for a scope, restored (or unset) at its end: the tests' switches
// (GPUBOX_STEP_GRAPHS, GPUBOX_PADDED_STEPS) are read when a trainer's card workers and HeterComms
// are made, so a scope around a trainer's construction and run sets them for it alone.
#pragma once

#include <cstdlib>
#include <string>

namespace gpubox::testing {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_.empty()) {
      ::unsetenv(name_);
    } else {
      ::setenv(name_, old_.c_str(), 1);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
};

}  // namespace gpubox::testing
