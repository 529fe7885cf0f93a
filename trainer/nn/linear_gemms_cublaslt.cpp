// cuBLASLt implementation of trainer/nn/linear_gemms.hpp (cuda backend). No test executes this
// file (no GPU on the development machines): it is reviewed line by line against the oneDNN one,
// which the tests check, and every cublasStatus_t is checked.
//
// Row-major to column-major: a row-major [r x c] matrix with row stride ld is, to cuBLASLt, the
// column-major [c x r] matrix with leading dimension ld (its transpose). So, with D = op(A) op(B)
// in cuBLASLt's column-major terms:
//   forward   Y^T [out x B]     = W^T [out x in]   X^T [in x B]         A = W, B = X, both N
//             epilogue RELU_AUX_BIAS (hidden) or BIAS (logit): bias of length out = D's rows;
//             RELU_AUX_BIAS also writes the ReLU bit mask of D, aux ld = out rounded up to 128.
//   weights   dW^T [out x in]   = dZ^T [out x B]   (X^T)^T [B x in]     A = dZ (N), B = X (T)
//             epilogue BGRADA: db = row sums of A over k = B, the batch (length out = D's rows);
//             where cuBLASLt offers no BGRADA algorithm, no epilogue and db^T [out x 1] =
//             dZ^T [out x B] 1 [B x 1], a GEMM of its own (the oneDNN path's ones GEMM).
//   data      dX^T [dxc x B]    = (W^T [out x dxc])^T  dZ^T [out x B]   A = W (T), B = dZ (N)
//             with alpha; epilogue DRELU with the producer's bit mask when the input is a ReLU
//             output (D [in x B] here is the producer's forward D, so the mask lines up).
// W's first dx_cols rows are the first dx_cols columns of its column-major view: same pointer.
//
// Types: A and B in the layer's input type (bf16: tensor cores), D in its output / dx type,
// CUBLAS_COMPUTE_32F with fp32 alpha/beta (accumulation in fp32 either way: no TF32 for fp32
// inputs, so the cuda fp32 path computes what the cpu one does). The bias vector has D's type
// (cuBLASLt's default), so a bf16 Y reads the parameters' bf16 copy of the bias.
//
// Device rules: the workspace is the Blas's, allocated when it was made; the ReLU mask buffer is
// sized by prepare() (before the step's collectives); executing a plan allocates nothing and only
// enqueues on the card's stream. Descriptors and algorithm choices are host objects made by
// prepare() per batch size.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "trainer/nn/detail/gemm_backend.hpp"
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

// One GEMM: its operation descriptor, the layouts of A, B and D (C = D, beta = 0), and the
// algorithm the heuristic chose for them.
struct Gemm {
  cublasLtMatmulDesc_t desc = nullptr;
  Layout a, b, d;
  cublasLtMatmulAlgo_t algo{};
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;

  Gemm() = default;
  Gemm(Gemm&& other) noexcept
      : desc(std::exchange(other.desc, nullptr)),
        a(std::move(other.a)),
        b(std::move(other.b)),
        d(std::move(other.d)),
        algo(other.algo),
        epilogue(other.epilogue) {}
  Gemm& operator=(Gemm&& other) noexcept {
    std::swap(desc, other.desc);
    a = std::move(other.a);
    b = std::move(other.b);
    d = std::move(other.d);
    std::swap(algo, other.algo);
    std::swap(epilogue, other.epilogue);
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
};

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
  const bool wants_bf16 = spec.input == ElementType::kBf16 || spec.output == ElementType::kBf16 ||
                          spec.dx == ElementType::kBf16;
  GPUBOX_EXPECTS(!wants_bf16 || blas.bf16() == Bf16Support::kHardware, "layer ", spec.name,
                 ": bf16 GEMMs asked for on a GPU without bf16 tensor cores (", blas.isa(), ")");
  plans_->mask = blas.card().make_buffer<char>(0);
  plans_->ones = blas.card().make_buffer<char>(0);
  plans_->mask_ld = spec.relu ? mask_ld_bits(spec.out) : 0;
}

LinearGemms::~LinearGemms() = default;
LinearGemms::LinearGemms(LinearGemms&& other) noexcept = default;
LinearGemms& LinearGemms::operator=(LinearGemms&& other) noexcept = default;

namespace {

// Makes `gemm`'s descriptor, layouts and algorithm. Pointer attributes (bias, mask) are set per
// call; the heuristic is told the alignment every call's A, B and D pointers keep (16 bytes:
// each is the start of a card buffer or of a parameter block, blocks start every 16 elements).
// It sees null bias and mask pointers, i.e. assumes them fully aligned: they are a parameter
// block (64 bytes fp32, 32 bytes bf16) and the start of a card buffer.
// Returns false when cuBLASLt has no algorithm for it (the heuristic found none or answered
// CUBLAS_STATUS_NOT_SUPPORTED); other statuses throw.
bool try_make_gemm(Gemm& gemm, Blas::Backend& backend, cublasOperation_t op_a,
                   cublasOperation_t op_b, Layout a, Layout b, Layout d,
                   cublasLtEpilogue_t epilogue, int64_t mask_ld) {
  if (gemm.desc != nullptr) {
    cublasLtMatmulDescDestroy(gemm.desc);
    gemm.desc = nullptr;
  }
  GPUBOX_CUBLAS_TRY(cublasLtMatmulDescCreate(&gemm.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  gemm.set(CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  gemm.set(CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  // A cuBLASLt that does not know the epilogue refuses it here: no algorithm either.
  const cublasStatus_t epilogue_status = cublasLtMatmulDescSetAttribute(
      gemm.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
  if (epilogue_status == CUBLAS_STATUS_INVALID_VALUE ||
      epilogue_status == CUBLAS_STATUS_NOT_SUPPORTED) {
    return false;
  }
  GPUBOX_CUBLAS_TRY(epilogue_status);
  if (mask_ld > 0) gemm.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, mask_ld);
  gemm.a = std::move(a);
  gemm.b = std::move(b);
  gemm.d = std::move(d);
  gemm.epilogue = epilogue;

  cublasLtMatmulPreference_t preference = nullptr;
  GPUBOX_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace = backend.workspace_bytes;
  const uint32_t alignment = 16;
  cublasLtMatmulHeuristicResult_t result{};
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
                                            gemm.d.handle, gemm.d.handle, preference, 1, &result,
                                            &found);
  }
  cublasLtMatmulPreferenceDestroy(preference);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  GPUBOX_CUBLAS_TRY(status);
  if (found == 0) return false;
  gemm.algo = result.algo;
  return true;
}

void make_gemm(Gemm& gemm, Blas::Backend& backend, const std::string& layer, const char* what,
               cublasOperation_t op_a, cublasOperation_t op_b, Layout a, Layout b, Layout d,
               cublasLtEpilogue_t epilogue, int64_t mask_ld) {
  if (!try_make_gemm(gemm, backend, op_a, op_b, std::move(a), std::move(b), std::move(d), epilogue,
                     mask_ld)) {
    GPUBOX_FAIL("layer ", layer, ": cuBLASLt has no algorithm for its ", what,
                " GEMM with epilogue ", epilogue_name(epilogue));
  }
}

void run(const Gemm& gemm, Blas::Backend& backend, const device::Stream& stream, float alpha,
         const void* a, const void* b, void* d) {
  const float beta = 0.0f;
  count_gemm_launch(stream);
  GPUBOX_CUBLAS_TRY(cublasLtMatmul(
      backend.lt, gemm.desc, &alpha, a, gemm.a.handle, b, gemm.b.handle, &beta, d, gemm.d.handle, d,
      gemm.d.handle, &gemm.algo, backend.workspace, backend.workspace_bytes, stream.native()));
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
  make_gemm(plan.forward, backend, s.name, "forward", CUBLAS_OP_N, CUBLAS_OP_N,
            Layout(in, s.out, s.in, s.out), Layout(in, s.in, rows, s.x_ld),
            Layout(cuda_type(s.output), s.out, rows, s.y_ld),
            s.relu ? CUBLASLT_EPILOGUE_RELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS, p.mask_ld);
  // BGRADA is not offered for every type and shape by every cuBLASLt version: without it, the
  // weight gradient runs with no epilogue and db = dZ^T 1 is a GEMM of its own.
  if (!try_make_gemm(plan.weights, backend, CUBLAS_OP_N, CUBLAS_OP_T,
                     Layout(in, s.out, rows, s.dz_ld), Layout(in, s.in, rows, s.x_ld),
                     Layout(CUDA_R_32F, s.out, s.in, s.out), CUBLASLT_EPILOGUE_BGRADA, 0)) {
    make_gemm(plan.weights, backend, s.name, "weight gradient", CUBLAS_OP_N, CUBLAS_OP_T,
              Layout(in, s.out, rows, s.dz_ld), Layout(in, s.in, rows, s.x_ld),
              Layout(CUDA_R_32F, s.out, s.in, s.out), CUBLASLT_EPILOGUE_DEFAULT, 0);
    // The ones' leading dimension rounded up to 8 elements (16 bytes of bf16, the alignment the
    // heuristic is told); with one column only `rows` of them are read.
    const int64_t ones_ld = (rows + 7) / 8 * 8;
    make_gemm(plan.bias, backend, s.name, "bias gradient", CUBLAS_OP_N, CUBLAS_OP_N,
              Layout(in, s.out, rows, s.dz_ld), Layout(in, rows, 1, ones_ld),
              Layout(CUDA_R_32F, s.out, 1, s.out), CUBLASLT_EPILOGUE_DEFAULT, 0);
    if (p.ones_count < ones_ld) fill_ones(p, s.input, ones_ld, blas_->stream());
  }
  if (s.dx_cols > 0) {
    // The mask's leading dimension is the producer's: D [in x B] is its forward D.
    make_gemm(plan.data, backend, s.name, "input gradient", CUBLAS_OP_T, CUBLAS_OP_N,
              Layout(in, s.out, s.dx_cols, s.out), Layout(in, s.out, rows, s.dz_ld),
              Layout(cuda_type(s.dx), s.dx_cols, rows, s.dx_ld),
              s.input_is_relu ? CUBLASLT_EPILOGUE_DRELU : CUBLASLT_EPILOGUE_DEFAULT,
              s.input_is_relu ? mask_ld_bits(s.in) : 0);
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
  const void* bias_ptr = bf16_bias ? static_cast<const void*>(bias_bf16) : bias;
  gemm.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_ptr);
  if (spec_.relu)
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

void LinearGemms::backward_data(const void* dz, const void* w, const void* /*x: oneDNN's*/,
                                const LinearGemms* producer, float alpha, void* dx, int64_t batch) {
  GPUBOX_EXPECTS(!spec_.input_is_relu || producer != nullptr, "layer ", spec_.name,
                 ": the ReLU mask needs the layer that produced the input");
  if (batch == 0 || spec_.dx_cols == 0) return;
  Gemm& gemm = plan_for(*plans_, batch, spec_.name).data;
  if (spec_.input_is_relu) {
    GPUBOX_EXPECTS(producer->spec_.relu && producer->spec_.out == spec_.in, "layer ", spec_.name,
                   ": its producer ", producer->spec_.name, " records no matching ReLU mask");
    gemm.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
             static_cast<const void*>(producer->plans_->mask.data()));
  }
  run(gemm, blas_->backend(), blas_->stream(), alpha, w, dz, dx);
}

std::string LinearGemms::describe(int64_t batch) const {
  const Plans::Plan& plan = plan_for(*plans_, batch, spec_.name);
  std::string line = std::string("forward ") + epilogue_name(plan.forward.epilogue) +
                     ", weight grad " + epilogue_name(plan.weights.epilogue);
  if (plan.weights.epilogue != CUBLASLT_EPILOGUE_BGRADA) line += " + bias GEMM of ones";
  if (spec_.dx_cols > 0) line += std::string(", input grad ") + epilogue_name(plan.data.epilogue);
  line += " (cuBLASLt, " + blas_->isa() + ", " + element_type_name(spec_.input) +
          (spec_.input == ElementType::kBf16 ? " tensor cores)" : ")");
  return line;
}

}  // namespace gpubox::trainer
