#include "trainer/engine/pass_pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "common/thread_priority.hpp"
#include "common/timer.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/queue_dataset.hpp"
#include "heterps/card_tier/card_tier.hpp"

namespace gpubox::trainer {
namespace {

// The sorted union of `a` and `b`.
std::vector<uint64_t> merged(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  std::vector<uint64_t> out;
  out.reserve(a.size() + b.size());
  std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

// Adds `nice` to the calling thread's nice value (common/thread_priority.hpp). The threads it
// starts (the reader's) inherit it; the host-tier pulls of its staging run on the pass cards'
// staging workers, lowered by as much (PassManagerOptions::staging_nice), so a pass's whole
// staging runs below the steps. A refusal is only logged.
void lower_staging_priority(int nice, int64_t pass) {
  const Status st = lower_thread_priority(nice);
  if (!st.ok()) {
    GPUBOX_LOG(WARNING) << "pass " << pass << ": the staging thread (runner.staging_nice " << nice
                        << "): " << st.to_string();
  }
}

}  // namespace

std::unique_ptr<PreparedPass> prepare_pass(const ReadPass& read, int64_t pass) {
  Timer timer;
  auto prepared = std::make_unique<PreparedPass>();
  prepared->pass = pass;
  read(pass, prepared.get());
  GPUBOX_EXPECTS(prepared->keys != nullptr, "pass ", pass, ": the reader gave no keys");
  // The data sets give their distinct keys in ascending order (a reader that does not is sorted
  // here, slots along, into a copy: the data set's are shared with it and the pass cache). Held
  // here, not referenced through prepared->keys, which the sorted copy replaces.
  const std::shared_ptr<const dataset::UniqueKeys> given = prepared->keys;
  const dataset::UniqueKeys& keys = *given;
  const auto ascending = [](uint64_t a, uint64_t b) { return a >= b; };
  if (std::adjacent_find(keys.keys.begin(), keys.keys.end(), ascending) != keys.keys.end()) {
    std::vector<std::pair<uint64_t, int32_t>> pairs(keys.keys.size());
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      pairs[i] = {keys.keys[i], keys.slots.empty() ? 0 : keys.slots[i]};
    }
    // Stable: a repeated key keeps its first slot, as begin_pass would.
    std::stable_sort(pairs.begin(), pairs.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    pairs.erase(std::unique(pairs.begin(), pairs.end(),
                            [](const auto& a, const auto& b) { return a.first == b.first; }),
                pairs.end());
    auto sorted = std::make_shared<dataset::UniqueKeys>();
    sorted->keys.resize(pairs.size());
    sorted->slots.resize(pairs.size());
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      std::tie(sorted->keys[i], sorted->slots[i]) = pairs[i];
    }
    prepared->keys = std::move(sorted);
  }
  // An alias of prepared->keys: the keys' owner stays alive while they are read.
  prepared->sorted_keys =
      std::shared_ptr<const std::vector<uint64_t>>(prepared->keys, &prepared->keys->keys);
  prepared->read_seconds = timer.seconds();
  return prepared;
}

std::size_t staged_bytes_per_key(int32_t stride) {
  return sizeof(float) * static_cast<std::size_t>(stride) + 2 * sizeof(uint64_t) + sizeof(int32_t);
}

PassPipeline::PassPipeline(tier_owner::CardTier& tier, int depth, ReadPass read,
                           uint64_t host_budget_bytes, int staging_nice)
    : tier_(tier),
      depth_(std::max(0, depth)),
      read_(std::move(read)),
      host_budget_bytes_(host_budget_bytes),
      staging_nice_(staging_nice) {}

PassPipeline::~PassPipeline() { wait(); }

std::shared_ptr<PreparedPass> PassPipeline::take(int64_t pass) {
  Timer timer;
  // Passes are taken in order; anything else (a schedule that jumped back) reads in place.
  if (!jobs_.empty() && jobs_.front().pass != pass) clear();
  std::shared_ptr<PreparedPass> prepared;
  if (jobs_.empty()) {
    prepared = prepare_pass(read_, pass);
  } else {
    const Job job = std::move(jobs_.front());
    jobs_.pop_front();
    prepared = job.ready.get();  // a failure to read the pass is thrown here
    const double mib = 1.0 / (1 << 20);
    const std::size_t data_bytes = prepared->data ? prepared->data->memory_bytes() : 0;
    // Blocks the pass data cache held too when the pass was read (its budget counts them): not on
    // top of it. Memory sources' blocks, shared with their registration, count as the data set's.
    const std::size_t shared_bytes = prepared->data ? prepared->data->shared_bytes() : 0;
    const std::size_t held = data_bytes - shared_bytes + prepared->staged.bytes();
    std::string budget;
    if (host_budget_bytes_ > 0) {
      budget = ", " + std::to_string(static_cast<int>(100.0 * held / host_budget_bytes_ + 0.5)) +
               "% of runner.host_memory_mb " + std::to_string(host_budget_bytes_ >> 20) +
               " MiB, on top of it";
    }
    GPUBOX_LOG(INFO) << "pass " << pass << " was read ahead (" << prepared->read_seconds
                     << " s, data set " << data_bytes * mib << " MiB, " << shared_bytes * mib
                     << " MiB of it shared with the pass data cache when read, memory sources' "
                        "blocks not) and "
                     << (prepared->staged.fetched ? prepared->staged.keys.size() : 0) << " of its "
                     << prepared->sorted_keys->size() << " keys staged ("
                     << prepared->staged.bytes() * mib << " MiB, " << prepared->staged.seconds
                     << " s) while the pass before it trained (" << held * mib
                     << " MiB in all, the cache's aside" << budget
                     << "); runner.prefetch_passes = " << depth_ << " holds at most " << depth_
                     << " such pass(es)";
  }
  prepared->waited_seconds = timer.seconds();
  return prepared;
}

void PassPipeline::start_after(const PreparedPass& current, int64_t end) {
  const int64_t last = std::min(end - 1, current.pass + depth_);
  const int64_t first = jobs_.empty() ? current.pass + 1 : jobs_.back().pass + 1;
  if (first > last) return;
  // The keys on the cards now (the cards idle between begin_pass and the steps), sorted by the
  // first job: a coming pass's key among them is a hit at its begin_pass, its staged row unused.
  Timer listing;
  auto resident = std::make_shared<std::vector<uint64_t>>(tier_.resident_keys());
  GPUBOX_LOG(INFO) << "pass " << current.pass << ": " << resident->size()
                   << " keys on the cards listed in " << listing.seconds()
                   << " s; the staging of the next pass(es) skips them";
  auto resident_sorted = std::make_shared<std::once_flag>();
  for (int64_t pass = first; pass <= last; ++pass) {
    // Excluded from its staging: the keys of the passes that train before it from now on, and
    // the keys on the cards.
    std::vector<std::shared_future<std::shared_ptr<PreparedPass>>> before;
    for (const Job& job : jobs_) before.push_back(job.ready);
    auto keys_read = std::make_shared<std::promise<std::shared_ptr<const std::vector<uint64_t>>>>();
    auto keys = keys_read->get_future().share();
    auto staging_planned = std::make_shared<std::promise<std::shared_ptr<PreparedPass>>>();
    auto planned = staging_planned->get_future().share();
    auto job = [&tier = tier_, &read = read_, nice = staging_nice_, pass,
                current_keys = current.sorted_keys, resident, resident_sorted, keys_read,
                staging_planned, before = std::move(before)]() -> std::shared_ptr<PreparedPass> {
      lower_staging_priority(nice, pass);  // a thread of its own (std::async), ends with the job
      std::shared_ptr<PreparedPass> prepared;
      try {
        prepared = prepare_pass(read, pass);
      } catch (...) {
        keys_read->set_value(nullptr);
        staging_planned->set_value(nullptr);
        throw;
      }
      keys_read->set_value(prepared->sorted_keys);
      prepared->prefetched = true;
      bool plan_published = false;
      try {
        std::call_once(*resident_sorted, [&] {
          std::sort(resident->begin(), resident->end());
          resident->erase(std::unique(resident->begin(), resident->end()), resident->end());
        });
        std::vector<uint64_t> exclude = merged(*current_keys, *resident);
        for (const auto& earlier : before) exclude = merged(exclude, *earlier.get()->sorted_keys);
        prepared->staged =
            tier.plan_staging(*prepared->sorted_keys, prepared->keys->slots, exclude);
        exclude = {};
        // From here the cards may read the plan (its keys) while the rows are fetched.
        staging_planned->set_value(prepared);
        plan_published = true;
        tier.fetch_staged(&prepared->staged);
      } catch (const Error& e) {
        // begin_pass pulls the rows itself (and reports a host-tier failure there); a pass
        // before this one that failed to read is reported when it is taken. The plan stays as
        // it is (the cards may be reading it), never fetched.
        GPUBOX_LOG(WARNING) << "pass " << pass << ": staging its rows ahead failed, its "
                            << "begin_pass pulls them: " << e.what();
        if (!plan_published) staging_planned->set_value(nullptr);
      } catch (...) {
        // Anything else (bad_alloc) is the job's error, thrown by take(); the cards stop waiting
        // for a plan.
        if (!plan_published) staging_planned->set_value(nullptr);
        throw;
      }
      return prepared;
    };
    jobs_.push_back(
        Job{pass, std::async(std::launch::async, std::move(job)).share(), keys, planned});
  }
}

std::shared_ptr<const std::vector<uint64_t>> PassPipeline::keys_of(int64_t pass) const {
  for (const Job& job : jobs_) {
    if (job.pass == pass) return job.keys.get();
  }
  return nullptr;
}

std::function<pass::StagingProgress()> PassPipeline::staged_poll(int64_t pass) const {
  const auto now = [](const auto& future) {
    return future.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  };
  for (const Job& job : jobs_) {
    if (job.pass != pass) continue;
    return [planned = job.planned, ready = job.ready, now]() -> pass::StagingProgress {
      // Nothing when reading the pass or planning its staging failed (take() reports a failure
      // to read it, or what else ended the job): called between the steps, it never throws.
      pass::StagingProgress progress;
      try {
        if (!now(planned) || planned.get() == nullptr) return progress;
        progress.staged = &planned.get()->staged;
      } catch (...) {
        return progress;
      }
      // The job ends once the fetch is done or failed; `fetched` says which (its writes happen
      // before the job's end).
      progress.rows_ready = now(ready) && progress.staged->fetched;
      return progress;
    };
  }
  return {};
}

void PassPipeline::wait() {
  for (const Job& job : jobs_) job.ready.wait();
}

void PassPipeline::wait_for(int64_t pass) const {
  for (const Job& job : jobs_) {
    if (job.pass == pass) job.ready.wait();
  }
}

void PassPipeline::clear() {
  wait();
  jobs_.clear();
}

}  // namespace gpubox::trainer
