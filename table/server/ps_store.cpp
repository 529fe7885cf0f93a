#include "table/server/ps_store.hpp"

#include <cmath>
#include <sstream>

#include "common/hash.hpp"
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

Status PsStore::apply(HostTier& table, const PsPushRequest& request) {
  const RowLayout& layout = table.layout();
  const AccessorConfig& config = table.config();
  const std::size_t n = request.keys.size();
  if (n == 0) return Status::OK();
  const auto dim = static_cast<uint32_t>(layout.push_dim());
  if (request.dim != dim) {
    return Status::InvalidArgument("PS_PUSH records of width " + std::to_string(request.dim) +
                                   " sent to a table whose records are " + std::to_string(dim) +
                                   " wide (mf_dim " + std::to_string(layout.mf_dim) + ")");
  }
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

Status PsStore::dense(DenseRequest request, std::vector<uint8_t>* reply) {
  const std::size_t bad = first_non_finite(request.values.data(), request.values.size());
  if (bad != request.values.size()) {
    return Status::InvalidArgument("DENSE '" + request.name + "': value " + std::to_string(bad) +
                                   " is not finite; nothing was applied");
  }
  MutexLock lock(dense_mu_);
  auto it = dense_.find(request.name);
  if (it != dense_.end() && request.action == DenseAction::kWrite) {
    it->second = std::move(request.values);
  } else if (it == dense_.end()) {
    if (request.action == DenseAction::kAdd) {
      return Status::NotFound("DENSE '" + request.name +
                              "': an add to a table no trainer has read (created) yet");
    }
    if (dense_.size() >= kMaxDenseTables) {
      return Status::ResourceExhausted("DENSE '" + request.name + "': this server already holds " +
                                       std::to_string(kMaxDenseTables) + " dense tables");
    }
    it = dense_.emplace(request.name, std::move(request.values)).first;
  } else {
    std::vector<float>& values = it->second;
    if (request.values.size() != values.size()) {
      return Status::InvalidArgument("DENSE '" + request.name + "' holds " +
                                     std::to_string(values.size()) + " values; the request has " +
                                     std::to_string(request.values.size()) +
                                     " (trainers with different models?)");
    }
    if (request.action == DenseAction::kAdd) {
      // The sums are checked before any is stored: an add that would leave a value non-finite
      // is refused whole.
      for (std::size_t i = 0; i < values.size(); ++i) {
        const float sum = values[i] + request.values[i];
        if (std::isfinite(sum)) continue;
        std::ostringstream msg;
        msg << "DENSE '" << request.name << "': value " << i << " would become " << sum << " ("
            << values[i] << " + " << request.values[i] << "); nothing was applied";
        return Status::InvalidArgument(msg.str());
      }
      for (std::size_t i = 0; i < values.size(); ++i) values[i] += request.values[i];
    }
  }
  // Encoded from the table itself: the async mode sends the whole dense net every step.
  encode_dense_reply(it->second.data(), it->second.size(), reply);
  return Status::OK();
}

}  // namespace gpubox::table::server
