// A gtest fixture driving PsStore's ranged DENSE writes directly, with its clock given and each
// peer only an address string: "10.0.0.x" stand for other hosts without a network of the test's
// own, and thousands of writes take milliseconds. Every range comes on a new connection, none of
// them closed, so no write is abandoned.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "table/server/ps_store.hpp"

namespace gpubox::table::server::testing {

class DenseStoreDriver : public ::testing::Test {
 protected:
  using Clock = std::chrono::steady_clock;
  // DenseLimits::max_idle; a quarter of it is the grace of stale and abandoned writes.
  static constexpr Clock::duration kMaxIdle = std::chrono::seconds(1);

  // The first range (4 of 8 values) of write `write` of table "dense" from `client` at `address`.
  Status first_range(uint64_t client, const std::string& address, uint64_t write) {
    return range(client, address, write, 0);
  }
  // The range [offset, offset + count) of that write; the one completing it commits it.
  Status range(uint64_t client, const std::string& address, uint64_t write, uint32_t offset,
               uint32_t count = 4) {
    DenseRequest request;
    request.action = DenseAction::kWrite;
    request.name = "dense";
    request.total = 8;
    request.offset = offset;
    request.count = count;
    request.write_id = write;
    request.has_values = true;
    request.values.assign(count, 1.0f);
    std::vector<uint8_t> reply;
    return store_.dense(DenseCaller{client, ++connection_, address}, request, &reply, now_);
  }
  // Every held write received no range for the idle limit: the sweep drops them (recorded).
  std::size_t expire() {
    now_ += kMaxIdle + std::chrono::milliseconds(1);
    return store_.expire_held_writes(now_);
  }

  PsStore store_{DenseLimits{std::size_t{1} << 30, kMaxIdle, 1.0}};
  Clock::time_point now_ = Clock::now();
  uint64_t connection_ = 0;
};

}  // namespace gpubox::table::server::testing
