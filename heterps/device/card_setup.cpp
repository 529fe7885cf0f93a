#include "heterps/device/card_setup.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/logging.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/cuda_check.hpp"

namespace gpubox::device {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

#if !defined(GPUBOX_BACKEND_CUDA)
// The kernel's estimate of memory available without swapping (MemAvailable), else free pages.
std::size_t host_available_bytes() {
  if (std::FILE* meminfo = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof(line), meminfo) != nullptr) {
      found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    }
    std::fclose(meminfo);
    if (found) return static_cast<std::size_t>(kib) * 1024;
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page)
                               : 0;
}
#endif

}  // namespace

ModuleLoading module_loading_choice(const char* current) {
  if (current == nullptr || current[0] == '\0') return ModuleLoading::kSetEager;
  return std::strcmp(current, "EAGER") == 0 ? ModuleLoading::kKeptEager : ModuleLoading::kKeptUser;
}

void prefer_eager_module_loading() {
#if defined(GPUBOX_BACKEND_CUDA)
  const char* current = std::getenv("CUDA_MODULE_LOADING");
  switch (module_loading_choice(current)) {
    case ModuleLoading::kSetEager:
      ::setenv("CUDA_MODULE_LOADING", "EAGER", 1);
      break;
    case ModuleLoading::kKeptEager:
      break;
    case ModuleLoading::kKeptUser: {
      static bool warned = false;  // once per process (main's thread, before the cards start)
      if (!warned) {
        warned = true;
        GPUBOX_LOG(WARNING) << "CUDA_MODULE_LOADING=" << current
                            << " kept as set: with lazy loading, the first launch of a kernel "
                               "right after a collective was enqueued can deadlock against the "
                               "peers' NCCL kernels; GPUBox sets EAGER when it is unset";
      }
      break;
    }
  }
#endif
}

std::size_t library_reserve_bytes(int total_cards) {
#if !defined(GPUBOX_BACKEND_CUDA)
  (void)total_cards;
  return 0;  // no NCCL, no cuBLAS
#endif
  const std::size_t peers = total_cards > 1 ? static_cast<std::size_t>(total_cards - 1) : 0;
  const std::size_t blas = 32 * kMiB + 256 * kMiB;  // workspace; handles and loaded modules
  const std::size_t nccl = peers * 2 * 8 * 4 * kMiB + (peers > 0 ? 64 * kMiB : 0);
  return blas + nccl;
}

Status check_card_memory_budget(int64_t budget_mb, std::size_t free_bytes,
                                std::size_t reserve_bytes, int card) {
  if (budget_mb <= 0) return Status::OK();
  const std::size_t usable = free_bytes > reserve_bytes ? free_bytes - reserve_bytes : 0;
  // Compared in MiB: the key goes up to INT64_MAX, whose bytes (from 2^44 MiB on) wrap a size_t.
  if (static_cast<uint64_t>(budget_mb) <= usable / kMiB) return Status::OK();
  return Status::InvalidArgument(
      "runner.card_memory_mb = " + std::to_string(budget_mb) + " does not fit card " +
      std::to_string(card) + ": it has " + std::to_string(free_bytes / kMiB) +
      " MiB free, of which " + std::to_string(reserve_bytes / kMiB) +
      " MiB stay for NCCL's peer buffers and cuBLAS (workspace, handles, kernels); set "
      "runner.card_memory_mb to at most " +
      std::to_string(usable / kMiB) +
      " (the step buffers and the dense model need some of that too)");
}

std::size_t card_free_bytes(const Card& card, int local_cards) {
#if defined(GPUBOX_BACKEND_CUDA)
  (void)local_cards;
  DeviceGuard guard(card.device());
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  GPUBOX_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
#else
  (void)card;
  return host_available_bytes() / static_cast<std::size_t>(local_cards < 1 ? 1 : local_cards);
#endif
}

void trim_card_pool(Card& card, std::size_t keep_bytes) {
#if defined(GPUBOX_BACKEND_CUDA)
  DeviceGuard guard(card.device());
  // Frees enqueued on the stream must have run for their blocks to count as unused.
  detail::synchronize_uncounted(card.stream());
  cudaMemPool_t pool = nullptr;
  GPUBOX_CUDA_TRY(cudaDeviceGetDefaultMemPool(&pool, card.device()));
  GPUBOX_CUDA_TRY(cudaMemPoolTrimTo(pool, keep_bytes));
#else
  (void)card;
  (void)keep_bytes;
#endif
}

}  // namespace gpubox::device
