// cuBLASLt implementation of trainer/nn/linear_gemms.hpp (cuda backend). No test executes this
// file (no GPU on the development machines): it is reviewed line by line against the oneDNN one,
// which the tests check, and every cublasStatus_t is checked.
//
// Row-major to column-major: a row-major [r x c] matrix with row stride ld is, to cuBLASLt, the
// column-major [c x r] matrix with leading dimension ld (its transpose). So, with D = op(A) op(B)
// in cuBLASLt's column-major terms:
//   forward   Y^T [out x B]     = W^T [out x in]   X^T [in x B]         A = W, B = X, both N
//             epilogue RELU_AUX_BIAS (hidden) or BIAS (logit): bias of length out = D's rows;
//             RELU_AUX_BIAS also writes the ReLU bit mask of D, aux ld = out rounded up to 128;
//             a hidden output rewritten after the forward (dropout, output_rewritten) RELU_BIAS,
//             no mask: nothing would read it.
//   weights   dW^T [out x in]   = dZ^T [out x B]   (X^T)^T [B x in]     A = dZ (N), B = X (T)
//             epilogue BGRADA: db = row sums of A over k = B, the batch (length out = D's rows);
//             where cuBLASLt offers no BGRADA algorithm, no epilogue and db^T [out x 1] =
//             dZ^T [out x B] 1 [B x 1], a GEMM of its own (the oneDNN path's ones GEMM).
//   data      dX^T [dxc x B]    = (W^T [out x dxc])^T  dZ^T [out x B]   A = W (T), B = dZ (N)
//             with alpha; epilogue DRELU with the producer's bit mask when the input is a ReLU
//             output (D [in x B] here is the producer's forward D, so the mask lines up); a
//             rewritten input (input_rewritten): no epilogue, then the x > 0 mask kernel.
// W's first dx_cols rows are the first dx_cols columns of its column-major view: same pointer.
//
// Types: A and B in the layer's input type (bf16: tensor cores), D in its output / dx type,
// CUBLAS_COMPUTE_32F with fp32 alpha/beta (accumulation in fp32 either way: no TF32 for fp32
// inputs, so the cuda fp32 path computes what the cpu one does). The bias vector has D's type
// (cuBLASLt's default), so a bf16 Y reads the parameters' bf16 copy of the bias.
//
// Fallback (gemm_fallback.hpp): each GEMM takes the first of up to 8 heuristic algorithms that
// passes cublasLtMatmulAlgoCheck; with none, a plain cublasGemmEx of the same shape runs it and
// the element-wise kernels do the epilogue's work (bias and ReLU after the forward; for DRELU
// the mask is taken from the input, x > 0, since a plain forward records none); logged once per
// layer and GEMM. The BGRADA epilogue's own fallback (a GEMM of ones) takes the same path.
// GPUBOX_FORCE_GEMM_FALLBACK=1 sends every GEMM down it (try_make_gemm finds no algorithm).
//
// Device rules: the workspace is the Blas's, allocated when it was made; the ReLU mask buffer is
// sized by prepare() (before the step's collectives); executing a plan allocates nothing and only
// enqueues on the card's stream. Descriptors and algorithm choices are host objects made by
// prepare() per batch size.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "trainer/nn/detail/gemm_backend.hpp"
#include "trainer/nn/gemm_fallback.hpp"
#include "trainer/nn/linear_gemms.hpp"

namespace gpubox::trainer {
namespace {

// Plans kept per layer: the training batch, the last (smaller) batch of a pass, the evaluation
// batch, and one spare.
constexpr std::size_t kPlansKept = 4;

cudaDataType_t cuda_type(ElementType t) {
  return t == ElementType::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
}

// The ReLU bit mask's leading dimension in bits: D's rows rounded up to 128 (cuBLASLt's rule).
int64_t mask_ld_bits(int rows) { return (static_cast<int64_t>(rows) + 127) / 128 * 128; }

// Owners of cuBLASLt's host-side descriptors.
struct Layout {
  cublasLtMatrixLayout_t handle = nullptr;
  Layout() = default;
  Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
    GPUBOX_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&handle, type, static_cast<uint64_t>(rows),
                                                 static_cast<uint64_t>(cols), ld));
  }
  Layout(Layout&& other) noexcept : handle(std::exchange(other.handle, nullptr)) {}
  Layout& operator=(Layout&& other) noexcept {
    std::swap(handle, other.handle);
    return *this;
  }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
  ~Layout() {
    if (handle != nullptr) cublasLtMatrixLayoutDestroy(handle);
  }
};

// A GEMM's operands as cuBLAS sees them (column-major): op(A) [m x k], op(B) [k x n], D [m x n].
struct GemmShape {
  cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  cudaDataType_t a_type = CUDA_R_32F, b_type = CUDA_R_32F, d_type = CUDA_R_32F;
  int64_t a_rows = 0, a_cols = 0, lda = 0;
  int64_t b_rows = 0, b_cols = 0, ldb = 0;
  int64_t m = 0, n = 0, ldd = 0;  // D's rows and columns
  int64_t k() const { return op_a == CUBLAS_OP_N ? a_cols : a_rows; }
};

// One GEMM: its operation descriptor, the layouts of A, B and D (C = D, beta = 0), and the
// algorithm the heuristic chose for them; or, where cuBLASLt has none (`plain`), the plain
// cublasGemmEx of the same shape, its epilogue's work left to the element-wise kernels
// (gemm_fallback.hpp).
struct Gemm {
  cublasLtMatmulDesc_t desc = nullptr;
  Layout a, b, d;
  cublasLtMatmulAlgo_t algo{};
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  GemmShape shape;
  bool plain = false;

  Gemm() = default;
  Gemm(Gemm&& other) noexcept
      : desc(std::exchange(other.desc, nullptr)),
        a(std::move(other.a)),
        b(std::move(other.b)),
        d(std::move(other.d)),
        algo(other.algo),
        epilogue(other.epilogue),
        shape(other.shape),
        plain(other.plain) {}
  Gemm& operator=(Gemm&& other) noexcept {
    std::swap(desc, other.desc);
    a = std::move(other.a);
    b = std::move(other.b);
    d = std::move(other.d);
    std::swap(algo, other.algo);
    std::swap(epilogue, other.epilogue);
    std::swap(shape, other.shape);
    std::swap(plain, other.plain);
    return *this;
  }
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  ~Gemm() {
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }

  template <class T>
  void set(cublasLtMatmulDescAttributes_t attribute, const T& value) {
    GPUBOX_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
  }
};

const char* epilogue_name(cublasLtEpilogue_t epilogue) {
  switch (epilogue) {
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS:
      return "RELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_RELU_BIAS:
      return "RELU_BIAS";
    case CUBLASLT_EPILOGUE_BIAS:
      return "BIAS";
    case CUBLASLT_EPILOGUE_BGRADA:
      return "BGRADA";
    case CUBLASLT_EPILOGUE_DRELU:
      return "DRELU";
    default:
      return "none";
  }
}

}  // namespace

struct LinearGemms::Plans {
  struct Plan {
    int64_t batch = 0;
    Gemm forward, weights, data;
    // db = dZ^T ones, made only when cuBLASLt has no BGRADA algorithm for `weights` (which then
    // runs with no epilogue): the oneDNN path's ones GEMM.
    Gemm bias;
  };
  std::vector<Plan> plans;  // most recently made first
  // `ones_count` ones of the layer's input type for the bias GEMMs (card memory, filled by
  // prepare(), before the step's collectives).
  device::device_buffer<char> ones;
  int64_t ones_count = 0;
  // RELU_AUX_BIAS's bit mask of the last forward: mask_ld bits per batch row (card memory),
  // read by the consumer layer's DRELU.
  device::device_buffer<char> mask;
  int64_t mask_ld = 0;
  // The batch of the last non-empty forward (-1 before one): `mask` holds its rows, which a
  // consumer's backward_data of that batch reads.
  int64_t last_forward_batch = -1;
};

int fast_dx_cols(int wanted, int in) {
  GPUBOX_EXPECTS(wanted >= 0 && wanted <= in, "dX columns ", wanted, " of a layer over ", in);
  return wanted;
}

LinearGemms::LinearGemms(Blas& blas, const LinearGemmSpec& spec)
    : blas_(&blas), spec_(spec), plans_(std::make_unique<Plans>()) {
  GPUBOX_EXPECTS(spec.in > 0 && spec.out > 0 && spec.dx_cols >= 0 && spec.dx_cols <= spec.in,
                 "layer ", spec.name, ": bad shape ", spec.in, " x ", spec.out, ", dx columns ",
                 spec.dx_cols);
  GPUBOX_EXPECTS(spec.x_ld >= spec.in && spec.y_ld >= spec.out && spec.dz_ld >= spec.out &&
                     spec.dx_ld >= spec.dx_cols,
                 "layer ", spec.name, ": a row stride is shorter than its row");
  GPUBOX_EXPECTS(!spec.input_is_relu || spec.dx_cols == spec.in, "layer ", spec.name,
                 ": the ReLU mask covers whole input rows");
  GPUBOX_EXPECTS(!spec.input_rewritten || spec.input_is_relu, "layer ", spec.name,
                 ": a rewritten input is masked as a ReLU output");
  const bool wants_bf16 = spec.input == ElementType::kBf16 || spec.output == ElementType::kBf16 ||
                          spec.dx == ElementType::kBf16;
  GPUBOX_EXPECTS(!wants_bf16 || blas.bf16() == Bf16Support::kHardware, "layer ", spec.name,
                 ": bf16 GEMMs asked for on a GPU without bf16 tensor cores (", blas.isa(), ")");
  plans_->mask = blas.card().make_buffer<char>(0);
  plans_->ones = blas.card().make_buffer<char>(0);
  // A rewritten output's ReLU mask is never read (the consumer masks by its input): none recorded.
  plans_->mask_ld = spec.relu && !spec.output_rewritten ? mask_ld_bits(spec.out) : 0;
}

LinearGemms::~LinearGemms() = default;
LinearGemms::LinearGemms(LinearGemms&& other) noexcept = default;
LinearGemms& LinearGemms::operator=(LinearGemms&& other) noexcept = default;

namespace {

// Heuristic candidates asked for per GEMM: the best first, the others when it fails its check.
constexpr int kCandidates = 8;

// `shape` as cuBLASLt layouts.
Layout layout_a(const GemmShape& g) { return Layout(g.a_type, g.a_rows, g.a_cols, g.lda); }
Layout layout_b(const GemmShape& g) { return Layout(g.b_type, g.b_rows, g.b_cols, g.ldb); }
Layout layout_d(const GemmShape& g) { return Layout(g.d_type, g.m, g.n, g.ldd); }

// The first of up to kCandidates heuristic algorithms for `gemm` (descriptor and layouts set)
// that cublasLtMatmulAlgoCheck accepts, into gemm.algo; its index, or -1 when none.
int choose_algorithm(Gemm& gemm, Blas::Backend& backend) {
  cublasLtMatmulPreference_t preference = nullptr;
  GPUBOX_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace = backend.workspace_bytes;
  const uint32_t alignment = 16;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  for (auto attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment,
                                                    sizeof(alignment));
    }
  }
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulAlgoGetHeuristic(backend.lt, gemm.desc, gemm.a.handle, gemm.b.handle,
                                            gemm.d.handle, gemm.d.handle, preference, kCandidates,
                                            results, &found);
  }
  cublasLtMatmulPreferenceDestroy(preference);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return -1;
  GPUBOX_CUBLAS_TRY(status);
  std::vector<bool> passed(static_cast<std::size_t>(std::max(0, found)), false);
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    cublasLtMatmulHeuristicResult_t check{};
    passed[static_cast<std::size_t>(i)] =
        cublasLtMatmulAlgoCheck(backend.lt, gemm.desc, gemm.a.handle, gemm.b.handle, gemm.d.handle,
                                gemm.d.handle, &results[i].algo, &check) == CUBLAS_STATUS_SUCCESS &&
        check.workspaceSize <= workspace;
  }
  const int chosen = first_usable_algorithm(passed);
  if (chosen >= 0) gemm.algo = results[chosen].algo;
  return chosen;
}

// Makes `gemm`'s descriptor, layouts and algorithm. Pointer attributes (bias, mask) are set per
// call; the heuristic is told the alignment every call's A, B and D pointers keep (16 bytes:
// each is the start of a card buffer or of a parameter block, blocks start every 16 elements).
// It sees null bias and mask pointers, i.e. assumes them fully aligned: they are a parameter
// block (64 bytes fp32, 32 bytes bf16) and the start of a card buffer.
// Returns the chosen candidate's index, or -1 when cuBLASLt has no algorithm for it (the
// heuristic found none that passes its check, or answered CUBLAS_STATUS_NOT_SUPPORTED, or the
// epilogue is unknown to it); other statuses throw.
int try_make_gemm(Gemm& gemm, Blas::Backend& backend, const GemmShape& shape,
                  cublasLtEpilogue_t epilogue, int64_t mask_ld) {
  if (gemm.desc != nullptr) {
    cublasLtMatmulDescDestroy(gemm.desc);
    gemm.desc = nullptr;
  }
  gemm.shape = shape;
  gemm.plain = false;
  // GPUBOX_FORCE_GEMM_FALLBACK=1 (gemm_fallback.hpp): as if cuBLASLt had no algorithm for it.
  if (gemm_fallback_forced()) return -1;
  GPUBOX_CUBLAS_TRY(cublasLtMatmulDescCreate(&gemm.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  gemm.set(CUBLASLT_MATMUL_DESC_TRANSA, shape.op_a);
  gemm.set(CUBLASLT_MATMUL_DESC_TRANSB, shape.op_b);
  // A cuBLASLt that does not know the epilogue refuses it here: no algorithm either.
  const cublasStatus_t epilogue_status = cublasLtMatmulDescSetAttribute(
      gemm.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
  if (epilogue_status == CUBLAS_STATUS_INVALID_VALUE ||
      epilogue_status == CUBLAS_STATUS_NOT_SUPPORTED) {
    return -1;
  }
  GPUBOX_CUBLAS_TRY(epilogue_status);
  if (mask_ld > 0) gemm.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, mask_ld);
  gemm.a = layout_a(shape);
  gemm.b = layout_b(shape);
  gemm.d = layout_d(shape);
  gemm.epilogue = epilogue;
  return choose_algorithm(gemm, backend);
}

// try_make_gemm, and where cuBLASLt has no algorithm, the plain GEMM of the same shape (its
// epilogue left to the caller's element-wise kernels). Both outcomes other than the best
// algorithm are logged once per layer and GEMM.
void make_gemm(Gemm& gemm, Blas::Backend& backend, const std::string& layer, const char* what,
               const GemmShape& shape, cublasLtEpilogue_t epilogue, int64_t mask_ld) {
  const int chosen = try_make_gemm(gemm, backend, shape, epilogue, mask_ld);
  const std::string key = layer + " " + what;
  if (chosen > 0) {
    log_fallback_once(key, "layer " + layer + ": cuBLASLt's first algorithm for its " + what +
                               " GEMM (epilogue " + epilogue_name(epilogue) +
                               ") failed its check; candidate " + std::to_string(chosen) +
                               " runs instead");
  }
  if (chosen >= 0) return;
  gemm.plain = true;
  gemm.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (gemm_fallback_forced()) return;  // logged once for the process, not per layer
  log_fallback_once(key, "layer " + layer + ": cuBLASLt has no algorithm for its " + what +
                             " GEMM with epilogue " + epilogue_name(epilogue) +
                             ": a plain cublasGemmEx and element-wise kernels run it (slower)");
}

// D = alpha * op(A) op(B) with the gemm's shape, by cublasGemmEx (fp32 accumulation, as the
// cuBLASLt descriptors ask): the fallback, and the twin of a fused GEMM whose epilogue cannot
// apply (a DRELU whose producer recorded no mask).
void run_plain(const Gemm& gemm, Blas::Backend& backend, const device::Stream& stream, float alpha,
               const void* a, const void* b, void* d) {
  const GemmShape& g = gemm.shape;
  const float beta = 0.0f;
  const auto as_int = [](int64_t v) { return static_cast<int>(v); };
  count_gemm_launch(stream);
  GPUBOX_CUBLAS_TRY(cublasGemmEx(backend.handle, g.op_a, g.op_b, as_int(g.m), as_int(g.n),
                                 as_int(g.k()), &alpha, a, g.a_type, as_int(g.lda), b, g.b_type,
                                 as_int(g.ldb), &beta, d, g.d_type, as_int(g.ldd),
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void run(const Gemm& gemm, Blas::Backend& backend, const device::Stream& stream, float alpha,
         const void* a, const void* b, void* d) {
  if (gemm.plain) {
    run_plain(gemm, backend, stream, alpha, a, b, d);
    return;
  }
  const float beta = 0.0f;
  count_gemm_launch(stream);
  GPUBOX_CUBLAS_TRY(cublasLtMatmul(
      backend.lt, gemm.desc, &alpha, a, gemm.a.handle, b, gemm.b.handle, &beta, d, gemm.d.handle, d,
      gemm.d.handle, &gemm.algo, backend.workspace, backend.workspace_bytes, stream.native()));
}

GemmShape shape_of(cublasOperation_t op_a, cublasOperation_t op_b, cudaDataType_t a_type,
                   int64_t a_rows, int64_t a_cols, int64_t lda, cudaDataType_t b_type,
                   int64_t b_rows, int64_t b_cols, int64_t ldb, cudaDataType_t d_type, int64_t m,
                   int64_t n, int64_t ldd) {
  GemmShape g;
  g.op_a = op_a;
  g.op_b = op_b;
  g.a_type = a_type;
  g.a_rows = a_rows;
  g.a_cols = a_cols;
  g.lda = lda;
  g.b_type = b_type;
  g.b_rows = b_rows;
  g.b_cols = b_cols;
  g.ldb = ldb;
  g.d_type = d_type;
  g.m = m;
  g.n = n;
  g.ldd = ldd;
  return g;
}

// Makes p.ones hold `count` ones of type `type` (setup time: waits for the copy).
void fill_ones(LinearGemms::Plans& p, ElementType type, int64_t count,
               const device::Stream& stream) {
  const bool bf16 = type == ElementType::kBf16;
  const std::size_t element = bf16 ? sizeof(Bf16) : sizeof(float);
  std::vector<char> host(static_cast<std::size_t>(count) * element);
  for (std::size_t i = 0; i < static_cast<std::size_t>(count); ++i) {
    if (bf16) {
      const Bf16 one = to_bf16(1.0f);
      std::memcpy(host.data() + i * element, &one, element);
    } else {
      const float one = 1.0f;
      std::memcpy(host.data() + i * element, &one, element);
    }
  }
  p.ones.resize_discard(host.size());
  device::copy_async(p.ones.data(), host.data(), host.size(), stream);
  stream.synchronize();
  p.ones_count = count;
}

}  // namespace

void LinearGemms::prepare(int64_t batch) {
  GPUBOX_EXPECTS(batch >= 0, "layer ", spec_.name, ": negative batch ", batch);
  Plans& p = *plans_;
  for (std::size_t i = 0; i < p.plans.size(); ++i) {
    if (p.plans[i].batch == batch) {
      std::rotate(p.plans.begin(), p.plans.begin() + static_cast<std::ptrdiff_t>(i),
                  p.plans.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      return;
    }
  }
  Blas::Backend& backend = blas_->backend();
  device::DeviceGuard guard(backend.device);
  const LinearGemmSpec& s = spec_;
  const int64_t rows = std::max<int64_t>(batch, 1);  // plans for an empty batch are unused
  const cudaDataType_t in = cuda_type(s.input);
  Plans::Plan plan;
  plan.batch = batch;
  const GemmShape forward = shape_of(CUBLAS_OP_N, CUBLAS_OP_N, in, s.out, s.in, s.out, in, s.in,
                                     rows, s.x_ld, cuda_type(s.output), s.out, rows, s.y_ld);
  // A rewritten output (dropout) records no mask: RELU_BIAS, and mask_ld is 0.
  const cublasLtEpilogue_t activation =
      s.output_rewritten ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
  make_gemm(plan.forward, backend, s.name, "forward", forward,
            s.relu ? activation : CUBLASLT_EPILOGUE_BIAS, p.mask_ld);
  // BGRADA is not offered for every type and shape by every cuBLASLt version: without it, the
  // weight gradient runs with no epilogue and db = dZ^T 1 is a GEMM of its own.
  const GemmShape weights = shape_of(CUBLAS_OP_N, CUBLAS_OP_T, in, s.out, rows, s.dz_ld, in, s.in,
                                     rows, s.x_ld, CUDA_R_32F, s.out, s.in, s.out);
  if (try_make_gemm(plan.weights, backend, weights, CUBLASLT_EPILOGUE_BGRADA, 0) < 0) {
    make_gemm(plan.weights, backend, s.name, "weight gradient", weights, CUBLASLT_EPILOGUE_DEFAULT,
              0);
    // The ones' leading dimension rounded up to 8 elements (16 bytes of bf16, the alignment the
    // heuristic is told); with one column only `rows` of them are read.
    const int64_t ones_ld = (rows + 7) / 8 * 8;
    make_gemm(plan.bias, backend, s.name, "bias gradient",
              shape_of(CUBLAS_OP_N, CUBLAS_OP_N, in, s.out, rows, s.dz_ld, in, rows, 1, ones_ld,
                       CUDA_R_32F, s.out, 1, s.out),
              CUBLASLT_EPILOGUE_DEFAULT, 0);
    if (p.ones_count < ones_ld) fill_ones(p, s.input, ones_ld, blas_->stream());
  }
  if (s.dx_cols > 0) {
    // The mask's leading dimension is the producer's: D [in x B] is its forward D. A rewritten
    // input has no recorded mask: no epilogue, and backward_data masks by X > 0 after the GEMM.
    const bool drelu = s.input_is_relu && !s.input_rewritten;
    make_gemm(plan.data, backend, s.name, "input gradient",
              shape_of(CUBLAS_OP_T, CUBLAS_OP_N, in, s.out, s.dx_cols, s.out, in, s.out, rows,
                       s.dz_ld, cuda_type(s.dx), s.dx_cols, rows, s.dx_ld),
              drelu ? CUBLASLT_EPILOGUE_DRELU : CUBLASLT_EPILOGUE_DEFAULT,
              drelu ? mask_ld_bits(s.in) : 0);
  }
  // The mask buffer, sized now (before the step's collectives): mask_ld bits per row.
  const std::size_t mask_bytes = static_cast<std::size_t>(p.mask_ld / 8 * rows);
  if (p.mask.size() < mask_bytes) p.mask.resize_discard(mask_bytes);
  p.plans.insert(p.plans.begin(), std::move(plan));
  if (p.plans.size() > kPlansKept) p.plans.pop_back();
}

namespace {
LinearGemms::Plans::Plan& plan_for(LinearGemms::Plans& p, int64_t batch, const std::string& name) {
  for (auto& plan : p.plans) {
    if (plan.batch == batch) return plan;
  }
  GPUBOX_FAIL("layer ", name, ": no GEMM plan for batch ", batch, " (prepare() it first)");
}
}  // namespace

void LinearGemms::forward(const void* x, const void* w, const float* bias, const Bf16* bias_bf16,
                          void* y, int64_t batch) {
  if (batch == 0) return;
  Plans& p = *plans_;
  Gemm& gemm = plan_for(p, batch, spec_.name).forward;
  const bool bf16_bias = spec_.output == ElementType::kBf16;
  GPUBOX_EXPECTS(!bf16_bias || bias_bf16 != nullptr, "layer ", spec_.name,
                 ": a bf16 output needs the bf16 copy of the bias");
  // Set once the checks passed: a forward that threw has not run (as the oneDNN backend).
  p.last_forward_batch = batch;
  if (gemm.plain) {
    // No mask is recorded: the consumer layer's backward_data masks by its input instead.
    run(gemm, blas_->backend(), blas_->stream(), 1.0f, w, x, y);
    add_bias_activation(y, spec_.output, spec_.y_ld, bias, batch, spec_.out, spec_.relu,
                        blas_->stream());
    return;
  }
  const void* bias_ptr = bf16_bias ? static_cast<const void*>(bias_bf16) : bias;
  gemm.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_ptr);
  if (spec_.relu && !spec_.output_rewritten)
    gemm.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(p.mask.data()));
  run(gemm, blas_->backend(), blas_->stream(), 1.0f, w, x, y);
}

void LinearGemms::backward_weights(const void* x, const void* dz, float* dw, float* db,
                                   int64_t batch) {
  const device::Stream& stream = blas_->stream();
  if (batch == 0) {
    device::memset_bytes_async(dw, 0, sizeof(float) * spec_.in * spec_.out, stream);
    device::memset_bytes_async(db, 0, sizeof(float) * spec_.out, stream);
    return;
  }
  Plans::Plan& plan = plan_for(*plans_, batch, spec_.name);
  if (plan.weights.epilogue == CUBLASLT_EPILOGUE_BGRADA) {
    plan.weights.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<void*>(db));
    run(plan.weights, blas_->backend(), stream, 1.0f, dz, x, dw);
    return;
  }
  run(plan.weights, blas_->backend(), stream, 1.0f, dz, x, dw);
  run(plan.bias, blas_->backend(), stream, 1.0f, dz, plans_->ones.data(), db);
}

void LinearGemms::backward_data(const void* dz, const void* w, const void* x,
                                const LinearGemms* producer, float alpha, void* dx, int64_t batch) {
  GPUBOX_EXPECTS(!spec_.input_is_relu || producer != nullptr, "layer ", spec_.name,
                 ": the ReLU mask needs the layer that produced the input");
  if (batch == 0 || spec_.dx_cols == 0) return;
  Gemm& gemm = plan_for(*plans_, batch, spec_.name).data;
  if (!spec_.input_is_relu) {
    run(gemm, blas_->backend(), blas_->stream(), alpha, w, dz, dx);
    return;
  }
  GPUBOX_EXPECTS(producer->spec_.relu && producer->spec_.out == spec_.in, "layer ", spec_.name,
                 ": its producer ", producer->spec_.name, " records no matching ReLU mask");
  GPUBOX_EXPECTS(producer->plans_->last_forward_batch == batch, "layer ", spec_.name,
                 ": its producer ", producer->spec_.name, " ran no forward of batch ", batch,
                 " before it (its last: ", producer->plans_->last_forward_batch,
                 "): the ReLU mask is that forward's");
  GPUBOX_EXPECTS(producer->spec_.output_rewritten == spec_.input_rewritten, "layer ", spec_.name,
                 ": its producer ", producer->spec_.name,
                 " disagrees on whether its output is rewritten after the forward");
  // DRELU reads the mask the producer's fused forward recorded; where either GEMM fell back to
  // the plain one, or the input was rewritten after its forward (dropout: no mask recorded, the
  // GEMM built without DRELU), the mask comes from the input itself (x > 0, as oneDNN's path
  // does): the GEMM, then the mask kernel.
  const bool recorded = !gemm.plain && !spec_.input_rewritten &&
                        !plan_for(*producer->plans_, batch, producer->spec_.name).forward.plain;
  if (!recorded) {
    if (gemm.epilogue == CUBLASLT_EPILOGUE_DEFAULT) {
      run(gemm, blas_->backend(), blas_->stream(), alpha, w, dz, dx);  // plain or not
    } else {
      run_plain(gemm, blas_->backend(), blas_->stream(), alpha, w, dz, dx);
    }
    mask_by_relu_input(dx, spec_.dx, spec_.dx_ld, x, spec_.input, spec_.x_ld, batch, spec_.dx_cols,
                       blas_->stream());
    return;
  }
  gemm.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
           static_cast<const void*>(producer->plans_->mask.data()));
  run(gemm, blas_->backend(), blas_->stream(), alpha, w, dz, dx);
}

std::string LinearGemms::describe(int64_t batch) const {
  const Plans::Plan& plan = plan_for(*plans_, batch, spec_.name);
  const auto name = [](const Gemm& gemm) {
    return gemm.plain ? std::string("plain GEMM + element-wise") : epilogue_name(gemm.epilogue);
  };
  std::string line = "forward " + name(plan.forward) + ", weight grad " + name(plan.weights);
  if (plan.weights.epilogue != CUBLASLT_EPILOGUE_BGRADA) line += " + bias GEMM of ones";
  if (spec_.dx_cols > 0) {
    // A rewritten input: the GEMM (no epilogue), then the x > 0 mask kernel.
    line += ", input grad " + (spec_.input_rewritten && !plan.data.plain
                                   ? std::string("GEMM + x>0 mask")
                                   : name(plan.data));
  }
  line += " (cuBLASLt, " + blas_->isa() + ", " + element_type_name(spec_.input) +
          (spec_.input == ElementType::kBf16 ? " tensor cores)" : ")");
  return line;
}

}  // namespace gpubox::trainer
