#include "trainer/schedule/job_settings.hpp"

#include <xxhash.h>

#include <exception>
#include <filesystem>
#include <functional>
#include <set>
#include <system_error>
#include <vector>

#include "common/config/config_enums.hpp"
#include "dataset/memory_source.hpp"
#include "table/io/save_dir.hpp"

namespace gpubox::trainer {
namespace {

// Keys a trainer sets for its own machine (besides places_rows_only's): the in-process table's
// lock shards, where its pipe_command's utilities lie.
bool set_per_machine(const std::string& key) {
  return places_rows_only(key) || key == "runner.host_table_shards" ||
         key == "runner.pipe_utils_path";
}

std::string escaped(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '\\' || c == '\t' || c == '\n') {
      out += '\\';
      out += c == '\t' ? 't' : c == '\n' ? 'n' : '\\';
    } else {
      out += c;
    }
  }
  return out;
}

std::string unescaped(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size()) {
      const char c = text[++i];
      out += c == 't' ? '\t' : c == 'n' ? '\n' : c;
    } else {
      out += text[i];
    }
  }
  return out;
}

// The data every trainer lists and takes its share of (trainer_file_share): the same files, or
// one reads a file another also reads and a file goes unread, unsaid. A file is compared by its
// name and size (the folder's mount point and name may differ between machines, copies differ in
// times; the passes' order is kept); a data set in memory by its rows' digest. "<n> files,
// <bytes> bytes[, <r> rows in memory], digest <hex> (first: <name>)", or why they could not be
// listed (those compare as they fail).
using ListFiles = std::function<std::vector<std::vector<std::string>>()>;

std::string data_listing(const ListFiles& list) {
  std::string text;
  std::size_t files = 0;
  std::size_t rows = 0;
  uint64_t bytes = 0;
  std::string first;
  try {
    for (const auto& pass : list()) {
      for (const std::string& file : pass) {
        std::string entry;
        if (dataset::is_memory_source(file)) {
          const dataset::MemorySource source = dataset::find_memory_source(file);
          rows += source.block->size();
          entry = "in memory " + std::to_string(source.digest);
        } else {
          const std::filesystem::path path(file);
          std::error_code ec;
          const auto size = std::filesystem::file_size(path, ec);
          if (!ec) bytes += size;
          ++files;
          entry = path.filename().string();
          if (first.empty()) first = entry;
          entry += ec ? std::string(" (no size)") : " " + std::to_string(size);
        }
        text += entry + '\n';
      }
      text += "|\n";
    }
  } catch (const std::exception& e) {
    return std::string("(not listed: ") + e.what() + ")";
  }
  return std::to_string(files) + " files, " + std::to_string(bytes) + " bytes" +
         (rows > 0 ? ", " + std::to_string(rows) + " rows in memory" : std::string()) +
         ", digest " + table::io::hex64(XXH3_64bits(text.data(), text.size())) +
         (first.empty() ? std::string() : " (first: " + first + ")");
}

// The data listings a job of several trainers compares, where each reads its share of them: in
// the gpubox mode what it evaluates (a --mode infer or gpubox.evaluate job), else what it trains
// and evaluates each epoch; the PS modes evaluate every file on every trainer, and read every
// training file on every trainer unless runner.split_file_list says (each its own data, as
// PaddleRec's parameter-server workers).
void add_data_listings(const TrainerConfig& config, JobSettings& settings) {
  const RunnerConfig& runner = config.runner;
  const bool gpubox = runner.sync_mode == SyncMode::kGpubox;
  if (config.evaluated_files) {
    if (gpubox) {
      settings["evaluated data files (their name and size)"] = data_listing(
          [&] { return std::vector<std::vector<std::string>>{*config.evaluated_files}; });
    }
    return;
  }
  if (gpubox || runner.split_file_list) {
    settings["training data files (their name and size)"] = data_listing([&] {
      std::vector<std::vector<std::string>> passes;
      // Quiet: the run's own listing warns of what it skips (once, not here again).
      for (const std::string& dir : runner.pass_dirs) {
        passes.push_back(data_files(dir, SkipWarnings::kQuiet));
      }
      if (passes.empty() && !runner.train_data_dir.empty()) {
        passes.push_back(
            data_files(runner.train_data_dir, runner.train_data_dirs, SkipWarnings::kQuiet));
      }
      return passes;
    });
  }
  if (gpubox && !runner.test_data_dir.empty()) {
    settings["test data files (their name and size)"] = data_listing([&] {
      return std::vector<std::vector<std::string>>{
          data_files(runner.test_data_dir, runner.test_data_dirs, SkipWarnings::kQuiet)};
    });
  }
}

std::string value_or_unset(const JobSettings& settings, const std::string& key) {
  const auto found = settings.find(key);
  return found == settings.end() ? "(not set)" : found->second;
}

}  // namespace

JobSettings job_settings(const TrainerConfig& config, const TrainerEnv& env,
                         const std::string& parallelism, int units, bool threads_shape_job) {
  JobSettings settings;
  settings["trainers in the job (PADDLE_TRAINERS_NUM)"] = std::to_string(env.trainers);
  if (!parallelism.empty()) settings[parallelism] = std::to_string(units);
  for (const auto* keys : {&config.model_keys, &config.job_keys}) {
    for (const auto& [key, value] : *keys) {
      if (set_per_machine(key) || (!threads_shape_job && key == "runner.thread_num")) continue;
      settings[key] = value;
    }
  }
  if (env.trainers == 1) return settings;
  // What no result depends on but every trainer must do alike, or one waits alone at a meeting
  // the others never come to (a pass, an evaluation, a save) or gathers another size.
  const RunnerConfig& runner = config.runner;
  settings["passes an epoch (runner.pass_dirs)"] =
      std::to_string(runner.pass_dirs.empty() ? 1 : runner.pass_dirs.size());
  settings["evaluates each epoch (runner.test_data_dir)"] =
      runner.test_data_dir.empty() ? "no" : "yes";
  // The gpubox mode gathers the AUC's buckets across trainers; the PS modes' trainers each their
  // own.
  if (runner.sync_mode == SyncMode::kGpubox) {
    settings["runner.auc_buckets_log2"] = std::to_string(runner.auc_buckets_log2);
  }
  const bool saves = !runner.model_save_path.empty() && runner.save_mode != SaveKind::kNone;
  settings["saves (runner.model_save_path, runner.save_mode)"] =
      saves ? std::string(name_of(config::kSaveKindNames, runner.save_mode)) : "no";
  add_data_listings(config, settings);
  return settings;
}

std::string encode_settings(const JobSettings& settings) {
  std::string text;
  for (const auto& [key, value] : settings) text += escaped(key) + '\t' + escaped(value) + '\n';
  return text;
}

JobSettings decode_settings(const std::string& text) {
  JobSettings settings;
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    const std::size_t tab = line.find('\t');
    if (tab != std::string::npos) {
      settings[unescaped(line.substr(0, tab))] = unescaped(line.substr(tab + 1));
    }
    begin = end + 1;
  }
  return settings;
}

uint64_t settings_digest(const JobSettings& settings) {
  const std::string text = encode_settings(settings);
  return XXH3_64bits(text.data(), text.size());
}

std::string settings_differences(const JobSettings& mine, int me, const JobSettings& theirs,
                                 int other) {
  std::set<std::string> keys;
  for (const auto& [key, value] : mine) keys.insert(key);
  for (const auto& [key, value] : theirs) keys.insert(key);
  std::vector<std::string> differences;
  for (const std::string& key : keys) {
    const std::string a = value_or_unset(mine, key), b = value_or_unset(theirs, key);
    if (a != b) {
      differences.push_back(key + ": trainer " + std::to_string(other) + " has " + b +
                            ", trainer " + std::to_string(me) + " (this one) " + a);
    }
  }
  constexpr std::size_t kNamed = 6;
  std::string named;
  for (std::size_t i = 0; i < differences.size() && i < kNamed; ++i) {
    named += (i == 0 ? "" : "; ") + differences[i];
  }
  if (differences.size() > kNamed) {
    named += "; and " + std::to_string(differences.size() - kNamed) + " more";
  }
  return named;
}

}  // namespace gpubox::trainer
