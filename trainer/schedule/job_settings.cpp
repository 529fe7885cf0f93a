#include "trainer/schedule/job_settings.hpp"

#include <xxhash.h>

#include <set>
#include <vector>

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
