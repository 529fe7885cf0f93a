#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/gemm_fallback.hpp"

namespace gpubox::trainer {
namespace {

template <class Y>
struct BiasActivation {
  Y* y;
  int64_t y_ld;
  const float* bias;
  int out;
  bool relu;
  GPUBOX_HD void operator()(std::size_t item) const {
    const int64_t r = static_cast<int64_t>(item) / out;
    const int c = static_cast<int>(static_cast<int64_t>(item) % out);
    Y* at = y + r * y_ld + c;
    const float v = to_float(*at) + bias[c];
    store_as(at, relu && !(v > 0.0f) ? 0.0f : v);
  }
};

template <class Dx, class X>
struct MaskByInput {
  Dx* dx;
  int64_t dx_ld;
  const X* x;
  int64_t x_ld;
  int cols;
  GPUBOX_HD void operator()(std::size_t item) const {
    const int64_t r = static_cast<int64_t>(item) / cols;
    const int c = static_cast<int>(static_cast<int64_t>(item) % cols);
    if (!(to_float(x[r * x_ld + c]) > 0.0f)) store_as(dx + r * dx_ld + c, 0.0f);
  }
};

template <class X>
void mask_typed_x(void* dx, ElementType dx_type, int64_t dx_ld, const X* x, int64_t x_ld,
                  std::size_t n, int cols, const device::Stream& stream) {
  if (dx_type == ElementType::kBf16) {
    device::parallel_for(stream, n,
                         MaskByInput<Bf16, X>{static_cast<Bf16*>(dx), dx_ld, x, x_ld, cols});
  } else {
    device::parallel_for(stream, n,
                         MaskByInput<float, X>{static_cast<float*>(dx), dx_ld, x, x_ld, cols});
  }
}

}  // namespace

int first_usable_algorithm(const std::vector<bool>& passed_check) {
  for (std::size_t i = 0; i < passed_check.size(); ++i) {
    if (passed_check[i]) return static_cast<int>(i);
  }
  return -1;
}

bool log_fallback_once(const std::string& key, const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> logged;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!logged.insert(key).second) return false;
  }
  GPUBOX_LOG(WARNING) << message;
  return true;
}

bool gemm_fallback_forced() {
  const char* value = std::getenv("GPUBOX_FORCE_GEMM_FALLBACK");
  if (value == nullptr || value[0] == '\0' || std::strcmp(value, "0") == 0) return false;
  GPUBOX_EXPECTS(std::strcmp(value, "1") == 0, "GPUBOX_FORCE_GEMM_FALLBACK=", value,
                 ": 1 runs every layer GEMM as a plain cublasGemmEx and element-wise kernels, 0 "
                 "or unset does not");
  log_fallback_once("GPUBOX_FORCE_GEMM_FALLBACK",
                    "GPUBOX_FORCE_GEMM_FALLBACK=1: every layer GEMM runs as a plain cublasGemmEx "
                    "and element-wise kernels (cuBLASLt's fallback path, slower)");
  return true;
}

void add_bias_activation(void* y, ElementType y_type, int64_t y_ld, const float* bias,
                         int64_t batch, int out, bool relu, const device::Stream& stream) {
  if (batch <= 0 || out <= 0) return;
  const auto n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(out);
  if (y_type == ElementType::kBf16) {
    device::parallel_for(stream, n,
                         BiasActivation<Bf16>{static_cast<Bf16*>(y), y_ld, bias, out, relu});
  } else {
    device::parallel_for(stream, n,
                         BiasActivation<float>{static_cast<float*>(y), y_ld, bias, out, relu});
  }
}

void mask_by_relu_input(void* dx, ElementType dx_type, int64_t dx_ld, const void* x,
                        ElementType x_type, int64_t x_ld, int64_t batch, int cols,
                        const device::Stream& stream) {
  if (batch <= 0 || cols <= 0) return;
  const auto n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(cols);
  if (x_type == ElementType::kBf16) {
    mask_typed_x(dx, dx_type, dx_ld, static_cast<const Bf16*>(x), x_ld, n, cols, stream);
  } else {
    mask_typed_x(dx, dx_type, dx_ld, static_cast<const float*>(x), x_ld, n, cols, stream);
  }
}

}  // namespace gpubox::trainer
