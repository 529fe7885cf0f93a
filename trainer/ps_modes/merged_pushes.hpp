// MergedPushes: the sync mode's sparse push of one trainer's step (issue 32). Every training
// thread has merged its batch's gradients per key (PsWorker::computed_push); these are summed per
// key over the trainer's threads before they go to the servers, so the servers apply a key's rule
// once a trainer a step, as the gpubox mode's cards sum a key's gradients and apply its rule once
// a step. (Pushed thread by thread, a key in every thread's batch had its rule applied once per
// thread: with Adagrad's or Adam's state, another row than one step on the summed gradient.) The
// keys are shared among the threads by hash: thread t sums and pushes those with
// mix64(key) % threads == t, adding the threads' gradients in thread order, so the sums do not
// depend on the threads' timing.
//
// Each thread files its computed push right after compute_step (file: its keys' indices bucketed
// by the thread that owns them), so that the owner reads only its share: O(keys) a step over
// the trainer, not O(threads x keys).
//
// A job of several trainers sums their pushes too: each thread's share goes to the servers as its
// part of the job's step, and every server sums a key's parts in part order and applies the rule
// once the step is whole (join_job; table/server/ps_step_sums.hpp).
//
// Thread-safety: join_job before any other call; file(t, ...) and then merge(t)/push(t, ...) from
// thread t, concurrently for every t; every thread's file() before any thread's merge() and every
// merge() before any thread's next file() (the sync mode's barriers: the step's pull barrier and
// the step barrier); each thread's buckets and share are its own, others' only read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "trainer/ps_modes/ps_push_types.hpp"
#include "trainer/ps_modes/step_buffers.hpp"

namespace gpubox::table::server {
class RemoteHostTier;
}

namespace gpubox::trainer::ps_modes {

class MergedPushes {
 public:
  // `threads` training threads of the trainer, each push record `push_dim` floats.
  MergedPushes(int threads, int push_dim);

  // Thread t's computed push of the step (its arrays read until the others' merge() returns),
  // filed by owner thread: mix64(key) % threads.
  void file(int t, const ComputedPush& computed);
  // Thread t's share of the step's keys, each summed over every thread's filed push (in thread
  // order, so the sums do not depend on the threads' timing); valid until t's next merge().
  ComputedPush merge(int t);
  // A job of several trainers (trainer `trainer` of `trainers`, each of `threads` threads): the
  // step's pushes are parts of job `job`'s step, which the servers sum over every trainer's
  // parts before one update (RemoteHostTier::push_step; issue 32). Before the first push. Throws
  // when trainers x threads is over kMaxStepParts (the servers would refuse every push).
  void join_job(uint64_t job, int trainer, int trainers);
  // merge(t), pushed through `servers` (one record per key): applied on arrival (one trainer),
  // or as thread t's part of the job's step (join_job; sent also when t has no key). Throws a
  // failed push naming `pass` and `step`.
  void push(int t, table::server::RemoteHostTier& servers, int64_t pass, int64_t step);
  // The growths of every thread's buffers so far (a steady step grows nothing).
  uint64_t growths() const;

 private:
  // One thread's state: its filed push and its keys' indices by owner thread (owner o's in
  // by_owner[owner_start[o], owner_start[o + 1]), in index order); and its share of a step's
  // keys: their slots and summed records, and an open-addressing index (linear probing, at most
  // half full) of the keys.
  struct Share {
    BufferGrowth growth;
    ComputedPush filed;
    std::vector<uint32_t> owner_start;  // threads + 1 offsets into by_owner
    std::vector<uint32_t> by_owner;     // the push's n indices
    std::vector<uint64_t> keys;
    std::vector<int32_t> slots;
    std::vector<float> values;  // keys x push_dim
    std::vector<uint32_t> index;
    // The lowest step id (pass << 32 | step) this thread may push next in the joined job: the
    // servers take a repeated step's parts for copies of the applied one (applying nothing).
    uint64_t next_step = 0;
  };
  // Empties `share` with room for `keys` keys.
  void clear(Share& share, std::size_t keys) const;
  // `key`'s record in `share` (added, zeroed, with `slot`, when absent).
  float* record(Share& share, uint64_t key, int32_t slot) const;

  const std::size_t threads_;
  const std::size_t push_dim_;
  // join_job's: the job's id, this trainer's first part (trainer x threads) and the job's parts;
  // parts 0: one trainer (pushes applied on arrival).
  uint64_t job_ = 0;
  uint32_t first_part_ = 0;
  uint32_t parts_ = 0;
  std::vector<Share> shares_;
};

}  // namespace gpubox::trainer::ps_modes
