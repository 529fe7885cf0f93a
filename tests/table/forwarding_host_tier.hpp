// A HostTier that forwards every call to another (borrowed: it must outlive the wrapper). Test
// wrappers that observe or change some calls (recording them, failing them, holding them) derive
// from it and override only those, so a method added to HostTier is forwarded in one place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "table/host_tier.hpp"

namespace gpubox::table::testing {

class ForwardingHostTier : public HostTier {
 public:
  explicit ForwardingHostTier(HostTier& inner) : inner_(inner) {}

  const RowLayout& layout() const override { return inner_.layout(); }
  const AccessorConfig& config() const override { return inner_.config(); }
  Status pull(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
              std::size_t* created) override {
    return inner_.pull(keys, slots, n, rows, created);
  }
  Status peek(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
              std::size_t* unknown) override {
    return inner_.peek(keys, slots, n, rows, unknown);
  }
  Status push(const uint64_t* keys, std::size_t n, const float* rows) override {
    return inner_.push(keys, n, rows);
  }
  // pushes_by_address and push_at are not forwarded: HostTier's says false (and refuses
  // push_at), so the pass write-back gathers the rows and calls push, which a wrapper observes or
  // fails.
  Status erase(const uint64_t* keys, std::size_t n) override { return inner_.erase(keys, n); }
  StatusOr<HostTierStats> stats() override { return inner_.stats(); }
  using HostTier::shrink;
  StatusOr<uint64_t> shrink(const std::function<void()>& on_progress) override {
    return inner_.shrink(on_progress);
  }
  using HostTier::load;
  using HostTier::save;
  Status save(const std::string& path, SaveKind mode, io::FileEnv* env) override {
    return inner_.save(path, mode, env);
  }
  Status load(const std::string& path, io::FileEnv* env) override { return inner_.load(path, env); }
  Status end_job(uint32_t trainers) override { return inner_.end_job(trainers); }

 protected:
  HostTier& inner() const { return inner_; }

 private:
  HostTier& inner_;
};

}  // namespace gpubox::table::testing
