// DenseState: a card's dense parameters with their optimizer state (values, the two moments,
// the step count) as host copies: what a save's dense half holds, what every mode restores and
// what the trainers of a job compare (digest) before one of them saves. One definition for
// every schedule: the dense half a gpubox-mode run writes is the one a PS-mode run loads, and
// back.
//
// The save's dense half is a table::DenseTable under <save>/dense with one block "dense":
// values, and state "moment1", "moment2" and "steps" (the int64 step count stored bit-exactly in
// two floats), and "table_steps" (the same form) when the sparse table's step count (per_table
// adam_bias_correction) is not 0, which the trainer keeps in checkpoint saves only: a save
// without it (per_row rows, base and delta saves, saves from before the key) loads as 0.
// fat_deepffm with dropout keeps its undropped bias (kFatDeepffmBiasBlock) apart, in a block of
// that name (its value, its "moment1" and "moment2"): "dense" then holds the values before it,
// the same net's layout at p = 0. A save without that block (made before the bias existed, or at
// p = 0) loads with the bias at 0 and says so at INFO; a save with it into a model without it
// (another rate) is refused naming it; a block of another name is refused.
//
// Thread-safety: plain data; the functions taking a card's parts run on that card's thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "heterps/device/stream.hpp"
#include "trainer/nn/dense_model_types.hpp"

namespace gpubox::table::io {
class FileEnv;
}  // namespace gpubox::table::io

namespace gpubox::trainer {

class DenseModel;
class DenseOptimizer;

struct DenseState {
  std::vector<float> values;
  std::vector<float> moment1;
  std::vector<float> moment2;
  int64_t steps = 0;
  // The card's sparse table's steps (heter_comm::HeterComm::table_steps; 0 per_row): the
  // caller's to fill and restore (a checkpoint's only), as the card tier is not the dense's.
  int64_t table_steps = 0;
  // The model's undropped bias (DenseModel::undropped_bias), which the save keeps apart; nullopt:
  // the block "dense" holds every value.
  std::optional<UndroppedBias> undropped_bias;
  // Loaded from a save without its block: the bias is 0 and its moments are left as the
  // optimizer's initial ones.
  bool undropped_bias_missing = false;

  // Host copies of one card's state. Synchronizes `stream` (the card's).
  static DenseState of(const DenseModel& model, DenseOptimizer& optimizer,
                       const device::Stream& stream);
  // Writes the moments and the step count into `optimizer` (on `stream`; the copies are
  // complete when it is next synchronized): every saved value's, not those of the padding before
  // an undropped bias nor of one the save lacked (the optimizer's own stay). The values are the
  // caller's: a card takes them with set_values, the PS modes through the servers' dense table.
  // Throws naming `dir` (the save they came from) when the moments' sizes differ from the
  // optimizer's.
  void restore_optimizer(DenseOptimizer& optimizer, const device::Stream& stream,
                         const std::string& dir) const;
  // A digest of all five: equal on every card of a job while their updates agree.
  uint64_t digest() const;
};

// Writes `state` as the dense half of the save `dir` (<dir>/dense) through `env` (nullptr: POSIX;
// trainer 0 passes an io::ProgressEnv over RemoteHostTier::local_work, whose operations the others
// waiting for its save see move) and returns the half's digest as its manifest names it. Throws
// naming the folder.
uint64_t save_dense_half(const std::string& dir, const DenseState& state,
                         table::io::FileEnv* env = nullptr);

// Reads the dense half of the save `dir`, checked against a model of `parameters` dense
// parameters with `undropped_bias` (DenseModel::undropped_bias): throws naming the save and what
// differs (another network, a half without optimizer state, the undropped bias's block for a
// model without one). `network_note` (checkpoint.hpp) is what a count that differs adds: the
// model keys the save was made with that differ; "" guesses at them.
DenseState load_dense_half(const std::string& dir, std::size_t parameters,
                           const std::string& network_note = "",
                           const std::optional<UndroppedBias>& undropped_bias = std::nullopt);

}  // namespace gpubox::trainer
