#include "trainer/schedule/dense_state.hpp"

#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <utility>

#include "common/error.hpp"
#include "heterps/device/memory.hpp"
#include "table/dense_table.hpp"
#include "table/io/file_env.hpp"
#include "table/io/model_manifest.hpp"
#include "trainer/nn/dense_optimizer.hpp"
#include "trainer/nn/dense_parameters.hpp"

namespace gpubox::trainer {
namespace {

// The save's block and state names (the format both modes read and write).
constexpr const char* kDenseBlock = "dense";
constexpr const char* kMoment1 = "moment1";
constexpr const char* kMoment2 = "moment2";
constexpr const char* kSteps = "steps";
constexpr const char* kTableSteps = "table_steps";

// The step count stored bit-exactly in two floats of a state block.
std::vector<float> pack_steps(int64_t steps) {
  std::vector<float> out(2);
  std::memcpy(out.data(), &steps, sizeof(steps));
  return out;
}

int64_t unpack_steps(const std::vector<float>& packed, const std::string& dir) {
  GPUBOX_EXPECTS(packed.size() == 2, "save ", dir, ": bad dense optimizer step record");
  int64_t steps = 0;
  std::memcpy(&steps, packed.data(), sizeof(steps));
  return steps;
}

std::string dense_dir(const std::string& dir) {
  return (std::filesystem::path(dir) / "dense").string();
}

}  // namespace

DenseState DenseState::of(const DenseParameters& parameters, DenseOptimizer& optimizer,
                          const device::Stream& stream) {
  DenseState state;
  state.values = parameters.values_to_host();
  // SGD keeps no moments: its buffers are empty and bound to no stream.
  for (auto [host, buffer] : {std::pair{&state.moment1, &optimizer.moment1()},
                              std::pair{&state.moment2, &optimizer.moment2()}}) {
    if (buffer->size() > 0) *host = device::to_host(buffer->data(), buffer->size(), stream);
  }
  state.steps = optimizer.steps();
  stream.synchronize();
  return state;
}

void DenseState::restore_optimizer(DenseOptimizer& optimizer, const device::Stream& stream,
                                   const std::string& dir) const {
  for (const auto* host : {&moment1, &moment2}) {
    auto& buffer = host == &moment1 ? optimizer.moment1() : optimizer.moment2();
    GPUBOX_EXPECTS(host->size() == buffer.size(), "save ", dir, ": optimizer state '",
                   host == &moment1 ? kMoment1 : kMoment2, "' has ", host->size(),
                   " values, expected ", buffer.size());
    if (!host->empty()) device::copy_async(buffer.data(), host->data(), host->size(), stream);
  }
  optimizer.set_steps(steps);
}

uint64_t DenseState::digest() const {
  XXH3_state_t* state = XXH3_createState();
  GPUBOX_EXPECTS(state != nullptr, "dense digest: out of memory");
  XXH3_64bits_reset(state);
  for (const std::vector<float>* part : {&values, &moment1, &moment2})
    XXH3_64bits_update(state, part->data(), part->size() * sizeof(float));
  XXH3_64bits_update(state, &steps, sizeof(steps));
  XXH3_64bits_update(state, &table_steps, sizeof(table_steps));
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

uint64_t save_dense_half(const std::string& dir, const DenseState& state, table::io::FileEnv* env) {
  if (env == nullptr) env = table::io::FileEnv::posix();
  table::DenseBlock block;
  block.values = state.values;
  block.state[kMoment1] = state.moment1;
  block.state[kMoment2] = state.moment2;
  block.state[kSteps] = pack_steps(state.steps);
  if (state.table_steps != 0) block.state[kTableSteps] = pack_steps(state.table_steps);
  table::DenseTable dense(env);
  dense.put(kDenseBlock, std::move(block));
  const std::string folder = dense_dir(dir);
  throw_if_error(dense.save(folder).with_context("saving the dense parameters under " + dir));
  auto digest = table::io::read_half_digest(env, folder, table::io::kDenseHalf);
  throw_if_error(digest.status().with_context("reading back " + folder));
  return *digest;
}

DenseState load_dense_half(const std::string& dir, std::size_t parameters,
                           const std::string& network_note) {
  table::DenseTable dense;
  throw_if_error(
      dense.load(dense_dir(dir)).with_context("loading the dense parameters from " + dir));
  auto block = dense.get(kDenseBlock);
  GPUBOX_EXPECTS(block.has_value(), "save ", dir, " has no dense block");
  GPUBOX_EXPECTS(
      block->values.size() == parameters, "save ", dir, " holds ", block->values.size(),
      " dense parameters but the configured model has ", parameters,
      network_note.empty()
          ? " (different fc_sizes, slots, dense_input_dim, dnn_batch_norm or dlrm_output?)"
          : network_note);
  for (const char* name : {kMoment1, kMoment2, kSteps}) {
    GPUBOX_EXPECTS(block->state.count(name) == 1, "save ", dir,
                   ": the dense half has no optimizer state '", name, "'");
  }
  DenseState state;
  state.values = std::move(block->values);
  state.moment1 = std::move(block->state.at(kMoment1));
  state.moment2 = std::move(block->state.at(kMoment2));
  state.steps = unpack_steps(block->state.at(kSteps), dir);
  if (block->state.count(kTableSteps) == 1) {
    state.table_steps = unpack_steps(block->state.at(kTableSteps), dir);
  }
  return state;
}

}  // namespace gpubox::trainer
