// PsStore's room for a new ranged DENSE write (ps_store.hpp): the slots of a client, a host (its
// share address) and the server (make_room, free_slot, fair_share_victim) and the dense memory
// (admit_held), the writes that give way chosen first (doom) and dropped only once the new write
// fits (settle_doomed).
#include <algorithm>
#include <sstream>

#include "common/logging.hpp"
#include "table/server/ps_store.hpp"

namespace gpubox::table::server {

Status PsStore::make_room(const DenseCaller& caller, const std::string& host,
                          const std::string& name, const std::string& what, Clock::time_point now) {
  // This client's writes of this table that are abandoned, or idle long enough that their
  // connection is taken for half-open: superseded by the new one (a rewrite retried on a new
  // connection after its old one was lost needs no room for the stale write).
  for (StagedWrite& w : staged_) {
    if (w.client_id == caller.client_id && w.name == name && (w.abandoned() || stale(w, now))) {
      doom(w,
           "superseded by a newer write of the table by its client, after its connections closed "
           "or no range came for a quarter of gpubox_server --dense_write_max_idle_s",
           "");
    }
  }
  // The client's own oldest write (abandoned ones first) makes room for its new one (dropped even
  // when the new one is then refused); another client's live write is never dropped for it.
  auto own_oldest = staged_.end();
  std::size_t own = 0;
  const auto goes_first = [](const StagedWrite& a, const StagedWrite& b) {
    if (a.abandoned() != b.abandoned()) return a.abandoned();
    return a.started < b.started;
  };
  for (auto w = staged_.begin(); w != staged_.end(); ++w) {
    if (w->client_id != caller.client_id || w->doomed) continue;
    ++own;
    if (own_oldest == staged_.end() || goes_first(*w, *own_oldest)) own_oldest = w;
  }
  if (own >= kMaxStagedDenseWrites) {
    doom(*own_oldest,
         "its client began more than " + std::to_string(kMaxStagedDenseWrites) +
             " ranged writes at once",
         "");
    return Status::OK();
  }
  const std::string share = "at most " + std::to_string(kMaxStagedDenseWrites) + " a client, " +
                            std::to_string(kMaxHeldDenseWritesPerHost) + " a host";
  // Named as the peer, and as the host it counts as when that differs ("peer 127.0.0.2 (host
  // loopback)": every loopback address is one host).
  const std::string peer =
      "peer " + caller.address + (host == caller.address ? "" : " (host " + host + ")");
  GPUBOX_RETURN_IF_ERROR(
      free_slot(host, kMaxHeldDenseWritesPerHost, caller, what, now,
                peer + " already holds " + std::to_string(kMaxHeldDenseWritesPerHost) +
                    " ranged writes of its clients (" + share + ", of the server's " +
                    std::to_string(kMaxHeldDenseWrites) + ")"));
  return free_slot("", kMaxHeldDenseWrites, caller, what, now,
                   "this server already holds " + std::to_string(kMaxHeldDenseWrites) +
                       " ranged writes of its clients (" + share + ")");
}

Status PsStore::free_slot(const std::string& host, std::size_t limit, const DenseCaller& caller,
                          const std::string& what, Clock::time_point now, const std::string& why) {
  std::size_t held = 0;
  std::map<uint64_t, std::size_t> per_client;  // the writes counted against the limit, by client
  // The abandoned one that received no range for longest, and for the grace at least: a writer
  // whose connection closed under it (a transport retry) reconnects and finishes its write.
  auto idlest = staged_.end();
  for (auto w = staged_.begin(); w != staged_.end(); ++w) {
    if ((!host.empty() && w->host != host) || w->doomed) continue;
    ++held;
    ++per_client[w->client_id];
    if (w->abandoned() && stale(*w, now) &&
        (idlest == staged_.end() || w->last_range < idlest->last_range)) {
      idlest = w;
    }
  }
  if (held < limit) return Status::OK();
  const std::size_t own = per_client[caller.client_id];
  // How the log line names the write dropped and why.
  std::string dropped = "the abandoned ranged DENSE write";
  std::string reason = "its connections closed";
  if (idlest == staged_.end()) {
    idlest = fair_share_victim(host, per_client, caller.client_id, now);
    dropped = "the ranged DENSE write";
    if (idlest != staged_.end()) {
      reason = "the slowest of a client holding " + std::to_string(per_client[idlest->client_id]) +
               " of them, the most, against the new write's client's " + std::to_string(own);
    }
  }
  if (idlest == staged_.end()) {
    std::ostringstream msg;
    msg << what << " from " << caller.address << ": " << why << ", and no other client holds "
        << "more of them than this one's " << own
        << " (a client holding two more gives its slowest write to one holding fewer, one more "
           "only "
           "a write slower than --min_transfer_kb_s), nor is one abandoned for "
        << std::chrono::duration<double>(stale_after()).count()
        << " s (a quarter of gpubox_server --dense_write_max_idle_s: a writer whose connection "
           "closed may reconnect and finish); retry once they completed";
    return Status::ResourceExhausted(msg.str());
  }
  std::ostringstream log;
  log << dropped << " " << idlest->write_id << " of client " << idlest->client_id << " from "
      << idlest->address << " ('" << idlest->name << "', " << reason << ") for a write of client "
      << caller.client_id << " from " << caller.address << ": " << why;
  doom(*idlest, "its slot went to a write of another client (" + reason + "): " + why, log.str());
  return Status::OK();
}

std::vector<PsStore::StagedWrite>::iterator PsStore::fair_share_victim(
    const std::string& host, const std::map<uint64_t, std::size_t>& per_client, uint64_t client_id,
    Clock::time_point now) {
  const auto own = per_client.find(client_id);
  const std::size_t own_count = own == per_client.end() ? 0 : own->second;
  // Of the clients holding more than the new write's, those holding the most give first; among
  // their writes, the one slowest on average since its first range (not the one idle longest: a
  // dripping client touching each write often would make a trainer moving big ranges the idlest).
  // A client holding just one more gives only a write that is not moving at
  // DenseLimits::min_bytes_per_s or received no range for the grace: two trainers holding about
  // as many do not take each other's moving writes in turn.
  auto victim = staged_.end();
  std::size_t victim_count = 0;
  double victim_rate = 0.0;
  for (auto w = staged_.begin(); w != staged_.end(); ++w) {
    if ((!host.empty() && w->host != host) || w->client_id == client_id || w->doomed) {
      continue;
    }
    const std::size_t count = per_client.at(w->client_id);
    const double rate = average_rate(*w, now);
    if (count <= own_count ||
        (count == own_count + 1 && !stale(*w, now) && rate >= limits_.min_bytes_per_s)) {
      continue;
    }
    if (victim == staged_.end() || count > victim_count ||
        (count == victim_count && rate < victim_rate)) {
      victim = w;
      victim_count = count;
      victim_rate = rate;
    }
  }
  return victim;
}

double PsStore::average_rate(const StagedWrite& w, Clock::time_point now) const {
  // Over the grace at least: a write just begun has not had the time to show its pace.
  const double seconds = std::max(std::chrono::duration<double>(now - w.first_range).count(),
                                  std::chrono::duration<double>(stale_after()).count());
  return static_cast<double>(sizeof(float) * w.received) / std::max(seconds, 1e-3);
}

bool PsStore::stalled(const StagedWrite& w, Clock::time_point now) const {
  if (limits_.min_bytes_per_s <= 0.0) return false;
  const double since_grace =
      std::chrono::duration<double>(now - w.first_range - stale_after()).count();
  return since_grace > 0.0 &&
         static_cast<double>(sizeof(float) * w.received) < limits_.min_bytes_per_s * since_grace;
}

Status PsStore::admit_held(const DenseCaller& caller, const std::string& what,
                           std::size_t table_bytes, std::size_t replaced_bytes,
                           std::size_t held_bytes, Clock::time_point now) {
  for (;;) {
    Status fits = admit(what, table_bytes, replaced_bytes, held_bytes);
    if (fits.ok()) return fits;
    auto largest = staged_.end();
    for (auto w = staged_.begin(); w != staged_.end(); ++w) {
      if (!w->doomed && stalled(*w, now) && (largest == staged_.end() || w->total > largest->total))
        largest = w;
    }
    if (largest == staged_.end()) {
      return Status::ResourceExhausted(
          fits.message() +
          "; no held write is stalled (each received its bytes at gpubox_server "
          "--min_transfer_kb_s at least after a quarter of "
          "--dense_write_max_idle_s)");
    }
    const std::string slow = std::to_string(sizeof(float) * largest->received) + " of its " +
                             std::to_string(sizeof(float) * std::size_t{largest->total}) +
                             " announced bytes received, slower than --min_transfer_kb_s";
    std::ostringstream log;
    log << "the stalled ranged DENSE write " << largest->write_id << " of client "
        << largest->client_id << " from " << largest->address << " ('" << largest->name << "', "
        << slow << ") for a write of client " << caller.client_id << " from " << caller.address
        << " at the dense memory limit";
    doom(*largest, "stalled (" + slow + ") at the server's dense memory limit", log.str());
  }
}

Status PsStore::admit_settled(const DenseCaller& caller, const std::string& what,
                              std::size_t table_bytes, std::size_t replaced_bytes,
                              Clock::time_point now) {
  Status fits = admit_held(caller, what, table_bytes, replaced_bytes, 0, now);
  settle_doomed(fits.ok());
  return fits;
}

void PsStore::doom(StagedWrite& w, std::string reason, std::string log) {
  w.doomed = true;
  w.doom_reason = std::move(reason);
  w.doom_log = std::move(log);
}

void PsStore::settle_doomed(bool drop) {
  for (auto w = staged_.begin(); w != staged_.end();) {
    if (!w->doomed) {
      ++w;
    } else if (!drop) {
      w->doomed = false;
      ++w;
    } else {
      uint64_t held_back = 0;
      if (!w->doom_log.empty() && drop_log_.allow(Clock::now(), &held_back)) {
        GPUBOX_LOG(WARNING) << "gpubox_server: dropped " << w->doom_log << " (and " << held_back
                            << " similar lines held back)";
      }
      const std::string reason = std::move(w->doom_reason);
      w = drop_held(w, reason);
    }
  }
}

}  // namespace gpubox::table::server
