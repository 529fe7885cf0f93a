// GeoRows: a geo-mode training thread's local copy of the sparse rows it touched
// (runner.sync_mode: geo). Rows come from the servers on first touch; the thread's steps apply
// the accessor's rule to them locally (sparse_rule.hpp: apply_push); every runner.geo_step
// steps sync() pushes the change of each touched row since its last sync (local minus synced:
// show, click, embed_w, embedx_w) and adopts the servers' merged values. The optimizer state
// stays local, as in Paddle's geo mode (the servers only add deltas). "Synced" is what the
// servers held when the row was pulled or last synced; an embedx part created here counts from
// the key's initial values, which the servers create it at (apply_delta): another trainer may
// create the same part, and its initial values must be counted once.
//
// Thread-safety: one training thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "table/sparse_row/accessor.hpp"

namespace gpubox::table::server {
class RemoteHostTier;
}

namespace gpubox::trainer::ps_modes {

class GeoRows {
 public:
  explicit GeoRows(table::server::RemoteHostTier& servers);

  // rows[i * stride] = the local row of keys[i] (n distinct keys) and locals[i] its index
  // here (for apply); keys not held yet are pulled from the servers (created there in
  // slots[i]) and held from now on. Throws naming the servers on a failed pull.
  void read(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
            uint32_t* locals);
  // One step of the accessor's rule on the local rows locals[0..n) (read() gave them), from
  // their merged push records (push_dim floats each).
  void apply(const uint32_t* locals, std::size_t n, const float* push);
  // Pushes the deltas of every row changed since its last sync and adopts the servers' merged
  // values (their optimizer state stays local). The weight deltas (embed_w, embedx) are scaled
  // by `scale`, 1 / the job's training threads, as Paddle's GeoCommunicator scales them by
  // 1 / trainers: the servers average the local models' moves instead of adding them (added,
  // W threads that learn the same rows move them W times as far). show and click are counts
  // and add up unscaled. Returns the rows synced. Throws on a failed call.
  std::size_t sync(float scale);

  std::size_t size() const { return index_.size(); }

 private:
  float* row(uint32_t index) { return rows_.data() + std::size_t{index} * stride_; }
  // The servers' merged row `merged` becomes the local row's values (show, click, delta_score,
  // embed_w, embedx); the local optimizer state is kept.
  void adopt(float* local, const float* merged) const;

  table::server::RemoteHostTier& servers_;
  table::RowLayout layout_;
  table::AccessorConfig config_;
  std::size_t stride_;
  std::size_t push_dim_;
  std::unordered_map<uint64_t, uint32_t> index_;  // key -> local row
  std::vector<uint64_t> keys_;                    // local row -> key
  std::vector<float> rows_;                       // local rows, stride_ floats each
  std::vector<float> synced_;                     // pull record at the last sync, push_dim_ each
  std::vector<uint32_t> dirty_;                   // rows changed since the last sync
  std::vector<char> is_dirty_;
  std::vector<std::size_t> missing_;  // read(): positions of keys not held yet (reused)
};

}  // namespace gpubox::trainer::ps_modes
