#include "table/server/request_window.hpp"

#include "common/error.hpp"

namespace gpubox::table::server {

RequestWindow::RequestWindow(std::size_t per_client, std::size_t max_clients)
    : per_client_(per_client), max_clients_(max_clients) {
  GPUBOX_EXPECTS(per_client > 0 && max_clients > 0, "request window must hold something");
}

RequestWindow::Begin RequestWindow::begin(uint64_t client_id, uint64_t request_id,
                                          CachedReply* reply) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = clients_.try_emplace(client_id);
  ClientRequests& client = it->second;
  client.last_seen = ++clock_;
  auto found = client.by_id.find(request_id);
  if (found != client.by_id.end()) {
    if (!found->second.done) return Begin::kInProgress;
    *reply = found->second.reply;
    return Begin::kDone;
  }
  client.by_id.emplace(request_id, Entry{});
  client.order.push_back(request_id);
  // Never forget a request still being applied: its finish() would be lost and a retry would
  // apply it again. In-flight requests are few, so one pass over the ids is enough.
  const std::size_t ids = client.order.size();
  for (std::size_t scanned = 0; client.order.size() > per_client_ && scanned < ids; ++scanned) {
    const uint64_t oldest = client.order.front();
    client.order.pop_front();
    auto old = client.by_id.find(oldest);
    if (old != client.by_id.end() && !old->second.done) {
      client.order.push_back(oldest);
    } else {
      client.by_id.erase(oldest);
    }
  }
  if (inserted) evict_clients_locked();
  return Begin::kNew;
}

void RequestWindow::finish(uint64_t client_id, uint64_t request_id, CachedReply reply) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = clients_.find(client_id);
  if (it == clients_.end()) return;
  auto found = it->second.by_id.find(request_id);
  if (found == it->second.by_id.end()) return;
  found->second.done = true;
  found->second.reply = std::move(reply);
}

void RequestWindow::evict_clients_locked() {
  while (clients_.size() > max_clients_) {
    auto victim = clients_.end();
    for (auto it = clients_.begin(); it != clients_.end(); ++it) {
      bool busy = false;
      for (const auto& [id, entry] : it->second.by_id) busy |= !entry.done;
      if (busy) continue;
      if (victim == clients_.end() || it->second.last_seen < victim->second.last_seen) victim = it;
    }
    if (victim == clients_.end()) return;  // every client has work in flight: keep them all
    clients_.erase(victim);
  }
}

std::size_t RequestWindow::clients() const {
  std::lock_guard<std::mutex> lock(mu_);
  return clients_.size();
}

}  // namespace gpubox::table::server
