#include "dataset/pass_data_cache.hpp"

#include <sys/stat.h>

#include <utility>

namespace gpubox::dataset {
namespace {

std::string mib_text(std::size_t bytes) {
  return std::to_string((bytes + (std::size_t{1} << 20) - 1) >> 20) + " MiB";
}

}  // namespace

bool identify_files(const std::vector<std::string>& files, std::vector<FileIdentity>* out) {
  out->clear();
  out->reserve(files.size());
  for (const std::string& path : files) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
    FileIdentity id;
    id.size = static_cast<std::uint64_t>(st.st_size);
    id.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    id.inode = static_cast<std::uint64_t>(st.st_ino);
    id.device = static_cast<std::uint64_t>(st.st_dev);
    out->push_back(id);
  }
  return true;
}

bool PassDataCache::lookup(const std::vector<std::string>& files,
                           const std::vector<FileIdentity>& identities,
                           std::vector<InstanceBlock>* blocks, LoadStats* stats) {
  std::shared_ptr<const Entry> entry;
  {
    MutexLock lock(mu_);
    const auto it = entries_.find(files);
    if (it == entries_.end()) return false;
    if (it->second->identities != identities) {
      held_bytes_ -= it->second->bytes;
      entries_.erase(it);
      return false;
    }
    entry = it->second;
    ++loads_served_;
    instances_served_ += entry->stats.instances;
  }
  // Copied outside the lock: another load need not wait for this one's copy.
  blocks->insert(blocks->end(), entry->blocks.begin(), entry->blocks.end());
  *stats = entry->stats;
  return true;
}

std::string PassDataCache::offer(const std::vector<std::string>& files,
                                 const std::vector<FileIdentity>& identities,
                                 const std::vector<InstanceBlock>& blocks, const LoadStats& stats) {
  if (budget_bytes_ == 0) return "";
  std::size_t bytes = 0;
  for (const InstanceBlock& b : blocks) bytes += b.memory_bytes();
  {
    MutexLock lock(mu_);
    if (entries_.count(files) != 0) return "";
    if (bytes > budget_bytes_ - held_bytes_) {
      if (refusal_noted_) return "";
      refusal_noted_ = true;
      return "not kept in the pass data cache: its records take " + mib_text(bytes) + ", " +
             mib_text(budget_bytes_ - held_bytes_) + " of runner.pass_cache_mb (" +
             mib_text(budget_bytes_) +
             ") are left; loads that do not fit are read from their files every epoch (said "
             "once)";
    }
    held_bytes_ += bytes;  // reserved before the copy, so concurrent offers cannot overshoot
  }
  auto entry = std::make_shared<Entry>();
  entry->identities = identities;
  entry->blocks = blocks;
  entry->stats = stats;
  entry->bytes = bytes;
  MutexLock lock(mu_);
  if (!entries_.emplace(files, std::move(entry)).second) held_bytes_ -= bytes;
  return "";
}

PassCacheCounts PassDataCache::counts() const {
  MutexLock lock(mu_);
  PassCacheCounts out;
  out.loads_served = loads_served_;
  out.instances_served = instances_served_;
  out.entries = entries_.size();
  out.bytes = held_bytes_;
  return out;
}

}  // namespace gpubox::dataset
