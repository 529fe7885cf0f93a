// The shared helpers of the padded-step tests: heter_comm_padded_test_util.cuh.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "heterps/card_table/card_store.cuh"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "table/sparse_row/optimizer.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/heter_comm/heter_comm_padded_test_util.cuh"

namespace gpubox::heter_comm::padded_test {

using table::AccessorConfig;
using table::RowLayout;

std::vector<uint64_t> universe() {
  std::vector<uint64_t> keys;
  for (int i = 0; i < kUniverse; ++i) keys.push_back(mix64(1234 + i));
  keys[1] = 0;  // a key of value 0: a padded slot's key must never be taken for it
  return keys;
}

Data make_data(int cards, int push_dim, Placement placement) {
  const bool replicated = placement == Placement::kReplicated;
  const int row = replicated ? 1 : cards;
  const std::vector<uint64_t> all = universe();
  std::mt19937_64 rng(77 + cards);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  Data d;
  d.keys.assign(kSteps, std::vector<std::vector<uint64_t>>(cards));
  d.grads.assign(kSteps, std::vector<std::vector<float>>(cards));
  d.plan.assign(kSteps, std::vector<uint64_t>(static_cast<std::size_t>(cards * row), 0));
  for (int s = 0; s < kSteps; ++s) {
    for (int c = 0; c < cards; ++c) {
      const std::size_t n = (s == 4 && c == 0) ? 0 : 20 + rng() % 260;  // one empty batch
      for (std::size_t i = 0; i < n; ++i) {
        const double u = unit(rng);
        d.keys[s][c].push_back(all[static_cast<std::size_t>(u * u * u * kUniverse) % kUniverse]);
        for (int f = 0; f < push_dim; ++f) {
          d.grads[s][c].push_back(f == 0 ? 1.0f : static_cast<float>(unit(rng) - 0.4));
        }
      }
      const std::set<uint64_t> distinct(d.keys[s][c].begin(), d.keys[s][c].end());
      for (uint64_t k : distinct) ++d.plan[s][c * row + (replicated ? 0 : owner_card(k, cards))];
      d.bounds.occurrences = std::max(d.bounds.occurrences, n);
      d.bounds.unique = std::max(d.bounds.unique, distinct.size());
      d.bounds.block = std::max(d.bounds.block, distinct.size());
    }
    if (replicated) {  // every card receives every card's distinct keys
      std::size_t received = 0;
      for (int c = 0; c < cards; ++c) received += d.plan[s][c];
      d.bounds.received = std::max(d.bounds.received, received);
      d.bounds.pair_block = d.bounds.block;
      continue;
    }
    for (int o = 0; o < cards; ++o) {
      std::size_t received = 0;
      for (int c = 0; c < cards; ++c) {
        received += d.plan[s][c * cards + o];
        d.bounds.pair_block = std::max<std::size_t>(d.bounds.pair_block, d.plan[s][c * cards + o]);
      }
      d.bounds.received = std::max(d.bounds.received, received);
    }
  }
  return d;
}

namespace {

// The keys a card holds (owned, or every key when replicated) and their initial rows, on the card
// for the whole run (their buffers count in the card's memory figures, as any caller's would).
struct SeededKeys {
  std::vector<uint64_t> keys;
  device::device_buffer<uint64_t> on_card;
  device::device_buffer<float> rows;
};

// Card `card`'s keys of the universe (all of them when `replicated`; never `absent` when not 0),
// their rows initialised by `cfg`'s rule and inserted into `store`.
SeededKeys seed_store(device::Card& card, card_table::CardSparseStore& store, int cards,
                      bool replicated, uint64_t absent, const AccessorConfig& cfg,
                      const RowLayout& layout) {
  const int c = card.local_index();
  const device::Stream& stream = card.stream();
  std::vector<uint64_t> mine;
  std::vector<float> rows;
  for (uint64_t k : universe()) {
    if ((!replicated && owner_card(k, cards) != c) || (absent != 0 && k == absent)) continue;
    mine.push_back(k);
    rows.resize(rows.size() + layout.stride());
    table::init_row(rows.data() + rows.size() - layout.stride(), layout, cfg, k, 1);
  }
  auto dk = device::to_device(mine, card.memory(), stream);
  auto dr = device::to_device(rows, card.memory(), stream);
  store.insert_rows(dk.data(), dr.data(), mine.size(), stream);
  return SeededKeys{std::move(mine), std::move(dk), std::move(dr)};
}

// A step's buffers, sized once for the pass's most occurrences (a graph's capture holds their
// addresses).
struct StepBuffers {
  device::device_buffer<uint64_t> keys;
  device::device_buffer<float> grads;
  device::device_buffer<float> pulled;
  device::device_buffer<uint64_t> n_on_card;
};

StepBuffers make_step_buffers(device::Card& card, const HeterComm& hc, std::size_t most) {
  auto keys = card.make_buffer<uint64_t>(std::max<std::size_t>(most, 1));
  auto grads = card.make_buffer<float>(std::max<std::size_t>(most, 1) * hc.push_dim());
  auto pulled = card.make_buffer<float>(std::max<std::size_t>(most, 1) * hc.pull_dim());
  auto n_on_card = card.make_buffer<uint64_t>(1);
  return StepBuffers{std::move(keys), std::move(grads), std::move(pulled), std::move(n_on_card)};
}

// How run()'s steps go: as planned (`mode`), used (`use`), and step `wrong_step` planned by
// `wrong_plan` instead of its own.
struct StepsSpec {
  Mode mode;
  Use use;
  const std::vector<uint64_t>* wrong_plan;
  int wrong_step;
};

// Card `card`'s part of data's steps through `hc` (`comm` its communicator; plan rows of
// `plan_row` entries): every step's pulled records and the last step's counts into `out`.
void run_card_steps(device::Card& card, HeterComm& hc, comm::Communicator& comm, const Data& data,
                    std::size_t plan_row, const StepsSpec& spec, StepBuffers& buffers,
                    RunResult& out) {
  const int c = card.local_index();
  const device::Stream& stream = card.stream();
  for (int s = 0; s < kSteps; ++s) {
    const std::vector<uint64_t>& k = data.keys[s][c];
    const uint64_t n = k.size();
    if (n > 0) {
      device::copy_async(buffers.keys.data(), k.data(), k.size(), stream);
      device::copy_async(buffers.grads.data(), data.grads[s][c].data(), data.grads[s][c].size(),
                         stream);
    }
    device::copy_async(buffers.n_on_card.data(), &n, 1, stream);
    comm.set_step(2, s);
    const device::DeviceCounts before = card.counts();
    const uint64_t* plan = s == spec.wrong_step ? spec.wrong_plan->data() : data.plan[s].data();
    hc.plan_next_step({plan, plan_row},
                      spec.mode == Mode::kUnpadded ? nullptr : buffers.n_on_card.data());
    if (spec.use == Use::kPullOnly) {
      hc.pull_only(buffers.keys.data(), n, buffers.pulled.data(), stream);
    } else {
      hc.pull(buffers.keys.data(), n, buffers.pulled.data(), stream);
    }
    if (spec.use == Use::kTrain) hc.push_pulled(buffers.grads.data(), stream);
    out.last_step[c] = card.counts() - before;
    out.pulled[s][c] = device::to_host(buffers.pulled.data(), n * hc.pull_dim(), stream);
  }
}

// A RunResult with room for `cards` cards' figures.
RunResult sized_result(int cards) {
  RunResult out;
  out.pulled.assign(kSteps, std::vector<std::vector<float>>(cards));
  out.rows.resize(cards);
  out.last_step.resize(cards);
  out.memory.resize(cards);
  out.push_refused.resize(cards);
  out.table_steps.resize(cards);
  for (auto* v : {&out.in_use_before, &out.in_use_reserved, &out.in_use_after, &out.peak_reserved,
                  &out.peak_after}) {
    v->resize(cards);
  }
  return out;
}

}  // namespace

RunResult run(int cards, Placement placement, Mode mode, const Data& data,
              const std::vector<uint64_t>* wrong_plan, int wrong_step, uint64_t absent, Use use,
              const AccessorConfig& cfg, std::chrono::milliseconds collective_timeout) {
  const bool replicated = placement == Placement::kReplicated;
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  HeterCommOptions options;
  options.missing_keys = MissingKeyPolicy::kFail;
  options.step_graphs = mode == Mode::kPaddedGraphs;
  options.placement = placement;
  device::CardSet set = device::CardSet::from_list(device::testing::card_list(cards));
  auto group = comm::make_group(set, collective_timeout);
  std::vector<std::unique_ptr<card_table::CardSparseStore>> stores(cards);
  std::vector<std::unique_ptr<HeterComm>> comms(cards);
  RunResult out = sized_result(cards);
  const StepsSpec spec{mode, use, wrong_plan, wrong_step};
  set.run_on_cards(
      [&](device::Card& card) {
        const int c = card.local_index();
        const device::Stream& stream = card.stream();
        stores[c] = std::make_unique<card_table::CardSparseStore>(card, cfg);
        comms[c] = std::make_unique<HeterComm>(card, *stores[c], group->at(c), options);
        const SeededKeys mine =
            seed_store(card, *stores[c], cards, replicated, absent, cfg, layout);
        HeterComm& hc = *comms[c];
        StepBounds bounds = data.bounds;
        if (mode == Mode::kUnpadded) bounds.pair_block = 0;
        stream.synchronize();
        out.in_use_before[c] = card.memory().bytes_in_use();
        hc.reserve_steps(bounds);
        out.memory[c] = hc.memory();
        StepBuffers buffers = make_step_buffers(card, hc, data.bounds.occurrences);
        stream.synchronize();
        out.in_use_reserved[c] = card.memory().bytes_in_use();
        out.peak_reserved[c] = card.memory().peak_bytes();
        const std::size_t row = replicated ? 1 : static_cast<std::size_t>(cards);
        run_card_steps(card, hc, group->at(c), data, row, spec, buffers, out);
        group->at(c).set_step(-1, -1);
        hc.drain_checks();
        if (use == Use::kPullOnly) {
          try {  // refused before any collective: no peer waits for it
            hc.push_pulled(buffers.grads.data(), stream);
          } catch (const Error& e) {
            out.push_refused[c] = e.what();
          }
        }
        stream.synchronize();
        out.in_use_after[c] = card.memory().bytes_in_use();
        out.peak_after[c] = card.memory().peak_bytes();
        auto rows_out = card.make_buffer<float>(mine.keys.size() * layout.stride());
        stores[c]->read_rows(mine.on_card.data(), mine.keys.size(), rows_out.data(), stream);
        out.rows[c] = device::to_host(rows_out);
        out.table_steps[c] = comms[c]->table_steps();
        comms[c].reset();
        stores[c].reset();
      },
      [&](const std::string& why) { group->abort(why); });
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace gpubox::heter_comm::padded_test
