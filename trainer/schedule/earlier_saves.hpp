// What a fresh run (not a resume) does with the saves an earlier run left in its
// runner.model_save_path (docs/operations.md, "Durability and resume"): it removes them before
// its first pass, so that the folder never holds saves of two runs. Otherwise a rerun with fewer
// passes (5 epochs saved, then 2) would leave the earlier run's later saves (2 to 4) beside its
// own, and whatever takes "the last save" there (--mode infer's and export's folder of saves,
// runner.resume) would take the earlier run's pass 4 for this run's result.
// Host-only; called by trainer 0 (the one that saves) while it holds the save folder's lock.
#pragma once

#include <cstdint>
#include <string>

namespace gpubox::trainer {

// Removes, under `save_path`, every save folder (a numbered folder holding a save or a save's
// staging copy, `<pass>.tmp`) whose entries are all what a save writes (MODEL_MANIFEST, sparse,
// dense and their .tmp staging names), except the save `start_from` (--load or
// runner.model_init_path, "" for none) and the saves its delta chain applies onto. Throws before
// removing anything, naming the folder and what to do, when a save folder holds anything else
// (not provably a save: the user's files are never removed). Logs what it removed. Returns the
// highest sequence among the removed saves' model manifests (0 when none), which the run's saves
// continue after (SaveLineage::continue_after): sequences still order a folder's saves across
// runs.
uint64_t remove_earlier_saves(const std::string& save_path, const std::string& start_from);

}  // namespace gpubox::trainer
