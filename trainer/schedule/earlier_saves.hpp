// What a fresh run does with the saves an earlier run left in its runner.model_save_path
// (docs/operations.md, "Durability and resume"). A rerun with fewer passes (5 epochs saved, then
// 2) would leave the earlier run's later saves (2 to 4) beside its own, and whatever takes "the
// last save" there (--mode infer's and export's folder of saves, runner.resume) would take the
// earlier run's pass 4 for this run's result. So a run that ends its job removes, once its last
// save is made, the earlier run's saves of the passes after its own. Until then the folder
// mixes two runs: a resume continues the newest (its model manifest's sequence), and --mode
// infer and export refuse a folder whose saves' sequences go down (saved_models.hpp). A run
// killed, diverged or stopped before its end removes nothing.
// Host-only; called by trainer 0 (the one that saves) while it holds the save folder's lock.
#pragma once

#include <cstdint>
#include <string>

namespace gpubox::trainer {

// Before a run that saves into `save_path` looks for a save to resume (and at its end): deletes
// what an interrupted removal left, the hidden folders it had renamed for deletion, each only
// when it is a real folder (not a link or a file) holding nothing a save does not write, and
// logs each; others are kept with a warning. Nothing is deleted when `locked` is false (the
// folder's lock is not held).
void delete_removal_leftovers(const std::string& save_path, bool locked);

// At the start of a run that saves into `save_path`: throws, naming the folder, the file and
// what to do, when a save the run's end would remove (remove_earlier_saves, run of `passes`
// passes starting from `start_from`) holds a file a save does not write: refused before any
// pass trains rather than after. A folder its end keeps anyway (another pass's manifest, an
// older layout) is not refused.
void check_earlier_saves(const std::string& save_path, const std::string& start_from,
                         int64_t passes);

// At the end of a run whose saves are the folders 0 .. passes-1 of `save_path` (the last of
// them committed): removes every save folder numbered `passes` or more (a save or a save's
// staging copy, `<pass>.tmp`) that is provably an earlier run's save: its entries are all what
// a save writes, its model manifest names the folder's pass and a sequence below this run's last
// save's, and it is neither `start_from` (--load or runner.model_init_path, "" for none,
// compared as a folder however it is spelled) nor a save its delta chain applies onto. Each is
// renamed to a hidden name first (atomic), then deleted. Skipped with a warning when `locked` is
// false (the folder's lock is not held: another run may be saving there). Logs what it removed
// and what it kept.
void remove_earlier_saves(const std::string& save_path, const std::string& start_from,
                          int64_t passes, bool locked);

}  // namespace gpubox::trainer
