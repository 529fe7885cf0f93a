// The rendezvous store: a small key -> bytes map that every process of a job can reach, through
// which the trainers find each other (Gloo's pair addresses, the NCCL unique id). Values are
// written once and never change; a reader waits for a key, bounded by a timeout.
//
// Back end today: a file store on a folder every process can read and write
// (GPUBOX_RENDEZVOUS=file:///shared/dir; one file per key, written to a temporary name and
// renamed into place, so a reader sees a whole value or none). The folder belongs to one job:
// keys left by an earlier job would be read as this job's (scripts/run_gpubox.sh makes a fresh
// folder per run).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace gpubox::comm {

class RendezvousStore {
 public:
  // The largest value set() accepts: addresses and ids, never data.
  static constexpr std::size_t kMaxValueBytes = std::size_t{1} << 20;

  virtual ~RendezvousStore() = default;
  // Publishes `value` under `key` (keys: letters, digits and "/_-.", not starting with ".", at most
  // 200 characters).
  // Throws gpubox::Error when the key or value is refused or the write fails.
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  // Publishes `value` under `key` unless the key is set: true when this call set it, false when
  // it was set before (by any process; one caller of several at once gets true). Throws as set.
  virtual bool set_once(const std::string& key, const std::vector<char>& value) = 0;
  // The value of `key`, waiting up to `timeout` for it to be set. Throws naming the key.
  virtual std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Returns once every key is set. Throws after `timeout`, naming the keys still missing.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Where it lives, for messages ("file:///dir").
  virtual std::string describe() const = 0;
};

// The store `url` names: "file:///abs/dir" (the folder is created when missing). Throws naming
// the url when it is malformed or the folder cannot be made.
std::unique_ptr<RendezvousStore> open_rendezvous_store(const std::string& url);

}  // namespace gpubox::comm
