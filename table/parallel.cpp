#include "table/parallel.hpp"

#include <omp.h>

#include <exception>
#include <new>
#include <vector>

namespace gpubox::table {
namespace {

Status run_one(const std::function<Status(std::size_t)>& task, std::size_t i) {
  try {
    return task(i);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("out of memory");
  } catch (const std::exception& e) {
    return Status::Internal(e.what());
  }
}

}  // namespace

Status run_parallel(std::size_t count, int threads,
                    const std::function<Status(std::size_t)>& task) {
  if (count == 0) return Status::OK();
  std::vector<Status> results(count);
  const int team = threads > 0 ? threads : omp_get_max_threads();
  if (team <= 1 || count == 1) {
    for (std::size_t i = 0; i < count; ++i) {
      results[i] = run_one(task, i);
      if (!results[i].ok()) return results[i];
    }
    return Status::OK();
  }
  const long long n = static_cast<long long>(count);
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
  for (long long i = 0; i < n; ++i) results[i] = run_one(task, static_cast<std::size_t>(i));
  for (const Status& st : results) {
    if (!st.ok()) return st;
  }
  return Status::OK();
}

}  // namespace gpubox::table
