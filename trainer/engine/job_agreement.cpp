#include "trainer/engine/job_agreement.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "table/server/remote_host_tier.hpp"
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

std::string failed_key_of(int trainer) { return "job/failed/" + std::to_string(trainer); }
std::string mode_key_of(int trainer) { return "job/ps_mode/" + std::to_string(trainer); }

// `key`, trainer `trainer`'s, waiting up to `timeout` in slices; none after it (`missing`: the
// store's words). Throws at once, naming its message, when the trainer said it failed
// (tell_job_failed), or when a trainer of this one's id `me` did (another process started with
// this trainer's PADDLE_TRAINER_ID: whichever of the two waits would wait for an id nobody has).
std::optional<std::vector<char>> read_or_failure(comm::RendezvousStore& store,
                                                 const std::string& key, int trainer, int me,
                                                 std::chrono::milliseconds timeout,
                                                 std::string* missing) {
  constexpr std::chrono::milliseconds kSlice(200);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    try {
      return store.get(key, std::max(std::min(left, kSlice), std::chrono::milliseconds(0)));
    } catch (const Error& e) {
      if (left <= kSlice) {
        *missing = e.what();
        return std::nullopt;
      }
    }
    std::vector<char> mode;
    try {
      mode = store.get(mode_key_of(trainer), std::chrono::milliseconds(0));
    } catch (const Error&) {
    }
    if (!mode.empty()) {  // it publishes no entry: it meets the others through the servers
      GPUBOX_FAIL("trainer ", trainer, " of the job runs runner.sync_mode ",
                  std::string(mode.begin(), mode.end()), " (a parameter-server mode), trainer ", me,
                  " (this one) the gpubox mode or Collective: every trainer of a job runs one "
                  "mode; ",
                  kGiveTheSameSettings);
    }
    for (const int who : {trainer, me}) {
      std::vector<char> failed;
      try {
        failed = store.get(failed_key_of(who), std::chrono::milliseconds(0));
      } catch (const Error&) {
        continue;
      }
      const std::string said(failed.begin(), failed.end());
      if (who == trainer) GPUBOX_FAIL("trainer ", trainer, " of the job failed: ", said);
      GPUBOX_FAIL("another trainer started with this one's PADDLE_TRAINER_ID=", me,
                  " failed (two trainers were given one id, and no trainer has the id this one "
                  "waits for): ",
                  said);
    }
  }
}

}  // namespace

void agree_on_job(comm::RendezvousStore& store, const TrainerConfig& config, const TrainerEnv& env,
                  int cards_per_trainer, std::chrono::milliseconds timeout) {
  const int me = env.trainer_id;
  const std::string mine_key = key_of(me);
  const JobSettings mine = job_settings(config, env, "cards per trainer (FLAGS_selected_gpus)",
                                        cards_per_trainer, /*threads_shape_job=*/false);
  JobSettings published = mine;
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  published[kWho] = std::string(host) + " pid " + std::to_string(::getpid());
  // Set once (atomically): of two trainers started with one id at once, both had found the key
  // unset, and both waited out runner.collective_timeout_s for the id nobody had.
  if (!store.set_once(mine_key, bytes_of(encode_settings(published)))) {
    JobSettings earlier = read_entry(store, me, std::chrono::milliseconds(0));
    GPUBOX_FAIL("GPUBOX_RENDEZVOUS=", store.describe(), " already holds trainer ", me, "'s entry (",
                mine_key, ", from ", who_of(&earlier),
                "): the folder of an earlier job (give each job a fresh, empty folder), or two "
                "trainers started with PADDLE_TRAINER_ID=",
                me);
  }
  const auto read = [&](int trainer) {
    std::string missing;
    const auto entry = read_or_failure(store, key_of(trainer), trainer, me, timeout, &missing);
    if (!entry) {
      GPUBOX_FAIL("trainer ", trainer, " of the job (", env.trainers_from, "=", env.trainers,
                  ") did not arrive within runner.collective_timeout_s (", timeout.count() / 1000.0,
                  " s): ", missing);
    }
    return decode_settings(std::string(entry->begin(), entry->end()));
  };
  if (me != 0) {
    compare(mine, me, read(0), 0, store.describe());
    return;
  }
  for (int trainer = 1; trainer < env.trainers; ++trainer) {
    compare(mine, me, read(trainer), trainer, store.describe());
  }
}

namespace {

// A trainer's servers: their instance ids (compared), then how it names them (for the message),
// one line each.
struct ServersSeen {
  std::string ids;
  std::string named;
};

ServersSeen servers_seen(const table::HostTier& host) {
  const auto* remote = dynamic_cast<const table::server::RemoteHostTier*>(&host);
  if (remote == nullptr) return {"in-process", "an in-process table (no servers)"};
  ServersSeen seen;
  for (std::size_t e = 0; e < remote->endpoint_count(); ++e) {
    char id[32];
    std::snprintf(id, sizeof(id), "%016llx",
                  static_cast<unsigned long long>(remote->server_identity(e).instance_id));
    seen.ids += (e > 0 ? "," : "") + std::string(id);
    seen.named += (e > 0 ? ", " : "") + remote->endpoint_name(e) + " (instance " + id + ")";
  }
  return seen;
}

std::string encode_seen(const ServersSeen& seen) { return seen.ids + '\n' + seen.named; }

ServersSeen decode_seen(const std::vector<char>& bytes) {
  const std::string text(bytes.begin(), bytes.end());
  const std::size_t cut = text.find('\n');
  if (cut == std::string::npos) return {text, text};
  return {text.substr(0, cut), text.substr(cut + 1)};
}

}  // namespace

void agree_on_servers(comm::RendezvousStore& store, const TrainerEnv& env,
                      const table::HostTier& host, std::chrono::milliseconds timeout) {
  const int me = env.trainer_id;
  const ServersSeen mine = servers_seen(host);
  const std::string text = encode_seen(mine);
  store.set("job/servers/" + std::to_string(me), bytes_of(text));
  const auto compare_with = [&](int other) {
    std::string missing;
    const auto seen = read_or_failure(store, "job/servers/" + std::to_string(other), other, me,
                                      timeout, &missing);
    if (!seen) {
      GPUBOX_FAIL("trainer ", other, " of the job (", env.trainers_from, "=", env.trainers,
                  ") did not say which servers it reached within runner.collective_timeout_s (",
                  timeout.count() / 1000.0, " s): ", missing);
    }
    const ServersSeen theirs = decode_seen(*seen);
    GPUBOX_EXPECTS(theirs.ids == mine.ids, "the trainers of this job (", store.describe(),
                   ") reach different servers: trainer ", me, " reaches {", mine.named,
                   "}; trainer ", other, " reaches {", theirs.named,
                   "}; a trainer on other servers trains a table of its own: give every trainer "
                   "the job's servers (PADDLE_PSERVERS_IP_PORT_LIST, the same servers in the same "
                   "order)");
  };
  if (me != 0) {
    compare_with(0);
    return;
  }
  for (int trainer = 1; trainer < env.trainers; ++trainer) compare_with(trainer);
}

void publish_ps_mode(const TrainerEnv& env, SyncMode mode) noexcept {
  try {
    if (env.trainers <= 1 || env.rendezvous.empty()) return;
    const auto store = comm::open_rendezvous_store(env.rendezvous);
    store->set(mode_key_of(env.trainer_id), bytes_of(name_of(config::kSyncModeNames, mode)));
  } catch (...) {
    // The others then wait for this trainer's entry until runner.collective_timeout_s.
  }
}

std::string failure_told(const TrainerEnv& env, int trainer) noexcept {
  try {
    if (env.trainers <= 1 || env.rendezvous.empty()) return "";
    const auto store = comm::open_rendezvous_store(env.rendezvous);
    const std::vector<char> said = store->get(failed_key_of(trainer), std::chrono::milliseconds(0));
    return "trainer " + std::to_string(trainer) +
           " of the job failed: " + std::string(said.begin(), said.end());
  } catch (...) {
    return "";
  }
}

void tell_job_failed(const std::string& message) noexcept {
  try {
    const TrainerEnv env = TrainerEnv::from_environment();
    if (env.trainers <= 1 || env.rendezvous.empty()) return;
    const auto store = comm::open_rendezvous_store(env.rendezvous);
    std::string text = message.substr(0, comm::RendezvousStore::kMaxValueBytes);
    store->set(failed_key_of(env.trainer_id), bytes_of(text));
  } catch (...) {
    // The others still end after runner.collective_timeout_s, naming this trainer.
  }
}

}  // namespace gpubox::trainer
