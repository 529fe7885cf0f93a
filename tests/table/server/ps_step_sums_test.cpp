// The sync mode's step of several trainers on the servers (PS_PUSH kStepGradient,
// table/server/ps_step_sums.hpp): a key pushed by every part of a step is updated once, on the sum
// of its gradients added in part order whatever order the parts arrive in (against a float oracle
// of one update); a step is applied only when every part of it arrived, and a step that never
// completes is dropped, unapplied, by the next step's part or by its idle time; malformed or
// conflicting parts are refused.
#include "table/server/ps_step_sums.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <numeric>
#include <thread>
#include <vector>

#include "common/hash.hpp"
#include "table/server/ps_protocol.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "table/sparse_row/optimizer.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier and the loopback helpers

constexpr uint64_t kHotKey = 7;
constexpr int32_t kSlot = 2;
constexpr std::size_t kRecordBytes = 8 + 4 + 4 * 4;  // a key, its slot and 4 floats

// Two shards (so every part sends each an empty chunk or its keys) over fake tables, and one
// client per part, with small chunks (a part's keys on a shard travel in several).
struct StepJob {
  StepJob(const AccessorConfig& cfg, int parts, const ServerOptions& options = {})
      : layout(RowLayout::make(cfg.optimizer.kind, cfg.mf_dim)), table0(cfg), table1(cfg) {
    ServerOptions s0 = options, s1 = options;
    s0.shard_num = s1.shard_num = 2;
    s1.shard_id = 1;
    server0 = start_server(&table0, s0);
    server1 = start_server(&table1, s1);
    for (int p = 0; p < parts; ++p) {
      RemoteHostTierOptions options =
          client_options(server0->endpoint() + "," + server1->endpoint());
      options.config = cfg;
      options.chunk_rows = 3;
      clients.push_back(connect_client(options));
    }
  }
  std::vector<float> peek(const std::vector<uint64_t>& keys, std::size_t* unknown = nullptr) {
    std::vector<float> rows(keys.size() * static_cast<std::size_t>(layout.stride()));
    EXPECT_TRUE(clients[0]->peek(keys.data(), nullptr, keys.size(), rows.data(), unknown).ok());
    return rows;
  }
  RowLayout layout;
  FakeHostTier table0, table1;
  std::unique_ptr<Server> server0, server1;
  std::vector<std::unique_ptr<RemoteHostTier>> clients;
};

// Part p's push: the hot key and 10 keys of its own (so that chunks and both shards are used),
// gradients seeded by p; for three parts the hot key's embed_g is 4096, 1e-4 and -4096, whose
// float sum depends on the order it is added in ((4096 + 1e-4) - 4096 = 0, (4096 - 4096) + 1e-4 =
// 1e-4, which moves embed_w well over its rounding).
struct PartPush {
  std::vector<uint64_t> keys;
  std::vector<int32_t> slots;
  std::vector<float> values;
};
PartPush part_push(int p, std::size_t dim) {
  PartPush push;
  push.keys.push_back(kHotKey);
  for (uint64_t k = 0; k < 10; ++k) push.keys.push_back(1000 * (p + 1) + k);
  push.slots.assign(push.keys.size(), kSlot);
  push.values.resize(push.keys.size() * dim);
  for (std::size_t i = 0; i < push.keys.size(); ++i) {
    float* record = push.values.data() + i * dim;
    record[0] = 1.0f + static_cast<float>(p);  // show
    record[1] = static_cast<float>(p % 2);     // click
    for (std::size_t f = 2; f < dim; ++f) {
      record[f] = 0.01f * static_cast<float>((p + 1) * static_cast<int>(f + i)) - 0.03f;
    }
  }
  const float hot[] = {4096.0f, 1e-4f, -4096.0f};
  push.values[2] = hot[p % 3];
  return push;
}

PsStepPart step_part(uint64_t step, int parts, int part) {
  PsStepPart at;
  at.job = 99;
  at.step = step;
  at.parts = static_cast<uint32_t>(parts);
  at.part = static_cast<uint32_t>(part);
  return at;
}

// The rows after `steps` updates of every key, each on the sum of its parts' gradients added in
// part order: the initial row (init_row, as the servers create it) and apply_push once a step.
std::vector<float> oracle_rows(const AccessorConfig& cfg, const RowLayout& layout,
                               const std::vector<PartPush>& pushes,
                               const std::vector<uint64_t>& keys, int steps = 1) {
  const auto dim = static_cast<std::size_t>(layout.push_dim());
  const auto stride = static_cast<std::size_t>(layout.stride());
  std::vector<float> rows(keys.size() * stride);
  for (std::size_t k = 0; k < keys.size(); ++k) {
    std::vector<float> sum;
    for (const PartPush& push : pushes) {
      const auto at = std::find(push.keys.begin(), push.keys.end(), keys[k]);
      if (at == push.keys.end()) continue;
      const float* add = push.values.data() + (at - push.keys.begin()) * dim;
      if (sum.empty()) {
        sum.assign(add, add + dim);
      } else {
        for (std::size_t f = 0; f < dim; ++f) sum[f] += add[f];
      }
    }
    float* row = rows.data() + k * stride;
    init_row(row, layout, cfg, keys[k], kSlot);
    for (int s = 0; s < steps; ++s)
      table::optimizer::apply_push(row, layout, cfg, keys[k], sum.data());
  }
  return rows;
}

std::vector<uint64_t> keys_of(const std::vector<PartPush>& pushes) {
  std::vector<uint64_t> keys;
  for (const PartPush& push : pushes) keys.insert(keys.end(), push.keys.begin(), push.keys.end());
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

// Every arrival order of 2 and 3 parts, with Adagrad and Adam: nothing changes before the last
// part arrives; then every row, the hot key's included, is the oracle's bit for bit (one update on
// the sum in part order; two updates, or the sum in arrival order, differ).
TEST(PsStepSums, AHotKeyOfEveryPartIsOneUpdateOnTheSumInPartOrder) {
  for (const auto kind : {SparseOptimizerKind::kAdagrad, SparseOptimizerKind::kAdam}) {
    AccessorConfig cfg = test_config();
    cfg.optimizer.kind = kind;
    for (const int parts : {2, 3}) {
      std::vector<int> order(static_cast<std::size_t>(parts));
      std::iota(order.begin(), order.end(), 0);
      do {
        SCOPED_TRACE(std::to_string(parts) + " parts, first " + std::to_string(order[0]) +
                     (kind == SparseOptimizerKind::kAdam ? ", adam" : ", adagrad"));
        StepJob job(cfg, parts);
        const auto dim = static_cast<std::size_t>(job.layout.push_dim());
        std::vector<PartPush> pushes;
        for (int p = 0; p < parts; ++p) pushes.push_back(part_push(p, dim));
        const std::vector<uint64_t> keys = keys_of(pushes);
        for (std::size_t i = 0; i < order.size(); ++i) {
          std::size_t unknown = 0;
          job.peek(keys, &unknown);
          EXPECT_EQ(unknown, keys.size()) << "applied before the step was whole";
          const int p = order[i];
          const PartPush& push = pushes[static_cast<std::size_t>(p)];
          ASSERT_TRUE(job.clients[static_cast<std::size_t>(p)]
                          ->push_step(step_part(5, parts, p), push.keys.data(), push.slots.data(),
                                      push.keys.size(), push.values.data())
                          .ok());
        }
        const std::vector<float> rows = job.peek(keys);
        const std::vector<float> expected = oracle_rows(cfg, job.layout, pushes, keys);
        if (parts == 3) {  // the test sees the order: the sum in another order is another row
          const std::vector<PartPush> reordered = {pushes[0], pushes[2], pushes[1]};
          EXPECT_NE(oracle_rows(cfg, job.layout, reordered, keys), expected);
        }
        for (std::size_t i = 0; i < rows.size(); ++i) {
          ASSERT_EQ(rows[i], expected[i])
              << "key " << keys[i / job.layout.stride()] << " field " << i % job.layout.stride();
        }
      } while (std::next_permutation(order.begin(), order.end()));
    }
  }
}

void expect_rows(const std::vector<float>& rows, const std::vector<float>& expected) {
  ASSERT_EQ(rows.size(), expected.size());
  for (std::size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(rows[i], expected[i]) << "value " << i;
}

Status push_part(StepJob& job, const PartPush& push, uint64_t step, int parts, int part,
                 uint64_t job_id = 99) {
  PsStepPart at = step_part(step, parts, part);
  at.job = job_id;
  return job.clients[static_cast<std::size_t>(part)]->push_step(
      at, push.keys.data(), push.slots.data(), push.keys.size(), push.values.data());
}

// Concurrent parts (threads), a part with no key at all (an empty step: every shard gets its empty
// chunk), over several steps: after each step the rows are the oracle's after as many.
TEST(PsStepSums, ConcurrentPartsAndEmptyPartsStepAsTheOracle) {
  const AccessorConfig cfg = test_config();
  StepJob job(cfg, 3);
  const auto dim = static_cast<std::size_t>(job.layout.push_dim());
  const std::vector<PartPush> pushes = {part_push(0, dim), part_push(1, dim), PartPush{}};
  const std::vector<uint64_t> keys = keys_of(pushes);
  for (int step = 0; step < 4; ++step) {
    std::vector<std::thread> threads;
    for (int p = 0; p < 3; ++p) {
      threads.emplace_back([&, p] {
        EXPECT_TRUE(push_part(job, pushes[static_cast<std::size_t>(p)], step, 3, p).ok());
      });
    }
    for (auto& t : threads) t.join();
    expect_rows(job.peek(keys), oracle_rows(cfg, job.layout, pushes, keys, step + 1));
  }
}

// A step that never completes (part 1 of 2 died before pushing) is never applied, and the next
// job's step drops it when its first part arrives: the rows are that step's alone. Then what the
// server refuses: a chunk again under a new request id with other bytes (the same bytes are a
// retry the retry cache forgot: answered OK, held once), a part count other than the step's,
// and malformed part fields.
TEST(PsStepSums, AnIncompleteStepIsNeverAppliedAndConflictsAreRefused) {
  const AccessorConfig cfg = test_config();
  StepJob job(cfg, 2);
  const auto dim = static_cast<std::size_t>(job.layout.push_dim());
  const std::vector<PartPush> pushes = {part_push(0, dim), part_push(1, dim)};
  const std::vector<uint64_t> keys = keys_of(pushes);
  ASSERT_TRUE(push_part(job, pushes[0], 3, 2, 0, /*job_id=*/1).ok());
  std::size_t unknown = 0;
  job.peek(keys, &unknown);
  EXPECT_EQ(unknown, keys.size());
  ASSERT_TRUE(push_part(job, pushes[1], 3, 2, 1, /*job_id=*/2).ok());  // drops job 1's
  job.peek(keys, &unknown);
  EXPECT_EQ(unknown, keys.size());
  ASSERT_TRUE(push_part(job, pushes[0], 3, 2, 0, /*job_id=*/2).ok());
  expect_rows(job.peek(keys), oracle_rows(cfg, job.layout, pushes, keys));
  // The dead job's missing part, late: refused, nothing applied.
  EXPECT_EQ(push_part(job, pushes[1], 3, 2, 1, /*job_id=*/1).code(), Status::Code::kNotFound);
  expect_rows(job.peek(keys), oracle_rows(cfg, job.layout, pushes, keys));

  std::vector<uint64_t> own;  // a key of server 0's, which the raw requests go to
  for (uint64_t k = 1; own.empty(); ++k) {
    if (host_shard(k, 2) == 0) own.push_back(k);
  }
  const std::vector<float> record(dim, 0.5f);
  const int32_t slot = kSlot;
  Connection raw = raw_connection(job.server0->port());
  std::vector<uint8_t> payload;
  PsStepPart at = step_part(9, 2, 0);
  at.chunks = 2;
  at.chunk = 0;
  encode_ps_step_push_request(at, own.data(), &slot, 1, record.data(), static_cast<uint32_t>(dim),
                              &payload);
  ASSERT_TRUE(raw_call(raw, Op::kPsPush, payload, /*request_id=*/1).ok());
  const uint64_t held = job.server0->counters().step_held_bytes;
  // The same request again is the retry cache's; under a new id (a retry the cache forgot) the
  // same bytes are answered OK and held once; other bytes for that chunk are refused.
  EXPECT_TRUE(raw_call(raw, Op::kPsPush, payload, /*request_id=*/1).ok());
  EXPECT_TRUE(raw_call(raw, Op::kPsPush, payload, /*request_id=*/2).ok());
  EXPECT_EQ(job.server0->counters().step_held_bytes, held);
  const std::vector<float> other(dim, 0.25f);
  payload.clear();
  encode_ps_step_push_request(at, own.data(), &slot, 1, other.data(), static_cast<uint32_t>(dim),
                              &payload);
  EXPECT_EQ(raw_call(raw, Op::kPsPush, payload, /*request_id=*/20).code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(job.server0->counters().step_held_bytes, held);
  at.chunks = 3;  // the part said 2 before
  at.chunk = 1;
  payload.clear();
  encode_ps_step_push_request(at, own.data(), &slot, 1, record.data(), static_cast<uint32_t>(dim),
                              &payload);
  EXPECT_EQ(raw_call(raw, Op::kPsPush, payload, 3).code(), Status::Code::kInvalidArgument);
  at = step_part(9, 3, 1);  // the step has 2 parts
  at.chunks = 1;
  payload.clear();
  encode_ps_step_push_request(at, own.data(), &slot, 1, record.data(), static_cast<uint32_t>(dim),
                              &payload);
  EXPECT_EQ(raw_call(raw, Op::kPsPush, payload, 4).code(), Status::Code::kInvalidArgument);
  for (const auto& [parts, part, chunks, chunk] : std::vector<std::array<uint32_t, 4>>{
           {2, 2, 1, 0}, {0, 0, 1, 0}, {2, 0, 0, 0}, {2, 0, 1, 1}, {kMaxStepParts + 1, 0, 1, 0}}) {
    at = step_part(9, 2, 0);
    at.parts = parts;
    at.part = part;
    at.chunks = chunks;
    at.chunk = chunk;
    payload.clear();
    encode_ps_step_push_request(at, own.data(), &slot, 1, record.data(), static_cast<uint32_t>(dim),
                                &payload);
    EXPECT_FALSE(decode_ps_push_request(payload.data(), payload.size()).ok())
        << parts << " " << part << " " << chunks << " " << chunk;
    EXPECT_EQ(raw_call(raw, Op::kPsPush, payload, 10 + part + chunk).code(),
              Status::Code::kInvalidArgument);
  }
}

// A part whose records are not the table's width is refused on arrival, naming both widths,
// and does not drop the step the server holds (it was checked only when its step was applied,
// after it had dropped the held step of another job, whose later parts were then refused).
TEST(PsStepSums, APartOfTheWrongWidthIsRefusedBeforeItDropsTheHeldStep) {
  const AccessorConfig cfg = test_config();
  StepJob job(cfg, 2);
  const auto dim = static_cast<std::size_t>(job.layout.push_dim());
  const std::vector<PartPush> pushes = {part_push(0, dim), part_push(1, dim)};
  const std::vector<uint64_t> keys = keys_of(pushes);
  ASSERT_TRUE(push_part(job, pushes[0], 4, 2, 0).ok());
  const std::vector<float> record(dim + 1, 0.5f);
  const int32_t slot = kSlot;
  PsStepPart at = step_part(1, 2, 0);
  at.job = 77;
  at.chunks = 1;
  for (const uint32_t shard : {0u, 1u}) {
    uint64_t key = 1;  // one of the shard's (another shard's key is refused for that)
    while (host_shard(key, 2) != shard) ++key;
    std::vector<uint8_t> payload;
    encode_ps_step_push_request(at, &key, &slot, 1, record.data(), static_cast<uint32_t>(dim + 1),
                                &payload);
    Connection raw = raw_connection((shard == 0 ? job.server0 : job.server1)->port());
    const Status wide = raw_call(raw, Op::kPsPush, payload, /*request_id=*/1);
    EXPECT_EQ(wide.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(wide.message().find("records of width " + std::to_string(dim + 1)), std::string::npos)
        << wide.message();
  }
  ASSERT_TRUE(push_part(job, pushes[1], 4, 2, 1).ok());
  expect_rows(job.peek(keys), oracle_rows(cfg, job.layout, pushes, keys));
}

// The held step's limits are the server's own flags, not the dense tables': a step whose parts
// did not all come within --step_max_wait_s is dropped by the sweep (--dense_write_max_idle_s
// stays 120 s), and a part over --max_step_mb is refused naming it.
TEST(PsStepSums, TheServersStepLimitsAreItsOwn) {
  const AccessorConfig cfg = test_config();
  ServerOptions options;
  // Long enough that the push and the read below come before the sweep on a loaded machine
  // (at 0.2 s the step could be dropped before it was seen held).
  options.step_max_wait_s = 1.5;
  StepJob job(cfg, 2, options);
  const auto dim = static_cast<std::size_t>(job.layout.push_dim());
  const std::vector<PartPush> pushes = {part_push(0, dim), part_push(1, dim)};
  ASSERT_TRUE(push_part(job, pushes[0], 1, 2, 0).ok());
  EXPECT_GT(job.server0->counters().step_held_bytes, 0u);
  for (Server* server : {job.server0.get(), job.server1.get()}) {
    EXPECT_TRUE(eventually([&] { return server->counters().steps_dropped == 1; }))
        << "the sweep never dropped the step";
    EXPECT_EQ(server->counters().step_held_bytes, 0u);
  }
  const Status late = push_part(job, pushes[1], 1, 2, 1);
  EXPECT_EQ(late.code(), Status::Code::kNotFound);
  EXPECT_NE(late.message().find("--step_max_wait_s"), std::string::npos) << late.message();

  options = ServerOptions{};
  options.max_step_bytes = 2048;  // a part of 11 keys, 6 on a server at most, fits; 100 do not
  StepJob small(cfg, 2, options);
  ASSERT_TRUE(push_part(small, pushes[0], 1, 2, 0).ok());
  PartPush big = part_push(1, dim);
  for (uint64_t k = 0; k < 100; ++k) {
    big.keys.push_back(50000 + k);
    big.slots.push_back(kSlot);
    big.values.insert(big.values.end(), dim, 0.25f);
  }
  const Status over = push_part(small, big, 1, 2, 1);
  EXPECT_EQ(over.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(over.message().find("--max_step_mb"), std::string::npos) << over.message();
}

// Chunk `chunk` of `chunks` of part `part` (of `parts`) of job 99's `step`: `keys` records of
// width 4 (kRecordBytes each), all 1.
PsPushRequest step_chunk(uint64_t step, int parts, int part, std::size_t keys, uint32_t chunks = 1,
                         uint32_t chunk = 0) {
  PsPushRequest request;
  request.kind = PsUpdateKind::kStepGradient;
  request.step = step_part(step, parts, part);
  request.step.chunks = chunks;
  request.step.chunk = chunk;
  request.dim = 4;
  for (std::size_t k = 0; k < keys; ++k) request.keys.push_back(k);
  request.slots.assign(keys, 0);
  request.values.assign(keys * 4, 1.0f);
  return request;
}

// Counts the steps applied.
struct CountApplied {
  Status operator()(const PsPushRequest&) {
    ++applied;
    return Status::OK();
  }
  int applied = 0;
};

// A late copy of a part of the step its job applied last (a retry the retry cache forgot, or a
// request left on a closed connection) arrives while the next step is held: it is answered OK and
// applies nothing, and the held step stays (it used to be dropped, its remaining parts then
// refused: a healthy job failed). A part of an older step is refused, the held step kept too.
TEST(PsStepSums, ALateCopyOfAnAppliedStepKeepsTheNextOne) {
  PsStepSums sums;
  CountApplied count;
  const PsStepSums::Apply apply = std::ref(count);
  ASSERT_TRUE(sums.add(step_chunk(1, 2, 0, 2), "client 1", apply).ok());
  ASSERT_TRUE(sums.add(step_chunk(1, 2, 1, 2), "client 2", apply).ok());
  EXPECT_EQ(count.applied, 1);
  ASSERT_TRUE(sums.add(step_chunk(2, 2, 0, 2), "client 1", apply).ok());
  const std::size_t held = sums.held_bytes();
  EXPECT_GT(held, 0u);
  EXPECT_TRUE(sums.add(step_chunk(1, 2, 0, 2), "client 1", apply).ok());  // the late copy
  EXPECT_TRUE(sums.add(step_chunk(1, 2, 1, 2), "client 2", apply).ok());
  const Status older = sums.add(step_chunk(0, 2, 1, 2), "client 2", apply);
  EXPECT_EQ(older.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(older.message().find("older step"), std::string::npos) << older.message();
  EXPECT_EQ(sums.held_bytes(), held);
  EXPECT_EQ(sums.dropped_steps(), 0u);
  EXPECT_EQ(count.applied, 1);
  ASSERT_TRUE(sums.add(step_chunk(2, 2, 1, 2), "client 2", apply).ok());  // step 2 completes
  EXPECT_EQ(count.applied, 2);
  // A part of a step between the one applied last and the held one: refused too.
  ASSERT_TRUE(sums.add(step_chunk(7, 2, 0, 2), "client 1", apply).ok());
  EXPECT_EQ(sums.add(step_chunk(5, 2, 1, 2), "client 2", apply).code(),
            Status::Code::kInvalidArgument);
  ASSERT_TRUE(sums.add(step_chunk(7, 2, 1, 2), "client 2", apply).ok());
  EXPECT_EQ(count.applied, 3);
  EXPECT_EQ(sums.dropped_steps(), 0u);
}

// A step whose apply fails (here: the table refuses it) is remembered as dropped, the failure its
// reason: a retry of its completing chunk, which the retry cache does not keep (it keeps only
// successes), is refused naming it, not held as the start of a new step and answered OK (the step
// was lost silently), and so is a late part of it.
TEST(PsStepSums, AStepWhoseApplyFailedIsRefusedNotStartedAgain) {
  PsStepSums sums;
  int applies = 0;
  const PsStepSums::Apply refuse = [&](const PsPushRequest&) {
    ++applies;
    return Status::ResourceExhausted("the table is full");
  };
  ASSERT_TRUE(sums.add(step_chunk(1, 2, 0, 2), "client 1", refuse).ok());
  EXPECT_EQ(sums.add(step_chunk(1, 2, 1, 2), "client 2", refuse).code(),
            Status::Code::kResourceExhausted);
  EXPECT_EQ(applies, 1);
  EXPECT_EQ(sums.dropped_steps(), 1u);
  for (int part : {1, 0}) {
    const Status again = sums.add(step_chunk(1, 2, part, 2), "client 2", refuse);
    EXPECT_EQ(again.code(), Status::Code::kNotFound);
    EXPECT_NE(
        again.message().find("applying its sums failed: ResourceExhausted: the table is full"),
        std::string::npos)
        << again.message();
  }
  EXPECT_EQ(sums.held_bytes(), 0u);
  EXPECT_EQ(applies, 1);
}

// The sweep's part: a held step whose parts did not all arrive within max_wait is dropped,
// unapplied, and a late part of it is refused; the limit on held bytes (the step, its parts and
// chunks, and their records) refuses a chunk that would go over it by one record.
TEST(PsStepSums, AnIdleStepExpiresAndHeldBytesAreBounded) {
  StepSumsLimits limits;
  limits.max_wait = std::chrono::seconds(10);
  const std::size_t chunk_bytes = PsStepSums::kChunkOverheadBytes;
  limits.max_bytes = PsStepSums::step_bytes(2) + 2 * chunk_bytes + 9 * kRecordBytes;
  PsStepSums sums(limits);
  CountApplied count;
  const PsStepSums::Apply apply = std::ref(count);
  const auto chunk = [](int part, std::size_t keys) { return step_chunk(1, 2, part, keys); };
  const auto t0 = PsStepSums::Clock::now();
  ASSERT_TRUE(sums.add(chunk(0, 2), "client 1", apply, t0).ok());
  EXPECT_EQ(sums.held_bytes(), PsStepSums::step_bytes(2) + chunk_bytes + 2 * kRecordBytes);
  EXPECT_EQ(sums.add(chunk(1, 8), "client 1", apply, t0).code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(sums.expire(t0 + std::chrono::seconds(9)), 0u);
  EXPECT_EQ(sums.expire(t0 + std::chrono::seconds(10)), 1u);
  EXPECT_EQ(sums.held_bytes(), 0u);
  EXPECT_EQ(sums.dropped_steps(), 1u);
  // Its straggler part comes after all: refused, naming the step (its trainer fails, rather than
  // go on without the step's update).
  const Status late = sums.add(chunk(1, 1), "client 1", apply, t0);
  EXPECT_EQ(late.code(), Status::Code::kNotFound);
  EXPECT_NE(late.message().find("pass 0, step 1 was dropped"), std::string::npos) << late.message();
  ASSERT_TRUE(
      sums.add(step_chunk(2, 2, 1, 2), "client 1", apply, t0).ok());  // the next step: part 1 alone
  EXPECT_EQ(count.applied, 0);
  // A first chunk of a newer step too large for the limit is refused before it drops the held one.
  EXPECT_EQ(sums.add(step_chunk(3, 2, 0, 20), "client 1", apply, t0).code(),
            Status::Code::kResourceExhausted);
  EXPECT_EQ(sums.dropped_steps(), 1u);
  ASSERT_TRUE(sums.add(step_chunk(2, 2, 0, 7), "client 1", apply, t0).ok());  // exactly the limit
  EXPECT_EQ(count.applied, 1);
  EXPECT_EQ(sums.held_bytes(), 0u);
}

// What a client cannot make the server hold: empty chunks cost kChunkOverheadBytes each (they
// were free: 60,000 of them held 0 bytes) and come only alone (one part with no key there), and
// a step is held at most max_wait from its first part however often chunks drip in.
TEST(PsStepSums, EmptyChunksCostAndADripHoldsAStepNoLonger) {
  StepSumsLimits limits;
  limits.max_wait = std::chrono::seconds(10);
  PsStepSums sums(limits);
  CountApplied count;
  const PsStepSums::Apply apply = std::ref(count);
  const auto t0 = PsStepSums::Clock::now();
  const Status empty =
      sums.add(step_chunk(1, 3, 0, 0, /*chunks=*/2, /*chunk=*/1), "client 1", apply, t0);
  EXPECT_EQ(empty.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(empty.message().find("empty chunk"), std::string::npos) << empty.message();
  EXPECT_EQ(sums.held_bytes(), 0u);
  ASSERT_TRUE(sums.add(step_chunk(1, 3, 0, 0), "client 1", apply, t0).ok());
  EXPECT_EQ(sums.held_bytes(), PsStepSums::step_bytes(3) + PsStepSums::kChunkOverheadBytes);
  // Part 1 drips its chunks, each within max_wait of the one before: the step goes at t0 + 10 s.
  for (uint32_t c = 0; c < 3; ++c) {
    const auto at = t0 + std::chrono::seconds(4 * c);
    ASSERT_TRUE(sums.add(step_chunk(1, 3, 1, 1, /*chunks=*/4, c), "client 1", apply, at).ok());
    EXPECT_EQ(sums.expire(at), 0u);
  }
  EXPECT_EQ(sums.expire(t0 + std::chrono::seconds(10)), 1u);
  EXPECT_EQ(sums.held_bytes(), 0u);
  EXPECT_EQ(count.applied, 0);
}

}  // namespace
}  // namespace gpubox::table::server
