#include "common/thread_priority.hpp"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

namespace gpubox {
namespace {
id_t this_thread_id() { return static_cast<id_t>(::syscall(SYS_gettid)); }
}  // namespace

int thread_nice() { return ::getpriority(PRIO_PROCESS, this_thread_id()); }

Status lower_thread_priority(int nice) {
  if (nice <= 0) return Status::OK();
  const id_t tid = this_thread_id();
  errno = 0;
  const int now = ::getpriority(PRIO_PROCESS, tid);
  if (errno == 0 && ::setpriority(PRIO_PROCESS, tid, std::min(19, now + nice)) == 0) {
    return Status::OK();
  }
  return Status::Internal("could not add " + std::to_string(nice) +
                          " to the thread's nice value: " + std::strerror(errno));
}

}  // namespace gpubox
