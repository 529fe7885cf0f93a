#include "trainer/schedule/restart_beside.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/error_report.hpp"
#include "trainer/schedule/checkpoint.hpp"

namespace gpubox::trainer {
namespace {

// "card 2" or "cards 1, 3".
std::string cards_named(const std::vector<int>& ranks) {
  std::string named = ranks.size() == 1 ? "card " : "cards ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    named += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return named;
}

}  // namespace

// Each distinct failure once, with the cards that met it, in card order.
std::string card_failures_beside_restart(const std::vector<device::CardsFailed::Failure>& failures,
                                         table::HostTier& host) {
  std::vector<std::pair<std::vector<int>, std::string>> distinct;
  for (const auto& failure : failures) {
    if (failure.told || SaveLineage::names_a_restart(failure.message, host)) continue;
    auto same = std::find_if(distinct.begin(), distinct.end(),
                             [&](const auto& d) { return d.second == failure.message; });
    if (same != distinct.end()) {
      same->first.push_back(failure.rank);
    } else {
      distinct.push_back({{failure.rank}, failure.message});
    }
  }
  std::string named;
  std::size_t more = 0;
  for (std::size_t i = 0; i < distinct.size(); ++i) {
    if (i >= kCardFailuresNamed) {
      more += distinct[i].first.size();
      continue;
    }
    named += (i ? "; " : "") + cards_named(distinct[i].first) + ": " + distinct[i].second;
  }
  if (more > 0) {
    named += "; and " + std::to_string(more) + (more == 1 ? " more card" : " more cards");
  }
  return named;
}

std::string failure_beside_restart(const std::exception& failure, table::HostTier& host) {
  if (const auto* cards = dynamic_cast<const device::CardsFailed*>(&failure)) {
    return card_failures_beside_restart(cards->failures(), host);
  }
  if (dynamic_cast<const FailureTold*>(&failure) != nullptr) return "";
  const std::string message = user_message(failure);
  return SaveLineage::names_a_restart(message, host) ? "" : message;
}

}  // namespace gpubox::trainer
