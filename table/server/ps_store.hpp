// PsStore: what a gpubox_server keeps for the parameter-server modes (ps_protocol.hpp) besides
// its table: the locks that make a PS_PUSH's read-modify-write of a row atomic per key, and the
// dense tables. Thread-safe: every server thread may call it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"
#include "table/host_tier.hpp"
#include "table/server/ps_protocol.hpp"

namespace gpubox::table::server {

class PsStore {
 public:
  // Applies a PS_PUSH to `table`: pulls the rows (creating missing ones in the request's slots),
  // applies each key's gradient (the accessor's rule, sparse_rule.hpp: apply_push) or geo delta
  // (apply_delta), checks every resulting value, and writes them back, all under the locks of
  // the key stripes the request touches, so two trainers' updates of one key never overwrite
  // each other. Refuses the whole request (nothing applied; rows it created at their initial
  // values stay, as after a PULL) when its width is not the table's push_dim, a value is not
  // finite, or a result would not be finite (naming the key and the row's field).
  Status apply(HostTier& table, const PsPushRequest& request);

  // DENSE from client `client_id` (ps_protocol.hpp: DenseRequest): reads the request's range of
  // table `name` (a whole-table read creates it from the request's values when absent), adds the
  // request's values to the range, or writes the table (a whole write replaces it at once; a
  // ranged write is staged and replaces it when its last range arrived); `*reply` becomes the
  // DENSE reply. Refuses (InvalidArgument, nothing applied) a total other than the table's size,
  // non-finite values, an add whose sum would not be finite (naming the value's index), a range
  // of a staged write that overlaps one received before or disagrees with its name or total; an
  // add to, or a ranged read of, a table never created (NotFound); a new table beyond
  // kMaxDenseTables (ResourceExhausted). Beyond kMaxStagedDenseWrites staged writes, the oldest
  // is dropped: its writer learns it when no range of its write replies committed.
  //
  // What a reader can observe mid-way: each range is applied under one lock, so a read range
  // sees an add range whole or not at all; a client's add of a table over one frame is several
  // ranges, so a concurrent read may see some of its ranges added and others not yet. A staged
  // write is never seen in part.
  Status dense(uint64_t client_id, DenseRequest request, std::vector<uint8_t>* reply);

 private:
  // A ranged write being received: its ranges by offset (never overlapping).
  struct StagedWrite {
    uint64_t client_id = 0;
    uint64_t write_id = 0;
    std::string name;
    uint32_t total = 0;
    uint64_t started = 0;  // arrival order, for dropping the oldest
    std::size_t received = 0;
    std::map<uint32_t, std::vector<float>> ranges;
  };
  // The table `name` after a whole write (created when absent, within kMaxDenseTables).
  Status write_table(const std::string& name, std::vector<float> values) GPUBOX_REQUIRES(dense_mu_);
  // Adds a ranged write's range; *committed when it completed the write (the table replaced).
  Status stage_write(uint64_t client_id, DenseRequest& request, bool* committed)
      GPUBOX_REQUIRES(dense_mu_);
  // A read or an add of an existing (or, whole read, new) table's range.
  Status read_or_add(DenseRequest& request, std::vector<uint8_t>* reply) GPUBOX_REQUIRES(dense_mu_);

  static constexpr std::size_t kStripes = 64;
  std::array<Mutex, kStripes> stripes_;
  Mutex dense_mu_;
  std::map<std::string, std::vector<float>> dense_ GPUBOX_GUARDED_BY(dense_mu_);
  std::vector<StagedWrite> staged_ GPUBOX_GUARDED_BY(dense_mu_);
  uint64_t staged_serial_ GPUBOX_GUARDED_BY(dense_mu_) = 0;
};

}  // namespace gpubox::table::server
