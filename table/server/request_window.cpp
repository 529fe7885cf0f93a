#include "table/server/request_window.hpp"

#include <xxhash.h>

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

RequestWindow::RequestWindow(std::size_t max_bytes, Clock::duration max_age)
    : max_bytes_(max_bytes), max_age_(max_age) {
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
  const std::size_t cost = kEntryOverheadBytes + reply.payload.size();
  it->second.done = true;
  it->second.reply = std::move(reply);
  finished_.push_back(Finished{now, key, cost});
  bytes_ += cost;
  evict_locked(now);
}

void RequestWindow::evict_locked(Clock::time_point now) {
  while (!finished_.empty() && (bytes_ > max_bytes_ || now - finished_.front().at > max_age_)) {
    entries_.erase(finished_.front().key);
    bytes_ -= finished_.front().bytes;
    finished_.pop_front();
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

}  // namespace gpubox::table::server
