// The identity of a training job: what a save records so that runner.resume continues only an
// interrupted run of the same job (checkpoint.hpp, SaveLineage::find_resume_point). A job is
// its config's keys that shape the result besides the model's (TrainerConfig::job_keys; the
// model's keys are recorded and checked on their own), its trainer count and its training data:
// the pass list's files, by absolute name, size and modification time, in schedule order.
//
// Host-only; reads file metadata, no contents.
#pragma once

#include <map>
#include <string>

#include "trainer/config/trainer_config.hpp"
#include "trainer/schedule/schedule.hpp"

namespace gpubox::trainer {

// Each entry a name and its value as text: the job keys, "trainers" (the job's trainer
// processes: each trains its share of the files), in the gpubox mode "cards" (a trainer's cards,
// `cards`: runner.train_batch_size is per card, so another count is another global batch; a
// resume on two cards of a job of one trained on at twice its batch, unsaid) and "data" = "<n>
// files in <p> passes an epoch, digest <hex>" over the files of `plan`; with at most 1,000
// files, each also as "data_file.<i>" = "<bytes> <modified, s.ns> <absolute name>" (so that a
// refusal names the file that changed). Throws naming a file whose metadata cannot be read.
std::map<std::string, std::string> job_identity(const TrainerConfig& config, const RunPlan& plan,
                                                int trainers, int cards);

// Takes the "data_file.<i>" entries out of both jobs and names the files that differ: added,
// gone, or of another size or time (the first three; the rest counted). "" when either job lists
// none (a save from before the list, or a job of more files than it holds).
std::string data_file_differences(std::map<std::string, std::string>* saved,
                                  std::map<std::string, std::string>* now);

}  // namespace gpubox::trainer
