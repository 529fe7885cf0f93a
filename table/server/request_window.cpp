#include "table/server/request_window.hpp"

#include <xxhash.h>

#include <algorithm>

#include "common/error.hpp"
#include "common/hash.hpp"

namespace gpubox::table::server {

uint64_t request_digest(const uint8_t* payload, std::size_t bytes) {
  return XXH3_64bits(payload, bytes);
}

std::size_t RequestWindow::KeyHash::operator()(const RequestKey& k) const {
  return static_cast<std::size_t>(
      mix64(k.client_id ^ fmix64(k.request_id) ^ mix64(k.payload_digest + k.op)));
}

RequestWindow::RequestWindow(std::size_t max_bytes, Clock::duration max_age,
                             std::size_t max_client_bytes)
    : max_bytes_(max_bytes),
      max_age_(max_age),
      max_client_bytes_(max_client_bytes == 0 ? max_bytes : std::min(max_client_bytes, max_bytes)) {
  GPUBOX_EXPECTS(max_bytes >= kEntryOverheadBytes && max_age.count() > 0,
                 "request window must hold something");
}

RequestWindow::Begin RequestWindow::begin(const RequestKey& key, Clock::time_point now,
                                          CachedReply* reply) {
  MutexLock lock(mu_);
  evict_locked(now);
  auto [it, inserted] = entries_.try_emplace(key);
  if (inserted) return Begin::kNew;
  if (!it->second.done) return Begin::kInProgress;
  *reply = it->second.reply;
  return Begin::kDone;
}

void RequestWindow::finish(const RequestKey& key, Clock::time_point now, CachedReply reply,
                           bool remember) {
  MutexLock lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.done) return;
  if (!remember) {
    entries_.erase(it);
    return;
  }
  const Finished record{now, key, kEntryOverheadBytes + reply.payload.size(), ++next_serial_};
  it->second.done = true;
  it->second.serial = record.serial;
  it->second.reply = std::move(reply);
  finished_.push_back(record);
  bytes_ += record.bytes;
  auto [client, new_client] = clients_.try_emplace(key.client_id);
  if (new_client) bytes_ += kClientOverheadBytes;
  ClientShare& share = client->second;
  share.order.push_back(record);
  share.bytes += record.bytes;
  while (bytes_ > max_bytes_ && share.bytes > max_client_bytes_ && share.order.size() > 1) {
    forget_client_oldest(key.client_id);
  }
  evict_locked(now);
}

bool RequestWindow::live_locked(const Finished& record) const {
  auto it = entries_.find(record.key);
  return it != entries_.end() && it->second.done && it->second.serial == record.serial;
}

void RequestWindow::forget_client_oldest(uint64_t client_id) {
  ClientShare& share = clients_[client_id];
  const Finished oldest = share.order.front();
  share.order.pop_front();
  share.bytes -= oldest.bytes;
  bytes_ -= oldest.bytes;
  entries_.erase(oldest.key);
  ++stale_;  // its record in finished_ names nothing now
  if (stale_ > 1024 && stale_ > finished_.size() / 2) {
    // Stale records outnumber live ones: drop them at once (amortized over the evictions that
    // made them), so a client evicting its own cannot grow finished_ beyond twice the entries.
    std::deque<Finished> live;
    for (const Finished& f : finished_) {
      if (live_locked(f)) live.push_back(f);
    }
    finished_.swap(live);
    stale_ = 0;
  }
}

void RequestWindow::evict_locked(Clock::time_point now) {
  while (!finished_.empty() && (bytes_ > max_bytes_ || now - finished_.front().at > max_age_)) {
    const Finished oldest = finished_.front();
    finished_.pop_front();
    if (!live_locked(oldest)) {
      --stale_;
      continue;
    }
    // The oldest of all is its client's oldest too (both lists are in finishing order).
    auto share = clients_.find(oldest.key.client_id);
    share->second.order.pop_front();
    share->second.bytes -= oldest.bytes;
    if (share->second.order.empty()) {
      clients_.erase(share);
      bytes_ -= kClientOverheadBytes;
    }
    entries_.erase(oldest.key);
    bytes_ -= oldest.bytes;
  }
}

std::size_t RequestWindow::entries() const {
  MutexLock lock(mu_);
  return entries_.size();
}

std::size_t RequestWindow::bytes() const {
  MutexLock lock(mu_);
  return bytes_;
}

std::size_t RequestWindow::client_bytes(uint64_t client_id) const {
  MutexLock lock(mu_);
  auto it = clients_.find(client_id);
  return it == clients_.end() ? 0 : it->second.bytes;
}

}  // namespace gpubox::table::server
