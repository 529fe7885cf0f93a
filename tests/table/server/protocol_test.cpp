// The wire protocol's messages (protocol.hpp, ps_protocol.hpp): headers and frames, each
// request's and reply's round trip and refusals, forged counts that would allocate, random and
// mutated bytes through every decoder, and the endpoint lists (transport.hpp). Rows on the wire:
// protocol_rows_test.cpp; the retry cache: request_window_test.cpp; the fuzzer's seed frames:
// protocol_seeds_test.cpp.
#include "table/server/protocol.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "table/server/remote_host_tier.hpp"
#include "table/server/transport.hpp"

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
  bytes[4] = static_cast<uint8_t>(kProtocolVersion + 1);  // another version
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

// PROGRESS (protocol 10): a response of its own op carrying the SAVE's request id; exactly 16
// payload bytes, nothing shorter or longer.
TEST(Protocol, ProgressRoundTripsAndIsExactlySized) {
  std::vector<uint8_t> p;
  encode_progress(ProgressNote{12, 1u << 30}, &p);
  ASSERT_EQ(p.size(), kProgressPayloadBytes);
  auto note = decode_progress(p.data(), p.size());
  ASSERT_TRUE(note.ok()) << note.status().to_string();
  EXPECT_EQ(note->steps, 12u);
  EXPECT_EQ(note->io_bytes, 1u << 30);
  EXPECT_FALSE(decode_progress(p.data(), p.size() - 1).ok());
  p.push_back(0);
  EXPECT_FALSE(decode_progress(p.data(), p.size()).ok());
  FrameHeader h = request(Op::kProgress, 41);
  h.response = true;
  p.pop_back();
  const std::vector<uint8_t> frame = encode_frame(h, p);
  auto back = decode_frame(frame.data(), frame.size(), kDefaultMaxPayloadBytes);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(is_progress(back->header));
  EXPECT_FALSE(is_notice(back->header));
  EXPECT_EQ(back->header.request_id, 41u);
  EXPECT_STREQ(op_name(Op::kProgress), "PROGRESS");
  EXPECT_TRUE(is_known_op(static_cast<uint16_t>(Op::kProgress)));
  EXPECT_FALSE(is_known_op(static_cast<uint16_t>(Op::kProgress) + 1));
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
    (void)decode_progress(d, n);
    (void)decode_pull_reply(d, n, 2, 3);
    FrameHeader h = request(Op::kPull);
    h.status = Status::Code::kInternal;
    (void)decode_error_reply(h, d, n);
  }
  EXPECT_GT(decoded, 0);  // mutations that hit only ids/payload still decode
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

}  // namespace
}  // namespace gpubox::table::server
