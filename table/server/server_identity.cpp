#include "table/server/server_identity.hpp"

#include <cstdio>

#include "common/error.hpp"
#include "common/logging.hpp"

namespace gpubox::table::server {
namespace {

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::string ServerRestart::what_was_lost() const {
  const std::string now = after.generation == 0
                              ? "now empty"
                              : "now holding the save of generation " + hex(after.generation);
  return "server " + where + " restarted (instance " + hex(before.instance_id) + " -> " +
         hex(after.instance_id) + ", " + now + "): the rows pushed since the last save are gone";
}

std::string ServerRestart::describe() const {
  return what_was_lost() + "; rerun to resume from the last save";
}

ServerIdentityBook::ServerIdentityBook(std::vector<std::string> endpoints) {
  entries_.resize(endpoints.size());
  for (std::size_t e = 0; e < endpoints.size(); ++e) entries_[e].where = std::move(endpoints[e]);
}

Status ServerIdentityBook::observe(std::size_t endpoint, ServerIdentity seen) {
  MutexLock lock(mu_);
  GPUBOX_EXPECTS(endpoint < entries_.size(), "endpoint index out of range");
  Entry& e = entries_[endpoint];
  if (e.known.instance_id == 0) {
    e.known = seen;
    e.clean = e.begun == e.ended;
    e.clean_generation = seen.generation;
    e.clean_at = e.begun;
    return Status::OK();
  }
  if (seen.instance_id == e.known.instance_id) {
    e.known.generation = seen.generation;  // a LOAD by any client
    return Status::OK();
  }
  const bool nothing_lost =
      !e.restarted && e.clean && e.clean_at == e.begun && e.clean_generation == seen.generation;
  if (nothing_lost) {
    GPUBOX_LOG(INFO) << "server " << e.where << " restarted (instance " << hex(e.known.instance_id)
                     << " -> " << hex(seen.instance_id) << ") from the state this client last "
                     << "saw (generation " << hex(seen.generation) << "): nothing was lost";
    e.known = seen;
    return Status::OK();
  }
  e.restarted = true;
  e.found = seen;
  return Status::Aborted(restart_of(endpoint, e).describe());
}

void ServerIdentityBook::mutation_begins(std::size_t endpoint) {
  MutexLock lock(mu_);
  ++entries_.at(endpoint).begun;
}

void ServerIdentityBook::mutation_ends(std::size_t endpoint) {
  MutexLock lock(mu_);
  ++entries_.at(endpoint).ended;
}

uint64_t ServerIdentityBook::sync_token(std::size_t endpoint) const {
  MutexLock lock(mu_);
  const Entry& e = entries_.at(endpoint);
  // A mutation in flight could land after the SAVE: the sync cannot vouch for the state.
  return e.begun == e.ended ? e.begun : UINT64_MAX;
}

void ServerIdentityBook::synced(std::size_t endpoint, uint64_t token, uint64_t generation) {
  MutexLock lock(mu_);
  Entry& e = entries_.at(endpoint);
  if (token != e.begun) {
    e.clean = false;
    return;
  }
  e.clean = true;
  e.clean_generation = generation;
  e.clean_at = token;
}

ServerRestart ServerIdentityBook::restart_of(std::size_t endpoint, const Entry& e) const {
  ServerRestart r;
  r.endpoint = endpoint;
  r.where = e.where;
  r.before = e.known;
  r.after = e.found;
  return r;
}

std::vector<ServerRestart> ServerIdentityBook::pending_restarts() const {
  MutexLock lock(mu_);
  std::vector<ServerRestart> out;
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].restarted) out.push_back(restart_of(i, entries_[i]));
  }
  return out;
}

void ServerIdentityBook::accept_restarts() {
  MutexLock lock(mu_);
  for (Entry& e : entries_) {
    if (!e.restarted) continue;
    e.restarted = false;
    e.known = e.found;
    e.clean = e.begun == e.ended;
    e.clean_generation = e.found.generation;
    e.clean_at = e.begun;
  }
}

ServerIdentity ServerIdentityBook::identity(std::size_t endpoint) const {
  MutexLock lock(mu_);
  return entries_.at(endpoint).known;
}

}  // namespace gpubox::table::server
