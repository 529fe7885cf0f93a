#include "dataset/memory_source.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

#include "common/error.hpp"
#include "common/thread_annotations.hpp"

namespace gpubox::dataset {
namespace {

constexpr const char kPrefix[] = "memory:";
constexpr char kShareMark = '@';  // "memory:<id>@<trainer>/<trainers>"

// A registered source, and the runs holding it (MemorySourcePins): released while held, it goes
// when the last of them ends.
struct Entry {
  MemorySource source;
  int pins = 0;
  bool released = false;
};

struct Registry {
  Mutex mu;
  uint64_t next GPUBOX_GUARDED_BY(mu) = 0;
  std::map<std::string, Entry> named GPUBOX_GUARDED_BY(mu);
};
Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: safe from any thread at exit
  return *r;
}

template <class T>
void hash_vector(XXH3_state_t* state, const std::vector<T>& v) {
  const uint64_t n = v.size();
  XXH3_64bits_update(state, &n, sizeof(n));
  XXH3_64bits_update(state, v.data(), v.size() * sizeof(T));
}

uint64_t digest_of(const InstanceBlock& block) {
  XXH3_state_t* state = XXH3_createState();
  GPUBOX_EXPECTS(state != nullptr, "memory data set: out of memory");
  XXH3_64bits_reset(state);
  hash_vector(state, block.labels);
  hash_vector(state, block.dense);
  hash_vector(state, block.keys);
  hash_vector(state, block.slot_sizes);
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

}  // namespace

bool is_memory_source(const std::string& name) { return name.rfind(kPrefix, 0) == 0; }

std::string register_memory_source(InstanceBlock block, std::vector<std::string> slot_names) {
  GPUBOX_EXPECTS(slot_names.size() == static_cast<std::size_t>(block.num_slots),
                 "memory data set: ", slot_names.size(), " slot names for ", block.num_slots,
                 " slots");
  MemorySource source;
  source.digest = digest_of(block);
  source.slot_names = std::move(slot_names);
  source.block = std::make_shared<const InstanceBlock>(std::move(block));
  Registry& r = registry();
  MutexLock lock(r.mu);
  std::string name = kPrefix + std::to_string(r.next++);
  r.named.emplace(name, Entry{std::move(source), 0, false});
  return name;
}

void unregister_memory_source(const std::string& name) {
  Registry& r = registry();
  MutexLock lock(r.mu);
  const auto found = r.named.find(name);
  if (found == r.named.end()) return;
  if (found->second.pins > 0) {
    found->second.released = true;  // the runs holding it read it to their end
  } else {
    r.named.erase(found);
  }
}

MemorySourcePins::MemorySourcePins(const std::vector<std::string>& names) {
  Registry& r = registry();
  MutexLock lock(r.mu);
  for (const std::string& name : names) {
    if (!is_memory_source(name)) continue;
    const std::string whole = name.substr(0, name.find(kShareMark));
    const auto found = r.named.find(whole);
    if (found == r.named.end()) continue;  // its first read names it
    ++found->second.pins;
    pinned_.push_back(whole);
  }
}

MemorySourcePins::~MemorySourcePins() {
  Registry& r = registry();
  MutexLock lock(r.mu);
  for (const std::string& name : pinned_) {
    const auto found = r.named.find(name);
    if (found == r.named.end()) continue;
    if (--found->second.pins == 0 && found->second.released) r.named.erase(found);
  }
}

namespace {

MemorySource find_registered(const std::string& name) {
  Registry& r = registry();
  MutexLock lock(r.mu);
  const auto found = r.named.find(name);
  GPUBOX_EXPECTS(found != r.named.end(), "in-memory data set '", name,
                 "' is not registered (released, or from another process)");
  return found->second.source;
}

// Rows [begin, end) of trainer t's share of n rows among `trainers` (trainer_file_share's split).
std::pair<std::size_t, std::size_t> share_rows(std::size_t n, std::size_t t, std::size_t trainers) {
  const std::size_t base = n / trainers;
  const std::size_t extra = n % trainers;
  const std::size_t begin = t * base + std::min(t, extra);
  return {begin, begin + base + (t < extra ? 1 : 0)};
}

}  // namespace

MemorySource find_memory_source(const std::string& name) {
  const std::size_t mark = name.find(kShareMark);
  if (mark == std::string::npos) return find_registered(name);
  const MemorySource whole = find_registered(name.substr(0, mark));
  int trainer = -1;
  int trainers = 0;
  const int read = std::sscanf(name.c_str() + mark + 1, "%d/%d", &trainer, &trainers);
  GPUBOX_EXPECTS(read == 2 && trainers >= 1 && trainer >= 0 && trainer < trainers,
                 "in-memory data set '", name, "': not a share name (<name>@<trainer>/<trainers>)");
  const InstanceBlock& all = *whole.block;
  const auto [begin, end] =
      share_rows(all.size(), static_cast<std::size_t>(trainer), static_cast<std::size_t>(trainers));
  InstanceBlock part(all.num_slots, all.dense_dim);
  for (std::size_t i = begin; i < end; ++i) part.append(all.instance(i));
  MemorySource share;
  share.digest = digest_of(part);
  share.slot_names = whole.slot_names;
  share.block = std::make_shared<const InstanceBlock>(std::move(part));
  return share;
}

std::string memory_source_share(const std::string& name, int trainer_id, int trainers) {
  GPUBOX_EXPECTS(trainers >= 1 && trainer_id >= 0 && trainer_id < trainers, "trainer id ",
                 trainer_id, " is not in [0, ", trainers, ")");
  GPUBOX_EXPECTS(name.find(kShareMark) == std::string::npos, "in-memory data set '", name,
                 "' is a share already");
  return name + kShareMark + std::to_string(trainer_id) + "/" + std::to_string(trainers);
}

}  // namespace gpubox::dataset
