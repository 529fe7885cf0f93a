// The protocol fuzzer's seed corpus (tests/fuzz/corpus/fuzz_protocol): each seed is a frame of
// this version whose payload its op's request or reply decoder takes, so that the fuzzer starts
// from frames the server and the client take; a seed named *_v<N> is a frame of an older version
// N, refused naming it; a seed named raw_* is deliberately not a frame (a crashing input kept).
//
// The seeds the encoders write (generated_seeds() below) are checked byte for byte; to write
// them again after a payload changes, run
//   GPUBOX_WRITE_FUZZ_SEEDS=1 build/bin/server_protocol_test --gtest_filter='ProtocolSeeds.*'
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "table/server/protocol.hpp"
#include "table/server/ps_protocol.hpp"
#include "tests/table/slot_dims_config.hpp"

namespace gpubox::table::server {
namespace {

using Bytes = std::vector<uint8_t>;

const std::filesystem::path& corpus() {
  static const std::filesystem::path dir =
      std::filesystem::path(GPUBOX_SOURCE_DIR) / "tests/fuzz/corpus/fuzz_protocol";
  return dir;
}

Bytes seed_frame(Op op, bool response, const Bytes& payload) {
  FrameHeader h;
  h.op = op;
  h.response = response;
  h.request_id = 7;
  h.client_id = 99;
  return encode_frame(h, payload);
}

// The seeds written by the encoders, by file name.
std::map<std::string, Bytes> generated_seeds() {
  std::map<std::string, Bytes> seeds;
  seeds["auth"] = seed_frame(Op::kAuth, false, {});  // the challenge's request: no payload
  InfoReply info;
  info.shard_num = 2;
  info.mf_dim = 8;
  info.stride = 17;
  info.instance_id = 0x1234;
  info.generation = 5;
  info.seed = 11;
  info.rule = {{"hyper_parameters.sparse_optimizer.l1_decay", 0.5}};
  Bytes p;
  encode_info_reply(info, &p);
  seeds["info_reply"] = seed_frame(Op::kInfo, true, p);
  const std::vector<float> values{0.5f, -1.0f, 2.0f};
  const std::pair<const char*, DenseAction> dense[] = {{"dense_read", DenseAction::kRead},
                                                       {"dense_add", DenseAction::kAdd},
                                                       {"dense_write", DenseAction::kWrite}};
  for (const auto& [name, action] : dense) {
    p.clear();
    encode_dense_request(action, "dense", values.data(), values.size(), &p);
    seeds[name] = seed_frame(Op::kDense, false, p);
  }
  p.clear();
  encode_dense_reply(0, values.data(), values.size(), /*committed=*/false, &p);
  seeds["dense_reply"] = seed_frame(Op::kDense, true, p);
  return seeds;
}

// The fuzzer's table of widths 4, 8 and 16 (adagrad): rows of the *_mixed_widths seeds.
AccessorConfig mixed_config() {
  AccessorConfig cfg;
  cfg.mf_dim = 4;
  return with_slot_dims(cfg, {{1, 8}, {2, 16}});
}

uint32_t u32_at(const Bytes& p, std::size_t at) {
  uint32_t v = 0;
  if (p.size() >= at + 4) std::memcpy(&v, p.data() + at, 4);
  return v;
}

// The request's payload through its op's decoder.
Status decode_request(Op op, const Bytes& p) {
  static const RowLayout mixed = record_layout(mixed_config());
  static const WidthClasses classes = width_classes(mixed_config());
  switch (op) {
    case Op::kPull:
    case Op::kPeek:
      return decode_pull_request(p.data(), p.size()).status();
    case Op::kPush:
      if (decode_push_request(p.data(), p.size()).ok()) return Status::OK();
      return decode_push_request(p.data(), p.size(), mixed, classes).status();
    case Op::kErase:
      return decode_erase_request(p.data(), p.size()).status();
    case Op::kSave:
      return decode_save_request(p.data(), p.size()).status();
    case Op::kLoad:
      return decode_path_request(p.data(), p.size()).status();
    case Op::kBarrier:
      return decode_barrier_request(p.data(), p.size()).status();
    case Op::kPsPush:
      return decode_ps_push_request(p.data(), p.size()).status();
    case Op::kDense:
      return decode_dense_request(p.data(), p.size()).status();
    default:  // AUTH, INFO, SHRINK, STATS, SHUTDOWN: no payload
      return p.empty() ? Status::OK() : Status::InvalidArgument("a payload on a payload-less op");
  }
}

// The reply's payload through its op's decoder (an error reply: through decode_error_reply, to
// its header's status).
Status decode_reply(const FrameHeader& h, const Bytes& p) {
  static const RowLayout mixed = record_layout(mixed_config());
  static const WidthClasses classes = width_classes(mixed_config());
  if (h.status != Status::Code::kOk) {
    const Status st = decode_error_reply(h, p.data(), p.size());
    return st.code() == h.status ? Status::OK() : Status::InvalidArgument(st.to_string());
  }
  switch (h.op) {
    case Op::kInfo:
      return decode_info_reply(p.data(), p.size()).status();
    case Op::kPull:
    case Op::kPeek:
      if (decode_pull_reply(p.data(), p.size(), u32_at(p, 0), u32_at(p, 4)).ok()) {
        return Status::OK();
      }
      return decode_pull_reply(p.data(), p.size(), u32_at(p, 0), mixed, classes).status();
    case Op::kSave:
    case Op::kLoad:
    case Op::kShrink:
      return decode_u64_reply(p.data(), p.size()).status();
    case Op::kStats:
      return decode_stats_reply(p.data(), p.size()).status();
    case Op::kProgress:
      return decode_progress(p.data(), p.size()).status();
    case Op::kDense:
      return decode_dense_reply(p.data(), p.size(), u32_at(p, 0), u32_at(p, 4)).status();
    default:
      return p.empty() ? Status::OK() : Status::InvalidArgument("a payload on a payload-less op");
  }
}

Bytes read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(ProtocolSeeds, TheEncodersSeedsAreCurrent) {
  const bool write = std::getenv("GPUBOX_WRITE_FUZZ_SEEDS") != nullptr;
  for (const auto& [name, bytes] : generated_seeds()) {
    if (write) {
      std::ofstream out(corpus() / name, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(bytes.data()),
                static_cast<std::streamsize>(bytes.size()));
    }
    EXPECT_EQ(read_bytes(corpus() / name), bytes) << name << " differs from its encoder's frame";
  }
}

TEST(ProtocolSeeds, EverySeedIsAFrameWhosePayloadDecodes) {
  const std::regex old_version("_v(\\d+)$");
  int frames = 0;
  for (const auto& entry : std::filesystem::directory_iterator(corpus())) {
    const Bytes bytes = read_bytes(entry.path());
    const std::string name = entry.path().filename().string();
    const uint16_t version = header_version(bytes.data(), bytes.size());
    if (name.rfind("raw_", 0) == 0) {
      EXPECT_EQ(version, 0) << name << ": a raw_ seed is not a frame";
      continue;
    }
    ASSERT_NE(version, 0) << name << ": not a frame (no GPBX magic); name a raw seed raw_*";
    ++frames;
    const auto frame = decode_frame(bytes.data(), bytes.size(), kDefaultMaxPayloadBytes);
    std::smatch old;
    if (std::regex_search(name, old, old_version)) {
      EXPECT_EQ(std::to_string(version), old[1].str()) << name;
      ASSERT_FALSE(frame.ok()) << name;
      EXPECT_NE(frame.status().message().find(std::to_string(version)), std::string::npos)
          << frame.status().to_string();
      continue;
    }
    EXPECT_EQ(version, kProtocolVersion) << name;
    ASSERT_TRUE(frame.ok()) << name << ": " << frame.status().to_string();
    const Status st = frame->header.response ? decode_reply(frame->header, frame->payload)
                                             : decode_request(frame->header.op, frame->payload);
    EXPECT_TRUE(st.ok()) << name << " (" << op_name(frame->header.op) << ")"
                         << (frame->header.response ? " reply" : " request") << ": "
                         << st.to_string();
  }
  EXPECT_GT(frames, 20);
}

}  // namespace
}  // namespace gpubox::table::server
