// The host-tier interface: what the pass manager (heterps) sees of the CPU side. Implemented by
// the in-process sharded table and by the gpubox_server client, so the pass manager does not
// know which it has. Rows are full sparse rows (table/sparse_row/accessor.hpp), `layout().stride()`
// floats each, packed in key order. Every call is bulk and returns a Status: the remote form
// crosses a socket. Implementations are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "common/config/config_enums.hpp"
#include "common/status.hpp"
#include "table/sparse_row/accessor.hpp"

namespace gpubox::table {
namespace io {
class FileEnv;
}  // namespace io

// What a save writes (runner.save_mode): base, delta or checkpoint; kNone is refused by save().
using SaveKind = config::SaveKind;
using config::kSaveKindNames;

// Where the rows of a bulk push lie: row i (of the call's keys) at row(i), either packed a
// record stride apart (HostTier::push) or each where its own pointer says (HostTier::push_at: a
// caller's rows read where they lie). prefetch_floats(): how many floats from row(i) a reader may
// prefetch before it knows the row's width: packed, the record stride (the record is there,
// zeros past a narrower row); by address, what the caller says every row holds (the narrowest
// width class's stride: a row lies alone at its own stride, so more would reach past a narrow
// row into memory the push never reads). Non-owning, trivially copyable; the rows must outlive it.
class PushedRows {
 public:
  static PushedRows packed(const float* rows, std::size_t stride) {
    return PushedRows(rows, stride, nullptr, stride);
  }
  static PushedRows at(const float* const* rows, std::size_t prefetch_floats) {
    return PushedRows(nullptr, 0, rows, prefetch_floats);
  }

  const float* row(std::size_t i) const { return at_ != nullptr ? at_[i] : packed_ + i * stride_; }
  std::size_t prefetch_floats() const { return prefetch_floats_; }

 private:
  PushedRows(const float* packed, std::size_t stride, const float* const* at,
             std::size_t prefetch_floats)
      : packed_(packed), stride_(stride), at_(at), prefetch_floats_(prefetch_floats) {}

  const float* packed_;
  std::size_t stride_;
  const float* const* at_;
  std::size_t prefetch_floats_;
};

struct HostTierStats {
  uint64_t rows_in_memory = 0;
  uint64_t rows_on_disk = 0;
  uint64_t memory_bytes = 0;
};

class HostTier {
 public:
  virtual ~HostTier() = default;
  virtual const RowLayout& layout() const = 0;
  virtual const AccessorConfig& config() const = 0;

  // rows[i] = the row of keys[i]; missing keys are created by the accessor rules (init_row,
  // slot from slots[i] when slots != nullptr, else 0) and counted in *created when given.
  virtual Status pull(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
                      std::size_t* created) = 0;
  // The read-only form of pull, for evaluation (which must leave the model as it found it):
  // rows[i] = the row of keys[i], or, for a key the tier does not hold, the row pull would create
  // (init_row, slot from slots[i] or 0), which is not stored. Nothing changes: no row is
  // created, no unseen-days counter is reset, rows on disk stay there. *unknown (when given) =
  // how many of the n keys the tier does not hold (a repeated key counts each time).
  virtual Status peek(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
                      std::size_t* unknown) = 0;
  // Writes back full rows a card updated (creates keys that are missing). `rows` is not read
  // after the call returns (the pass write-back reuses the buffer at once).
  virtual Status push(const uint64_t* keys, std::size_t n, const float* rows) = 0;
  // Whether push_at takes rows by their addresses, reading each where it lies (the in-process
  // table). A tier that does not (a remote one, a wrapper that observes or fails push) refuses
  // push_at: a caller whose rows lie apart packs them into records and calls push.
  virtual bool pushes_by_address() const { return false; }
  // push with the row of keys[i] read at rows[i]: a row under its own layout
  // (layout().of_row: a narrower width class's row needs no padding to the record stride), for
  // a caller whose rows lie apart (the pass write-back on the cpu backend pushes the cards' rows
  // where they lie, by their addresses). Neither `rows` nor the rows are read after the call
  // returns. Only where pushes_by_address(); this default refuses (InvalidArgument).
  virtual Status push_at(const uint64_t* keys, std::size_t n, const float* const* rows) {
    (void)keys;
    (void)n;
    (void)rows;
    return Status::InvalidArgument(
        "push_at: this host tier takes no rows by address (pushes_by_address): push packed rows");
  }
  virtual Status erase(const uint64_t* keys, std::size_t n) = 0;
  virtual StatusOr<HostTierStats> stats() = 0;

  // Decays show/click, ages unseen rows, deletes rows under delete_threshold or unseen longer
  // than delete_after_unseen_days. Returns how many rows were deleted.
  StatusOr<uint64_t> shrink() { return shrink(nullptr); }
  // The same, calling `on_progress` (when set) after each step of bounded work it finished (a
  // shard of the in-process table, or a bounded chunk of a shard's rows), from the thread that
  // did it (several at once): gpubox_server counts them for the PROGRESS frames of a SHRINK, so
  // it must be cheap and thread-safe. It may run under a shard's lock: it must not block, nor
  // call back into the table. A remote tier does not call it (its servers report to it).
  // The steps bound a SHRINK by progress only while the server's network threads, which send the
  // PROGRESS frames, are not all blocked on the shard being shrunk (a PULL or PUSH of it waits
  // for its whole shrink): trainers shrink at pass boundaries, when no batch is in flight.
  virtual StatusOr<uint64_t> shrink(const std::function<void()>& on_progress) = 0;
  // Model save/load under `path` (a folder; for servers, a folder on the server's machine),
  // through the tier's own file system (the in-process table's HostTableConfig::env).
  Status save(const std::string& path, SaveKind mode) { return save(path, mode, nullptr); }
  Status load(const std::string& path) { return load(path, nullptr); }
  // The same through `env` when it is not null (borrowed for the call): gpubox_server passes
  // its data_dir env (io/rooted_env.hpp), so that no file operation of a request's save or load
  // leaves data_dir whatever happens to the folders meanwhile. A remote tier refuses an env
  // (its servers save through their own).
  virtual Status save(const std::string& path, SaveKind mode, io::FileEnv* env) = 0;
  virtual Status load(const std::string& path, io::FileEnv* env) = 0;

  // Each of the job's `trainers` trainers calls this once when the job ended well (its last
  // save written). An in-process tier has no one to tell; a remote tier tells its servers,
  // which may then exit (gpubox_server --exit_when_job_ends).
  virtual Status end_job(uint32_t trainers) {
    (void)trainers;
    return Status::OK();
  }
};

}  // namespace gpubox::table
