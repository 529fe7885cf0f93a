#include "trainer/config/unread_keys.hpp"

#include <algorithm>
#include <vector>

#include "common/config/config_document.hpp"
#include "common/config/config_enums.hpp"
#include "common/enum_names.hpp"

namespace gpubox::trainer {

std::string unread_keys_note(const config::ConfigDocument& doc) {
  using config::SyncMode;
  struct ModeKey {
    const char* key;
    std::vector<SyncMode> read_in;
    const char* modes;
  };
  static const ModeKey kModeKeys[] = {
      {"runner.geo_step", {SyncMode::kGeo}, "geo"},
      {"runner.dense_sync_steps", {SyncMode::kAsync, SyncMode::kSync}, "async and sync"},
      {"runner.split_file_list",
       {SyncMode::kAsync, SyncMode::kSync, SyncMode::kGeo},
       "async, sync and geo"}};
  const SyncMode mode = doc.get_enum("runner.sync_mode", config::kSyncModeNames);
  std::string keys;
  for (const ModeKey& k : kModeKeys) {
    if (doc.is_default(k.key) ||
        std::find(k.read_in.begin(), k.read_in.end(), mode) != k.read_in.end()) {
      continue;
    }
    keys += std::string(keys.empty() ? "" : "; ") + k.key + " (read in " + k.modes + " mode)";
  }
  std::string note;
  if (!keys.empty()) {
    note = doc.source() + ": set, but not read in runner.sync_mode " +
           name_of(config::kSyncModeNames, mode) + ": " + keys;
  }
  if (!doc.get_string_list("runner.pass_dirs").empty() &&
      !doc.is_default("runner.train_data_dir")) {
    note += std::string(note.empty() ? doc.source() + ": " : "; ") + "runner.train_data_dir (" +
            doc.get_string("runner.train_data_dir") + ") is not read: runner.pass_dirs replaces it";
  }
  return note;
}

}  // namespace gpubox::trainer
