#include "dataset/dataset_config.hpp"

#include "common/config/config_document.hpp"
#include "common/config/network_shape.hpp"
#include "dataset/paddlerec_readers.hpp"
#include "dataset/pipe_command.hpp"

namespace gpubox::dataset {

StatusOr<DatasetConfig> dataset_config_from(const config::ConfigDocument& doc) {
  DatasetConfig c;
  c.data_format = doc.get_enum("runner.data_format", kDataFormatNames);
  // A PaddleRec model folder's feeds and its reader's transform, where the config leaves them.
  const ReaderProfile reader = paddlerec_reader_profile(doc);
  c.label_name = doc.get_string("runner.label_name");
  if (!reader.label_name.empty()) c.label_name = reader.label_name;
  c.dense_name = doc.get_string("runner.dense_name");
  c.slots = doc.get_string_list("hyper_parameters.slot_names");
  // The document checked that slot_names, when given, has sparse_inputs_slots - 1 names.
  const int sparse_inputs_slots = doc.get_int("hyper_parameters.sparse_inputs_slots");
  // flen's avazu reader counts its fields without the label; a format the config names instead
  // reads as that format does.
  const bool avazu =
      reader.avazu && (c.data_format == DataFormat::kAuto || c.data_format == DataFormat::kAvazu);
  if (c.slots.empty()) {
    c.slots = numbered_slots(sparse_inputs_slots + (avazu ? 1 : 0), c.label_name);
  }
  if (avazu) c.data_format = DataFormat::kAvazu;
  // As the table part reads it (ffm's rows are as wide as the fields): slot_dnn's folder has none.
  c.dense_dim = config::resolve_dense_dim(doc);
  if (avazu && !doc.is_set("hyper_parameters.dense_input_dim")) c.dense_dim = 0;
  c.multislot_order = doc.get_string_list("runner.multislot_order");
  if (!reader.multislot_order.empty()) {
    c.multislot_order = reader.multislot_order;
    c.multislot_order_from = "the field order of models/rank/" + reader.model +
                             "'s reader output (runner.multislot_order replaces it)";
  }
  c.dense_transform = reader.dense;
  c.reader_notes = reader.notes;
  c.feasign_first = doc.get_enum("runner.slot_token_order", config::kSlotTokenOrderNames) ==
                    config::SlotTokenOrder::kFeasignFirst;
  c.token_order_set = doc.is_set("runner.slot_token_order");
  c.ignore_unknown_slots = doc.get_bool("runner.ignore_unknown_slots");
  c.pipe_command = doc.get_string("runner.pipe_command");
  set_pipe_arguments(doc.get_enum("runner.pipe_command_args", config::kPipeCommandArgsNames),
                     doc.file_path(), doc.get_string("runner.pipe_utils_path"), &c);
  c.thread_num = doc.get_int("runner.thread_num");
  c.batch_size = doc.get_int("runner.train_batch_size");
  c.strict_parse = doc.get_bool("runner.strict_parse");
  c.max_malformed_share = doc.get_float("runner.max_malformed_share");
  c.max_line_bytes = doc.get_int<std::size_t>("runner.max_line_bytes");
  c.criteo_dense = doc.get_enum("runner.criteo_dense", kCriteoDenseNames);
  // PaddleRec's LR/FM configs name their feat_idx lines' field count: what this config reads;
  // its dlrm names the sparse fields its interaction reads.
  const int num_field = doc.get_int("hyper_parameters.num_field");
  const int sparse = static_cast<int>(c.slots.size());
  const int fields = c.dense_dim + sparse;
  if (num_field != 0 && num_field != fields && num_field != sparse) {
    return Status::InvalidArgument(
        doc.source() + ": hyper_parameters.num_field: " + std::to_string(num_field) +
        " fields, but dense_input_dim (" + std::to_string(c.dense_dim) + ") and the " +
        std::to_string(sparse) + " sparse slots of sparse_inputs_slots make " +
        std::to_string(fields) + " per line (PaddleRec's LR and FM) and " + std::to_string(sparse) +
        " sparse fields (its dlrm)");
  }
  const Status st = validate(c);
  if (!st.ok()) return Status::InvalidArgument(doc.source() + ": " + st.message());
  return c;
}

StatusOr<DatasetConfig> load_dataset_config(const std::string& path,
                                            const std::vector<std::string>& overrides) {
  StatusOr<config::ConfigDocument> doc = config::ConfigDocument::load(path, overrides);
  if (!doc.ok()) return doc.status();
  return dataset_config_from(*doc);
}

std::vector<std::string> cost_hints(const DatasetConfig& config, int cards, unsigned cores) {
  std::vector<std::string> hints;
  if (cores > 0 && static_cast<unsigned>(config.thread_num) > cores) {
    hints.push_back(
        "runner.thread_num: " + std::to_string(config.thread_num) + " reader threads on " +
        std::to_string(cores) + " cores: loading gets no faster past " + std::to_string(cores) +
        (config.pipe_command.empty() ? "" : " (each runs its own pipe_command process)") +
        "; the extra threads only take turns");
  }
  if (config.batch_size < kSmallBatch) {
    hints.push_back(
        "runner.train_batch_size: " + std::to_string(config.batch_size) +
        " instance(s) per card per step (" + std::to_string(config.batch_size * cards) + " over " +
        std::to_string(cards) +
        " card(s)): every step pays a fixed cost (key exchange, a dense all-reduce and an "
        "optimizer step over all dense parameters), so expect far fewer examples/s than with "
        "a few hundred per card; the results are exact all the same");
  }
  return hints;
}

}  // namespace gpubox::dataset
