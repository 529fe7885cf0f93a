// oneDNN implementation of trainer/nn/blas.hpp (cpu backend).
//
// Threads: oneDNN is built on the OpenMP runtime (Debian's libdnnl), the pool that parallel_for
// and Thrust use, so a GEMM runs on the calling card thread's OpenMP threads (Card::activate sets
// how many: one per card when several simulated cards share the cores). The OpenBLAS it replaces
// had its own thread pool, which spun against the OpenMP one (blas_cpu.cpp measured 870 against
// 12,100 examples/s) and had to be kept single-threaded per card.
//
// bf16: oneDNN runs bf16 matmuls natively on AVX512-BF16 and AMX (its avx512_core_bf16 and
// avx512_core_amx ISAs); elsewhere it has none worth using (oneDNN 2.6 refuses them on AVX2 and
// emulates them on plain AVX512), so the dense net runs in fp32 there.
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "trainer/nn/blas.hpp"
#include "trainer/nn/detail/fixed_order_gemv.hpp"
#include "trainer/nn/detail/gemm_backend.hpp"

namespace gpubox::trainer {
namespace {

std::string isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "isa " + std::to_string(static_cast<unsigned>(isa));
  }
}

// oneDNN's ISA values are cumulative bit sets: an ISA includes every bit of the ones it extends.
bool has_isa(dnnl::cpu_isa isa, dnnl::cpu_isa wanted) {
  const auto bits = static_cast<unsigned>(wanted);
  return (static_cast<unsigned>(isa) & bits) == bits;
}

void check(dnnl_status_t status, const char* what) {
  if (status != dnnl_success) GPUBOX_FAIL("oneDNN ", what, " failed with status ", status);
}

// cblas-style leading dimensions: oneDNN rejects ld < 1 even for empty matrices.
dnnl_dim_t ld(int64_t v) { return v < 1 ? 1 : v; }

// op(X) [rows x cols] of X stored row-major with row stride ld ([cols x rows] when transposed).
dnnl::memory::desc operand(Transpose t, int64_t rows, int64_t cols, int64_t ld,
                           dnnl::memory::data_type type) {
  using dims = dnnl::memory::dims;
  return t == Transpose::kNo ? dnnl::memory::desc(dims{rows, cols}, type, dims{ld, 1})
                             : dnnl::memory::desc(dims{rows, cols}, type, dims{1, ld});
}

// The entries X (op(X) [rows x cols], stride ld) spans as stored.
std::size_t stored_span(Transpose t, int64_t rows, int64_t cols, int64_t ld) {
  const int64_t stored_rows = t == Transpose::kNo ? rows : cols;
  const int64_t stored_cols = t == Transpose::kNo ? cols : rows;
  return static_cast<std::size_t>((stored_rows - 1) * ld + stored_cols);
}

// X as fp32 into `out` (stored_span entries), same layout: kEmulated's copy of a bf16 operand.
const float* widen(Transpose t, int64_t rows, int64_t cols, int64_t ld, const Bf16* x, float* out) {
  const int64_t stored_rows = t == Transpose::kNo ? rows : cols;
  const int64_t stored_cols = t == Transpose::kNo ? cols : rows;
  for (int64_t i = 0; i < stored_rows; ++i) {
    for (int64_t j = 0; j < stored_cols; ++j) out[i * ld + j] = to_float(x[i * ld + j]);
  }
  return out;
}

int64_t float_bits(float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

constexpr std::size_t kBf16GemmsKept = 256;

// gemm_bf16's primitive for one shape, made on its first call (see Backend::bf16_gemms).
// `capturing`: the call is being captured into a step graph, which may not allocate.
const Blas::Backend::Bf16Gemm& bf16_gemm(Blas::Backend& backend, bool capturing, Transpose ta,
                                         Transpose tb, int64_t m, int64_t n, int64_t k, float alpha,
                                         int64_t lda, int64_t ldb, float beta, int64_t ldc) {
  std::vector<int64_t> key{m,
                           n,
                           k,
                           lda,
                           ldb,
                           ldc,
                           static_cast<int64_t>(ta),
                           static_cast<int64_t>(tb),
                           float_bits(alpha),
                           float_bits(beta)};
  const auto found = backend.bf16_gemms.find(key);
  if (found != backend.bf16_gemms.end()) return found->second;
  // Shapes follow the batch sizes seen (a server's requests vary): past kBf16GemmsKept the cache
  // starts over (an enqueued call holds its own handle to the primitive).
  if (backend.bf16_gemms.size() >= kBf16GemmsKept) backend.bf16_gemms.clear();
  using type = dnnl::memory::data_type;
  Blas::Backend::Bf16Gemm gemm;
  gemm.a = operand(ta, m, k, lda, type::bf16);
  gemm.b = operand(tb, k, n, ldb, type::bf16);
  gemm.c = operand(Transpose::kNo, m, n, ldc, type::f32);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  run_gemm(backend, [&] {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(gemm.a, gemm.b, gemm.c), attr,
                                    backend.engine);
    gemm.scratch = pd.scratchpad_desc();
    if (backend.scratchpad.size() < gemm.scratch.get_size() && capturing) {
      // A shape first met inside a capture (CrossNet plans no shapes ahead) that needs more than
      // the card's scratchpad holds: oneDNN's own scratchpad, as before user scratchpads.
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::library);
      pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(gemm.a, gemm.b, gemm.c), attr,
                                        backend.engine);
      gemm.scratch = dnnl::memory::desc();
    }
    gemm.primitive = dnnl::matmul(pd);
  });
  // The card's one scratchpad, grown now (an execution reads it as it is then, never allocates).
  const std::size_t scratch = gemm.scratch.get_size();
  if (backend.scratchpad.size() < scratch) backend.scratchpad.resize_discard(scratch);
  return backend.bf16_gemms.emplace(std::move(key), gemm).first->second;
}

}  // namespace

Blas::Blas(device::Card& card) : card_(&card), backend_(std::make_unique<Backend>()) {
  Backend& b = *backend_;
  b.engine = dnnl::engine(dnnl::engine::kind::cpu, 0);
  b.stream = dnnl::stream(b.engine);
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  b.isa = isa_name(isa);
  const char* emulate = std::getenv("GPUBOX_BF16_EMULATION");
  const char* reproducible = std::getenv("GPUBOX_REPRODUCIBLE_GEMMS");
  b.one_thread_gemms = reproducible != nullptr && std::string(reproducible) == "1";
  if (has_isa(isa, dnnl::cpu_isa::avx512_core_bf16)) {
    b.bf16 = Bf16Support::kHardware;
  } else if (emulate != nullptr && std::string(emulate) == "1") {
    b.bf16 = Bf16Support::kEmulated;
  }
  b.scratchpad = card.make_buffer<char>(0);
}

Blas::~Blas() = default;
Blas::Blas(Blas&& other) noexcept = default;
Blas& Blas::operator=(Blas&& other) noexcept = default;

Bf16Support Blas::bf16() const { return backend_->bf16; }
std::string Blas::isa() const { return backend_->isa; }

void Blas::sgemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) const {
  GPUBOX_EXPECTS(m >= 0 && n >= 0 && k >= 0, "sgemm with negative size m=", m, " n=", n, " k=", k);
  if (m == 0 || n == 0) return;
  count_gemm_launch(stream());
  // Now, or at each replay of a step graph capturing the stream (step_graph.hpp).
  const Backend* backend = backend_.get();
  device::enqueue(stream(), "sgemm", [=] {
    if (k == 0) {
      // Empty product: C = beta * C (oneDNN rejects k == 0; beta == 0 also clears a NaN in C).
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j)
          c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
      }
      return;
    }
    run_gemm(*backend, [&] {
      check(
          dnnl_sgemm(trans_a == Transpose::kYes ? 'T' : 'N', trans_b == Transpose::kYes ? 'T' : 'N',
                     m, n, k, alpha, a, ld(lda), b, ld(ldb), beta, c, ld(ldc)),
          "sgemm");
    });
  });
}

void Blas::sgemm_batched(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k,
                         float alpha, const float* a, int64_t lda, int64_t stride_a, const float* b,
                         int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                         int64_t stride_c, int64_t batch) const {
  if (sgemm_batched_trivial(*this, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                            stride_c, batch)) {
    return;
  }
  count_gemm_launch(stream());
  const char ta = trans_a == Transpose::kYes ? 'T' : 'N',
             tb = trans_b == Transpose::kYes ? 'T' : 'N';
  device::enqueue(stream(), "sgemm_batched", [=] {
    // Inside the parallel region oneDNN's sgemm runs on its calling thread alone.
    int failed = 0;  // a failing matrix's status (dnnl_success is 0)
#pragma omp parallel for schedule(static) reduction(max : failed)
    for (int64_t t = 0; t < batch; ++t) {
      const dnnl_status_t one =
          dnnl_sgemm(ta, tb, m, n, k, alpha, a + t * stride_a, ld(lda), b + t * stride_b, ld(ldb),
                     beta, c + t * stride_c, ld(ldc));
      if (one != dnnl_success) failed = static_cast<int>(one);
    }
    check(static_cast<dnnl_status_t>(failed), "sgemm_batched");
  });
}

void Blas::gemm_bf16(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k,
                     float alpha, const Bf16* a, int64_t lda, const Bf16* b, int64_t ldb,
                     float beta, float* c, int64_t ldc) const {
  if (gemm_bf16_trivial(*this, trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, c, ldc)) return;
  Backend* backend = backend_.get();
  if (backend->bf16 == Bf16Support::kEmulated) {
    // The fp32 copies' buffers grow here, at the call; the work reads them as they are when it
    // runs (a replay after a later call grew them included), so running it never allocates.
    // Host memory, not the card's: a shape first met inside a capture may grow them.
    const std::size_t a_span = stored_span(trans_a, m, k, lda);
    const std::size_t b_span = stored_span(trans_b, k, n, ldb);
    if (backend->emulated_a.size() < a_span) backend->emulated_a.resize(a_span);
    if (backend->emulated_b.size() < b_span) backend->emulated_b.resize(b_span);
    count_gemm_launch(stream());
    device::enqueue(stream(), "gemm_bf16", [=] {
      const float* a32 = widen(trans_a, m, k, lda, a, backend->emulated_a.data());
      const float* b32 = widen(trans_b, k, n, ldb, b, backend->emulated_b.data());
      run_gemm(*backend, [&] {
        check(dnnl_sgemm(trans_a == Transpose::kYes ? 'T' : 'N',
                         trans_b == Transpose::kYes ? 'T' : 'N', m, n, k, alpha, a32, ld(lda), b32,
                         ld(ldb), beta, c, ld(ldc)),
              "gemm_bf16 (emulated)");
      });
    });
    return;
  }
  const Backend::Bf16Gemm gemm = bf16_gemm(*backend, stream().capturing() != nullptr, trans_a,
                                           trans_b, m, n, k, alpha, lda, ldb, beta, ldc);
  count_gemm_launch(stream());
  device::enqueue(stream(), "gemm_bf16", [=] {
    run_gemm(*backend, [&] {
      dnnl::memory ma(gemm.a, backend->engine, const_cast<Bf16*>(a));
      dnnl::memory mb(gemm.b, backend->engine, const_cast<Bf16*>(b));
      dnnl::memory mc(gemm.c, backend->engine, c);
      std::unordered_map<int, dnnl::memory> args{
          {DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
      if (!gemm.scratch.is_zero()) {
        args.emplace(DNNL_ARG_SCRATCHPAD,
                     dnnl::memory(gemm.scratch, backend->engine, backend->scratchpad.data()));
      }
      gemm.primitive.execute(backend->stream, args);
    });
  });
}

void Blas::sgemv(Transpose trans_a, int64_t rows, int64_t cols, float alpha, const float* a,
                 int64_t lda, const float* x, float beta, float* y) const {
  GPUBOX_EXPECTS(rows >= 0 && cols >= 0, "sgemv with negative size rows=", rows, " cols=", cols);
  const int64_t out = trans_a == Transpose::kYes ? cols : rows;
  const int64_t inner = trans_a == Transpose::kYes ? rows : cols;
  if (out == 0) return;
  count_gemm_launch(stream());
  device::enqueue(stream(), "sgemv", [=] {
    if (inner == 0) {
      // Empty product: y = beta * y (written here so that beta == 0 also clears a NaN in y).
      for (int64_t i = 0; i < out; ++i) y[i] = beta == 0.0f ? 0.0f : beta * y[i];
      return;
    }
    detail::fixed_order_sgemv(trans_a == Transpose::kYes, rows, cols, alpha, a, lda, x, beta, y);
  });
}

}  // namespace gpubox::trainer
