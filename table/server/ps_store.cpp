#include "table/server/ps_store.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <sstream>
#include <string_view>
#include <utility>

#include "common/hash.hpp"
#include "common/logging.hpp"
#include "table/server/connection_share.hpp"
#include "table/server/protocol.hpp"
#include "table/sparse_row/optimizer.hpp"

namespace gpubox::table::server {

namespace {

// The name of float slot `index` of a row of `layout` (its own width's layout), for errors.
std::string row_field_name(const RowLayout& layout, int32_t index) {
  const auto at = [](const char* name, int32_t i) {
    return std::string(name) + "[" + std::to_string(i) + "]";
  };
  switch (index) {
    case RowLayout::kShow:
      return "show";
    case RowLayout::kClick:
      return "click";
    case RowLayout::kDeltaScore:
      return "delta_score";
    case RowLayout::kUnseenDays:
      return "unseen_days";
    case RowLayout::kEmbedW:
      return "embed_w";
    default:
      break;
  }
  if (index < layout.slot()) return at("embed_state", index - RowLayout::kEmbedState);
  if (index == layout.slot()) return "slot";
  if (index == layout.mf_dim_offset()) return "mf_dim";
  if (index == layout.mf_size()) return "mf_size";
  if (index < layout.embedx_w()) return at("embedx_state", index - layout.embedx_state());
  const int32_t i = index - layout.embedx_w();
  return layout.packed() ? at("embedx_w", 2 * i) + " or " + at("embedx_w", 2 * i + 1)
                         : at("embedx_w", i);
}

// The stripes a request touches, locked in ascending order for as long as it lives (every
// request takes them in that order, so two requests never wait on each other in a cycle).
class StripeLocks {
 public:
  template <std::size_t N>
  StripeLocks(std::array<Mutex, N>& stripes,
              const std::vector<bool>& touched) GPUBOX_NO_THREAD_SAFETY_ANALYSIS {
    for (std::size_t s = 0; s < N; ++s) {
      if (!touched[s]) continue;
      stripes[s].lock();
      held_.push_back(&stripes[s]);
    }
  }
  ~StripeLocks() GPUBOX_NO_THREAD_SAFETY_ANALYSIS {
    for (auto it = held_.rbegin(); it != held_.rend(); ++it) (*it)->unlock();
  }
  StripeLocks(const StripeLocks&) = delete;
  StripeLocks& operator=(const StripeLocks&) = delete;

 private:
  std::vector<Mutex*> held_;
};

}  // namespace

Status check_push_width(const HostTier& table, uint32_t dim) {
  const RowLayout& layout = table.layout();
  const auto width = static_cast<uint32_t>(layout.push_dim());
  if (dim == width) return Status::OK();
  return Status::InvalidArgument("PS_PUSH records of width " + std::to_string(dim) +
                                 " sent to a table whose records are " + std::to_string(width) +
                                 " wide (mf_dim " + std::to_string(layout.mf_dim) + ")");
}

Status PsStore::apply(HostTier& table, const PsPushRequest& request) {
  const RowLayout& layout = table.layout();
  const AccessorConfig& config = table.config();
  const std::size_t n = request.keys.size();
  if (n == 0) return Status::OK();
  GPUBOX_RETURN_IF_ERROR(check_push_width(table, request.dim));
  const auto dim = static_cast<uint32_t>(layout.push_dim());
  const std::size_t bad = first_non_finite(request.values.data(), request.values.size());
  if (bad != request.values.size()) {
    return non_finite_row_error(request.keys.data(), n, request.values.data(), dim, bad);
  }
  // The whole read-modify-write runs under the locks of every stripe it touches: no other
  // trainer's update of these keys comes between the read and the write, and the results are
  // checked before anything is written, so a request that would store a non-finite value is
  // refused whole. (Two PS_PUSHes over common stripes run one after the other.)
  std::vector<bool> touched(kStripes, false);
  for (std::size_t i = 0; i < n; ++i) touched[fmix64(request.keys[i]) % kStripes] = true;
  StripeLocks locks(stripes_, touched);
  const auto stride = static_cast<std::size_t>(layout.stride());
  std::vector<float> rows(n * stride);
  GPUBOX_RETURN_IF_ERROR(
      table.pull(request.keys.data(), request.slots.data(), n, rows.data(), nullptr));
  for (std::size_t i = 0; i < n; ++i) {
    float* row = rows.data() + i * stride;
    const float* update = request.values.data() + i * dim;
    if (request.kind == PsUpdateKind::kGradient) {
      table::optimizer::apply_push(row, layout, config, request.keys[i], update);
    } else {
      table::optimizer::apply_delta(row, layout, config, request.keys[i], update);
    }
  }
  const std::size_t overflow = first_non_finite_row(rows.data(), n, layout);
  if (overflow != n * stride) {
    const std::size_t r = overflow / stride;
    const RowLayout own = layout.of_row(rows.data() + r * stride);
    std::ostringstream msg;
    msg << "PS_PUSH: key " << request.keys[r] << "'s "
        << row_field_name(own, static_cast<int32_t>(overflow % stride)) << " would not be finite "
        << "after this request's "
        << (request.kind == PsUpdateKind::kGradient ? "gradient" : "geo delta")
        << "; nothing of the request's " << n
        << " keys was applied (keys it names that the server did not hold were created at their "
           "initial values, as a PULL creates them)";
    return Status::InvalidArgument(msg.str());
  }
  return table.push(request.keys.data(), n, rows.data());
}

Status PsStore::dense(const DenseCaller& caller, DenseRequest request, std::vector<uint8_t>* reply,
                      Clock::time_point now) {
  const uint64_t client_id = caller.client_id;
  const std::size_t bad = first_non_finite(request.values.data(), request.values.size());
  if (bad != request.values.size()) {
    return Status::InvalidArgument("DENSE '" + request.name + "': value " +
                                   std::to_string(std::size_t{request.offset} + bad) +
                                   " is not finite; nothing was applied");
  }
  MutexLock lock(dense_mu_);
  if (request.action != DenseAction::kWrite) return read_or_add(caller, request, reply, now);
  bool committed = true;
  if (request.whole()) {
    auto it = dense_.find(request.name);
    GPUBOX_RETURN_IF_ERROR(admit_settled(
        caller, "DENSE '" + request.name + "': a write of client " + std::to_string(client_id),
        sizeof(float) * std::size_t{request.count},
        it == dense_.end() ? 0 : sizeof(float) * it->second.size(), now));
    GPUBOX_RETURN_IF_ERROR(write_table(request.name, std::move(request.values)));
  } else {
    GPUBOX_RETURN_IF_ERROR(stage_write(caller, request, now, &committed));
  }
  // A write replies no values: the writer has them.
  encode_dense_reply(request.offset, nullptr, 0, committed, reply);
  return Status::OK();
}

Status PsStore::admit(const std::string& who, std::size_t table_bytes, std::size_t replaced_bytes,
                      std::size_t held_bytes) const {
  // A held write commits by copying its ranges into one table while they are still held: the
  // largest held write's copy is counted, so every held write can commit within the limit.
  // The writes doomed to make room for a new one (make_room, admit_held) are counted as gone.
  std::size_t largest = held_bytes;
  std::size_t doomed = 0;
  for (const StagedWrite& w : staged_) {
    if (w.doomed) {
      doomed += sizeof(float) * std::size_t{w.total};
    } else {
      largest = std::max(largest, sizeof(float) * w.total);
    }
  }
  const std::size_t after =
      table_bytes_ - replaced_bytes + table_bytes + held_bytes_ - doomed + held_bytes + largest;
  if (after <= limits_.max_bytes) return Status::OK();
  std::ostringstream msg;
  msg << who << " would take the server's dense memory to " << after << " bytes (tables "
      << table_bytes_ - replaced_bytes + table_bytes << ", ranged writes held "
      << held_bytes_ - doomed + held_bytes << ", the largest one's commit copy " << largest
      << "), over its limit of " << limits_.max_bytes
      << " bytes (gpubox_server --max_dense_mb); nothing was stored";
  return Status::ResourceExhausted(msg.str());
}

Status PsStore::write_table(const std::string& name, std::vector<float> values) {
  auto it = dense_.find(name);
  if (it == dense_.end() && dense_.size() >= kMaxDenseTables) {
    return Status::ResourceExhausted("DENSE '" + name + "': this server already holds " +
                                     std::to_string(kMaxDenseTables) + " dense tables");
  }
  if (it != dense_.end()) table_bytes_ -= sizeof(float) * it->second.size();
  table_bytes_ += sizeof(float) * values.size();
  dense_[name] = std::move(values);
  return Status::OK();
}

std::vector<PsStore::StagedWrite>::iterator PsStore::release(
    std::vector<StagedWrite>::iterator staged) {
  held_bytes_ -= sizeof(float) * std::size_t{staged->total};
  return staged_.erase(staged);
}

std::vector<PsStore::StagedWrite>::iterator PsStore::drop_held(
    std::vector<StagedWrite>::iterator staged, const std::string& reason) {
  remember_dropped({staged->client_id, staged->write_id, staged->host, reason});
  return release(staged);
}

void PsStore::remember_dropped(DroppedWrite dropped) {
  const auto own = std::count_if(dropped_.begin(), dropped_.end(), [&](const DroppedWrite& d) {
    return d.client_id == dropped.client_id;
  });
  if (static_cast<std::size_t>(own) >= kMaxDroppedPerClient) {
    dropped_.erase(std::find_if(dropped_.begin(), dropped_.end(), [&](const DroppedWrite& d) {
      return d.client_id == dropped.client_id;
    }));
  } else if (dropped_.size() >= kMaxDroppedRecords) {
    forget_dropped_fairly();
  }
  dropped_.push_back(std::move(dropped));
}

void PsStore::forget_dropped_fairly() {
  std::map<std::string_view, std::size_t> per_host;
  std::map<std::pair<std::string_view, uint64_t>, std::size_t> per_client;
  for (const DroppedWrite& d : dropped_) {
    ++per_host[d.host];
    ++per_client[{d.host, d.client_id}];
  }
  // The first record (oldest first) of the largest count: ties go to the oldest record.
  // (The record is passed in: a lambda is outside the analysis of dense_mu_, held here.)
  const auto first_of_most = [](auto& records, auto&& count_of) {
    std::size_t best = 0;
    auto chosen = records.end();
    for (auto d = records.begin(); d != records.end(); ++d) {
      const std::size_t count = count_of(*d);
      if (count <= best) continue;
      best = count;
      chosen = d;
    }
    return chosen;
  };
  const auto top = first_of_most(dropped_, [&](const DroppedWrite& d) { return per_host[d.host]; });
  if (top == dropped_.end()) return;
  const std::string_view host = top->host;
  dropped_.erase(first_of_most(dropped_, [&](const DroppedWrite& d) {
    return d.host == host ? per_client[{d.host, d.client_id}] : std::size_t{0};
  }));
}

Status PsStore::dropped_error(uint64_t client_id, uint64_t write_id,
                              const std::string& what) const {
  for (const DroppedWrite& d : dropped_) {
    if (d.client_id != client_id || d.write_id != write_id) continue;
    return Status::NotFound(what + ": write " + std::to_string(write_id) + " was dropped: " +
                            d.reason + "; nothing of it was stored, write the table again");
  }
  return Status::OK();
}

Status PsStore::find_or_hold(const DenseCaller& caller, const DenseRequest& request,
                             const std::string& what, Clock::time_point now,
                             std::vector<StagedWrite>::iterator* staged) {
  *staged = std::find_if(staged_.begin(), staged_.end(), [&](const StagedWrite& w) {
    return w.client_id == caller.client_id && w.write_id == request.write_id;
  });
  if (*staged != staged_.end()) {
    auto& carriers = (*staged)->connections;
    if (std::find(carriers.begin(), carriers.end(), caller.connection) == carriers.end()) {
      carriers.push_back(caller.connection);
    }
    return Status::OK();
  }
  GPUBOX_RETURN_IF_ERROR(dropped_error(caller.client_id, request.write_id, what));
  if (dense_.count(request.name) == 0 && dense_.size() >= kMaxDenseTables) {
    return Status::ResourceExhausted(what + ": this server already holds " +
                                     std::to_string(kMaxDenseTables) + " dense tables");
  }
  // Checked at the announced total, before anything is allocated for it; the writes that would
  // make room are dropped only once the new write is known to fit (a forged total of 2^32 - 1 is
  // refused without dropping anything).
  const std::string host = share_address(caller.address);
  Status room = make_room(caller, host, request.name, what, now);
  if (room.ok()) {
    room = admit_held(
        caller, what + " (the first of a write of " + std::to_string(request.total) + " values)", 0,
        0, sizeof(float) * std::size_t{request.total}, now);
  }
  settle_doomed(room.ok());
  GPUBOX_RETURN_IF_ERROR(room);
  StagedWrite fresh;
  fresh.client_id = caller.client_id;
  fresh.write_id = request.write_id;
  fresh.address = caller.address;
  fresh.host = host;
  fresh.name = request.name;
  fresh.total = request.total;
  fresh.started = ++staged_serial_;
  fresh.first_range = now;
  fresh.last_range = now;
  fresh.connections.push_back(caller.connection);
  held_bytes_ += sizeof(float) * std::size_t{fresh.total};
  staged_.push_back(std::move(fresh));
  *staged = staged_.end() - 1;
  return Status::OK();
}

void PsStore::carried_by(const DenseCaller& caller, uint64_t write_id) {
  MutexLock lock(dense_mu_);
  for (StagedWrite& w : staged_) {
    if (w.client_id != caller.client_id || w.write_id != write_id) continue;
    if (std::find(w.connections.begin(), w.connections.end(), caller.connection) ==
        w.connections.end()) {
      w.connections.push_back(caller.connection);
    }
    return;
  }
}

void PsStore::connection_closed(uint64_t connection) {
  MutexLock lock(dense_mu_);
  for (StagedWrite& w : staged_) {
    w.connections.erase(std::remove(w.connections.begin(), w.connections.end(), connection),
                        w.connections.end());
  }
}

Status PsStore::stage_write(const DenseCaller& caller, DenseRequest& request, Clock::time_point now,
                            bool* committed) {
  *committed = false;
  const uint64_t client_id = caller.client_id;
  const std::string what =
      "DENSE '" + request.name + "': range [" + std::to_string(request.offset) + ", " +
      std::to_string(std::size_t{request.offset} + request.count) + ") of write " +
      std::to_string(request.write_id) + " of client " + std::to_string(client_id);
  // Refused before a held write is made for it: a range of no values would hold (and, beyond
  // the client's share, drop) a write for a few bytes.
  if (request.count == 0) {
    return Status::InvalidArgument(what +
                                   " carries no values: a ranged write's range carries "
                                   "at least one");
  }
  std::vector<StagedWrite>::iterator staged;
  GPUBOX_RETURN_IF_ERROR(find_or_hold(caller, request, what, now, &staged));
  if (staged->name != request.name || staged->total != request.total) {
    return Status::InvalidArgument(what + " names a table of " + std::to_string(request.total) +
                                   " values; its first range named '" + staged->name + "' of " +
                                   std::to_string(staged->total));
  }
  // The ranges received so far never overlap: the one starting at or after this offset must start
  // after its end, and the one before must end at or before its start.
  auto next = staged->ranges.lower_bound(request.offset);
  const auto overlap = [&](uint32_t begin, const std::vector<float>& v) {
    return Status::InvalidArgument(what + " overlaps the range [" + std::to_string(begin) + ", " +
                                   std::to_string(begin + v.size()) + ") received before");
  };
  if (next != staged->ranges.end() && next->first < request.offset + request.count) {
    return overlap(next->first, next->second);
  }
  if (next != staged->ranges.begin()) {
    const auto prev = std::prev(next);
    if (prev->first + prev->second.size() > request.offset)
      return overlap(prev->first, prev->second);
  }
  staged->received += request.count;
  staged->last_range = now;
  staged->ranges.emplace(request.offset, std::move(request.values));
  if (staged->received < staged->total) return Status::OK();
  // Every value arrived (no overlap, so exactly total of them): the table is replaced at once.
  GPUBOX_RETURN_IF_ERROR(commit(staged));
  *committed = true;
  return Status::OK();
}

Status PsStore::commit(std::vector<StagedWrite>::iterator staged) {
  std::vector<float> values(staged->total);
  // Each range is freed once copied: what the copy adds is at most one table (admit counted it).
  for (auto range = staged->ranges.begin(); range != staged->ranges.end();) {
    std::copy(range->second.begin(), range->second.end(), values.begin() + range->first);
    range = staged->ranges.erase(range);
  }
  const std::string name = staged->name;
  release(staged);
  return write_table(name, std::move(values));
}

std::size_t PsStore::expire_held_writes(Clock::time_point now) {
  MutexLock lock(dense_mu_);
  std::size_t expired = 0;
  for (auto w = staged_.begin(); w != staged_.end();) {
    if (now - w->last_range < limits_.max_idle) {
      ++w;
      continue;
    }
    w = drop_held(w, "no range of it arrived for gpubox_server --dense_write_max_idle_s");
    ++expired;
  }
  return expired;
}

std::size_t PsStore::held_writes() const {
  MutexLock lock(dense_mu_);
  return staged_.size();
}

std::size_t PsStore::dense_bytes() const {
  MutexLock lock(dense_mu_);
  return table_bytes_ + held_bytes_;
}

Status PsStore::read_or_add(const DenseCaller& caller, DenseRequest& request,
                            std::vector<uint8_t>* reply, Clock::time_point now) {
  auto it = dense_.find(request.name);
  if (it == dense_.end()) {
    if (request.action == DenseAction::kAdd) {
      return Status::NotFound("DENSE '" + request.name +
                              "': an add to a table no trainer has read (created) yet");
    }
    if (!request.whole() || !request.has_values) {
      return Status::NotFound("DENSE '" + request.name +
                              "': a read of a table this server does not hold (a table over "
                              "one frame is created by a write first)");
    }
    GPUBOX_RETURN_IF_ERROR(admit_settled(caller,
                                         "DENSE '" + request.name +
                                             "': a read (creating it) of client " +
                                             std::to_string(caller.client_id),
                                         sizeof(float) * std::size_t{request.count}, 0, now));
    GPUBOX_RETURN_IF_ERROR(write_table(request.name, std::move(request.values)));
    it = dense_.find(request.name);
  }
  std::vector<float>& values = it->second;
  if (request.total != values.size()) {
    return Status::InvalidArgument("DENSE '" + request.name + "' holds " +
                                   std::to_string(values.size()) + " values; the request has " +
                                   std::to_string(request.total) +
                                   " (trainers with different models?)");
  }
  float* range = values.data() + request.offset;
  if (request.action == DenseAction::kAdd) {
    // The sums are checked before any is stored: an add that would leave a value non-finite is
    // refused whole.
    for (std::size_t i = 0; i < request.count; ++i) {
      const float sum = range[i] + request.values[i];
      if (std::isfinite(sum)) continue;
      std::ostringstream msg;
      msg << "DENSE '" << request.name << "': value " << request.offset + i << " would become "
          << sum << " (" << range[i] << " + " << request.values[i] << "); nothing of the range ["
          << request.offset << ", " << std::size_t{request.offset} + request.count
          << ") was applied";
      return Status::InvalidArgument(msg.str());
    }
    for (std::size_t i = 0; i < request.count; ++i) range[i] += request.values[i];
  }
  // Encoded from the table itself: the async mode sends the whole dense net every step.
  encode_dense_reply(request.offset, range, request.count, false, reply);
  return Status::OK();
}

}  // namespace gpubox::table::server
