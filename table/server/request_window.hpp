// Remembers the recently applied mutating requests of each client, so that a retried request
// (same client id and request id, sent again after a lost connection or reply) is answered from
// the remembered reply instead of being applied a second time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/status.hpp"

namespace gpubox::table::server {

// A remembered reply: status code and payload (mutation replies are a few bytes).
struct CachedReply {
  Status::Code status = Status::Code::kOk;
  std::vector<uint8_t> payload;
};

// Bounded on both axes: at most `per_client` request ids per client (oldest forgotten first) and
// at most `max_clients` clients (the least recently seen forgotten first). A client never has more
// than a handful of requests in flight, so a retry always finds its original in the window.
// Thread-safe.
class RequestWindow {
 public:
  enum class Begin {
    kNew,         // not seen: the caller applies it and then calls finish()
    kDone,        // applied before: *reply holds the reply to send again
    kInProgress,  // the first copy is still being applied: ask the client to retry later
  };

  RequestWindow(std::size_t per_client, std::size_t max_clients);

  Begin begin(uint64_t client_id, uint64_t request_id, CachedReply* reply);
  // Records the reply of a request begun with kNew.
  void finish(uint64_t client_id, uint64_t request_id, CachedReply reply);

  std::size_t clients() const;

 private:
  struct Entry {
    bool done = false;
    CachedReply reply;
  };
  struct ClientRequests {
    std::unordered_map<uint64_t, Entry> by_id;
    std::deque<uint64_t> order;  // insertion order, for eviction
    uint64_t last_seen = 0;
  };
  void evict_clients_locked();

  const std::size_t per_client_;
  const std::size_t max_clients_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, ClientRequests> clients_;  // GUARDED_BY(mu_)
  uint64_t clock_ = 0;                                    // GUARDED_BY(mu_)
};

}  // namespace gpubox::table::server
