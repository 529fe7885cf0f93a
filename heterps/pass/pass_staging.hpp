// Staging ahead (PassManager::stage_rows, runner.prefetch_passes): a coming pass's keys split by
// owner card, and the host-tier rows of those no pass between now and its begin_pass touches,
// fetched while the cards train. Why a staged row is exactly what begin_pass would pull:
// pass_manager.hpp. Both steps touch only the host tier and the caller's StagedRows: any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "heterps/pass/pass_cards.hpp"
#include "heterps/pass/pass_types.hpp"

namespace gpubox::pass {

// `keys` split by owner card (with `slots`, as begin_pass splits them) and those to stage (not in
// `exclude`, sorted; Replicated: card 0's only), no rows yet (`fetched` false). Touches nothing
// shared.
StagedRows plan_staging(const PassCards& cards, const std::vector<uint64_t>& keys,
                        const std::vector<int32_t>& slots, const std::vector<uint64_t>& exclude);
// Pulls the rows of staged->keys into staged->rows and sets `fetched`. Writes only rows,
// created, seconds and fetched, so card threads may read the keys meanwhile (StagingProgress).
// Throws gpubox::Error when the host tier fails (`fetched` stays false).
void fetch_staged(const PassCards& cards, StagedRows* staged);

}  // namespace gpubox::pass
