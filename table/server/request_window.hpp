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
// (oldest first) while the remembered entries take more than `max_bytes`; and per client: when
// the entries take more than `max_bytes` and the client adding one holds more than
// `max_client_bytes`, its own oldest go first, so one client sending mutations fast cannot push
// out the replies that keep another client's retries from being applied twice. Within
// `max_bytes` a client keeps as many as fit (a PS trainer's threads share its id: a window cut to
// its share would forget a reply its own retry still needs). Entries still being applied are
// never forgotten (there is at most one per connection). Thread-safe.
class RequestWindow {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Begin {
    kNew,         // not seen: the caller applies it and then calls finish()
    kDone,        // applied before: *reply holds the reply to send again
    kInProgress,  // the first copy is still being applied: ask the client to retry later
  };
  // What one remembered entry costs besides its payload (map node, its two order records, key).
  static constexpr std::size_t kEntryOverheadBytes = 192;
  // What a client with remembered entries costs (its map node and order deque's first block).
  static constexpr std::size_t kClientOverheadBytes = 1024;

  // max_client_bytes: 0 (or over max_bytes) is max_bytes; at least one entry is kept per client.
  RequestWindow(std::size_t max_bytes, Clock::duration max_age, std::size_t max_client_bytes = 0);

  Begin begin(const RequestKey& key, Clock::time_point now, CachedReply* reply);
  // Ends a request begun with kNew. `remember`: its effect must not repeat (a mutation that
  // succeeded), so a retry gets `reply`; otherwise it is forgotten and a retry applies it again.
  void finish(const RequestKey& key, Clock::time_point now, CachedReply reply, bool remember);

  std::size_t entries() const;                         // remembered and in progress
  std::size_t bytes() const;                           // what the remembered entries cost
  std::size_t client_bytes(uint64_t client_id) const;  // what that client's remembered ones cost

 private:
  struct KeyHash {
    std::size_t operator()(const RequestKey& k) const;
  };
  struct Entry {
    bool done = false;
    uint64_t serial = 0;  // its Finished record's, once done
    CachedReply reply;
  };
  // A finished entry, in the order entries finished (their age order), with its cost.
  struct Finished {
    Clock::time_point at;
    RequestKey key;
    std::size_t bytes = 0;
    uint64_t serial = 0;
  };
  // One client's finished entries, oldest first, and what they cost.
  struct ClientShare {
    std::deque<Finished> order;
    std::size_t bytes = 0;
  };
  void evict_locked(Clock::time_point now) GPUBOX_REQUIRES(mu_);
  // Forgets the oldest entry of `client_id` (its record in finished_ becomes stale).
  void forget_client_oldest(uint64_t client_id) GPUBOX_REQUIRES(mu_);
  // Whether `record` still names a remembered entry (a client's own eviction leaves it stale).
  bool live_locked(const Finished& record) const GPUBOX_REQUIRES(mu_);

  const std::size_t max_bytes_;
  const Clock::duration max_age_;
  const std::size_t max_client_bytes_;
  mutable Mutex mu_;
  std::unordered_map<RequestKey, Entry, KeyHash> entries_ GPUBOX_GUARDED_BY(mu_);
  // Every finished entry in age order, plus `stale_` records of entries a client's own share
  // forgot (skipped when they reach the front; dropped all at once when they outnumber the rest).
  std::deque<Finished> finished_ GPUBOX_GUARDED_BY(mu_);
  std::size_t stale_ GPUBOX_GUARDED_BY(mu_) = 0;
  std::unordered_map<uint64_t, ClientShare> clients_ GPUBOX_GUARDED_BY(mu_);
  uint64_t next_serial_ GPUBOX_GUARDED_BY(mu_) = 0;
  std::size_t bytes_ GPUBOX_GUARDED_BY(mu_) = 0;
};

}  // namespace gpubox::table::server
