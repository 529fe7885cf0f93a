#include "table/server/protocol.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "table/server/remote_host_tier.hpp"
#include "table/server/request_window.hpp"
#include "table/server/transport.hpp"
#include "tests/table/slot_dims_config.hpp"

namespace gpubox::table::server {
namespace {

FrameHeader request(Op op, uint64_t id = 7, uint64_t client = 99) {
  FrameHeader h;
  h.op = op;
  h.request_id = id;
  h.client_id = client;
  return h;
}

TEST(Protocol, HeaderRoundTrip) {
  FrameHeader h = request(Op::kPush, 0x1122334455667788ULL, 0xfeedULL);
  h.response = true;
  h.status = Status::Code::kCorruption;
  h.payload_bytes = 1234;
  uint8_t bytes[kHeaderBytes];
  encode_header(h, bytes);
  auto back = decode_header(bytes, kHeaderBytes, 1 << 20);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->op, Op::kPush);
  EXPECT_TRUE(back->response);
  EXPECT_EQ(back->status, Status::Code::kCorruption);
  EXPECT_EQ(back->payload_bytes, 1234u);
  EXPECT_EQ(back->request_id, 0x1122334455667788ULL);
  EXPECT_EQ(back->client_id, 0xfeedULL);
}

TEST(Protocol, HeaderRejectsBadMagicVersionOpSizeAndTruncation) {
  uint8_t good[kHeaderBytes];
  FrameHeader h = request(Op::kPull);
  h.payload_bytes = 100;
  encode_header(h, good);

  uint8_t bytes[kHeaderBytes];
  std::memcpy(bytes, good, kHeaderBytes);
  bytes[0] ^= 0xff;
  auto st = decode_header(bytes, kHeaderBytes, 1000);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("magic"), std::string::npos);

  std::memcpy(bytes, good, kHeaderBytes);
  bytes[4] = 9;  // version
  st = decode_header(bytes, kHeaderBytes, 1000);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("version"), std::string::npos);

  std::memcpy(bytes, good, kHeaderBytes);
  bytes[6] = 77;  // op
  st = decode_header(bytes, kHeaderBytes, 1000);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("unknown op"), std::string::npos);

  st = decode_header(good, kHeaderBytes, 99);  // 100 payload bytes over a 99-byte limit
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), Status::Code::kResourceExhausted);
  EXPECT_NE(st.status().message().find("over the limit"), std::string::npos);

  EXPECT_TRUE(decode_header(good, kHeaderBytes, 100).ok());  // exactly at the limit
  st = decode_header(good, kHeaderBytes - 1, 1000);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("truncated"), std::string::npos);
}

TEST(Protocol, FrameRejectsTruncationAndTrailingBytes) {
  std::vector<uint8_t> payload{1, 2, 3, 4, 5};
  auto frame = encode_frame(request(Op::kStats), payload);
  auto ok = decode_frame(frame.data(), frame.size(), 1024);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->payload, payload);
  for (std::size_t cut = 0; cut < frame.size(); ++cut) {
    EXPECT_FALSE(decode_frame(frame.data(), cut, 1024).ok()) << "cut at " << cut;
  }
  frame.push_back(0);
  EXPECT_FALSE(decode_frame(frame.data(), frame.size(), 1024).ok());
}

TEST(Protocol, PullRequestRoundTripWithAndWithoutSlots) {
  for (std::size_t n : {0u, 1u, 5u}) {
    std::vector<uint64_t> keys(n);
    std::vector<int32_t> slots(n);
    for (std::size_t i = 0; i < n; ++i) {
      keys[i] = 0x8000000000000000ULL + i * 977;
      slots[i] = static_cast<int32_t>(i) - 2;
    }
    for (bool with_slots : {false, true}) {
      std::vector<uint8_t> payload;
      encode_pull_request(keys.data(), with_slots ? slots.data() : nullptr, n, &payload);
      auto req = decode_pull_request(payload.data(), payload.size());
      ASSERT_TRUE(req.ok()) << req.status().to_string();
      EXPECT_EQ(req->keys, keys);
      EXPECT_EQ(req->slots, with_slots ? slots : std::vector<int32_t>{});
    }
  }
}

TEST(Protocol, PullReplyChecksShape) {
  const uint32_t n = 3, stride = 4;
  std::vector<uint8_t> payload(pull_reply_bytes(n, stride));
  encode_pull_reply_head(n, stride, 2, payload.data());
  for (uint32_t i = 0; i < n * stride; ++i) {
    const float v = 0.5f * i;
    std::memcpy(payload.data() + pull_reply_rows_offset() + 4 * i, &v, 4);
  }
  auto view = decode_pull_reply(payload.data(), payload.size(), n, stride);
  ASSERT_TRUE(view.ok()) << view.status().to_string();
  EXPECT_EQ(view->created, 2u);
  float last;
  std::memcpy(&last, view->rows + 4 * (n * stride - 1), 4);
  EXPECT_EQ(last, 0.5f * (n * stride - 1));
  EXPECT_FALSE(decode_pull_reply(payload.data(), payload.size(), n + 1, stride).ok());
  EXPECT_FALSE(decode_pull_reply(payload.data(), payload.size(), n, stride + 1).ok());
  EXPECT_FALSE(decode_pull_reply(payload.data(), payload.size() - 1, n, stride).ok());
}

TEST(Protocol, InfoReplyRoundTripAndUnknownStorage) {
  InfoReply info;
  info.shard_id = 1;
  info.shard_num = 3;
  info.optimizer_kind = 2;
  info.mf_dim = 7;
  info.stride = 30;
  info.instance_id = 99;
  info.generation = 5;
  info.storage = static_cast<int32_t>(config::SparseStorage::kBf16);
  info.seed = 0xfedcba9876543210ull;  // every bit travels
  std::vector<uint8_t> p;
  encode_info_reply(info, &p);
  auto back = decode_info_reply(p.data(), p.size());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->seed, info.seed);
  EXPECT_EQ(back->storage, info.storage);
  EXPECT_EQ(back->stride, 30u);
  EXPECT_EQ(back->generation, 5u);
  EXPECT_TRUE(back->rule.empty());
  // The sparse rule travels field by field, keys and values exact.
  AccessorConfig rule_config;
  rule_config.optimizer.learning_rate = 0.0123f;
  info.rule = sparse_rule_fields(rule_config);
  p.clear();
  encode_info_reply(info, &p);
  back = decode_info_reply(p.data(), p.size());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  ASSERT_EQ(back->rule.size(), info.rule.size());
  for (std::size_t i = 0; i < info.rule.size(); ++i) {
    EXPECT_TRUE(back->rule[i].key == info.rule[i].key && back->rule[i].value == info.rule[i].value);
  }
  // More fields than any build sends: refused before they are read.
  info.rule.resize(kMaxInfoRuleFields + 1, SparseRuleField{"k", 1.0});
  p.clear();
  encode_info_reply(info, &p);
  back = decode_info_reply(p.data(), p.size());
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("65 sparse rule fields"), std::string::npos)
      << back.status().to_string();
  info.rule.clear();
  info.storage = 3;  // no such storage
  p.clear();
  encode_info_reply(info, &p);
  EXPECT_FALSE(decode_info_reply(p.data(), p.size()).ok());
  EXPECT_FALSE(decode_info_reply(p.data(), p.size() - 4).ok());  // a version-2 reply: truncated
}

TEST(Protocol, PushEraseSaveBarrierStatsRoundTrip) {
  std::vector<uint64_t> keys{1, 2, 3};
  std::vector<float> rows{1, 2, 3, 4, 5, 6};
  std::vector<uint8_t> p;
  encode_push_request(keys.data(), keys.size(), rows.data(), 2, &p);
  auto push = decode_push_request(p.data(), p.size());
  ASSERT_TRUE(push.ok());
  EXPECT_EQ(push->keys, keys);
  EXPECT_EQ(push->rows, rows);
  EXPECT_EQ(push->stride, 2u);

  p.clear();
  encode_erase_request(keys.data(), keys.size(), &p);
  auto erased = decode_erase_request(p.data(), p.size());
  ASSERT_TRUE(erased.ok());
  EXPECT_EQ(*erased, keys);

  p.clear();
  encode_save_request(SaveKind::kDelta, "model/day1", &p);
  auto save = decode_save_request(p.data(), p.size());
  ASSERT_TRUE(save.ok());
  EXPECT_EQ(save->mode, SaveKind::kDelta);
  EXPECT_EQ(save->path, "model/day1");
  p[0] = 9;  // unknown mode
  EXPECT_FALSE(decode_save_request(p.data(), p.size()).ok());

  p.clear();
  encode_barrier_request("pass-3", 4, &p);
  auto barrier = decode_barrier_request(p.data(), p.size());
  ASSERT_TRUE(barrier.ok());
  EXPECT_EQ(barrier->name, "pass-3");
  EXPECT_EQ(barrier->parties, 4u);

  p.clear();
  HostTierStats s{5, 6, 7};
  encode_stats_reply(s, &p);
  auto stats = decode_stats_reply(p.data(), p.size());
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->rows_in_memory, 5u);
  EXPECT_EQ(stats->rows_on_disk, 6u);
  EXPECT_EQ(stats->memory_bytes, 7u);

  p.clear();
  encode_error_reply("key 5 is missing", &p);
  FrameHeader h = request(Op::kPull);
  h.response = true;
  h.status = Status::Code::kNotFound;
  Status err = decode_error_reply(h, p.data(), p.size());
  EXPECT_EQ(err.code(), Status::Code::kNotFound);
  EXPECT_EQ(err.message(), "key 5 is missing");
}

// Protocol 4: with slot_dims (widths 4, 8, 16; adagrad) PUSH and PULL carry each row at its own
// width: the bytes are the sum of the rows' own strides, the rows come back exactly (zeros past
// their width), and a forged width, a cut row or bytes left over are errors.
TEST(Protocol, RowsTravelAtTheirOwnWidths) {
  AccessorConfig cfg;
  cfg.mf_dim = 4;
  const AccessorConfig mixed = with_slot_dims(cfg, {{1, 8}, {2, 16}});
  const RowLayout record = record_layout(mixed);
  const WidthClasses classes = width_classes(mixed);
  ASSERT_TRUE(record.mixed_widths);
  const auto stride = static_cast<std::size_t>(record.stride());
  std::mt19937_64 rng(3);
  const std::size_t n = 9;
  std::vector<uint64_t> keys(n);
  std::vector<float> rows(n * stride, 0.0f);
  std::size_t own_floats = 0;
  for (std::size_t i = 0; i < n; ++i) {
    keys[i] = rng();
    const int32_t width = std::vector<int32_t>{4, 8, 16}[i % 3];
    const RowLayout own = RowLayout::make(record.kind, width);
    for (int32_t f = 0; f < own.stride(); ++f)
      rows[i * stride + f] = static_cast<float>(rng() % 1000);
    rows[i * stride + own.mf_dim_offset()] = static_cast<float>(width);
    own_floats += own.stride();
  }
  EXPECT_EQ(own_floats, 3 * (14 + 18 + 26));  // adagrad strides of widths 4, 8, 16
  EXPECT_EQ(packed_floats(rows.data(), n, record), own_floats);

  std::vector<uint8_t> push;
  encode_push_request(keys.data(), n, rows.data(), record, &push);
  EXPECT_EQ(push.size(), 8 + n * sizeof(uint64_t) + own_floats * sizeof(float));
  auto decoded = decode_push_request(push.data(), push.size(), record, classes);
  ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
  EXPECT_EQ(decoded->keys, keys);
  EXPECT_EQ(decoded->rows, rows);
  // The same rows at one width: every row at the record stride.
  std::vector<uint8_t> padded;
  encode_push_request(keys.data(), n, rows.data(), static_cast<uint32_t>(stride), &padded);
  EXPECT_EQ(padded.size(), 8 + n * sizeof(uint64_t) + n * stride * sizeof(float));
  std::printf("PUSH of %zu rows of widths 4/8/16: %zu bytes at their own widths, %zu padded\n", n,
              push.size(), padded.size());

  // A forged width (past the widest, or not whole), a cut row, a byte too many.
  const std::size_t width_at = 8 + n * sizeof(uint64_t) + record.mf_dim_offset() * sizeof(float);
  for (const float forged : {17.0f, -1.0f, 4.5f}) {
    std::vector<uint8_t> bad = push;
    std::memcpy(bad.data() + width_at, &forged, sizeof forged);
    EXPECT_FALSE(decode_push_request(bad.data(), bad.size(), record, classes).ok()) << forged;
  }
  EXPECT_FALSE(decode_push_request(push.data(), push.size() - 4, record, classes).ok());
  std::vector<uint8_t> longer = push;
  longer.resize(longer.size() + 4);
  EXPECT_FALSE(decode_push_request(longer.data(), longer.size(), record, classes).ok());
  // Another record stride is refused naming both.
  std::vector<uint8_t> other = push;
  const uint32_t wrong = static_cast<uint32_t>(stride) + 1;
  std::memcpy(other.data() + 4, &wrong, 4);
  const auto refused = decode_push_request(other.data(), other.size(), record, classes);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("pushed to a table of stride"), std::string::npos);

  // PULL reply: packed in place by the server, unpacked into positions by the client.
  std::vector<uint8_t> reply(pull_reply_bytes(n, static_cast<uint32_t>(stride)));
  std::vector<float> work = rows;
  const std::size_t floats = pack_rows(work.data(), n, record, work.data());
  EXPECT_EQ(floats, own_floats);
  encode_pull_reply_head(n, static_cast<uint32_t>(stride), 2, reply.data());
  std::memcpy(reply.data() + pull_reply_rows_offset(), work.data(), floats * sizeof(float));
  reply.resize(pull_reply_rows_offset() + floats * sizeof(float));
  auto view =
      decode_pull_reply(reply.data(), reply.size(), static_cast<uint32_t>(n), record, classes);
  ASSERT_TRUE(view.ok()) << view.status().to_string();
  EXPECT_EQ(view->created, 2u);
  std::vector<uint32_t> positions(n);
  for (std::size_t j = 0; j < n; ++j) positions[j] = static_cast<uint32_t>(n - 1 - j);
  std::vector<float> out(n * stride, -1.0f);
  ASSERT_TRUE(unpack_rows(view->rows, view->rows_bytes, n, record, classes, positions.data(),
                          out.data(), "PULL reply")
                  .ok());
  for (std::size_t j = 0; j < n; ++j) {
    EXPECT_TRUE(std::equal(rows.begin() + j * stride, rows.begin() + (j + 1) * stride,
                           out.begin() + positions[j] * stride))
        << j;
  }
  EXPECT_FALSE(unpack_rows(view->rows, view->rows_bytes - 4, n, record, classes, nullptr,
                           out.data(), "PULL reply")
                   .ok());
  EXPECT_FALSE(
      decode_pull_reply(reply.data(), reply.size(), static_cast<uint32_t>(n + 1), record, classes)
          .ok());
}

// A width under the widest that is not one of the table's classes (0, 9, 12 of a 4/8/16 table)
// is refused naming the row and the width, in a PUSH request and in a PULL reply: the host
// table has no pool for such a row. And the rows' bytes are bounded by the narrowest class
// (width 4), not width 0: n rows claimed over fewer than n narrowest rows' bytes are refused
// before the rows are sized.
TEST(Protocol, RowWidthsMustBeTheTablesClassesAndBoundTheBytes) {
  for (const int32_t narrowest : {1, 4, 16}) {
    AccessorConfig cfg;
    cfg.mf_dim = narrowest;
    const AccessorConfig mixed = with_slot_dims(cfg, {{1, narrowest * 2}, {2, narrowest * 4}});
    const RowLayout record = record_layout(mixed);
    const WidthClasses classes = width_classes(mixed);
    const auto stride = static_cast<std::size_t>(record.stride());
    const auto own_stride = [&](int32_t w) {
      return static_cast<std::size_t>(RowLayout::make(record.kind, w).stride());
    };
    EXPECT_EQ(narrowest_row_bytes(record, classes), own_stride(narrowest) * sizeof(float));
    for (const int32_t width : {0, narrowest * 2 + 1, narrowest * 3}) {
      // Two rows: a good one of the widest width (so the bytes pass the narrowest bound), then
      // one of `width`.
      std::vector<float> rows(2 * stride, 1.0f);
      rows[record.mf_dim_offset()] = static_cast<float>(narrowest * 4);
      rows[stride + record.mf_dim_offset()] = static_cast<float>(width);
      const uint64_t keys[2] = {7, 8};
      std::vector<uint8_t> push;
      encode_push_request(keys, 2, rows.data(), record, &push);
      const auto refused = decode_push_request(push.data(), push.size(), record, classes);
      ASSERT_FALSE(refused.ok()) << narrowest << " " << width;
      EXPECT_EQ(refused.status().code(), Status::Code::kCorruption);
      EXPECT_NE(refused.status().message().find("row 1 of 2 records embedx width " +
                                                std::to_string(width) + ","),
                std::string::npos)
          << refused.status().to_string();
      EXPECT_NE(refused.status().message().find("not one of the table's widths"),
                std::string::npos);
      // The same rows as a PULL reply: the client refuses them the same way.
      const std::size_t floats = pack_rows(rows.data(), 2, record, rows.data());
      std::vector<float> out(2 * stride);
      const Status st =
          unpack_rows(reinterpret_cast<const uint8_t*>(rows.data()), floats * sizeof(float), 2,
                      record, classes, nullptr, out.data(), "PULL reply");
      EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.to_string();
    }
    // Bytes for n rows of width 0 but not of the narrowest class: refused before sizing.
    const uint32_t n = 1000;
    std::vector<uint8_t> forged;
    PayloadWriter w(&forged);
    w.put_u32(n);
    w.put_u32(static_cast<uint32_t>(stride));
    std::vector<uint64_t> keys(n, 1);
    w.put_array(keys.data(), n);
    std::vector<float> zeros(n * own_stride(0), 0.0f);  // every row says width 0
    w.put_array(zeros.data(), zeros.size());
    const auto push = decode_push_request(forged.data(), forged.size(), record, classes);
    ASSERT_FALSE(push.ok());
    EXPECT_NE(push.status().message().find("cannot hold 1000 rows"), std::string::npos)
        << push.status().to_string();
    std::vector<uint8_t> reply(pull_reply_rows_offset());
    encode_pull_reply_head(n, static_cast<uint32_t>(stride), 0, reply.data());
    reply.resize(pull_reply_rows_offset() + zeros.size() * sizeof(float));
    EXPECT_FALSE(decode_pull_reply(reply.data(), reply.size(), n, record, classes).ok());
  }
}

TEST(Protocol, ForgedCountsFailWithoutAllocating) {
  // n = 2^32-1 keys claimed, 8 bytes present: must be an error, not a 32 GiB resize.
  std::vector<uint8_t> p;
  PayloadWriter w(&p);
  w.put_u32(0xffffffffu);
  w.put_u32(1);  // has_slots for PULL, stride for PUSH
  w.put_u64(1);
  auto pull = decode_pull_request(p.data(), p.size());
  ASSERT_FALSE(pull.ok());
  EXPECT_NE(pull.status().message().find("do not fit"), std::string::npos);
  EXPECT_FALSE(decode_push_request(p.data(), p.size()).ok());
  EXPECT_FALSE(decode_erase_request(p.data(), p.size()).ok());
  EXPECT_FALSE(decode_save_request(p.data(), p.size()).ok());
  EXPECT_FALSE(decode_path_request(p.data(), p.size()).ok());
  EXPECT_FALSE(decode_barrier_request(p.data(), p.size()).ok());
}

// Random bytes and randomly mutated valid frames through every decoder: never a crash, and a
// decoded frame is always within the limit.
TEST(Protocol, FuzzRandomBytesNeverCrash) {
  std::mt19937_64 rng(20261121);
  std::vector<std::vector<uint8_t>> seeds;
  {
    std::vector<uint64_t> keys{1, 2, 3, 4};
    std::vector<int32_t> slots{1, 1, 2, 2};
    std::vector<float> rows(8, 1.5f);
    std::vector<uint8_t> p;
    encode_pull_request(keys.data(), slots.data(), keys.size(), &p);
    seeds.push_back(encode_frame(request(Op::kPull), p));
    p.clear();
    encode_push_request(keys.data(), 4, rows.data(), 2, &p);
    seeds.push_back(encode_frame(request(Op::kPush), p));
    p.clear();
    encode_save_request(SaveKind::kBase, "x", &p);
    seeds.push_back(encode_frame(request(Op::kSave), p));
    p.clear();
    encode_barrier_request("b", 2, &p);
    seeds.push_back(encode_frame(request(Op::kBarrier), p));
  }
  const uint32_t limit = 4096;
  int decoded = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> bytes;
    if (iter % 2 == 0) {
      bytes.resize(rng() % 200);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    } else {
      bytes = seeds[rng() % seeds.size()];
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips && !bytes.empty(); ++f) {
        bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
      }
      if (rng() % 4 == 0) bytes.resize(rng() % (bytes.size() + 1));
    }
    auto frame = decode_frame(bytes.data(), bytes.size(), limit);
    if (frame.ok()) {
      ++decoded;
      ASSERT_LE(frame->payload.size(), limit);
      ASSERT_EQ(frame->payload.size(), frame->header.payload_bytes);
    }
    // Every payload decoder on the raw bytes (as if they followed a valid header).
    const uint8_t* d = bytes.data();
    const std::size_t n = bytes.size();
    (void)decode_pull_request(d, n);
    (void)decode_push_request(d, n);
    (void)decode_erase_request(d, n);
    (void)decode_save_request(d, n);
    (void)decode_path_request(d, n);
    (void)decode_barrier_request(d, n);
    (void)decode_stats_reply(d, n);
    (void)decode_info_reply(d, n);
    (void)decode_u64_reply(d, n);
    (void)decode_pull_reply(d, n, 2, 3);
    FrameHeader h = request(Op::kPull);
    h.status = Status::Code::kInternal;
    (void)decode_error_reply(h, d, n);
  }
  EXPECT_GT(decoded, 0);  // mutations that hit only ids/payload still decode
}

RequestKey key(uint64_t client, uint64_t id, Op op = Op::kPush, uint64_t digest = 5) {
  return RequestKey{client, id, static_cast<uint16_t>(op), digest};
}

using WindowClock = RequestWindow::Clock;
constexpr auto kHour = std::chrono::hours(1);

TEST(RequestWindow, RemembersSuccessfulRepliesOnly) {
  RequestWindow window(1 << 20, kHour);
  const auto t = WindowClock::now();
  CachedReply reply;
  EXPECT_EQ(window.begin(key(1, 10), t, &reply), RequestWindow::Begin::kNew);
  EXPECT_EQ(window.begin(key(1, 10), t, &reply), RequestWindow::Begin::kInProgress);
  window.finish(key(1, 10), t, CachedReply{Status::Code::kOk, {42}}, /*remember=*/true);
  ASSERT_EQ(window.begin(key(1, 10), t, &reply), RequestWindow::Begin::kDone);
  EXPECT_EQ(reply.payload, std::vector<uint8_t>{42});
  // A refused request is forgotten: its retry is applied again, and it costs nothing.
  ASSERT_EQ(window.begin(key(1, 11), t, &reply), RequestWindow::Begin::kNew);
  window.finish(key(1, 11), t, CachedReply{Status::Code::kInvalidArgument, {1, 2}}, false);
  EXPECT_EQ(window.begin(key(1, 11), t, &reply), RequestWindow::Begin::kNew);
  window.finish(key(1, 11), t, {}, false);
  EXPECT_EQ(window.entries(), 1u);
  EXPECT_EQ(window.bytes(),
            RequestWindow::kClientOverheadBytes + RequestWindow::kEntryOverheadBytes + 1);
}

TEST(RequestWindow, KeyIncludesOpAndPayload) {
  RequestWindow window(1 << 20, kHour);
  const auto t = WindowClock::now();
  CachedReply reply;
  ASSERT_EQ(window.begin(key(1, 7, Op::kPush, 100), t, &reply), RequestWindow::Begin::kNew);
  window.finish(key(1, 7, Op::kPush, 100), t, {}, true);
  // The same ids for a SAVE, or for a PUSH of other rows, are other requests.
  EXPECT_EQ(window.begin(key(1, 7, Op::kSave, 100), t, &reply), RequestWindow::Begin::kNew);
  EXPECT_EQ(window.begin(key(1, 7, Op::kPush, 101), t, &reply), RequestWindow::Begin::kNew);
  EXPECT_EQ(window.begin(key(2, 7, Op::kPush, 100), t, &reply), RequestWindow::Begin::kNew);
  EXPECT_EQ(window.begin(key(1, 7, Op::kPush, 100), t, &reply), RequestWindow::Begin::kDone);
  const std::vector<uint8_t> a{1, 2, 3}, b{1, 2, 4};
  EXPECT_NE(request_digest(a.data(), a.size()), request_digest(b.data(), b.size()));
}

TEST(RequestWindow, BoundedByBytesOldestFirst) {
  const std::size_t per = RequestWindow::kEntryOverheadBytes + 8;
  const std::size_t bound = RequestWindow::kClientOverheadBytes + 10 * per;  // one client's 10
  RequestWindow window(bound, kHour);
  const auto t = WindowClock::now();
  CachedReply reply;
  for (uint64_t id = 0; id < 1000; ++id) {
    ASSERT_EQ(window.begin(key(1, id), t, &reply), RequestWindow::Begin::kNew);
    window.finish(key(1, id), t, CachedReply{Status::Code::kOk, std::vector<uint8_t>(8)}, true);
    ASSERT_LE(window.bytes(), bound);
  }
  EXPECT_EQ(window.entries(), 10u);
  EXPECT_EQ(window.begin(key(1, 999), t, &reply), RequestWindow::Begin::kDone);
  EXPECT_EQ(window.begin(key(1, 990), t, &reply), RequestWindow::Begin::kDone);
  EXPECT_EQ(window.begin(key(1, 989), t, &reply), RequestWindow::Begin::kNew);
}

TEST(RequestWindow, ForgetsByAgeButNeverARequestInProgress) {
  RequestWindow window(1 << 20, std::chrono::seconds(10));
  const auto t = WindowClock::now();
  CachedReply reply;
  ASSERT_EQ(window.begin(key(1, 1), t, &reply), RequestWindow::Begin::kNew);  // stays in progress
  ASSERT_EQ(window.begin(key(1, 2), t, &reply), RequestWindow::Begin::kNew);
  window.finish(key(1, 2), t, {}, true);
  ASSERT_EQ(window.begin(key(1, 3), t + std::chrono::seconds(8), &reply),
            RequestWindow::Begin::kNew);
  window.finish(key(1, 3), t + std::chrono::seconds(8), {}, true);
  const auto later = t + std::chrono::seconds(15);
  EXPECT_EQ(window.begin(key(1, 2), later, &reply), RequestWindow::Begin::kNew);   // 15 s old
  EXPECT_EQ(window.begin(key(1, 3), later, &reply), RequestWindow::Begin::kDone);  // 7 s old
  EXPECT_EQ(window.begin(key(1, 1), later, &reply), RequestWindow::Begin::kInProgress);
  // A small byte bound never drops the one in progress either.
  RequestWindow tiny(RequestWindow::kEntryOverheadBytes, kHour);
  ASSERT_EQ(tiny.begin(key(1, 1), t, &reply), RequestWindow::Begin::kNew);
  for (uint64_t id = 2; id < 6; ++id) {
    ASSERT_EQ(tiny.begin(key(1, id), t, &reply), RequestWindow::Begin::kNew);
    tiny.finish(key(1, id), t, {}, true);
  }
  EXPECT_EQ(tiny.begin(key(1, 1), t, &reply), RequestWindow::Begin::kInProgress);
}

TEST(Endpoints, ParsesPaddleListAndRejectsBadEntries) {
  auto eps = parse_endpoints("127.0.0.1:29011, 10.0.0.2:80,[::1]:7");
  ASSERT_TRUE(eps.ok()) << eps.status().to_string();
  ASSERT_EQ(eps->size(), 3u);
  EXPECT_EQ((*eps)[0].to_string(), "127.0.0.1:29011");
  EXPECT_EQ((*eps)[1].port, 80);
  EXPECT_EQ((*eps)[2].host, "::1");
  for (const char* bad : {"", "127.0.0.1", "127.0.0.1:", ":80", "h:0", "h:65536", "h:12x"}) {
    auto st = parse_endpoints(bad);
    EXPECT_FALSE(st.ok()) << bad;
  }
  auto st = parse_endpoints("a:1,b:99999");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("b:99999"), std::string::npos);
}

TEST(Endpoints, FromEnvironmentPrefersPaddleName) {
  ::unsetenv("PADDLE_PSERVERS_IP_PORT_LIST");
  ::unsetenv("GPUBOX_PSERVERS_IP_PORT_LIST");
  EXPECT_EQ(endpoints_from_environment(), "");
  ::setenv("GPUBOX_PSERVERS_IP_PORT_LIST", "127.0.0.1:2", 1);
  EXPECT_EQ(endpoints_from_environment(), "127.0.0.1:2");
  ::setenv("PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:1", 1);
  EXPECT_EQ(endpoints_from_environment(), "127.0.0.1:1");
  ::unsetenv("PADDLE_PSERVERS_IP_PORT_LIST");
  ::unsetenv("GPUBOX_PSERVERS_IP_PORT_LIST");
}

// With fp16/bf16 sparse_storage an embedding slot holds two 16-bit halves: a NaN or infinity in
// either half (which a float's exponent test misses in the low half, and for fp16 in the high
// half too) is found, at the slot that holds it, in every position of a few rows.
TEST(Protocol, FirstNonFiniteRowReadsSixteenBitHalves) {
  for (const auto storage : {config::SparseStorage::kFp16, config::SparseStorage::kBf16}) {
    const RowLayout layout = RowLayout::make(SparseOptimizerKind::kAdagrad, 8, storage);
    const auto stride = static_cast<std::size_t>(layout.stride());
    constexpr std::size_t kRows = 3;
    std::vector<float> rows(kRows * stride, 0.0f);
    for (std::size_t r = 0; r < kRows; ++r) {
      float* row = rows.data() + r * stride;
      row[layout.mf_dim_offset()] = static_cast<float>(layout.mf_dim);
      write_embed_w(row, layout, 0.5f);
      for (int32_t i = 0; i < layout.mf_dim; ++i) write_embedx_w(row, layout, i, -0.25f * i);
    }
    ASSERT_EQ(first_non_finite_row(rows.data(), kRows, layout), kRows * stride);
    EXPECT_EQ(first_non_finite_row(rows.data(), 0, layout), 0u);
    for (const float bad :
         {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      for (int32_t i = -1; i < layout.mf_dim; ++i) {  // -1: embed_w
        std::vector<float> copy = rows;
        float* row = copy.data() + stride;  // the second row
        i < 0 ? write_embed_w(row, layout, bad) : write_embedx_w(row, layout, i, bad);
        const std::size_t slot =
            i < 0 ? RowLayout::kEmbedW
                  : static_cast<std::size_t>(table::detail::packed_embedx_slot(layout, i));
        EXPECT_EQ(first_non_finite_row(copy.data(), kRows, layout), stride + slot)
            << "storage " << static_cast<int>(storage) << ", value " << bad << ", position " << i;
      }
    }
  }
}

}  // namespace
}  // namespace gpubox::table::server
