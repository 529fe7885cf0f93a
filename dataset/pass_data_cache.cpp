#include "dataset/pass_data_cache.hpp"

#include <sys/stat.h>

#include <iterator>
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
    id.ctime_ns = static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
    id.inode = static_cast<std::uint64_t>(st.st_ino);
    id.device = static_cast<std::uint64_t>(st.st_dev);
    out->push_back(id);
  }
  return true;
}

std::string parse_fingerprint(const DatasetConfig& c) {
  std::string out;
  // Each field as its length and text, so that no two configs write the same string.
  const auto add = [&out](const std::string& field) {
    out += std::to_string(field.size()) + ":" + field;
  };
  add(std::to_string(static_cast<int>(c.data_format)));
  add(std::to_string(c.slots.size()));
  for (const std::string& slot : c.slots) add(slot);
  add(std::to_string(c.dense_dim));
  add(c.label_name);
  add(c.dense_name);
  add(std::to_string(c.feasign_first) + std::to_string(c.token_order_set) +
      std::to_string(c.ignore_unknown_slots) + std::to_string(c.strict_parse));
  add(std::to_string(c.multislot_order.size()));
  for (const std::string& field : c.multislot_order) add(field);
  add(c.pipe_command);
  add(std::to_string(c.pipe_arguments.size()));
  for (const std::string& argument : c.pipe_arguments) add(argument);
  add(std::to_string(c.max_line_bytes));
  add(std::to_string(c.max_reported_errors));
  add(std::to_string(c.split_bytes));
  add(std::to_string(static_cast<int>(c.criteo_dense)));
  add(std::to_string(static_cast<int>(c.dense_transform)));
  return out;
}

bool PassDataCache::lookup(const PassKey& key, const std::vector<FileIdentity>& identities,
                           bool with_unique_keys, Served* served) {
  std::shared_ptr<const Entry> entry;
  {
    MutexLock lock(mu_);
    const auto it = entries_.find(key);
    if (it == entries_.end()) return false;
    if (it->second->identities != identities) {
      erase_entry(it);
      return false;
    }
    entry = it->second;
    ++loads_served_;
    instances_served_ += entry->stats.instances;
    with_unique_keys = with_unique_keys && entry->unique_keys != nullptr;
    if (with_unique_keys) ++unique_keys_served_;
  }
  // The entry outlives the lock (held by `entry`): a concurrent drop cannot free its blocks.
  served->blocks = entry->blocks;
  served->stats = entry->stats;
  served->unique_keys = with_unique_keys ? entry->unique_keys : nullptr;
  return true;
}

void PassDataCache::forget(const std::vector<std::string>& files) {
  MutexLock lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    it = it->first.files == files ? erase_entry(it) : std::next(it);
  }
}

PassDataCache::Entries::iterator PassDataCache::erase_entry(Entries::iterator it) {
  held_bytes_ -= it->second->bytes;
  unique_keys_bytes_ -= it->second->unique_keys_bytes;
  return entries_.erase(it);
}

bool PassDataCache::make_room(std::size_t bytes) {
  // held_bytes_ <= budget_bytes_ and unique_keys_bytes_ <= held_bytes_: no overflow.
  if (bytes > budget_bytes_ - held_bytes_ + unique_keys_bytes_) return false;
  for (auto it = entries_.begin(); it != entries_.end() && bytes > budget_bytes_ - held_bytes_;
       ++it) {
    if (it->second->unique_keys == nullptr) continue;
    // Entries are immutable (lookups read them outside the lock): a new one, the blocks shared.
    auto entry = std::make_shared<Entry>(*it->second);
    held_bytes_ -= entry->unique_keys_bytes;
    entry->bytes -= entry->unique_keys_bytes;
    unique_keys_bytes_ -= entry->unique_keys_bytes;
    entry->unique_keys = nullptr;
    entry->unique_keys_bytes = 0;
    it->second = std::move(entry);
  }
  return true;
}

std::size_t PassDataCache::entry_bytes(const PassKey& key,
                                       const std::vector<SharedInstanceBlock>& blocks) {
  // The identities are one a file.
  std::size_t bytes = sizeof(Entry) + key.parse.size() + key.files.size() * sizeof(FileIdentity);
  for (const std::string& file : key.files) bytes += sizeof(std::string) + file.size();
  for (const SharedInstanceBlock& b : blocks) {
    bytes += sizeof(SharedInstanceBlock) + sizeof(InstanceBlock) + b->memory_bytes();
  }
  return bytes;
}

PassDataCache::Offered PassDataCache::offer(const PassKey& key,
                                            const std::vector<FileIdentity>& identities,
                                            const std::vector<SharedInstanceBlock>& blocks,
                                            const LoadStats& stats) {
  Offered out;
  if (budget_bytes_ == 0) return out;
  const std::size_t bytes = entry_bytes(key, blocks);
  {
    MutexLock lock(mu_);
    if (entries_.count(key) != 0) return out;
    if (!make_room(bytes)) {
      if (refusal_noted_) return out;
      refusal_noted_ = true;
      out.note = "not kept in the pass data cache: its records take " + mib_text(bytes) + ", " +
                 mib_text(budget_bytes_ - held_bytes_ + unique_keys_bytes_) +
                 " of runner.pass_cache_mb (" + mib_text(budget_bytes_) +
                 ") are left to records; loads that do not fit are read from their files every "
                 "epoch (said once)";
      return out;
    }
    held_bytes_ += bytes;  // reserved before the entry is built, so concurrent offers cannot
                           // overshoot
  }
  auto entry = std::make_shared<Entry>();
  entry->identities = identities;
  entry->blocks = blocks;  // shared: the offering load keeps them too
  entry->stats = stats;
  entry->bytes = bytes;
  MutexLock lock(mu_);
  out.kept = entries_.emplace(key, std::move(entry)).second;
  if (!out.kept) held_bytes_ -= bytes;
  return out;
}

void PassDataCache::remember_unique_keys(const PassKey& key,
                                         const std::vector<SharedInstanceBlock>& blocks,
                                         std::shared_ptr<const UniqueKeys> unique_keys) {
  const std::size_t bytes = sizeof(UniqueKeys) +
                            unique_keys->keys.capacity() * sizeof(std::uint64_t) +
                            unique_keys->slots.capacity() * sizeof(std::int32_t);
  MutexLock lock(mu_);
  const auto it = entries_.find(key);
  // Another load of `key` (its files changed, read and kept again) has other keys.
  if (it == entries_.end() || it->second->blocks != blocks || it->second->unique_keys != nullptr) {
    return;
  }
  if (bytes > budget_bytes_ - held_bytes_) return;
  // Entries are immutable (lookups read them outside the lock): a new one, the blocks shared.
  auto entry = std::make_shared<Entry>(*it->second);
  entry->unique_keys = std::move(unique_keys);
  entry->unique_keys_bytes = bytes;
  entry->bytes += bytes;
  held_bytes_ += bytes;
  unique_keys_bytes_ += bytes;
  it->second = std::move(entry);
}

PassCacheCounts PassDataCache::counts() const {
  MutexLock lock(mu_);
  PassCacheCounts out;
  out.loads_served = loads_served_;
  out.instances_served = instances_served_;
  out.unique_keys_served = unique_keys_served_;
  out.entries = entries_.size();
  out.bytes = held_bytes_;
  out.unique_keys_bytes = unique_keys_bytes_;
  return out;
}

}  // namespace gpubox::dataset
