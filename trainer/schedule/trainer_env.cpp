#include "trainer/schedule/trainer_env.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "common/enum_names.hpp"
#include "common/error.hpp"
#include "common/logging.hpp"
#include "dataset/data_files.hpp"
#include "dataset/memory_source.hpp"

namespace gpubox::trainer {
namespace {

// $paddle, else $gpubox, else `fallback`; `read_from` (when given) names the variable read.
int env_int(const char* paddle, const char* gpubox, int fallback,
            std::string* read_from = nullptr) {
  const char* name = std::getenv(paddle) ? paddle : gpubox;
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  if (read_from != nullptr) *read_from = name;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  GPUBOX_EXPECTS(end != value && *end == '\0', "environment variable ", name, "='", value,
                 "' is not a whole number");
  return static_cast<int>(parsed);
}

bool whole_number(const char* text) {
  return *text != '\0' &&
         std::all_of(text, text + std::strlen(text), [](char c) { return c >= '0' && c <= '9'; });
}

std::string env_string(const char* paddle, const char* gpubox, const std::string& fallback,
                       std::string* read_from = nullptr) {
  for (const char* name : {paddle, gpubox}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') {
      if (read_from != nullptr) *read_from = name;
      return value;
    }
  }
  return fallback;
}

// A cluster launcher's value for a job variable the launcher did not set itself: mpirun's
// (Open MPI) first, then srun's (Slurm), else `fallback`. The launcher only starts processes;
// each learns its place from the variables the launcher gives every rank.
int launcher_int(const char* ompi, const char* slurm, int fallback, std::string* read_from) {
  for (const char* name : {ompi, slurm}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') return env_int(name, name, fallback, read_from);
  }
  return fallback;
}

}  // namespace

TrainerEnv TrainerEnv::from_environment() {
  TrainerEnv env;
  env.selected_cards =
      env_string("FLAGS_selected_gpus", "GPUBOX_SELECTED_GPUS", "0", &env.selected_cards_from);
  env.servers = env_string("PADDLE_PSERVERS_IP_PORT_LIST", "GPUBOX_PSERVERS_IP_PORT_LIST", "");
  std::string id_from = "PADDLE_TRAINER_ID";
  std::string count_from;  // empty: no variable gave the count (1)
  env.trainer_id =
      env_int("PADDLE_TRAINER_ID", "GPUBOX_TRAINER_ID",
              launcher_int("OMPI_COMM_WORLD_RANK", "SLURM_PROCID", 0, &id_from), &id_from);
  // PADDLE_TRAINERS: the count's name in PaddleRec's launch scripts (its fleetrun sets
  // PADDLE_TRAINERS_NUM); a job that sets both with different counts is refused. Paddle's cloud
  // launcher gives the trainers' addresses under that name ("10.0.0.1,10.0.0.2"): not a count,
  // so not read as one.
  std::string paddle_trainers_from;
  const char* listed = std::getenv("PADDLE_TRAINERS");
  // An address list holds ',', '.' or ':', or is one host's name (it starts with a letter:
  // "localhost"); what starts as a number is read as the count, so a typo ("2x", "-2") is refused
  // naming the variable rather than taken as one trainer. Where PADDLE_TRAINERS_NUM gives the
  // count, only a whole number is: a host named "3node" is then the list it is.
  const bool count_given = !env_string("PADDLE_TRAINERS_NUM", "GPUBOX_TRAINERS_NUM", "").empty();
  const bool counted = listed != nullptr && *listed != '\0' &&
                       std::strpbrk(listed, ",.:") == nullptr &&
                       std::isalpha(static_cast<unsigned char>(*listed)) == 0 &&
                       (!count_given || whole_number(listed));
  GPUBOX_EXPECTS(!counted || whole_number(listed), "PADDLE_TRAINERS='", listed,
                 "' is not a whole number: it is read as the job's trainer count, as PaddleRec's "
                 "scripts set it; where it names the trainers' hosts, set PADDLE_TRAINERS_NUM to "
                 "their count");
  const int paddle_trainers =
      counted ? env_int("PADDLE_TRAINERS", "PADDLE_TRAINERS", 0, &paddle_trainers_from) : 0;
  env.trainers = env_int("PADDLE_TRAINERS_NUM", "GPUBOX_TRAINERS_NUM",
                         paddle_trainers_from.empty()
                             ? launcher_int("OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", 1, &count_from)
                             : paddle_trainers,
                         &count_from);
  if (count_from.empty()) count_from = paddle_trainers_from;
  if (!count_from.empty()) env.trainers_from = count_from;
  GPUBOX_EXPECTS(paddle_trainers_from.empty() || paddle_trainers == env.trainers,
                 "PADDLE_TRAINERS=", paddle_trainers, " and ", count_from, "=", env.trainers,
                 " disagree on the trainers in the job: set one");
  const std::string count_text = count_from.empty()
                                     ? std::string("PADDLE_TRAINERS_NUM unset: 1 trainer")
                                     : count_from + "=" + std::to_string(env.trainers);
  GPUBOX_EXPECTS(env.trainers >= 1, count_text, ": a job has at least one trainer");
  GPUBOX_EXPECTS(env.trainer_id >= 0 && env.trainer_id < env.trainers, id_from, "=", env.trainer_id,
                 " is not a trainer of the job: ids run from 0 to ", env.trainers - 1, " (",
                 count_text, ")");
  env.rendezvous = env_string("GPUBOX_RENDEZVOUS", "GPUBOX_RENDEZVOUS", "");
  env.host = env_string("POD_IP", "GPUBOX_POD_IP", "127.0.0.1");
  return env;
}

std::vector<std::string> trainer_file_share(const std::vector<std::string>& files, int trainer_id,
                                            int trainers) {
  GPUBOX_EXPECTS(trainers >= 1 && trainer_id >= 0 && trainer_id < trainers, "trainer id ",
                 trainer_id, " is not in [0, ", trainers, ")");
  if (trainers > 1 && !files.empty() && dataset::is_memory_source(files.front())) {
    // One data set given whole to every trainer (a DataFrame): its rows are what is split.
    std::vector<std::string> shares;
    for (const std::string& name : files) {
      shares.push_back(dataset::memory_source_share(name, trainer_id, trainers));
    }
    return shares;
  }
  const std::size_t n = files.size();
  const auto t = static_cast<std::size_t>(trainer_id);
  const std::size_t base = n / static_cast<std::size_t>(trainers);
  const std::size_t extra = n % static_cast<std::size_t>(trainers);
  const std::size_t begin = t * base + std::min(t, extra);
  const std::size_t end = begin + base + (t < extra ? 1 : 0);
  return std::vector<std::string>(files.begin() + static_cast<std::ptrdiff_t>(begin),
                                  files.begin() + static_cast<std::ptrdiff_t>(end));
}

std::string trainer_metrics_path(const std::string& metrics_path, int trainer_id) {
  if (trainer_id == 0 || metrics_path.empty()) return metrics_path;
  const std::filesystem::path path(metrics_path);
  return (path.parent_path() / (path.stem().string() + ".trainer" + std::to_string(trainer_id) +
                                path.extension().string()))
      .string();
}

namespace {

// A folder's files, with its unexpected skips warned of; a folder with no data file throws.
std::vector<std::string> files_of(const std::string& dir, dataset::DataFileList* listed,
                                  SkipWarnings warnings) {
  const std::string skipped = dataset::skipped_text(dir, listed->unexpected_skips());
  if (!skipped.empty() && warnings == SkipWarnings::kLog) GPUBOX_LOG(WARNING) << skipped;
  const auto listed_before = [](const dataset::SkippedEntry& e) {
    return e.reason == dataset::SkipReason::kSameFile;
  };
  if (listed->files.empty() && !listed->skipped.empty() &&
      std::all_of(listed->skipped.begin(), listed->skipped.end(), listed_before)) {
    const dataset::SkippedEntry& first = listed->skipped.front();
    GPUBOX_FAIL("'", dir, "' in the list of data folders names only files listed before it (",
                first.path, " is ", first.same_as,
                "): each pass would read them twice; leave it out of the list");
  }
  if (listed->files.empty()) {
    GPUBOX_FAIL("data folder '", dir, "' holds no data file",
                listed->skipped.empty() ? "" : "; " + dataset::skipped_text(dir, listed->skipped));
  }
  return std::move(listed->files);
}

}  // namespace

std::vector<std::string> data_files(const std::string& dir, SkipWarnings warnings) {
  if (dataset::is_memory_source(dir)) return {dir};  // an in-memory data set stands for itself
  auto listed = dataset::list_data_files(dir);
  throw_if_error(listed.status());
  return files_of(dir, &*listed, warnings);
}

std::vector<std::string> data_files(const std::string& dir, const std::vector<std::string>& dirs,
                                    SkipWarnings warnings) {
  if (dirs.empty()) return data_files(dir, warnings);
  std::vector<std::string> folders;  // in-memory sources stand for themselves, in their place
  std::map<std::string, std::string> named;  // a folder's canonical path -> its entry
  for (const std::string& d : dirs) {
    if (dataset::is_memory_source(d)) continue;
    folders.push_back(d);
    std::error_code ec;
    const std::string canonical = std::filesystem::canonical(d, ec).string();
    if (ec) continue;  // listing it names what is wrong
    const auto [it, inserted] = named.emplace(canonical, d);
    if (!inserted) {
      GPUBOX_FAIL("the list of data folders names '", it->second, "' twice",
                  d == it->second ? "" : " (again as '" + d + "')",
                  ": each pass would read its files twice");
    }
  }
  auto listed = dataset::list_data_folders(folders);
  throw_if_error(listed.status());
  std::vector<std::string> files;
  std::size_t next = 0;
  for (const std::string& d : dirs) {
    if (dataset::is_memory_source(d)) {
      files.push_back(d);
      continue;
    }
    std::vector<std::string> more = files_of(d, &(*listed)[next++], warnings);
    files.insert(files.end(), more.begin(), more.end());
  }
  return files;
}

void check_memory_source_transform(const std::vector<std::string>& files,
                                   const dataset::DatasetConfig& dataset_config) {
  const config::DenseTransform t = dataset_config.dense_transform;
  if (files.empty() || !dataset::is_memory_source(files.front()) ||
      t == config::DenseTransform::kNone || t == config::DenseTransform::kAuto) {
    return;
  }
  GPUBOX_FAIL("runner.dense_transform is ", name_of(config::kDenseTransformNames, t),
              ", but the data set ", files.front(),
              " is held in memory (a DataFrame or arrays), whose dense values are taken as given: "
              "apply the transform to its dense columns and set runner.dense_transform: none "
              "(a save records the transform, and its export would apply it to served values)");
}

}  // namespace gpubox::trainer
