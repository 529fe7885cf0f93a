#include "trainer/schedule/evaluation_marks.hpp"

#include <filesystem>
#include <fstream>

#include "common/logging.hpp"
#include "trainer/schedule/checkpoint.hpp"

namespace gpubox::trainer {

std::string evaluated_mark(const RunnerConfig& runner, int64_t pass, const char* name) {
  return (std::filesystem::path(runner.model_save_path) / std::to_string(pass) / name).string();
}

void mark_evaluating(const RunnerConfig& runner, bool marks, int64_t pass) {
  if (marks) std::ofstream(evaluated_mark(runner, pass, kEvaluatingMark)) << "evaluating\n";
}

void mark_evaluated(const RunnerConfig& runner, bool marks, int64_t pass) {
  if (!marks) return;
  std::ofstream(evaluated_mark(runner, pass)) << "evaluated\n";  // at worst, again
  std::error_code ec;  // left behind, it says no more than the mark beside it
  std::filesystem::remove(evaluated_mark(runner, pass, kEvaluatingMark), ec);
}

std::optional<bool> epoch_cut_short(Schedule& schedule, const TrainerConfig& config,
                                    const RunPlan& plan, int64_t first) {
  // first == plan.total: the job's last save, resumed for its evaluation (find_resume_point).
  const bool unmarked = first > 0 && first <= plan.total && plan.ends_epoch(first - 1) &&
                        !std::filesystem::exists(evaluated_mark(config.runner, first - 1));
  const std::optional<bool> any = schedule.on_any_trainer(
      unmarked, "whether the epoch before the run's first pass was evaluated");
  if (!any.value_or(false)) return any;
  GPUBOX_LOG(INFO) << "epoch " << (first - 1) / plan.per_epoch
                   << ": the run before this one stopped after its last pass's save (pass "
                   << first - 1
                   << ") and before its evaluation ended (the save holds no mark of one): "
                      "evaluating it now (its training line is that run's)";
  return true;
}

}  // namespace gpubox::trainer
