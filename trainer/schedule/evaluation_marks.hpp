// The mark an epoch's evaluation leaves in the save of the epoch's last pass (a job that saves
// and evaluates): a run killed after that save and before the evaluation ended left none, and
// its rerun, which resumes after the save, evaluates the epoch first (the epoch went
// unevaluated, unsaid); a rerun of a job whose last evaluation was cut short resumes from its
// last save for it (SaveLineage::set_marks_evaluations). Several trainers share the saves'
// folder (Schedule::agree_on_start): trainer 0 writes the mark, and the epoch is evaluated again
// when any trainer finds none; a schedule that cannot ask the other trainers
// (Schedule::on_any_trainer) writes none.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "trainer/config/trainer_config.hpp"
#include "trainer/schedule/checkpoint.hpp"
#include "trainer/schedule/schedule.hpp"

namespace gpubox::trainer {

// <model_save_path>/<pass>/.gpubox_evaluated (kEvaluatingMark's: the one of an evaluation
// begun).
std::string evaluated_mark(const RunnerConfig& runner, int64_t pass,
                           const char* name = kEvaluatedMark);

// Writes pass `pass`'s mark of an evaluation begun when `marks`.
void mark_evaluating(const RunnerConfig& runner, bool marks, int64_t pass);

// Writes pass `pass`'s mark when `marks`, and removes the one of its evaluation begun.
void mark_evaluated(const RunnerConfig& runner, bool marks, int64_t pass);

// A run resuming right after an epoch's last save whose evaluation left no mark: that epoch is
// evaluated first (the run before stopped between the save and the evaluation's end), as an
// epoch's end run again (train_passes: a stop or a server failure there is handled as in any).
// Every trainer of the job answers alike (logging it when true); nullopt when the schedule
// cannot ask the others (the run then neither reads nor writes marks).
std::optional<bool> epoch_cut_short(Schedule& schedule, const TrainerConfig& config,
                                    const RunPlan& plan, int64_t first);

}  // namespace gpubox::trainer
