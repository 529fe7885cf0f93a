#include "trainer/schedule/job_identity.hpp"

#include <sys/stat.h>
#include <time.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <vector>

#include "common/error.hpp"
#include "dataset/memory_source.hpp"
#include "table/io/save_dir.hpp"

namespace gpubox::trainer {
namespace {

constexpr const char* kDataFilePrefix = "data_file.";
// Jobs of more files record only their digest (a save's manifest holds a line a file).
constexpr std::size_t kMaxListedFiles = 1000;
constexpr std::size_t kMaxNamedFiles = 3;  // in a refusal; the rest counted

bool is_data_file_key(const std::string& key) {
  return key.compare(0, std::strlen(kDataFilePrefix), kDataFilePrefix) == 0;
}

// "<bytes> <seconds>.<nanoseconds> <absolute name>", a listed file's entry.
std::string file_entry(const std::string& name, const struct stat& st) {
  char head[64];
  std::snprintf(head, sizeof(head), "%" PRId64 " %" PRId64 ".%09ld ",
                static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec),
                static_cast<long>(st.st_mtim.tv_nsec));
  return head + name;
}

// A listed file's size and time as a person reads them, by name.
std::map<std::string, std::string> listed_files(const std::map<std::string, std::string>& job) {
  std::map<std::string, std::string> files;
  for (const auto& [key, entry] : job) {
    if (!is_data_file_key(key)) continue;
    std::istringstream in(entry);
    int64_t bytes = 0;
    std::string modified, name;
    in >> bytes >> modified;
    std::getline(in >> std::ws, name);
    const int64_t seconds = std::strtoll(modified.c_str(), nullptr, 10);
    const std::size_t dot = modified.find('.');
    const time_t t = static_cast<time_t>(seconds);
    struct tm utc {};
    char when[32] = "?";
    if (::gmtime_r(&t, &utc) != nullptr)
      std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &utc);
    files[name] = std::to_string(bytes) + " bytes, modified " + when +
                  (dot == std::string::npos ? "" : modified.substr(dot)) + " UTC";
  }
  return files;
}

}  // namespace

std::string data_file_differences(std::map<std::string, std::string>* saved,
                                  std::map<std::string, std::string>* now) {
  const std::map<std::string, std::string> was = listed_files(*saved);
  const std::map<std::string, std::string> is = listed_files(*now);
  for (auto* job : {saved, now}) {
    for (auto it = job->begin(); it != job->end();) {
      it = is_data_file_key(it->first) ? job->erase(it) : std::next(it);
    }
  }
  if (was.empty() || is.empty()) return "";  // a save from before the list, or a long list
  std::vector<std::string> differences;
  for (const auto& [name, entry] : was) {
    const auto n = is.find(name);
    if (n == is.end()) {
      differences.push_back(name + " (" + entry + ") is not in this job's data");
    } else if (n->second != entry) {
      differences.push_back(name + ": saved " + entry + ", now " + n->second);
    }
  }
  for (const auto& [name, entry] : is) {
    if (was.count(name) == 0) differences.push_back(name + " (" + entry + ") is new");
  }
  std::string out;
  for (std::size_t i = 0; i < std::min(differences.size(), kMaxNamedFiles); ++i) {
    out += (out.empty() ? "" : "; ") + differences[i];
  }
  if (differences.size() > kMaxNamedFiles) {
    out += "; and " + std::to_string(differences.size() - kMaxNamedFiles) + " more file(s)";
  }
  return out;
}

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
  std::size_t all_files = 0;
  for (const auto& pass : plan.pass_files) all_files += pass.size();
  // A name a manifest line cannot hold lists none.
  bool list = all_files <= kMaxListedFiles;
  std::vector<std::string> entries;
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
      list = list && name.find_first_of("\n\r") == std::string::npos;
      if (list) entries.push_back(file_entry(name, st));
    }
    XXH3_64bits_update(state, "|", 1);  // where a pass ends
  }
  const uint64_t digest = XXH3_64bits_digest(state);
  identity["data"] = std::to_string(files) + " files in " + std::to_string(plan.per_epoch) +
                     " passes an epoch, digest " + table::io::hex64(digest) +
                     " (their names, sizes and modification times)";
  std::sort(entries.begin(), entries.end());
  entries.erase(std::unique(entries.begin(), entries.end()), entries.end());  // pass_dirs repeats
  for (std::size_t i = 0; list && i < entries.size(); ++i) {
    identity[kDataFilePrefix + std::to_string(i)] = entries[i];
  }
  return identity;
}

}  // namespace gpubox::trainer
