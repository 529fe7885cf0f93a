// The pass boundary's write-back (PassBoundary::end_pass / sync): dirty rows from the cards to
// the host tier, streamed a batch at a time.
#include <algorithm>
#include <deque>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "common/timer.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/pass/pass_boundary.hpp"
#include "heterps/pass/row_marks.hpp"

namespace gpubox::pass {
namespace {

using card_table::row_index_t;

const std::vector<uint64_t> kNoKeys;

// `buffer`'s memory, of at least `count` elements: reallocated only when it holds fewer (by half
// as much again when `grow`, so a table whose dirty rows grow pass by pass reallocates rarely).
// The old block is freed before the new one is made: the two are never both held.
// Called only inside a write-back (end_pass, sync), between passes: the steps' collectives have
// completed and the write-back runs none, so the device-wide wait of cudaMallocHost/cudaFreeHost
// cannot hold up a peer's collective (it waits only for this process's own queued work).
template <class T>
T* reserve_pinned(device::pinned_buffer<T>& buffer, std::size_t count, bool grow) {
  if (buffer.size() < count) {
    const std::size_t size = grow ? std::max(count, buffer.size() + buffer.size() / 2) : count;
    buffer = device::pinned_buffer<T>();
    buffer = device::pinned_buffer<T>(size);
  }
  return buffer.data();
}

}  // namespace

PassStats PassBoundary::end_pass(const std::vector<uint64_t>& keep) {
  GPUBOX_EXPECTS(std::is_sorted(keep.begin(), keep.end()),
                 "end_pass: the kept keys are not sorted");
  GPUBOX_EXPECTS(in_pass_, "end_pass called without begin_pass");
  Timer timer;
  if (access_ == PassAccess::kEvaluate) {
    next_work_.keys_changed();
    // The borrowed rows are clean (an evaluation pass only pulls): they leave without a
    // write-back, and the host tier never saw them.
    cards_.cards().run_on_cards([&](device::Card& card) {
      const int c = card.local_index();
      cards_.erase_from_card(c, borrowed_[c]);
      borrowed_[c] = {};
    });
  }
  // Replicated: every replica's flags are cleared by card 0's write-back; nothing is kept.
  current_.written_back +=
      write_back_all(access_ == PassAccess::kTrain && !cards_.replicated() ? keep : kNoKeys);
  current_.kept_dirty = kept_dirty_;
  uint64_t rows = 0;
  for (std::size_t c = 0; c < cards_.num_cards(); ++c) {
    rows += cards_.store(static_cast<int>(c)).size();
  }
  current_.rows_on_cards = rows;
  current_.end_seconds = timer.seconds();
  GPUBOX_LOG(INFO) << "end_pass " << current_.pass_id << ": " << current_.written_back
                   << " rows written back, " << current_.kept_dirty
                   << " kept dirty on the cards for the next pass, in " << current_.end_seconds
                   << " s; the slowest card gathered its rows off the card in " << gather_seconds_
                   << " s, the rest waited for the host tier";
  in_pass_ = false;
  return current_;
}

uint64_t PassBoundary::write_back_all(const std::vector<uint64_t>& keep) {
  std::vector<uint64_t> written(cards_.num_cards(), 0);
  std::vector<uint64_t> kept(written.size(), 0);
  std::vector<double> gathering(written.size(), 0);
  if (write_back_buffers_.size() < written.size()) write_back_buffers_.resize(written.size());
  cards_.cards().run_on_cards([&](device::Card& card) {
    const int c = card.local_index();
    written[c] = write_back(c, &gathering[c], keep, &kept[c]);
  });
  gather_seconds_ = *std::max_element(gathering.begin(), gathering.end());
  kept_dirty_ = std::accumulate(kept.begin(), kept.end(), uint64_t{0});
  return std::accumulate(written.begin(), written.end(), uint64_t{0});
}

uint64_t PassBoundary::write_back(int c, double* gather_seconds, const std::vector<uint64_t>& keep,
                                  uint64_t* kept) {
  card_table::CardSparseStore& store = cards_.store(c);
  device::Card& card = cards_.card(c);
  const device::Stream& stream = card.stream();
  // The next pass's erases in flight are checked before the table is listed (a victim missing
  // would show here only as a count that disagrees).
  next_work_.settle(c);
  if (cards_.replicated() && c > 0) {
    // The replicas are identical (heter_comm.hpp): card 0's write-back covers this one.
    store.clear_dirty(stream);
    stream.synchronize();
    return 0;
  }
  // The dirty rows' keys and indices (12 bytes each), the keys read back into pinned memory,
  // then the rows a batch at a time (push_rows).
  device::device_buffer<uint64_t> d_keys(0, card.memory(), stream);
  device::device_buffer<row_index_t> d_rows(0, card.memory(), stream);
  const std::size_t listed = store.list_entries(/*dirty_only=*/true, d_keys, d_rows, stream);
  if (listed == 0) return 0;
  uint64_t* keys = reserve_pinned(write_back_buffers_[c].keys, listed, /*grow=*/true);
  device::copy_async(keys, d_keys.data(), listed, stream);
  stream.synchronize();
  d_keys.release();
  std::size_t count = listed;
  if (!keep.empty()) {
    *kept = drop_kept(c, keep, keys, count, d_rows);
    count -= *kept;
  }
  const Status st = push_rows(c, keys, count, d_rows, gather_seconds);
  // On failure the rows stay dirty on the card: a retried end_pass/sync writes them again.
  throw_host_error(st, "writing back " + std::to_string(count) + " dirty rows of card " +
                           std::to_string(card.rank()) + " to the host tier");
  if (keep.empty()) {
    store.clear_dirty(stream);
  } else {
    store.clear_dirty(d_rows.data(), count, stream);
  }
  stream.synchronize();
  return count;
}

std::size_t PassBoundary::drop_kept(int c, const std::vector<uint64_t>& keep, uint64_t* keys,
                                    std::size_t count, device::device_buffer<row_index_t>& d_rows) {
  card_table::CardSparseStore& store = cards_.store(c);
  device::Card& card = cards_.card(c);
  const device::Stream& stream = card.stream();
  WriteBackBuffers& buffers = write_back_buffers_[c];
  // The rows of `keep` stay dirty: marked by row index, then the others listed again (and only
  // they are marked clean after the push). Every host<->card copy goes through the card's pinned
  // buffers (kept from pass to pass, grown rarely), none through pageable memory.
  row_index_t* rows = reserve_pinned(buffers.rows, count, /*grow=*/true);
  device::copy_async(rows, d_rows.data(), count, stream);
  // The keep keys looked up a page at a time (card memory stays within the plan: d_rows, 4 bytes a
  // dirty row, is what is left of the listing's 12). Their pinned buffers are made a whole page
  // once, so a keep that grows from pass to pass does not free and make them again.
  const std::size_t chunk = std::min(keep.size(), store.page_rows());
  uint64_t* keep_staged = reserve_pinned(buffers.keep, store.page_rows(), /*grow=*/false);
  row_index_t* found = reserve_pinned(buffers.found, store.page_rows(), /*grow=*/false);
  stream.synchronize();  // the row indices are in `rows`
  const row_index_t row_end = *std::max_element(rows, rows + count) + 1;
  RowMarks kept_row(row_end, count);
  {
    device::device_buffer<uint64_t> d_keep(chunk, card.memory(), stream);
    device::device_buffer<row_index_t> d_found(chunk, card.memory(), stream);
    for (std::size_t b = 0; b < keep.size(); b += chunk) {
      const std::size_t n = std::min(keep.size(), b + chunk) - b;
      // The previous chunk's wait covers its upload from keep_staged.
      std::copy_n(keep.data() + b, n, keep_staged);
      device::copy_async(d_keep.data(), keep_staged, n, stream);
      store.lookup_or_create(d_keep.data(), nullptr, n, d_found.data(),
                             /*create_missing=*/false, nullptr, stream);
      device::copy_async(found, d_found.data(), n, stream);
      stream.synchronize();
      for (std::size_t i = 0; i < n; ++i) kept_row.mark(found[i]);
    }
  }
  kept_row.seal();
  std::size_t pushed = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (kept_row.has(rows[i])) continue;
    keys[pushed] = keys[i];
    rows[pushed] = rows[i];
    ++pushed;
  }
  // Back into d_rows' own memory (it only shrinks), left queued on the card's stream when this
  // returns: ordered before the gathers that read d_rows (same stream), and `rows` is not written
  // again before the write-back's last wait (push_rows synchronizes the stream).
  d_rows.resize(pushed);
  if (pushed > 0) device::copy_async(d_rows.data(), rows, pushed, stream);
  return count - pushed;
}

Status PassBoundary::push_rows(int c, const uint64_t* keys, std::size_t count,
                               const device::device_buffer<row_index_t>& d_rows,
                               double* gather_seconds) {
  card_table::CardSparseStore& store = cards_.store(c);
  device::Card& card = cards_.card(c);
  const device::Stream& stream = card.stream();
  const std::size_t stride = cards_.stride();
  // A batch is gathered off the card (on cuda a page at a time: the card never holds a second
  // copy of the rows) while the batches before it are pushed, at most pulls_in_flight at once, so
  // the host holds pulls_in_flight + 1 batches of rows, not a copy of every dirty row (785 MB for a
  // pass of 10.9 M rows).
  const std::size_t batch = std::max<std::size_t>(cards_.options().host_batch_keys, 1);
  const auto in_flight = static_cast<std::size_t>(std::max(1, cards_.options().pulls_in_flight));
  // A batch's rows land in one of the card's pinned batch buffers (kept from pass to pass, left
  // uninitialised: the gather writes every float), reused once its push is done. Only as many
  // as the pass has batches are made, each of a whole batch even when the write-back is smaller
  // (a sync() before a save, a short first pass): sized to it, a later larger write-back would
  // free and make each again (cudaFreeHost waits for the whole device).
  const std::size_t batches = (count + batch - 1) / batch;
  const std::size_t batch_floats = batch * stride;
  std::vector<device::pinned_buffer<float>>& buffers = write_back_buffers_[c].batches;
  const std::size_t slots = std::min(in_flight + 1, batches);
  if (buffers.size() < slots) buffers.resize(slots);
  std::vector<float*> spare;
  for (std::size_t i = 0; i < slots; ++i) {
    spare.push_back(reserve_pinned(buffers[i], batch_floats, /*grow=*/false));
  }
  // At most in_flight pushes at once (the window) on the pass cards' host-call threads. The
  // window waits for every push in it before it goes, so an error that unwinds this function
  // leaves no push reading a buffer that a later write-back refills.
  CallWindow window(cards_.host_calls(), in_flight);
  std::deque<float*> pushing;  // the rows of the pushes in the window, oldest first
  Status st;
  // Waits for the oldest push; keeps the first error.
  auto retire = [&] {
    const Status pushed = window.retire();  // rethrows what the push threw
    if (!pushed.ok() && st.ok()) st = pushed;
    spare.push_back(pushing.front());
    pushing.pop_front();
  };
#if defined(GPUBOX_BACKEND_CUDA)
  // One staging page on the card; the gathers and the copies into pinned memory are ordered on
  // the card's stream, and the host waits once per batch, before its push reads it.
  const std::size_t page = store.page_rows();
  device::device_buffer<float> staged(std::min(count, page) * stride, card.memory(), stream);
#endif
  table::HostTier& host = cards_.host();
  for (std::size_t b = 0; b < count && st.ok(); b += batch) {
    const std::size_t n = std::min(count, b + batch) - b;
    if (window.full()) retire();
    Timer gather;
    float* rows = spare.back();
    spare.pop_back();
#if defined(GPUBOX_BACKEND_CUDA)
    for (std::size_t p = 0; p < n; p += page) {
      const std::size_t m = std::min(n, p + page) - p;
      store.gather_rows(d_rows.data() + b + p, m, staged.data(), stream);
      device::copy_async(rows + p * stride, staged.data(), m * stride, stream);
    }
#else
    // cpu: the card's memory is the host's, so the gather writes the batch itself; staging it
    // a page at a time and copying was a second pass over every row written back (68 MB of
    // memcpy a wide_deep pass of 444k rows).
    store.gather_rows(d_rows.data() + b, n, rows, stream);
#endif
    stream.synchronize();  // the batch's rows are in `rows` before its push reads them
    *gather_seconds += gather.seconds();
    window.submit([&host, keys, b, n, rows] { return host.push(keys + b, n, rows); });
    pushing.push_back(rows);
  }
  while (!window.empty()) retire();
  return st;
}

}  // namespace gpubox::pass
