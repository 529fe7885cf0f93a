// Remembers the replies of recently applied mutations, so that a retried request (the same
// client id, request id, op and payload, sent again after a lost connection or reply) is answered
// from the remembered reply instead of being applied a second time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"

namespace gpubox::table::server {

// What names one request. A client that reuses a request id for another op or another payload
// sends another request: it is applied, never answered with the first one's reply.
struct RequestKey {
  uint64_t client_id = 0;
  uint64_t request_id = 0;
  uint16_t op = 0;
  uint64_t payload_digest = 0;  // xxh3 of the payload (request_digest)
  bool operator==(const RequestKey& o) const {
    return client_id == o.client_id && request_id == o.request_id && op == o.op &&
           payload_digest == o.payload_digest;
  }
};

// 64-bit digest of a request payload, for RequestKey.
uint64_t request_digest(const uint8_t* payload, std::size_t bytes);

// A remembered reply: status code and payload (mutation replies are a few bytes).
struct CachedReply {
  Status::Code status = Status::Code::kOk;
  std::vector<uint8_t> payload;
};

// Bounded by bytes and by age: a finished entry is forgotten once it is older than `max_age`, or
// (oldest first) while the remembered entries take more than `max_bytes`. Entries still being
// applied are never forgotten (there is at most one per connection). Thread-safe.
class RequestWindow {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Begin {
    kNew,         // not seen: the caller applies it and then calls finish()
    kDone,        // applied before: *reply holds the reply to send again
    kInProgress,  // the first copy is still being applied: ask the client to retry later
  };
  // What one remembered entry costs besides its payload (map node, order record, key).
  static constexpr std::size_t kEntryOverheadBytes = 128;

  RequestWindow(std::size_t max_bytes, Clock::duration max_age);

  Begin begin(const RequestKey& key, Clock::time_point now, CachedReply* reply);
  // Ends a request begun with kNew. `remember`: its effect must not repeat (a mutation that
  // succeeded), so a retry gets `reply`; otherwise it is forgotten and a retry applies it again.
  void finish(const RequestKey& key, Clock::time_point now, CachedReply reply, bool remember);

  std::size_t entries() const;  // remembered and in progress
  std::size_t bytes() const;    // what the remembered entries cost

 private:
  struct KeyHash {
    std::size_t operator()(const RequestKey& k) const;
  };
  struct Entry {
    bool done = false;
    CachedReply reply;
  };
  void evict_locked(Clock::time_point now) GPUBOX_REQUIRES(mu_);

  const std::size_t max_bytes_;
  const Clock::duration max_age_;
  mutable Mutex mu_;
  std::unordered_map<RequestKey, Entry, KeyHash> entries_ GPUBOX_GUARDED_BY(mu_);
  // Finished entries in the order they finished (their age order), with their cost.
  struct Finished {
    Clock::time_point at;
    RequestKey key;
    std::size_t bytes;
  };
  std::deque<Finished> finished_ GPUBOX_GUARDED_BY(mu_);
  std::size_t bytes_ GPUBOX_GUARDED_BY(mu_) = 0;
};

}  // namespace gpubox::table::server
