// A Schedule that forwards every call to another (borrowed: it must outlive the wrapper). Test
// schedules that change some calls (a stop before a pass, a server restarted at a save) derive
// from it and override only those, so that the epoch loop drives the real schedule everywhere
// else, and a method added to Schedule is forwarded in one place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "trainer/schedule/schedule.hpp"

namespace gpubox::trainer::testing {

class ForwardingSchedule : public Schedule {
 public:
  explicit ForwardingSchedule(Schedule& inner) : inner_(inner) {}

  const TrainerEnv& env() const override { return inner_.env(); }
  table::HostTier& host_tier() override { return inner_.host_tier(); }
  SaveLineage& lineage() override { return inner_.lineage(); }
  bool prints() const override { return inner_.prints(); }
  int local_cards() const override { return inner_.local_cards(); }
  int64_t passes_done() const override { return inner_.passes_done(); }
  void set_passes_done(int64_t passes) override { inner_.set_passes_done(passes); }
  void agree_on_start(const std::optional<SavePoint>& resume, const std::string& origin) override {
    inner_.agree_on_start(resume, origin);
  }
  void plan_pass_cache(int64_t loads) override { inner_.plan_pass_cache(loads); }
  const dataset::PassDataCache* pass_cache() const override { return inner_.pass_cache(); }
  int64_t step_plans_served() const override { return inner_.step_plans_served(); }
  void begin_run(const RunPlan& plan) override { inner_.begin_run(plan); }
  void end_run() noexcept override { inner_.end_run(); }
  PassReport train_scheduled_pass(const RunPlan& plan, int64_t pass) override {
    return inner_.train_scheduled_pass(plan, pass);
  }
  void set_step_hooks(const StepHooks& hooks) override { inner_.set_step_hooks(hooks); }
  void accumulate_pass_metrics(std::vector<double>* sums) const override {
    inner_.accumulate_pass_metrics(sums);
  }
  std::size_t metric_buckets() const override { return inner_.metric_buckets(); }
  void settle() override { inner_.settle(); }
  EvalResult evaluate(const std::vector<std::string>& files, bool keep_predictions) override {
    return inner_.evaluate(files, keep_predictions);
  }
  void agree_after_evaluation(int64_t pass) override { inner_.agree_after_evaluation(pass); }
  void save(const std::string& dir) override { inner_.save(dir); }
  void shrink(int64_t pass) override { inner_.shrink(pass); }
  void load(const std::string& dir) override { inner_.load(dir); }
  std::optional<int64_t> recover(const Error& error, int64_t pass) override {
    return inner_.recover(error, pass);
  }
  void tell_failure(const std::exception& error) noexcept override { inner_.tell_failure(error); }

 private:
  Schedule& inner_;
};

}  // namespace gpubox::trainer::testing
