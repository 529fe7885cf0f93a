#include "trainer/schedule/job_identity.hpp"

#include <sys/stat.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "common/error.hpp"
#include "dataset/memory_source.hpp"
#include "table/io/save_dir.hpp"

namespace gpubox::trainer {

std::map<std::string, std::string> job_identity(const TrainerConfig& config, const RunPlan& plan,
                                                int trainers, int cards) {
  std::map<std::string, std::string> identity = config.job_keys;
  identity["trainers"] = std::to_string(trainers);
  if (config.runner.sync_mode == SyncMode::kGpubox) identity["cards"] = std::to_string(cards);
  // Freed on every way out (find_memory_source and GPUBOX_FAIL throw).
  const std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> owned(XXH3_createState(),
                                                                              &XXH3_freeState);
  XXH3_state_t* const state = owned.get();
  GPUBOX_EXPECTS(state != nullptr, "job identity: out of memory");
  XXH3_64bits_reset(state);
  std::size_t files = 0;
  for (const auto& pass : plan.pass_files) {
    for (const std::string& file : pass) {
      if (dataset::is_memory_source(file)) {  // its content, whatever name it was given
        const uint64_t content = dataset::find_memory_source(file).digest;
        XXH3_64bits_update(state, &content, sizeof(content));
        ++files;
        continue;
      }
      struct stat st {};
      if (::stat(file.c_str(), &st) != 0) {
        const int err = errno;
        GPUBOX_FAIL("reading the size and time of data file '", file, "': ", std::strerror(err));
      }
      const std::string name = std::filesystem::absolute(file).lexically_normal().string();
      const int64_t meta[3] = {static_cast<int64_t>(st.st_size),
                               static_cast<int64_t>(st.st_mtim.tv_sec),
                               static_cast<int64_t>(st.st_mtim.tv_nsec)};
      XXH3_64bits_update(state, name.data(), name.size() + 1);  // with its terminator
      XXH3_64bits_update(state, meta, sizeof(meta));
      ++files;
    }
    XXH3_64bits_update(state, "|", 1);  // where a pass ends
  }
  const uint64_t digest = XXH3_64bits_digest(state);
  identity["data"] = std::to_string(files) + " files in " + std::to_string(plan.per_epoch) +
                     " passes an epoch, digest " + table::io::hex64(digest) +
                     " (their names, sizes and modification times)";
  return identity;
}

}  // namespace gpubox::trainer
