// The server's retry cache (request_window.hpp): what it remembers (successful replies only,
// keyed by client, request id, op and payload), bounded by bytes and age, never forgetting a
// request still being applied.
#include "table/server/request_window.hpp"

#include <gtest/gtest.h>

#include <chrono>

#include "table/server/protocol.hpp"

namespace gpubox::table::server {
namespace {

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

}  // namespace
}  // namespace gpubox::table::server
