// Device-wide sort and scan with temporary storage sized once (issue 31, item 5): CUB on CUDA
// (cub::DeviceRadixSort, cub::DeviceScan), a portable twin with the same contract on the cpu
// backend, so HeterComm's step is written once.
//
//   PairSorter<V>   stable sort of (WideKey, V) pairs by the key's bits [0, 64 + high_bits):
//                   `high` above `low`, ties keep their input order.
//   Scanner<T>      out[i] = value_at(0) + ... + value_at(i) for a GPUBOX_HD functor value_at.
//
// Temporary storage: reserve(n) sizes it for inputs up to n (the pass's largest batch, before
// the pass's first step). A run over more than the reserved inputs grows it then (a counted card
// allocation, refused while a step graph captures); within the reservation a run allocates
// nothing, waits for nothing and is ordered on the stream, so it can be captured: CUDA records
// CUB's kernels, the cpu backend records the call and runs it at each replay.
//
// Counting: each run counts one launch on the stream's card, as a Thrust call does
// (exec_policy.cuh); on CUDA a radix sort is more than one kernel (CCCL 3.0's dispatch for
// sm_90: one kernel up to a single tile, else 2 memsets, a histogram and an exclusive-sum kernel
// and one memset plus one kernel per 8-bit digit pass), a scan two (tile-state init, scan).
// Not thread-safe: one card thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/error.hpp"
#include "common/macros.hpp"
#include "heterps/device/counters.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/stream.hpp"

#if defined(GPUBOX_BACKEND_CUDA)
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "heterps/device/cuda_check.hpp"
#else
#include <omp.h>
#endif

namespace gpubox::device {

// A sort key of two words: `high` (its high_bits low bits significant) orders before `low`.
// Two full words, no padding: CUB copies whole keys, and padding bytes nobody writes would be
// uninitialised reads to compute-sanitizer's initcheck.
struct WideKey {
  uint64_t low;
  uint64_t high;
};
static_assert(std::has_unique_object_representations_v<WideKey>,
              "WideKey must have no padding (CUB copies whole keys)");

// The high word's significant bits: the sort sees `high & wide_high_mask(high_bits)` only.
GPUBOX_HD inline uint64_t wide_high_mask(int high_bits) {
  return high_bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << high_bits) - 1;
}

// The sort's order over bits [0, 64 + high_bits): high's bits above high_bits are ignored, as
// CUB's end_bit ignores them.
GPUBOX_HD inline bool wide_key_less(const WideKey& a, const WideKey& b, int high_bits) {
  const uint64_t mask = wide_high_mask(high_bits);
  const uint64_t ha = a.high & mask;
  const uint64_t hb = b.high & mask;
  return ha != hb ? ha < hb : a.low < b.low;
}

#if !defined(GPUBOX_BACKEND_CUDA)
// The cpu twin sorts at least this many pairs on the card's OpenMP threads (fewer: in the calling
// thread). Two barriers a digit pass (12 in all): when the card's threads share the cores with
// other cards' and the read-ahead thread (the default: threads_per_card fills the cores), a
// blocked barrier sleeps a time slice, and 106,496 pairs took 71 ms on 2 threads against 6.3 ms
// serial. At ~60 ns a pair that cost is only repaid near a million pairs, so the limit is there,
// far above a step's keys at the shipped batch (13,312 pairs at 512 x 26); no win below it has
// been measured on any machine.
inline constexpr std::size_t kParallelSortLimit = std::size_t{1} << 20;
#endif

#if defined(GPUBOX_BACKEND_CUDA)
// The decomposer overloads of cub::DeviceRadixSort (CCCL 2.1).
static_assert(CUB_VERSION >= 200100, "PairSorter needs CUB 2.1 or later (decomposer sort)");
namespace detail {
// CUB's view of a WideKey: the most significant member first.
struct WideKeyDecomposer {
  __host__ __device__ ::cuda::std::tuple<uint64_t&, uint64_t&> operator()(WideKey& key) const {
    return {key.high, key.low};
  }
};
}  // namespace detail
#endif

template <class V>
class PairSorter {
 public:
  // `memory` and `stream` (the card's) must outlive the sorter. Allocates nothing yet.
  PairSorter(CardMemory& memory, const Stream& stream)
      : temp_(0, memory, stream), stream_(&stream) {}

  // Sizes the temporary storage for runs over up to n pairs (any high_bits up to 32).
  void reserve(std::size_t n) {
    GPUBOX_EXPECTS(n < (std::size_t{1} << 32), "PairSorter: ", n, " pairs exceed 2^32");
    if (n <= reserved_) return;
#if !defined(GPUBOX_BACKEND_CUDA)
    // The cpu twin's digit counts: one row per OpenMP thread of the thread that reserves
    // (omp_get_max_threads there: the card's thread when run() reserves, the controlling
    // thread's setting when that thread calls reserve()); a run on more threads uses this many.
    const int rows = std::max(count_rows_, omp_get_max_threads());
    temp_.resize_discard(temp_bytes(n, rows));
    count_rows_ = rows;  // after the resize: a failed one leaves the tables it sized
#else
    temp_.resize_discard(temp_bytes(n, 32));  // any high_bits up to 32
#endif
    reserved_ = n;
  }

  // keys_out/values_out[0, n) = keys_in/values_in[0, n) stably sorted by (high, low), high taken
  // over its high_bits low bits: bits above them are ignored (keys equal but for them keep their
  // input order) and copied through. Inputs and outputs are card memory and must not overlap.
  // `stream`: the one given at construction (the temporary storage is ordered on it).
  void run(const WideKey* keys_in, WideKey* keys_out, const V* values_in, V* values_out,
           std::size_t n, int high_bits, const Stream& stream) {
    GPUBOX_EXPECTS(high_bits >= 0 && high_bits <= 32, "PairSorter: high_bits ", high_bits,
                   " outside [0, 32]");
    GPUBOX_EXPECTS(&stream == stream_, "PairSorter::run on a stream other than its own");
    if (n == 0) return;
    if (n > reserved_) reserve(n);
    if (CardCounters* counters = stream.counters()) counters->add_launches();
#if defined(GPUBOX_BACKEND_CUDA)
    std::size_t bytes = temp_bytes(n, high_bits);
    if (bytes > temp_.size()) temp_.resize_discard(bytes);  // a type's own query said more
    GPUBOX_CUDA_TRY(cub::DeviceRadixSort::SortPairs(
        temp_.data(), bytes, keys_in, keys_out, values_in, values_out, static_cast<uint32_t>(n),
        detail::WideKeyDecomposer{}, 0, 64 + high_bits, stream.native()));
#else
    // The cpu twin: a stable LSD radix sort in wide_key_less's order through the owned buffer.
    Buffers buffers;
    buffers.a = reinterpret_cast<Entry*>(temp_.data());
    buffers.b = buffers.a + reserved_;
    buffers.counts = reinterpret_cast<uint32_t*>(buffers.b + reserved_);
    buffers.count_rows = count_rows_;
    enqueue(stream, "PairSorter::run", [=] {
      const int threads =
          n < kParallelSortLimit ? 1 : std::min(omp_get_max_threads(), buffers.count_rows);
      if (threads == 1) {
        sort_serial(keys_in, values_in, buffers, n, high_bits, keys_out, values_out);
        return;
      }
#pragma omp parallel num_threads(threads)
      sort_part(keys_in, values_in, buffers, n, high_bits, keys_out, values_out,
                Part{static_cast<std::size_t>(omp_get_thread_num()),
                     static_cast<std::size_t>(omp_get_num_threads())});  // the team it got
    });
#endif
  }

 private:
#if defined(GPUBOX_BACKEND_CUDA)
  static std::size_t temp_bytes(std::size_t n, int high_bits) {
    std::size_t bytes = 0;
    GPUBOX_CUDA_TRY(cub::DeviceRadixSort::SortPairs(
        nullptr, bytes, static_cast<WideKey*>(nullptr), static_cast<WideKey*>(nullptr),
        static_cast<V*>(nullptr), static_cast<V*>(nullptr), static_cast<uint32_t>(n),
        detail::WideKeyDecomposer{}, 0, 64 + high_bits));
    return bytes;
  }
#else
  struct Entry {
    WideKey key;
    V value;
  };
  // The temporary storage: two entry arrays of reserved_, and the digit counts: two tables (a
  // pass's and the next one's) of count_rows rows for sort_part, a row per pass for sort_serial.
  struct Buffers {
    Entry* a;
    Entry* b;
    uint32_t* counts;
    int count_rows;
  };
  // Digits of kDigitBits over the sort's bits [0, 64 + high_bits): the low word first, then the
  // high word's significant bits (a digit may straddle the two).
  static constexpr int kDigitBits = 11;
  static constexpr std::size_t kBuckets = std::size_t{1} << kDigitBits;
  static constexpr int kMaxPasses = (64 + 32 + kDigitBits - 1) / kDigitBits;
  // sort_serial's digits over a packed word (at most 64 bits: at most 6 passes).
  static constexpr int kPackedDigitBits = 12;
  static constexpr std::size_t kSerialCounts =
      std::max<std::size_t>(std::size_t{kMaxPasses} * kBuckets, std::size_t{6} << kPackedDigitBits);

  // Two entry arrays of n, and the count tables: two of `count_rows` rows (sort_part), or a row
  // per pass (sort_serial).
  static std::size_t temp_bytes(std::size_t n, int count_rows) {
    const std::size_t counts =
        std::max(2 * static_cast<std::size_t>(count_rows) * kBuckets, kSerialCounts);
    return 2 * n * sizeof(Entry) + counts * sizeof(uint32_t);
  }
  static std::size_t digit_of(const WideKey& key, int shift, uint64_t high_mask) {
    const uint64_t high = key.high & high_mask;
    uint64_t bits = 0;
    if (shift < 64) {
      bits = key.low >> shift;
      if (shift > 0) bits |= high << (64 - shift);
    } else {
      bits = high >> (shift - 64);
    }
    return static_cast<std::size_t>(bits & (kBuckets - 1));
  }

  // Which part of the sort a thread runs: index t of T parts.
  struct Part {
    std::size_t index;
    std::size_t count;
  };

  // The bits a set of keys differ in, and how sort_serial orders them by those bits: when the low
  // word's (up to its highest differing one) and the high word's significant ones fit one word
  // together, packed into it, the high word's above the low word's (word()); else by the keys'
  // own bits [0, 64 + high_bits) (wide).
  struct Packing {
    uint64_t high_mask = 0;
    uint64_t low_kept = 0;   // the low word's bits up to its highest differing one
    uint64_t high_kept = 0;  // high_mask when the high words differ, else 0
    int low_bits = 0;
    int high_bits = 0;  // the high word's bits up to its highest differing one
    // Over entries[0, n), n > 0.
    static Packing of(const Entry* entries, std::size_t n, uint64_t high_mask) {
      uint64_t low_differs = 0;
      uint64_t high_differs = 0;
      for (std::size_t i = 0; i < n; ++i) {
        low_differs |= entries[i].key.low ^ entries[0].key.low;
        high_differs |= entries[i].key.high ^ entries[0].key.high;
      }
      return from(low_differs, high_differs & high_mask, high_mask);
    }
    static Packing from(uint64_t low_differs, uint64_t high_differs, uint64_t high_mask) {
      Packing packing;
      packing.high_mask = high_mask;
      packing.low_bits = bit_width(low_differs);
      packing.high_bits = bit_width(high_differs);
      packing.low_kept =
          packing.low_bits == 64 ? ~uint64_t{0} : (uint64_t{1} << packing.low_bits) - 1;
      packing.high_kept = high_differs == 0 ? 0 : high_mask;
      return packing;
    }
    bool packed() const { return low_bits + high_bits <= 64; }
    // The bits that order the keys: the highest differing one's position + 1.
    int bits() const { return packed() ? low_bits + high_bits : 64 + high_bits; }
    // The packed word (packed() only). Bits past bits() are every key's same (the high word's
    // above its differing ones), so a digit reaching past them orders nothing differently.
    uint64_t word(const WideKey& key) const {
      const uint64_t high = (key.high & high_kept) << (low_bits & 63);
      return (key.low & low_kept) | (low_bits == 64 ? 0 : high);
    }
    // The `width` bits (0 < width <= bits()) up to the highest differing one: every bit above
    // them is every key's same, so ascending digits are ascending keys.
    std::size_t top_digit(const WideKey& key, int width) const {
      const uint64_t digit_mask = (uint64_t{1} << width) - 1;
      if (packed()) return static_cast<std::size_t>((word(key) >> (bits() - width)) & digit_mask);
      const int shift = 64 + high_bits - width;  // wide: high_bits >= 1, so shift > 0
      const uint64_t high = key.high & high_mask;
      if (shift >= 64) return static_cast<std::size_t>((high >> (shift - 64)) & digit_mask);
      return static_cast<std::size_t>(((high << (64 - shift)) | (key.low >> shift)) & digit_mask);
    }
  };

  // sort_serial's split: inputs of more than kInsertionLimit pairs whose differing bits take
  // more than two passes (a step's 64-bit feasigns: 6) are first split by their top differing
  // bits, up to kSplitBits (about 8 pairs a part), then each part is sorted alone: by insertion
  // up to kInsertionLimit pairs, else by the passes over its own differing bits.
  static constexpr std::size_t kInsertionLimit = 48;
  static constexpr int kSplitBits = 11;

  // The sort on one thread, in wide_key_less's stable order (sort_part's). Only the bits some
  // keys differ in order them (Packing): a step's keys, feasigns under 2^22 with a 2-bit owner,
  // take 2 passes of 12 bits; 64-bit feasigns are split by their top 11 bits first (split_sort).
  static void sort_serial(const WideKey* keys_in, const V* values_in, const Buffers& buffers,
                          std::size_t n, int high_bits, WideKey* keys_out, V* values_out) {
    const uint64_t high_mask = wide_high_mask(high_bits);
    Entry* in = buffers.a;
    uint64_t low_differs = 0;
    uint64_t high_differs = 0;
    for (std::size_t i = 0; i < n; ++i) {
      in[i] = Entry{keys_in[i], values_in[i]};
      low_differs |= keys_in[i].low ^ keys_in[0].low;
      high_differs |= (keys_in[i].high ^ keys_in[0].high) & high_mask;
    }
    if (n <= kInsertionLimit) {
      insertion_sort(in, n, high_bits, keys_out, values_out);
      return;
    }
    const Packing packing = Packing::from(low_differs, high_differs, high_mask);
    const bool many_passes = !packing.packed() || packing.bits() > 2 * kPackedDigitBits;
    if (many_passes && split_sort(buffers, n, high_bits, packing, keys_out, values_out)) return;
    lsd_sort(buffers, n, high_bits, packing, kPackedDigitBits, keys_out, values_out);
  }

  // entries[0, n) into the outputs in stable order (n small: quadratic).
  static void insertion_sort(const Entry* entries, std::size_t n, int high_bits, WideKey* keys_out,
                             V* values_out) {
    for (std::size_t i = 0; i < n; ++i) {
      const Entry entry = entries[i];
      std::size_t j = i;
      for (; j > 0 && wide_key_less(entry.key, keys_out[j - 1], high_bits); --j) {
        keys_out[j] = keys_out[j - 1];
        values_out[j] = values_out[j - 1];
      }
      keys_out[j] = entry.key;
      values_out[j] = entry.value;
    }
  }

  // buffers.a's n entries into the outputs by least significant digit first: packed, in as few
  // passes of up to max_width bits as packing.bits() takes; wide, in digits of kDigitBits.
  static void lsd_sort(const Buffers& buffers, std::size_t n, int high_bits, const Packing& packing,
                       int max_width, WideKey* keys_out, V* values_out) {
    if (!packing.packed()) {
      const uint64_t high_mask = packing.high_mask;
      place_passes(
          buffers, n, (64 + high_bits + kDigitBits - 1) / kDigitBits, kDigitBits,
          [=](const WideKey& key, int shift) { return digit_of(key, shift, high_mask); }, keys_out,
          values_out);
      return;
    }
    const int passes = (packing.bits() + max_width - 1) / max_width;
    const int width = passes == 0 ? 0 : (packing.bits() + passes - 1) / passes;
    place_passes(
        buffers, n, passes, width,
        [=](const WideKey& key, int shift) {
          return static_cast<std::size_t>((packing.word(key) >> shift) &
                                          ((uint64_t{1} << width) - 1));
        },
        keys_out, values_out);
  }

  // buffers.a's n entries split by their top differing bits into buffers.b (stable: parts in
  // ascending order), then each part sorted alone into the outputs at its place. Returns false,
  // having moved nothing, when one part would hold more than half the entries (a hot key or a
  // shared top: the passes over every entry cost no more).
  static bool split_sort(const Buffers& buffers, std::size_t n, int high_bits,
                         const Packing& packing, WideKey* keys_out, V* values_out) {
    const int width = std::min({kSplitBits, packing.bits(), std::max(1, bit_width(n) - 3)});
    const std::size_t parts = std::size_t{1} << width;
    const Entry* in = buffers.a;
    Entry* split = buffers.b;
    std::size_t at[std::size_t{1} << kSplitBits];
    std::fill(at, at + parts, std::size_t{0});
    for (std::size_t i = 0; i < n; ++i) ++at[packing.top_digit(in[i].key, width)];
    std::size_t sum = 0;
    std::size_t largest = 0;
    for (std::size_t d = 0; d < parts; ++d) {
      const std::size_t count = at[d];
      at[d] = sum;
      sum += count;
      largest = std::max(largest, count);
    }
    if (largest > n / 2) return false;
    for (std::size_t i = 0; i < n; ++i) split[at[packing.top_digit(in[i].key, width)]++] = in[i];
    // at[d] is now part d's end; buffers.a is free, each part's scratch at its own place.
    std::size_t begin = 0;
    for (std::size_t d = 0; d < parts; begin = at[d], ++d) {
      const std::size_t size = at[d] - begin;
      if (size <= kInsertionLimit) {
        insertion_sort(split + begin, size, high_bits, keys_out + begin, values_out + begin);
        continue;
      }
      const Buffers part{split + begin, buffers.a + begin, buffers.counts, buffers.count_rows};
      lsd_sort(part, size, high_bits, Packing::of(part.a, size, packing.high_mask),
               std::clamp(bit_width(size), 4, kPackedDigitBits), keys_out + begin,
               values_out + begin);
    }
    return true;
  }

  // Bits up to the highest set one of `x` (0 for 0).
  static int bit_width(uint64_t x) { return x == 0 ? 0 : 64 - __builtin_clzll(x); }

  // sort_serial's passes over buffers.a's n entries: `passes` digits of `width` bits,
  // digit(key, shift) the one at `shift` (= pass * width), counted in one read, placed where they
  // differ, the last placing into the outputs.
  template <class Digit>
  static void place_passes(const Buffers& buffers, std::size_t n, int passes, int width,
                           const Digit& digit, WideKey* keys_out, V* values_out) {
    const std::size_t buckets = std::size_t{1} << width;
    uint32_t* counts = buffers.counts;
    std::fill(counts, counts + static_cast<std::size_t>(passes) * buckets, 0u);
    Entry* in = buffers.a;
    Entry* out = buffers.b;
    for (std::size_t i = 0; i < n; ++i) {
      for (int p = 0; p < passes; ++p) {
        ++counts[static_cast<std::size_t>(p) * buckets + digit(in[i].key, p * width)];
      }
    }
    int placing[kMaxPasses];
    int placings = 0;
    for (int p = 0; p < passes; ++p) {
      const uint32_t* count = counts + static_cast<std::size_t>(p) * buckets;
      if (count[digit(in[0].key, p * width)] != n) placing[placings++] = p;
    }
    for (int k = 0; k < placings; ++k) {
      const int shift = placing[k] * width;
      const uint32_t* count = counts + static_cast<std::size_t>(placing[k]) * buckets;
      std::size_t at[std::size_t{1} << kPackedDigitBits];
      std::size_t sum = 0;
      for (std::size_t d = 0; d < buckets; ++d) {
        at[d] = sum;
        sum += count[d];
      }
      if (k + 1 == placings) {
        for (std::size_t i = 0; i < n; ++i) {
          const std::size_t to = at[digit(in[i].key, shift)]++;
          keys_out[to] = in[i].key;
          values_out[to] = in[i].value;
        }
        return;
      }
      for (std::size_t i = 0; i < n; ++i) out[at[digit(in[i].key, shift)]++] = in[i];
      std::swap(in, out);
    }
    for (std::size_t i = 0; i < n; ++i) {  // every key the same: the input order
      keys_out[i] = in[i].key;
      values_out[i] = in[i].value;
    }
  }

  // One part of the sort, `which` = part t of T: with T > 1 run by every thread of the
  // enclosing OpenMP team (its barriers are the team's); with T == 1 by one thread alone, no
  // barrier (the caller may be inside an unrelated team). Part t owns entries
  // [n t / T, n (t + 1) / T) of each pass's input. Least significant digit first; a pass
  // counts each part's digits, places part t's entries of digit
  // d after every entry of a smaller digit and after parts < t's of digit d, in their order, and
  // is skipped when every key has the same digit there. Each pass is stable, so the result is
  // the stable order by (high & mask, low), what CUB's radix sort gives on CUDA, for any T.
  // Requires n > 0 and T <= buffers.count_rows.
  static void sort_part(const WideKey* keys_in, const V* values_in, const Buffers& buffers,
                        std::size_t n, int high_bits, WideKey* keys_out, V* values_out,
                        Part which) {
    const std::size_t parts = which.count;
    const std::size_t part = which.index;
    const std::size_t begin = n * part / parts;
    const std::size_t end = n * (part + 1) / parts;
    Entry* in = buffers.a;
    Entry* out = buffers.b;
    for (std::size_t i = begin; i < end; ++i) in[i] = Entry{keys_in[i], values_in[i]};
    const uint64_t high_mask = wide_high_mask(high_bits);
    bool odd_pass = false;
    for (int shift = 0; shift < 64 + high_bits; shift += kDigitBits, odd_pass = !odd_pass) {
      // Tables alternate by pass, so that a thread counting the next pass's digits never
      // overwrites counts another thread still reads (no barrier between the two).
      uint32_t* counts =
          buffers.counts + (odd_pass ? static_cast<std::size_t>(buffers.count_rows) * kBuckets : 0);
      uint32_t* mine = counts + part * kBuckets;
      std::fill(mine, mine + kBuckets, 0u);
      for (std::size_t i = begin; i < end; ++i) ++mine[digit_of(in[i].key, shift, high_mask)];
      if (parts > 1) {
#pragma omp barrier
      }
      // Every thread reads every row: the pass is skipped (by all) when every key has in[0]'s
      // digit, else this part's entries of digit d go after every entry of a smaller digit
      // and after the earlier parts' of digit d.
      const std::size_t first_digit = digit_of(in[0].key, shift, high_mask);
      std::size_t first_digit_count = 0;
      for (std::size_t p = 0; p < parts; ++p) {
        first_digit_count += counts[p * kBuckets + first_digit];
      }
      if (first_digit_count == n) continue;  // the same for every thread
      std::size_t at[kBuckets];
      std::size_t sum = 0;
      for (std::size_t d = 0; d < kBuckets; ++d) {
        at[d] = sum;
        for (std::size_t p = 0; p < part; ++p) at[d] += counts[p * kBuckets + d];
        for (std::size_t p = 0; p < parts; ++p) sum += counts[p * kBuckets + d];
      }
      for (std::size_t i = begin; i < end; ++i) {
        out[at[digit_of(in[i].key, shift, high_mask)]++] = in[i];
      }
      std::swap(in, out);
      if (parts > 1) {
#pragma omp barrier
      }
    }
    for (std::size_t i = begin; i < end; ++i) {
      keys_out[i] = in[i].key;
      values_out[i] = in[i].value;
    }
  }
#endif

  device_buffer<char> temp_;
  const Stream* stream_;
  std::size_t reserved_ = 0;
#if !defined(GPUBOX_BACKEND_CUDA)
  int count_rows_ = 1;
#endif
};

template <class T>
class Scanner {
 public:
  Scanner(CardMemory& memory, const Stream& stream) : temp_(0, memory, stream) {}

  // Sizes the temporary storage for scans of up to n values.
  void reserve(std::size_t n) {
    GPUBOX_EXPECTS(n < (std::size_t{1} << 32), "Scanner: ", n, " values exceed 2^32");
    if (n <= reserved_) return;
#if defined(GPUBOX_BACKEND_CUDA)
    temp_.resize_discard(temp_bytes(static_cast<const T*>(nullptr), n));
#endif
    reserved_ = n;
  }

  // out[i] = value_at(0) + ... + value_at(i), i < n (left to right on cpu; CUB's order on CUDA:
  // exact for integer T). value_at: trivially copyable GPUBOX_HD functor, T operator()(size_t).
  template <class ValueAt>
  void inclusive(ValueAt value_at, T* out, std::size_t n, const Stream& stream) {
    if (n == 0) return;
    if (n > reserved_) reserve(n);
    if (CardCounters* counters = stream.counters()) counters->add_launches();
#if defined(GPUBOX_BACKEND_CUDA)
    auto in = thrust::make_transform_iterator(thrust::counting_iterator<std::size_t>(0), value_at);
    std::size_t bytes = temp_bytes(in, n);
    if (bytes > temp_.size()) temp_.resize_discard(bytes);
    GPUBOX_CUDA_TRY(cub::DeviceScan::InclusiveSum(temp_.data(), bytes, in, out,
                                                  static_cast<uint32_t>(n), stream.native()));
#else
    enqueue(stream, "Scanner::inclusive", [=] {
      T sum = T{};
      for (std::size_t i = 0; i < n; ++i) out[i] = sum = sum + value_at(i);
    });
#endif
  }

 private:
#if defined(GPUBOX_BACKEND_CUDA)
  template <class In>
  static std::size_t temp_bytes(In in, std::size_t n) {
    std::size_t bytes = 0;
    GPUBOX_CUDA_TRY(cub::DeviceScan::InclusiveSum(nullptr, bytes, in, static_cast<T*>(nullptr),
                                                  static_cast<uint32_t>(n)));
    return bytes;
  }
#endif

  device_buffer<char> temp_;
  std::size_t reserved_ = 0;
};

}  // namespace gpubox::device
