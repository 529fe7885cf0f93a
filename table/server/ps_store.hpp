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

  // DENSE: reads table `name` (creating it from the request's values when absent), adds the
  // request's values to it, or replaces it by them; `*reply` becomes the DENSE reply holding
  // the table's values after the request. Refuses (a read or an add) a size that differs from
  // the table's, non-finite values, an add whose sum would not be finite (naming the value's
  // index; nothing added), an add to a table never read, and a new table beyond
  // kMaxDenseTables.
  Status dense(DenseRequest request, std::vector<uint8_t>* reply);

 private:
  static constexpr std::size_t kStripes = 64;
  std::array<Mutex, kStripes> stripes_;
  Mutex dense_mu_;
  std::map<std::string, std::vector<float>> dense_ GPUBOX_GUARDED_BY(dense_mu_);
};

}  // namespace gpubox::table::server
