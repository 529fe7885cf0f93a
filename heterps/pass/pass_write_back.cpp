// The pass boundary's write-back (PassBoundary::end_pass / sync): dirty rows from the cards to
// the host tier, streamed a batch at a time: gathered off the card into pinned batches (cuda),
// or on cpu pushed where they lie on the card, by their addresses (reads_rows_in_place).
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

// The write-back's staging page (push_rows, gather_part): two halves gathered and copied in
// turn, of staging_rows rows each (at most PassCards::kKeptRows); a page of one row is one half
// (gathered and copied in turn with itself). Kept from pass to pass: the plan counts it as
// kept_bytes.
std::size_t staging_halves(std::size_t page_rows) { return PassCards::staging_halves(page_rows); }
std::size_t staging_rows(std::size_t page_rows) { return PassCards::staging_rows(page_rows); }

// Whether the write-back pushes its rows to the host tier where they lie on the card, by their
// addresses (HostTier::push_at), instead of gathering them into pinned batches: only on cpu,
// whose card memory is the host's (the gather was a second copy of every row written back), when
// options.write_back_in_place, not under GPUBOX_DEVICE_CHECK=defer, where the rows are gathered
// and staged as cuda does (stages_rows) so that the deferred streams check its events, and only
// to a host tier that reads rows where they lie (HostTier::pushes_by_address: the in-process
// table; a remote tier would pack them into a message anyway, from a pinned batch the write-back
// counts in write_back_pinned_bytes).
bool reads_rows_in_place([[maybe_unused]] const device::Stream& stream,
                         [[maybe_unused]] const PassManagerOptions& options,
                         [[maybe_unused]] const table::HostTier& host) {
#if defined(GPUBOX_BACKEND_CUDA)
  return false;
#else
  return options.write_back_in_place && stream.deferred() == nullptr && host.pushes_by_address();
#endif
}

// Whether the write-back gathers its rows into the staging page and copies them off the card on
// the copy stream: always on cuda. On cpu the card's memory is the host's, so the gather writes
// the pinned batch itself (staging and copying was a second pass over every row written back:
// 68 MB of memcpy a wide_deep pass of 444k rows), but under GPUBOX_DEVICE_CHECK=defer it stages
// as cuda does, so that the deferred streams check the events that order the halves.
bool stages_rows([[maybe_unused]] const device::Stream& stream) {
#if defined(GPUBOX_BACKEND_CUDA)
  return true;
#else
  return stream.deferred() != nullptr;
#endif
}

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
  current_.write_back_pinned_bytes = 0;
  for (const WriteBackBuffers& buffers : write_back_buffers_) {
    current_.write_back_pinned_bytes += buffers.pinned_bytes();
  }
  current_.end_seconds = timer.seconds();
  GPUBOX_LOG(INFO) << "end_pass " << current_.pass_id << ": " << current_.written_back
                   << " rows written back, " << current_.kept_dirty
                   << " kept dirty on the cards for the next pass, in " << current_.end_seconds
                   << " s; the slowest card made its batches ready (rows gathered off the card, or "
                      "on cpu their addresses listed) in "
                   << gather_seconds_
                   << " s, the rest waited for the host tier; the write-back holds "
                   << static_cast<double>(current_.write_back_pinned_bytes) / (1 << 20)
                   << " MiB of pinned host memory (kept for the next pass's end)";
  in_pass_ = false;
  return current_;
}

void PassBoundary::abandon_pass() {
  next_work_.keys_changed();
  borrowed_.assign(cards_.num_cards(), {});
  // kept_dirty_ stays: the caller empties the cards next (clear_cards resets it); a failed
  // clear leaves a count that is stale but safe (make_room spares more than it must).
  in_pass_ = false;
}

uint64_t PassBoundary::write_back_all(const std::vector<uint64_t>& keep) {
  std::vector<uint64_t> written(cards_.num_cards(), 0);
  std::vector<uint64_t> kept(written.size(), 0);
  std::vector<double> gathering(written.size(), 0);
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
  // The dirty rows' keys and indices (12 bytes each) listed into the card's kept listing, the
  // keys read back into pinned memory, then the rows a batch at a time (push_rows).
  WriteBackBuffers& buffers = this->buffers(c);
  CardPassBuffers& lent = cards_.kept(c);
  const std::size_t listed =
      store.list_entries(/*dirty_only=*/true, lent.listed_keys, lent.listed_rows, stream);
  if (listed == 0) return 0;
  uint64_t* keys = reserve_pinned(buffers.keys, listed, /*grow=*/true);
  device::copy_async(keys, lent.listed_keys.data(), listed, stream);
  stream.synchronize();
  std::size_t count = listed;
  if (!keep.empty()) {
    *kept = drop_kept(c, keep, keys, count, lent.listed_rows);
    count -= *kept;
  }
  const Status st = push_rows(c, keys, count, lent.listed_rows, gather_seconds);
  // On failure the rows stay dirty on the card: a retried end_pass/sync writes them again.
  throw_host_error(st, "writing back " + std::to_string(count) + " dirty rows of card " +
                           std::to_string(card.rank()) + " to the host tier");
  if (keep.empty()) {
    store.clear_dirty(stream);
  } else {
    store.clear_dirty(lent.listed_rows.data(), count, stream);
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
  // The keep keys looked up PassCards::keep_rows at a time (a page, at most kKeptRows: card
  // memory stays within the plan's kept_bytes beside the listing). Their pinned buffers are made
  // that size once, so a keep that grows from pass to pass does not free and make them again;
  // their card buffers are the card's kept page of keys and rows (PassCards::kept).
  const std::size_t page = PassCards::keep_rows(store.page_rows());
  const std::size_t chunk = std::min(keep.size(), page);
  uint64_t* keep_staged = reserve_pinned(buffers.keep, page, /*grow=*/false);
  row_index_t* found = reserve_pinned(buffers.found, page, /*grow=*/false);
  CardPassBuffers& lent = cards_.kept(c);
  stream.synchronize();  // the row indices are in `rows`
  const row_index_t row_end = *std::max_element(rows, rows + count) + 1;
  RowMarks kept_row(row_end, count);
  for (std::size_t b = 0; b < keep.size(); b += chunk) {
    const std::size_t n = std::min(keep.size(), b + chunk) - b;
    // The previous chunk's wait covers its upload from keep_staged.
    std::copy_n(keep.data() + b, n, keep_staged);
    device::copy_async(lent.page_keys.data(), keep_staged, n, stream);
    store.lookup_or_create(lent.page_keys.data(), nullptr, n, lent.page_rows.data(),
                           /*create_missing=*/false, nullptr, stream);
    device::copy_async(found, lent.page_rows.data(), n, stream);
    stream.synchronize();
    for (std::size_t i = 0; i < n; ++i) kept_row.mark(found[i]);
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
  // returns: ordered before the gathers (or, in place, row_addresses) that read d_rows (same
  // stream), and `rows` is not written again before the write-back's last wait (write_back
  // synchronizes the stream).
  d_rows.resize(pushed);
  if (pushed > 0) device::copy_async(d_rows.data(), rows, pushed, stream);
  return count - pushed;
}

Status PassBoundary::push_rows(int c, const uint64_t* keys, std::size_t count,
                               const device::device_buffer<row_index_t>& d_rows,
                               double* gather_seconds) {
  const card_table::CardSparseStore& store = cards_.store(c);
  device::Card& card = cards_.card(c);
  // A batch is made ready on the card (its rows gathered off the card, or on cpu their addresses
  // listed: reads_rows_in_place, CardSparseStore::row_addresses) while the batches before it are
  // pushed, at most pulls_in_flight at once, so the host holds pulls_in_flight + 1 batches, not a
  // copy of every dirty row (785 MB for a pass of 10.9 M rows).
  const std::size_t batch = std::max<std::size_t>(cards_.options().host_batch_keys, 1);
  const auto in_flight = static_cast<std::size_t>(std::max(1, cards_.options().pulls_in_flight));
  table::HostTier& host = cards_.host();
  const bool in_place = reads_rows_in_place(card.stream(), cards_.options(), host);
  // A batch's rows (or addresses) land in one of the card's pinned batch buffers (kept from pass
  // to pass, left uninitialised: the gather writes every float, row_addresses every address),
  // reused once its push is done. Only as many as the pass has batches are made, each of a whole
  // batch even when the write-back is smaller (a sync() before a save, a short first pass): sized
  // to it, a later larger write-back would free and make each again (cudaFreeHost waits for the
  // whole device).
  const std::size_t slots = std::min(in_flight + 1, (count + batch - 1) / batch);
  std::vector<BatchSlot> spare = batch_slots(c, slots, batch, in_place);
  // At most in_flight pushes at once (the window) on the pass cards' host-call threads. The
  // window waits for every push in it before it goes, so an error that unwinds this function
  // leaves no push reading a buffer that a later write-back refills.
  CallWindow window(cards_.host_calls(), in_flight);
  std::deque<BatchSlot> pushing;  // the buffers of the pushes in the window, oldest first
  Status st;
  // Waits for the oldest push; keeps the first error.
  auto retire = [&] {
    const Status pushed = window.retire();  // rethrows what the push threw
    if (!pushed.ok() && st.ok()) st = pushed;
    spare.push_back(pushing.front());
    pushing.pop_front();
  };
  std::size_t parts = 0;  // gathered: of the write-back so far (gather_batch)
  try {
    for (std::size_t b = 0; b < count && st.ok(); b += batch) {
      const std::size_t n = std::min(count, b + batch) - b;
      if (window.full()) retire();
      Timer ready;
      const BatchSlot slot = spare.back();
      spare.pop_back();
      if (in_place) {
        // The rows stay where they are: nothing writes them before the window's last push
        // (clear_dirty runs after it), and the pushes read them from the host-call threads.
        store.row_addresses(d_rows.data() + b, n, slot.addresses, card.stream());
        card.stream().synchronize();
        window.submit(
            [&host, keys, b, n, slot] { return host.push_at(keys + b, n, slot.addresses); });
      } else {
        gather_batch(c, d_rows.data() + b, n, slot.rows, &parts);
        window.submit([&host, keys, b, n, slot] { return host.push(keys + b, n, slot.rows); });
      }
      *gather_seconds += ready.seconds();
      pushing.push_back(slot);
    }
  } catch (...) {
    // No copy stays queued reading the staging page (freed on the card's stream, which does not
    // wait for the copy stream) or writing a batch buffer (the window's pushes are waited for
    // after this). The error that unwinds is the one to report.
    try {
      card.copy_stream().synchronize();
    } catch (...) {
      // a failing card: the error already unwinding says more
    }
    throw;
  }
  while (!window.empty()) retire();
  return st;
}

std::vector<PassBoundary::BatchSlot> PassBoundary::batch_slots(int c, std::size_t slots,
                                                               std::size_t batch, bool in_place) {
  WriteBackBuffers& buffers = write_back_buffers_[c];
  std::vector<BatchSlot> made(slots);
  // The first `slots` of `kept` (made on first use), `count` elements each, into each slot's
  // `field`: rows or addresses.
  const auto reserve = [&](auto& kept, std::size_t count, auto field) {
    if (kept.size() < slots) kept.resize(slots);
    for (std::size_t i = 0; i < slots; ++i) {
      made[i].*field = reserve_pinned(kept[i], count, /*grow=*/false);
    }
  };
  if (in_place) {
    reserve(buffers.addresses, batch, &BatchSlot::addresses);
  } else {
    reserve(buffers.batches, batch * cards_.stride(), &BatchSlot::rows);
  }
  return made;
}

void PassBoundary::gather_batch(int c, const row_index_t* d_rows, std::size_t n, float* rows,
                                std::size_t* parts) {
  const card_table::CardSparseStore& store = cards_.store(c);
  device::Card& card = cards_.card(c);
  const std::size_t stride = cards_.stride();
  // A batch is gathered and copied a staging half at a time (half a page, at most kKeptRows
  // rows: gather_part), the halves in turn: the card gathers one while the other is copied off
  // it. Not staged (cpu, gathered: reads_rows_in_place false; stages_rows), a part is half a page
  // as before the staging was bounded: the gather writes the pinned batch itself, and in parts of
  // 2048 rows the gathers of a cpu write-back of 400k rows of 14 floats took about 45 ms instead
  // of 22-33 (medians of 12 on a loaded 2-core machine; the whole end_pass 81-90 ms instead of
  // 76-83).
  const std::size_t halves = staging_halves(store.page_rows());
  const std::size_t part = stages_rows(card.stream())
                               ? staging_rows(store.page_rows())
                               : std::max<std::size_t>(1, store.page_rows() / halves);
  for (std::size_t p = 0; p < n; p += part, ++*parts) {
    gather_part(c, d_rows + p, std::min(n, p + part) - p, rows + p * stride, *parts % halves);
  }
  // The batch's last copy waited for its gather, and follows the copies before it on the copy
  // stream: every row is in `rows` before its push reads them.
  card.copy_stream().synchronize();
}

void PassBoundary::gather_part(int c, const row_index_t* d_rows, std::size_t m, float* rows,
                               std::size_t half) {
  const card_table::CardSparseStore& store = cards_.store(c);
  device::Card& card = cards_.card(c);
  const device::Stream& stream = card.stream();
  const device::Stream& copy_stream = card.copy_stream();
  WriteBackBuffers& buffers = write_back_buffers_[c];
  // The half is written again only once its last copy off the card has completed (the card
  // orders it; a half never copied yet, or last copied by an earlier write-back, passes).
  stream.wait(buffers.copied[half]);
  // Not staged (cpu, stages_rows): the gather writes `rows` itself; the events and waits stay, so
  // both backends count the same structure (a part each; cpu's parts are half a page, push_rows).
  const bool staging = stages_rows(stream);
  const std::size_t stride = cards_.stride();
  float* gathered =
      staging ? cards_.kept(c).staged.data() + half * staging_rows(store.page_rows()) * stride
              : rows;
  store.gather_rows(d_rows, m, gathered, stream);
  buffers.gathered[half].record(stream);
  // The copy stream takes the half once gathered, while the card's stream gathers the other.
  copy_stream.wait(buffers.gathered[half]);
  if (staging) device::copy_async(rows, gathered, m * stride, copy_stream);
  buffers.copied[half].record(copy_stream);
}

PassBoundary::WriteBackBuffers& PassBoundary::buffers(int c) {
  WriteBackBuffers& buffers = write_back_buffers_[static_cast<std::size_t>(c)];
  if (buffers.made) return buffers;
  device::Card& card = cards_.card(c);
  const device::Stream& stream = card.stream();
  for (int half = 0; half < 2; ++half) {
    buffers.gathered.emplace_back(card.device(), stream.counters());
    buffers.copied.emplace_back(card.device(), card.copy_stream().counters());
  }
  buffers.made = true;
  return buffers;
}

std::size_t PassBoundary::WriteBackBuffers::pinned_bytes() const {
  std::size_t bytes = keys.size() * sizeof(uint64_t) + rows.size() * sizeof(row_index_t) +
                      keep.size() * sizeof(uint64_t) + found.size() * sizeof(row_index_t);
  for (const device::pinned_buffer<float>& batch : batches) bytes += batch.size() * sizeof(float);
  for (const device::pinned_buffer<const float*>& batch : addresses) {
    bytes += batch.size() * sizeof(const float*);
  }
  return bytes;
}

}  // namespace gpubox::pass
