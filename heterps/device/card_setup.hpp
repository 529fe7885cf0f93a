// What a process and its cards set up before training, and what they give back at pass
// boundaries (issue 31, item 6: the review's hang and late-failure risks on the first GPU runs).
//
//  - CUDA_MODULE_LOADING=EAGER before CUDA initialises. With CUDA 12's default (LAZY) a kernel's
//    module is loaded at its first launch, and loading takes locks and may synchronize the
//    context: our first launches of a step's kernels and cuBLASLt's came right after a collective
//    was enqueued, while the peers' NCCL kernels waited for this card (the pattern that
//    deadlocked other NCCL users). EAGER loads every module when the context is made, once, for
//    our kernels, CUB's and cuBLAS/cuBLASLt's alike. Chosen over a warm-up step between host
//    barriers: that would need a second step path with no collective inside, and would cover
//    only the kernels that one step happens to launch (not an evaluation's, not a smaller last
//    batch's GEMM algorithm). The cost is start-up time and some card memory for the loaded
//    modules, counted in library_reserve_bytes below.
//  - runner.card_memory_mb checked at start against the card's free memory less what NCCL and
//    cuBLAS will still take: a budget that cannot fit fails at once, naming the key, not with
//    an out-of-memory error in a later pass.
//  - The card's memory pool trimmed after pass boundaries (cudaMemPoolTrimTo): a boundary's peak
//    (begin_pass's sorts, the scratch arena's growth) does not stay with the process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.hpp"

namespace gpubox::device {

class Card;

// What prefer_eager_module_loading does for a CUDA_MODULE_LOADING value (null: unset).
enum class ModuleLoading {
  kSetEager,   // unset: set to EAGER
  kKeptEager,  // already EAGER
  kKeptUser,   // the user's other value (LAZY): kept, with a warning naming the risk
};
ModuleLoading module_loading_choice(const char* current);

// CUDA backend: sets CUDA_MODULE_LOADING=EAGER unless the user set it (a user's LAZY is kept and
// warned about). Has effect only before CUDA initialises in the process: binaries call it first
// thing in main (use_passive_cpu_waits does), CardSet::from_list again for library users. cpu
// backend: nothing.
void prefer_eager_module_loading();

// Card memory NCCL and cuBLAS still take after a card's budget was checked: the cuBLAS/cuBLASLt
// workspace (32 MiB) and handles, the modules EAGER loading brings in, and NCCL's peer buffers
// (connected lazily, at the first collective to each peer: 4 MiB NCCL_BUFFSIZE x up to 8 channels
// x 2 directions per peer). Estimates, stated in the error so a user can judge them. 0 on cpu.
std::size_t library_reserve_bytes(int total_cards);

// OK when `budget_mb` (runner.card_memory_mb; <= 0: no budget) fits in `free_bytes` of card
// `card` less `reserve_bytes`; else an InvalidArgument naming the key, the card, the numbers
// and the largest budget that fits.
Status check_card_memory_budget(int64_t budget_mb, std::size_t free_bytes,
                                std::size_t reserve_bytes, int card);

// The memory a card can still take: cudaMemGetInfo's free bytes on CUDA; on cpu the machine's
// available memory (MemAvailable) shared by the process's `local_cards` simulated cards.
std::size_t card_free_bytes(const Card& card, int local_cards);

// After a pass boundary, on the card's thread or the controlling one with the card idle: waits
// for the card's stream, then gives the pool's unused memory above `keep_bytes` back to the
// driver (cudaMemPoolTrimTo). No-op on cpu (its card memory is the process heap).
void trim_card_pool(Card& card, std::size_t keep_bytes);

}  // namespace gpubox::device
