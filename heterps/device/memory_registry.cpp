#include "heterps/device/memory_registry.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <sstream>

#include "common/error.hpp"
#include "common/thread_annotations.hpp"

namespace gpubox::device {
namespace {

struct Registry {
  SharedMutex mu;
  std::map<std::uintptr_t, MemoryRange> ranges GPUBOX_GUARDED_BY(mu);  // keyed by begin
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: buffers may outlive statics
  return *instance;
}

bool check_from_environment() {
  const char* value = std::getenv("GPUBOX_DEVICE_CHECK");
  return value != nullptr && std::strcmp(value, "") != 0 && std::strcmp(value, "0") != 0;
}

std::atomic<bool>& check_flag() {
  static std::atomic<bool> flag{check_from_environment()};
  return flag;
}

std::string hex(std::uintptr_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << value;
  return out.str();
}

}  // namespace

void register_memory(const void* ptr, std::size_t bytes, MemoryKind kind, int device) {
  if (ptr == nullptr || bytes == 0) return;
  const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
  Registry& r = registry();
  WriterLock lock(r.mu);
  r.ranges[begin] = MemoryRange{kind, device, begin, bytes};
}

void unregister_memory(const void* ptr) noexcept {
  if (ptr == nullptr) return;
  Registry& r = registry();
  WriterLock lock(r.mu);
  r.ranges.erase(reinterpret_cast<std::uintptr_t>(ptr));
}

MemoryRange find_memory(const void* ptr) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  Registry& r = registry();
  ReaderLock lock(r.mu);
  auto it = r.ranges.upper_bound(address);
  if (it == r.ranges.begin()) return MemoryRange{};
  --it;
  const MemoryRange& range = it->second;
  if (address - range.begin < range.bytes) return range;
  return MemoryRange{};
}

bool device_check_enabled() { return check_flag().load(std::memory_order_relaxed); }
void set_device_check(bool enabled) { check_flag().store(enabled, std::memory_order_relaxed); }

std::string describe(const MemoryRange& range) {
  switch (range.kind) {
    case MemoryKind::kPinned:
      return "pinned host memory (allocation " + hex(range.begin) + " of " +
             std::to_string(range.bytes) + " bytes)";
    case MemoryKind::kCard:
      return "card " + std::to_string(range.device) + " memory (allocation " + hex(range.begin) +
             " of " + std::to_string(range.bytes) + " bytes)";
    case MemoryKind::kPageable:
      break;
  }
  return "pageable host memory (no card or pinned allocation holds it)";
}

void check_card_range(const void* ptr, std::size_t bytes, int device, const char* what,
                      const char* role) {
  if (bytes == 0) return;
  const MemoryRange range = find_memory(ptr);
  const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
  const char* space = *role != '\0' ? " " : "";
  if (range.kind != MemoryKind::kCard || range.device != device) {
    GPUBOX_FAIL("GPUBOX_DEVICE_CHECK: ", what, space, role, " ", hex(begin), " (", bytes,
                " bytes) must be card ", device, " memory, but it is ", describe(range));
  }
  if (begin + bytes > range.begin + range.bytes) {
    GPUBOX_FAIL("GPUBOX_DEVICE_CHECK: ", what, space, role, " ", hex(begin), " (", bytes,
                " bytes) runs past the end of its allocation: ", describe(range), " ends ",
                range.begin + range.bytes - begin, " bytes after it");
  }
}

}  // namespace gpubox::device
