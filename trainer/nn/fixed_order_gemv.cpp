// Blas::sgemv's kernels on the cpu backend (detail/fixed_order_gemv.hpp: the summation order).
#include "trainer/nn/detail/fixed_order_gemv.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>

namespace gpubox::trainer::detail {
namespace {

constexpr int kLanes = 16;
// 16 floats; + and * act lane by lane, so a sum over vectors keeps each lane's order.
using Lanes = float __attribute__((vector_size(kLanes * sizeof(float))));

// The kernels below are compiled three times, for AVX-512, AVX2+FMA and the baseline, and the
// loader picks the best the machine runs (the build targets the baseline, where oneDNN JITs).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GPUBOX_GEMV_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define GPUBOX_GEMV_CLONES
#endif
// Inlined into each clone, so they run on its instruction set (vectors pass by pointer: a
// 64-byte vector by value has a different ABI per instruction set).
#define GPUBOX_GEMV_INLINE __attribute__((always_inline)) inline

constexpr int64_t kBlock = 256;             // A^T x: outputs per block (16 vectors)
constexpr int64_t kChunkRows = 512;         // A^T x: the fewest rows a range sums alone
constexpr int64_t kMaxPartials = 32;        // A^T x: blocks x ranges summed into partials
constexpr int64_t kTileRows = 64;           // A x: rows per parallel item
constexpr int64_t kParallelWork = 1 << 15;  // fewer multiply-adds run faster on one thread

GPUBOX_GEMV_INLINE void load(Lanes* v, const float* p) { std::memcpy(v, p, sizeof(Lanes)); }
GPUBOX_GEMV_INLINE void splat(Lanes* v, float value) {
  for (int l = 0; l < kLanes; ++l) (*v)[l] = value;
}

// Rows [0, R) of A dotted with x into sums[R]: column c into partial c mod 32 (32 columns at a
// time as two vectors, the last < 32 columns one float at a time), then partial l + 16 into l
// and the 16 folded (l + 8 into l, then l + 4, ...). R rows share each load of x.
template <int R>
GPUBOX_GEMV_INLINE void dot_tile(const float* a, int64_t lda, int64_t cols, const float* x,
                                 float* sums) {
  Lanes lo[R];
  Lanes hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = Lanes{};
  int64_t c = 0;
  for (; c + 2 * kLanes <= cols; c += 2 * kLanes) {
    Lanes x0, x1;
    load(&x0, x + c);
    load(&x1, x + c + kLanes);
    for (int r = 0; r < R; ++r) {
      Lanes a0, a1;
      load(&a0, a + r * lda + c);
      load(&a1, a + r * lda + c + kLanes);
      lo[r] += a0 * x0;
      hi[r] += a1 * x1;
    }
  }
  float partial[R][2 * kLanes];
  for (int r = 0; r < R; ++r) {
    std::memcpy(partial[r], &lo[r], sizeof(Lanes));
    std::memcpy(partial[r] + kLanes, &hi[r], sizeof(Lanes));
  }
  for (int64_t j = 0; c + j < cols; ++j) {
    const float xj = x[c + j];
    for (int r = 0; r < R; ++r) partial[r][j] += a[r * lda + c + j] * xj;
  }
  for (int r = 0; r < R; ++r) {
    float* s = partial[r];
    for (int width = kLanes; width >= 1; width /= 2) {
      for (int l = 0; l < width; ++l) s[l] += s[l + width];
    }
    sums[r] = s[0];
  }
}

// Rows of fewer than 32 columns, each summed in ascending column order, eight rows at a time
// (eight independent sums: 32 partials and their fold would cost more than the row).
GPUBOX_GEMV_INLINE void dot_short_rows(const float* a, int64_t lda, int64_t rows, int64_t cols,
                                       const float* x, float* sums) {
  constexpr int64_t kRows = 8;
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) {
    float s[kRows] = {};
    for (int64_t c = 0; c < cols; ++c) {
      const float xc = x[c];
      for (int64_t i = 0; i < kRows; ++i) s[i] += a[(r + i) * lda + c] * xc;
    }
    for (int64_t i = 0; i < kRows; ++i) sums[r + i] = s[i];
  }
  for (; r < rows; ++r) {
    float s = 0.0f;
    for (int64_t c = 0; c < cols; ++c) s += a[r * lda + c] * x[c];
    sums[r] = s;
  }
}

// sums[r] = row r of A (rows <= kTileRows) dotted with x, four rows at a time.
GPUBOX_GEMV_CLONES
void dot_rows(const float* a, int64_t lda, int64_t rows, int64_t cols, const float* x,
              float* sums) {
  if (cols < 2 * kLanes) {
    dot_short_rows(a, lda, rows, cols, x, sums);
    return;
  }
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) dot_tile<4>(a + r * lda, lda, cols, x, sums + r);
  switch (rows - r) {
    case 3:
      dot_tile<3>(a + r * lda, lda, cols, x, sums + r);
      break;
    case 2:
      dot_tile<2>(a + r * lda, lda, cols, x, sums + r);
      break;
    case 1:
      dot_tile<1>(a + r * lda, lda, cols, x, sums + r);
      break;
    default:
      break;
  }
}

// out[0, vectors * kLanes) = the columns' sums over rows [0, rows) times x: even and odd rows in
// their own partials, added at the end. kMaxVectors bounds `vectors`; up to 4 (a constant) the
// partials stay in registers, more (up to kBlock / kLanes) in L1, each row read as one stream.
template <int64_t kMaxVectors>
GPUBOX_GEMV_INLINE void column_sums_vectors(const float* a, int64_t lda, const float* x,
                                            int64_t rows, int64_t vectors, float* out) {
  Lanes even[kMaxVectors];
  Lanes odd[kMaxVectors];
  for (int64_t v = 0; v < vectors; ++v) even[v] = odd[v] = Lanes{};
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) {
    const float* p = a + r * lda;
    Lanes xe, xo;
    splat(&xe, x[r]);
    splat(&xo, x[r + 1]);
    for (int64_t v = 0; v < vectors; ++v) {
      Lanes pe, po;
      load(&pe, p + v * kLanes);
      load(&po, p + lda + v * kLanes);
      even[v] += pe * xe;
      odd[v] += po * xo;
    }
  }
  if (r < rows) {
    Lanes xe;
    splat(&xe, x[r]);
    for (int64_t v = 0; v < vectors; ++v) {
      Lanes pe;
      load(&pe, a + r * lda + v * kLanes);
      even[v] += pe * xe;
    }
  }
  for (int64_t v = 0; v < vectors; ++v) {
    const Lanes both = even[v] + odd[v];
    std::memcpy(out + v * kLanes, &both, sizeof(Lanes));
  }
}

// The same sums, in the same order, for width (< kLanes) columns one float at a time.
GPUBOX_GEMV_INLINE void column_sums_floats(const float* a, int64_t lda, const float* x,
                                           int64_t rows, int64_t width, float* out) {
  float even[kLanes] = {};
  float odd[kLanes] = {};
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) {
    const float* p = a + r * lda;
    const float xe = x[r], xo = x[r + 1];
    for (int64_t c = 0; c < width; ++c) {
      even[c] += p[c] * xe;
      odd[c] += p[lda + c] * xo;
    }
  }
  if (r < rows) {
    for (int64_t c = 0; c < width; ++c) even[c] += a[r * lda + c] * x[r];
  }
  for (int64_t c = 0; c < width; ++c) out[c] = even[c] + odd[c];
}

// out[0, width) (width <= kBlock) = columns [0, width) of A summed over rows [0, rows), times x.
GPUBOX_GEMV_CLONES
void column_sums(const float* a, int64_t lda, const float* x, int64_t rows, int64_t width,
                 float* out) {
  const int64_t vectors = width / kLanes;
  switch (vectors) {
    case 4:
      column_sums_vectors<4>(a, lda, x, rows, 4, out);
      break;
    case 3:
      column_sums_vectors<3>(a, lda, x, rows, 3, out);
      break;
    case 2:
      column_sums_vectors<2>(a, lda, x, rows, 2, out);
      break;
    case 1:
      column_sums_vectors<1>(a, lda, x, rows, 1, out);
      break;
    case 0:
      break;
    default:
      column_sums_vectors<kBlock / kLanes>(a, lda, x, rows, vectors, out);
      break;
  }
  const int64_t done = vectors * kLanes;
  if (done < width) column_sums_floats(a + done, lda, x, rows, width - done, out + done);
}

void store(float* y, float sum, float alpha, float beta) {
  *y = beta == 0.0f ? alpha * sum : alpha * sum + beta * *y;
}

void product(int64_t rows, int64_t cols, float alpha, const float* a, int64_t lda, const float* x,
             float beta, float* y) {
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelWork)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t first = t * kTileRows;
    const int64_t count = std::min(kTileRows, rows - first);
    float sums[kTileRows];
    dot_rows(a + first * lda, lda, count, cols, x, sums);
    for (int64_t i = 0; i < count; ++i) store(y + first + i, sums[i], alpha, beta);
  }
}

void transposed_product(int64_t rows, int64_t cols, float alpha, const float* a, int64_t lda,
                        const float* x, float beta, float* y) {
  const int64_t blocks = (cols + kBlock - 1) / kBlock;
  const int64_t chunks = transposed_row_chunks(rows, cols);
  // Used when chunks > 1, which bounds blocks x chunks by kMaxPartials.
  float partials[kMaxPartials * kBlock];
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelWork)
  for (int64_t item = 0; item < blocks * chunks; ++item) {
    const int64_t block = item / chunks, chunk = item % chunks;
    const int64_t first = block * kBlock;
    const int64_t width = std::min(kBlock, cols - first);
    const int64_t begin = chunk * rows / chunks, end = (chunk + 1) * rows / chunks;
    float sums[kBlock];
    float* out = chunks == 1 ? sums : partials + item * kBlock;
    column_sums(a + begin * lda + first, lda, x + begin, end - begin, width, out);
    if (chunks > 1) continue;
    for (int64_t c = 0; c < width; ++c) store(y + first + c, sums[c], alpha, beta);
  }
  if (chunks == 1) return;
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t first = block * kBlock;
    const float* block_partials = partials + block * chunks * kBlock;
    for (int64_t c = 0; c < std::min(kBlock, cols - first); ++c) {
      float sum = block_partials[c];
      for (int64_t chunk = 1; chunk < chunks; ++chunk) sum += block_partials[chunk * kBlock + c];
      store(y + first + c, sum, alpha, beta);
    }
  }
}

}  // namespace

int64_t transposed_row_chunks(int64_t rows, int64_t cols) {
  const int64_t blocks = (cols + kBlock - 1) / kBlock;
  return std::max<int64_t>(1, std::min(rows / kChunkRows, kMaxPartials / blocks));
}

void fixed_order_sgemv(bool trans, int64_t rows, int64_t cols, float alpha, const float* a,
                       int64_t lda, const float* x, float beta, float* y) {
  if (trans) {
    transposed_product(rows, cols, alpha, a, lda, x, beta, y);
  } else {
    product(rows, cols, alpha, a, lda, x, beta, y);
  }
}

}  // namespace gpubox::trainer::detail
