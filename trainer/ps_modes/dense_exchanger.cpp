#include "trainer/ps_modes/dense_exchanger.hpp"

#include <utility>

#include "common/error.hpp"
#include "table/server/remote_host_tier.hpp"

namespace gpubox::trainer::ps_modes {

DenseExchanger::DenseExchanger(table::server::RemoteHostTier& servers, std::string table)
    : servers_(servers), table_(std::move(table)) {}

void DenseExchanger::start(std::vector<float>* values) {
  GPUBOX_EXPECTS(!pending_, "a dense exchange started before the last was waited for");
  ticket_ = calls_.submit(
      [this, values] { return servers_.dense(table::server::DenseAction::kAdd, table_, values); });
  pending_ = true;
}

Status DenseExchanger::wait() {
  GPUBOX_EXPECTS(pending_, "waiting for a dense exchange that was not started");
  pending_ = false;
  return calls_.wait(ticket_);
}

void DenseExchanger::cancel() {
  calls_.cancel();
  pending_ = false;
}

}  // namespace gpubox::trainer::ps_modes
