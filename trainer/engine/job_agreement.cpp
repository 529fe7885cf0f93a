#include "trainer/engine/job_agreement.hpp"

#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace gpubox::trainer {
namespace {

// Keys a trainer sets for its own machine (besides places_rows_only's): its reader threads,
// the in-process table's lock shards, where its pipe_command's utilities lie.
bool set_per_machine(const std::string& key) {
  return places_rows_only(key) || key == "runner.thread_num" || key == "runner.host_table_shards" ||
         key == "runner.pipe_utils_path";
}

// What a trainer publishes: "who" (host and pid, for messages), the trainer count under the
// variable that gave it, the cards per trainer, then the compared keys.
std::map<std::string, std::string> entry_of(const TrainerConfig& config, const TrainerEnv& env,
                                            int cards_per_trainer) {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::map<std::string, std::string> entry;
  entry[" who"] = std::string(host) + " pid " + std::to_string(::getpid());
  entry["trainers in the job (PADDLE_TRAINERS_NUM)"] = std::to_string(env.trainers);
  entry["cards per trainer (FLAGS_selected_gpus)"] = std::to_string(cards_per_trainer);
  for (const auto* keys : {&config.model_keys, &config.job_keys}) {
    for (const auto& [key, value] : *keys) {
      if (!set_per_machine(key)) entry[key] = value;
    }
  }
  return entry;
}

// Lines of "key\tvalue", tabs, newlines and backslashes in either escaped.
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

std::vector<char> encode(const std::map<std::string, std::string>& entry) {
  std::string text;
  for (const auto& [key, value] : entry) text += escaped(key) + '\t' + escaped(value) + '\n';
  return std::vector<char>(text.begin(), text.end());
}

std::map<std::string, std::string> decode(const std::vector<char>& bytes) {
  std::map<std::string, std::string> entry;
  const std::string text(bytes.begin(), bytes.end());
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    const std::size_t tab = line.find('\t');
    if (tab != std::string::npos)
      entry[unescaped(line.substr(0, tab))] = unescaped(line.substr(tab + 1));
    begin = end + 1;
  }
  return entry;
}

std::string key_of(int trainer) { return "job/config/" + std::to_string(trainer); }

std::string value_or_unset(const std::map<std::string, std::string>& entry,
                           const std::string& key) {
  const auto found = entry.find(key);
  return found == entry.end() ? "(not set)" : found->second;
}

// Throws naming what `mine` (trainer `me`) and `theirs` (trainer `other`) differ in.
void compare(const std::map<std::string, std::string>& mine, int me,
             const std::map<std::string, std::string>& theirs, int other,
             const std::string& store) {
  std::vector<std::string> differences;
  std::map<std::string, bool> keys;
  for (const auto& [key, value] : mine) keys[key] = true;
  for (const auto& [key, value] : theirs) keys[key] = true;
  for (const auto& [key, unused] : keys) {
    if (key == " who") continue;
    const std::string a = value_or_unset(mine, key), b = value_or_unset(theirs, key);
    if (a != b) {
      differences.push_back(key + ": trainer " + std::to_string(other) + " has " + b +
                            ", trainer " + std::to_string(me) + " (this one) " + a);
    }
  }
  if (differences.empty()) return;
  constexpr std::size_t kNamed = 6;
  std::string named;
  for (std::size_t i = 0; i < differences.size() && i < kNamed; ++i) {
    named += (i == 0 ? "" : "; ") + differences[i];
  }
  if (differences.size() > kNamed) {
    named += "; and " + std::to_string(differences.size() - kNamed) + " more";
  }
  GPUBOX_FAIL("the trainers of this job (", store,
              ") were started with different settings: ", named, " (trainer ", other, ": ",
              value_or_unset(theirs, " who"),
              "): every trainer of a job trains one model, so give each the same config, -o "
              "overrides and trainer count");
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
    const auto earlier = decode(store.get(mine_key, std::chrono::milliseconds(0)));
    GPUBOX_FAIL("GPUBOX_RENDEZVOUS=", store.describe(), " already holds trainer ", me, "'s entry (",
                mine_key, ", from ", value_or_unset(earlier, " who"),
                "): the folder of an earlier job (give each job a fresh, empty folder), or two "
                "trainers started with PADDLE_TRAINER_ID=",
                me);
  }
  const auto mine = entry_of(config, env, cards_per_trainer);
  store.set(mine_key, encode(mine));
  const auto read = [&](int trainer) {
    try {
      return decode(store.get(key_of(trainer), timeout));
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
