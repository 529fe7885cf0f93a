// The PS modes' half of the trainers' agreement on their job (trainer/schedule/job_settings.hpp):
// the trainers of a PS job never talk to each other, so they compare through the first server's
// dense table kSettingsTable, at the job's first start (PsTrainer::start_job):
//   {per trainer: a claim count and its settings' digest (3 floats of 24 bits), then trainer 0's
//    settings as text, 3 bytes a float}.
// Trainer 0 writes it in the start's part (zeroed claims, its text); after the start's meeting each
// trainer adds its claim and digest to its own slot; after a second meeting every trainer reads
// the table and stops, naming what it found, when an id was claimed by no trainer or by several
// (two trainers started with one PADDLE_TRAINER_ID: one share of the files trained twice, another
// never) or a trainer's digest is not trainer 0's (the trainer that differs names the keys and both
// values; the others name it). Without it, trainers of another mode (async beside geo), slot order,
// dense transform or learning rate trained one job with exit 0.
#pragma once

#include <functional>
#include <string>

#include "common/status.hpp"
#include "table/server/remote_host_tier.hpp"
#include "trainer/schedule/job_settings.hpp"

namespace gpubox::trainer::ps_modes {

inline constexpr const char* kSettingsTable = "ps_job_settings";

// Trainer 0, in the start's part: the table for `trainers`, claims zeroed, its own settings.
Status write_settings_table(table::server::RemoteHostTier& servers, int trainers,
                            const JobSettings& mine);

// Every trainer (id `me` of `trainers`), after the start's meeting: adds its claim, meets the
// others
// (`meet(name, what)`), reads the table and throws as above.
void check_settings(table::server::RemoteHostTier& servers, int me, int trainers,
                    const JobSettings& mine,
                    const std::function<void(const std::string&, const std::string&)>& meet);

}  // namespace gpubox::trainer::ps_modes
