// The config keys a run sets but does not read, said at start (gpubox_train, Python's
// Config.from_yaml): set, they would pass for settings of the run.
#pragma once

#include <string>

namespace gpubox {
namespace config {
class ConfigDocument;
}
namespace trainer {

// gpubox_train's start warning for keys the config sets off their defaults that its
// runner.sync_mode does not read (runner.geo_step outside geo, runner.dense_sync_steps outside
// async and sync, runner.split_file_list in gpubox mode, the card tier's keys in the PS modes):
// kept, not refused (the shipped configs and PaddleRec's carry keys of several modes), but said, so
// that a run is not taken for one under them; runner.train_data_dir set beside runner.pass_dirs,
// which replace it; and keys of another network's parts (cross_layers, head_num, ...) than the one
// the config trains. "" when none.
std::string unread_keys_note(const config::ConfigDocument& doc);

}  // namespace trainer
}  // namespace gpubox
