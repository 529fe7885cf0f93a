#include "trainer/schedule/dense_state.hpp"

#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <utility>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "heterps/device/memory.hpp"
#include "table/dense_table.hpp"
#include "table/io/file_env.hpp"
#include "table/io/model_manifest.hpp"
#include "trainer/nn/dense_model.hpp"
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

// The first `count` floats of `all` (a moment: none for SGD, whose moments are empty).
std::vector<float> head(const std::vector<float>& all, std::size_t count) {
  if (all.empty()) return {};
  return std::vector<float>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(count));
}

// The undropped bias's block: its value and moments at `at`.
table::DenseBlock undropped_bias_block(const DenseState& state, std::size_t at) {
  table::DenseBlock block;
  block.values = {state.values.at(at)};
  if (!state.moment1.empty()) block.state[kMoment1] = {state.moment1.at(at)};
  if (!state.moment2.empty()) block.state[kMoment2] = {state.moment2.at(at)};
  return block;
}

// `state` read from the block "dense" (values [0, bias.before)) grown to the model's `parameters`
// values with the bias from `saved` (its block), or at 0 when the save has none.
void put_undropped_bias(DenseState& state, const UndroppedBias& bias, std::size_t parameters,
                        const std::optional<table::DenseBlock>& saved, const std::string& dir) {
  state.undropped_bias = bias;
  state.values.resize(parameters, 0.0f);
  for (std::vector<float>* moment : {&state.moment1, &state.moment2}) {
    if (moment->empty()) continue;  // SGD's
    GPUBOX_EXPECTS(moment->size() == bias.before, "save ", dir, ": optimizer state '",
                   moment == &state.moment1 ? kMoment1 : kMoment2, "' has ", moment->size(),
                   " values, expected ", bias.before);
    moment->resize(parameters, 0.0f);
  }
  if (!saved.has_value()) {
    state.undropped_bias_missing = true;
    GPUBOX_LOG(INFO) << "save " << dir << " has no dense block " << kFatDeepffmBiasBlock
                     << " (made before fat_deepffm learned PaddleRec's undropped bias, or without "
                     << "dropout): that bias starts at 0";
    return;
  }
  GPUBOX_EXPECTS(saved->values.size() == 1, "save ", dir, ": its dense block ",
                 kFatDeepffmBiasBlock, " holds ", saved->values.size(), " values, not 1");
  state.values[bias.at] = saved->values[0];
  for (auto [name, moment] :
       {std::pair{kMoment1, &state.moment1}, std::pair{kMoment2, &state.moment2}}) {
    if (moment->empty()) continue;
    const auto found = saved->state.find(name);
    GPUBOX_EXPECTS(found != saved->state.end() && found->second.size() == 1, "save ", dir,
                   ": its dense block ", kFatDeepffmBiasBlock, " has no optimizer state '", name,
                   "' of 1 value");
    (*moment)[bias.at] = found->second[0];
  }
}

// A dense half holds "dense" and, of fat_deepffm with dropout, the undropped bias's block; a
// block of another name comes from a newer build and is refused rather than dropped.
void check_block_names(const table::DenseTable& dense, bool undropped_bias,
                       const std::string& dir) {
  for (const std::string& name : dense.names()) {
    if (name == kDenseBlock) continue;
    GPUBOX_EXPECTS(name == kFatDeepffmBiasBlock, "save ", dir, " holds a dense block '", name,
                   "' this build does not know (saved by a newer build?)");
    GPUBOX_EXPECTS(undropped_bias, "save ", dir, " holds the dense block ", kFatDeepffmBiasBlock,
                   ", fat_deepffm's undropped bias, which the net learns with dropout only, but "
                   "the configured model has none (another model, or hyper_parameters.dnn_dropout "
                   "0): load it with the rate it was trained at (its MODEL_MANIFEST's model_keys "
                   "record hyper_parameters.dnn_dropout), or export it (the export folds the bias "
                   "into the DNN's output bias)");
  }
}

}  // namespace

DenseState DenseState::of(const DenseModel& model, DenseOptimizer& optimizer,
                          const device::Stream& stream) {
  DenseState state;
  state.values = model.parameters().values_to_host();
  state.undropped_bias = model.undropped_bias();
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
    // A save of another dense optimizer (Adam's two moments, adagrad's one, SGD's none).
    GPUBOX_EXPECTS(host->size() == buffer.size(), "save ", dir,
                   " holds the state of another dense optimizer than the config's "
                   "hyper_parameters.optimizer.class (its '",
                   host == &moment1 ? kMoment1 : kMoment2, "' has ", host->size(),
                   " values, this optimizer keeps ", buffer.size(),
                   "): load it with the class it was trained with (its MODEL_MANIFEST's "
                   "model_keys record it)");
    if (host->empty()) continue;
    if (!undropped_bias.has_value()) {
      device::copy_async(buffer.data(), host->data(), host->size(), stream);
      continue;
    }
    device::copy_async(buffer.data(), host->data(), undropped_bias->before, stream);
    const std::size_t at = undropped_bias->at;
    if (!undropped_bias_missing)
      device::copy_async(buffer.data() + at, host->data() + at, 1, stream);
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
  // With an undropped bias, "dense" holds the values before it (and their moments).
  const std::size_t shared =
      state.undropped_bias.has_value() ? state.undropped_bias->before : state.values.size();
  table::DenseBlock block;
  block.values = head(state.values, shared);
  block.state[kMoment1] = head(state.moment1, shared);
  block.state[kMoment2] = head(state.moment2, shared);
  block.state[kSteps] = pack_steps(state.steps);
  if (state.table_steps != 0) block.state[kTableSteps] = pack_steps(state.table_steps);
  table::DenseTable dense(env);
  dense.put(kDenseBlock, std::move(block));
  if (state.undropped_bias.has_value()) {
    dense.put(kFatDeepffmBiasBlock, undropped_bias_block(state, state.undropped_bias->at));
  }
  const std::string folder = dense_dir(dir);
  throw_if_error(dense.save(folder).with_context("saving the dense parameters under " + dir));
  auto digest = table::io::read_half_digest(env, folder, table::io::kDenseHalf);
  throw_if_error(digest.status().with_context("reading back " + folder));
  return *digest;
}

DenseState load_dense_half(const std::string& dir, std::size_t parameters,
                           const std::string& network_note,
                           const std::optional<UndroppedBias>& undropped_bias) {
  table::DenseTable dense;
  Status loaded = dense.load(dense_dir(dir));
  if (loaded.code() == Status::Code::kCorruption) {
    loaded = loaded.with_context("the save " + dir +
                                 " is damaged: move it (and the saves after it) out of the "
                                 "folder to resume from the save before, or load another");
  }
  throw_if_error(loaded.with_context("loading the dense parameters from " + dir));
  auto block = dense.get(kDenseBlock);
  GPUBOX_EXPECTS(block.has_value(), "save ", dir, " has no dense block");
  check_block_names(dense, undropped_bias.has_value(), dir);
  // The undropped bias is no part of "dense": the model's values before it are.
  const std::size_t shared = undropped_bias.has_value() ? undropped_bias->before : parameters;
  GPUBOX_EXPECTS(
      block->values.size() == shared, "save ", dir, " holds ", block->values.size(),
      " dense parameters but the configured model has ", shared,
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
  if (undropped_bias.has_value()) {
    put_undropped_bias(state, *undropped_bias, parameters, dense.get(kFatDeepffmBiasBlock), dir);
  }
  return state;
}

}  // namespace gpubox::trainer
