#include "trainer/engine/job_agreement.hpp"

#include <unistd.h>

#include <string>
#include <vector>

#include "common/error.hpp"
#include "trainer/schedule/job_settings.hpp"

namespace gpubox::trainer {
namespace {

// What a trainer publishes: its settings (job_settings.hpp), then "who" (host and pid) for the
// others' messages.
constexpr const char* kWho = " who";

std::string key_of(int trainer) { return "job/config/" + std::to_string(trainer); }

std::vector<char> bytes_of(const std::string& text) {
  return std::vector<char>(text.begin(), text.end());
}

JobSettings read_entry(comm::RendezvousStore& store, int trainer,
                       std::chrono::milliseconds timeout) {
  const std::vector<char> bytes = store.get(key_of(trainer), timeout);
  return decode_settings(std::string(bytes.begin(), bytes.end()));
}

std::string who_of(JobSettings* entry) {
  const auto found = entry->find(kWho);
  if (found == entry->end()) return "(unknown)";
  std::string who = found->second;
  entry->erase(found);
  return who;
}

// Throws naming what `mine` (trainer `me`) and `theirs` (trainer `other`) differ in.
void compare(const JobSettings& mine, int me, JobSettings theirs, int other,
             const std::string& store) {
  const std::string who = who_of(&theirs);
  const std::string differences = settings_differences(mine, me, theirs, other);
  if (differences.empty()) return;
  GPUBOX_FAIL("the trainers of this job (", store,
              ") were started with different settings: ", differences, " (trainer ", other, ": ",
              who, "): ", kGiveTheSameSettings);
}

}  // namespace

void agree_on_job(comm::RendezvousStore& store, const TrainerConfig& config, const TrainerEnv& env,
                  int cards_per_trainer, std::chrono::milliseconds timeout) {
  const int me = env.trainer_id;
  const std::string mine_key = key_of(me);
  bool taken = true;
  try {
    store.wait({mine_key}, std::chrono::milliseconds(0));
  } catch (const Error&) {
    taken = false;
  }
  if (taken) {
    JobSettings earlier = read_entry(store, me, std::chrono::milliseconds(0));
    GPUBOX_FAIL("GPUBOX_RENDEZVOUS=", store.describe(), " already holds trainer ", me, "'s entry (",
                mine_key, ", from ", who_of(&earlier),
                "): the folder of an earlier job (give each job a fresh, empty folder), or two "
                "trainers started with PADDLE_TRAINER_ID=",
                me);
  }
  const JobSettings mine = job_settings(config, env, "cards per trainer (FLAGS_selected_gpus)",
                                        cards_per_trainer, /*threads_shape_job=*/false);
  JobSettings published = mine;
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  published[kWho] = std::string(host) + " pid " + std::to_string(::getpid());
  store.set(mine_key, bytes_of(encode_settings(published)));
  const auto read = [&](int trainer) {
    try {
      return read_entry(store, trainer, timeout);
    } catch (const Error& e) {
      GPUBOX_FAIL("trainer ", trainer, " of the job (", env.trainers_from, "=", env.trainers,
                  ") did not arrive within runner.collective_timeout_s (", timeout.count() / 1000.0,
                  " s): ", e.what());
    }
  };
  if (me != 0) {
    compare(mine, me, read(0), 0, store.describe());
    return;
  }
  for (int trainer = 1; trainer < env.trainers; ++trainer) {
    compare(mine, me, read(trainer), trainer, store.describe());
  }
}

}  // namespace gpubox::trainer
