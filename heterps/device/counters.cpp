#include "heterps/device/counters.hpp"

namespace gpubox::device {

DeviceCounts DeviceCounts::operator-(const DeviceCounts& earlier) const {
  DeviceCounts difference = *this;
  for (const DeviceCountField& f : kDeviceCountFields) difference.*f.field -= earlier.*f.field;
  return difference;
}

DeviceCounts& DeviceCounts::operator+=(const DeviceCounts& other) {
  for (const DeviceCountField& f : kDeviceCountFields) this->*f.field += other.*f.field;
  return *this;
}

std::string to_string(const DeviceCounts& counts) {
  std::string out;
  for (const DeviceCountField& f : kDeviceCountFields) {
    if (!out.empty()) out += ", ";
    out += std::string(f.name) + " " + std::to_string(counts.*f.field);
  }
  return out;
}

DeviceCounts CardCounters::snapshot() const {
  DeviceCounts c;
  c.host_syncs = host_syncs_.load(std::memory_order_relaxed);
  c.pipeline_waits = pipeline_waits_.load(std::memory_order_relaxed);
  c.allocations = allocations_.load(std::memory_order_relaxed);
  c.frees = frees_.load(std::memory_order_relaxed);
  c.pinned_allocations = pinned_allocations_.load(std::memory_order_relaxed);
  c.pinned_frees = pinned_frees_.load(std::memory_order_relaxed);
  c.pinned_copies = pinned_copies_.load(std::memory_order_relaxed);
  c.pageable_copies = pageable_copies_.load(std::memory_order_relaxed);
  c.card_copies = card_copies_.load(std::memory_order_relaxed);
  c.host_copies = host_copies_.load(std::memory_order_relaxed);
  c.copy_stream_copies = copy_stream_copies_.load(std::memory_order_relaxed);
  c.stream_waits = stream_waits_.load(std::memory_order_relaxed);
  c.launches = launches_.load(std::memory_order_relaxed);
  c.collectives = collectives_.load(std::memory_order_relaxed);
  c.graph_launches = graph_launches_.load(std::memory_order_relaxed);
  c.graph_nodes = graph_nodes_.load(std::memory_order_relaxed);
  c.graph_captures = graph_captures_.load(std::memory_order_relaxed);
  c.window_allocations = window_allocations_.load(std::memory_order_relaxed);
  return c;
}

namespace {
thread_local CardCounters* t_pinned_counters = nullptr;
}  // namespace

void set_thread_pinned_counters(CardCounters* counters) { t_pinned_counters = counters; }
CardCounters* thread_pinned_counters() { return t_pinned_counters; }

}  // namespace gpubox::device
