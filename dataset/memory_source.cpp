#include "dataset/memory_source.hpp"

#include <xxhash.h>

#include <map>
#include <utility>

#include "common/error.hpp"
#include "common/thread_annotations.hpp"

namespace gpubox::dataset {
namespace {

constexpr const char kPrefix[] = "memory:";

struct Registry {
  Mutex mu;
  uint64_t next GPUBOX_GUARDED_BY(mu) = 0;
  std::map<std::string, MemorySource> named GPUBOX_GUARDED_BY(mu);
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

std::string register_memory_source(InstanceBlock block) {
  MemorySource source;
  source.digest = digest_of(block);
  source.block = std::make_shared<const InstanceBlock>(std::move(block));
  Registry& r = registry();
  MutexLock lock(r.mu);
  std::string name = kPrefix + std::to_string(r.next++);
  r.named.emplace(name, std::move(source));
  return name;
}

void unregister_memory_source(const std::string& name) {
  Registry& r = registry();
  MutexLock lock(r.mu);
  r.named.erase(name);
}

MemorySource find_memory_source(const std::string& name) {
  Registry& r = registry();
  MutexLock lock(r.mu);
  const auto found = r.named.find(name);
  GPUBOX_EXPECTS(found != r.named.end(), "in-memory data set '", name,
                 "' is not registered (released, or from another process)");
  return found->second;
}

}  // namespace gpubox::dataset
