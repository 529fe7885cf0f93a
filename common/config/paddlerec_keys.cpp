// PaddleRec's names in a GPUBox config: its keys that GPUBox accepts and ignores (each with
// why) and its spellings of GPUBox's keys. The key table itself is config_keys.cpp; PaddleRec's
// table_parameters section is read by paddlerec_tables.cpp.
#include <string>
#include <vector>

#include "common/config/config_keys.hpp"
#include "common/error.hpp"

namespace gpubox::config {
namespace {

// PaddleRec's keys that GPUBox ignores. Sources: the runner.* and hyper_parameters.* keys read
// by PaddleRec's tools/*trainer*.py, tools/*infer*.py and tools/utils/ (config.get), and the
// runner.* keys of its models/rank/*/*.yaml, and the hyper_parameters of the models/rank networks
// GPUBox builds that change nothing in GPUBox. Hyper-parameters of networks GPUBox does not build
// (din's, difm's, ...) are not here: they stay unknown keys.
void add_ignored_runner_keys(std::vector<IgnoredKey>& t) {
  const auto key = [&](std::string name, std::string reason) {
    t.push_back(IgnoredKey{"runner." + std::move(name), std::move(reason), false});
  };
  // clang-format off
  key("auc_num", "PaddleRec's count of AUC metrics; GPUBox reports one AUC per pass");
  key("batch_generator", "PaddleRec's Python batch generator; GPUBox's readers build batches");
  key("batch_size", "batch size of PaddleRec's heter and DataLoader loops; GPUBox reads runner.train_batch_size");
  key("candidate_size", "PaddleRec's feature-importance tool setting");
  key("CE", "PaddleRec's continuous-evaluation switch of its test harness");
  key("checkpoint_per_pass", "PaddleRec online trainer's checkpoint cadence; GPUBox saves after every pass (runner.model_save_path)");
  key("data_batch_size", "batch size of PaddleRec's data preparation scripts");
  key("data_dir", "PaddleRec online trainer's data root; GPUBox reads runner.train_data_dir or runner.pass_dirs");
  key("data_donefile", "PaddleRec online trainer's done-file wait; GPUBox reads the folders it is given");
  key("data_sleep_second", "PaddleRec online trainer's polling interval");
  key("days", "PaddleRec online trainer's day list; GPUBox's passes are runner.pass_dirs");
  key("dump_fields", "PaddleRec's dump of variables; GPUBox writes predictions with gpubox_train --predictions_out");
  key("dump_fields_path", "(see runner.dump_fields)");
  key("dump_param", "(see runner.dump_fields)");
  key("emb_weight_name", "PaddleRec's pretrained-embedding variable name");
  key("end_day", "PaddleRec online trainer's last day; GPUBox's passes are runner.pass_dirs");
  key("example_count_method", "PaddleRec's ips unit (example or word); GPUBox counts examples");
  key("fs_client", "PaddleRec's HDFS/AFS client; GPUBox reads the local file system (a mount, or pipe_command)");
  t.back().section = true;
  key("fs_name", "PaddleRec's HDFS name node; GPUBox reads the local file system (a mount, or pipe_command)");
  key("fs_ugi", "PaddleRec's HDFS user; GPUBox reads the local file system");
  key("infer_data_dir", "PaddleRec offline-infer data; GPUBox evaluates runner.test_data_dir or --infer_data_dir");
  key("infer_dump_fields_dir", "(see runner.dump_fields)");
  key("infer_reader_type", "PaddleRec's reader kind for inference; GPUBox loads evaluation data like training data");
  key("infer_thread_num", "PaddleRec's inference reader threads; GPUBox uses runner.thread_num");
  key("inference", "PaddleRec's inference-service switch; GPUBox evaluates with gpubox_train --mode infer");
  key("is_train", "PaddleRec model-config switch between training and inference");
  key("last_epoch", "the epoch PaddleRec's trainer resumes after; GPUBox resumes from a save (runner.model_init_path)");
  key("local_sparse", "PaddleRec's local sparse tables; GPUBox's sparse table is sharded over the cards");
  key("mode", "PaddleRec model-config run mode");
  key("model_mode", "PaddleRec's fleet.load_model mode; GPUBox saves name their kind in MANIFEST");
  key("model_path", "PaddleRec model-config model folder; GPUBox saves under runner.model_save_path");
  key("need_dump", "(see runner.dump_fields)");
  key("need_infer_dump", "(see runner.dump_fields)");
  key("need_prune", "PaddleRec online trainer's model pruning; GPUBox shrinks rows by the sparse_optimizer delete_* keys");
  key("need_train_dump", "(see runner.dump_fields)");
  key("num_workers", "PaddleRec DataLoader's worker processes; GPUBox's reader threads are runner.thread_num");
  key("out_vec_path", "PaddleRec's pretrained-embedding file");
  key("parse_content", "PaddleRec's InMemoryDataset content field; GPUBox's formats carry none");
  key("parse_ins_id", "PaddleRec's InMemoryDataset instance id field; GPUBox's formats carry none");
  key("pass_per_day", "PaddleRec online trainer's passes per day; GPUBox's passes are runner.pass_dirs");
  key("prefetch", "PaddleRec online trainer's prefetch of the next pass; GPUBox's is runner.prefetch_passes");
  key("preload_thread_num", "PaddleRec online trainer's preload threads; GPUBox uses runner.thread_num");
  key("print_period", "print interval of PaddleRec's heter loop; GPUBox reads runner.print_interval");
  key("reader_batch_size", "batch size of PaddleRec's reader scripts; GPUBox reads runner.train_batch_size");
  key("remote_sparse", "PaddleRec's remote sparse tables; GPUBox's host tier is gpubox_server");
  key("save_delta_frequency", "PaddleRec online trainer's delta saves; GPUBox's save kind is runner.save_mode");
  key("save_first_base", "PaddleRec online trainer's first base save; GPUBox's save kind is runner.save_mode");
  key("save_inference_feed_varnames", "PaddleRec's inference-program export; GPUBox saves its own model (runner.model_save_path)");
  key("save_inference_fetch_varnames", "(see runner.save_inference_feed_varnames)");
  key("shots_shuffle_list", "PaddleRec's feature-importance tool setting");
  key("shuffle_thread_num", "PaddleRec's global-shuffle threads; GPUBox shuffles each pass locally (runner.shuffle)");
  key("split_interval", "PaddleRec online trainer's minutes per pass; GPUBox's passes are runner.pass_dirs");
  key("split_per_pass", "(see runner.split_interval)");
  key("start_day", "PaddleRec online trainer's first day; GPUBox's passes are runner.pass_dirs");
  key("train_dump_fields_dir", "(see runner.dump_fields)");
  key("train_thread_num", "PaddleRec online trainer's reader threads; GPUBox uses runner.thread_num");
  key("use_inference", "PaddleRec's inference-program export; GPUBox saves its own model (runner.model_save_path)");
  key("use_npu", "PaddleRec's NPU switch; GPUBox runs on CUDA cards or the cpu build");
  key("use_out_vec", "PaddleRec's pretrained-embedding switch");
  key("use_save_data", "PaddleRec's switch to save the reader's output");
  key("use_visual", "PaddleRec's VisualDL logging; GPUBox appends metrics to runner.metrics_path");
  key("use_xpu", "PaddleRec's XPU switch; GPUBox runs on CUDA cards or the cpu build");
  key("user_define_reader", "PaddleRec's Python reader class switch; GPUBox reads files itself (or through pipe_command)");
  key("warmup_model_path", "the model PaddleRec's servers start from; GPUBox's is runner.model_init_path");
  key("with_coordinator", "PaddleRec's federated-learning coordinator");
  // clang-format on
}

// The hyper_parameters.* keys of the networks GPUBox builds that change nothing in GPUBox.
void add_ignored_hyper_keys(std::vector<IgnoredKey>& t) {
  // clang-format off
  t.push_back(IgnoredKey{"hyper_parameters.adam_d2sum", "PaddleRec's fleet strategy switch for its sparse Adam; GPUBox's sparse optimizer is hyper_parameters.sparse_optimizer.class", false});
  const auto hyper = [&](std::string name, std::string reason) {
    t.push_back(IgnoredKey{"hyper_parameters." + std::move(name), std::move(reason), false});
  };
  hyper("optimizer.adam_lazy_mode", "Paddle's Adam lazy_mode (only the embedding rows of the batch step), which no PaddleRec code reads (its static models pass lazy_mode=True whatever the key says); GPUBox's sparse rows always step only when their key is in the batch, the dense parameters every step, and rows under the config's Adam correct its moments as Paddle's mode does: per table without runner.sync_mode (its lazy adam op), per row with one (its parameter servers' rules, PSGPU's too): hyper_parameters.sparse_optimizer.adam_bias_correction");
  hyper("dnn_use_bn", "PaddleRec's dcn and dcn_v2 read it (static_model.py, dygraph_model.py) and pass it to no layer: their DNNs have no batch norm whatever it says, as GPUBox's");
  hyper("clip_by_norm", "PaddleRec's dcn hands it to its network, which keeps it unused, and dcn_v2 reads it unused: neither clips by it (dcn_v2's dygraph trainer clips by hyper_parameters.optimizer.clip_by_norm, 10 by default, which GPUBox builds: see that key)");
  hyper("dict_dim", "PaddleRec slot_dnn's embedding table size; GPUBox tables grow as keys come");
  hyper("feature_number", "PaddleRec autoint's embedding table size; GPUBox tables grow as keys come");
  hyper("use_sparse", "PaddleRec autoint's sparse-gradient switch for its embedding; GPUBox's embedding rows always take sparse per-key updates");
  hyper("is_sparse", "PaddleRec dcn's sparse-gradient switch for its embedding; GPUBox's embedding rows always take sparse per-key updates");
  t.push_back(IgnoredKey{"hyper_parameters.seed", "the seed of PaddleRec's static trainer; GPUBox's is runner.seed", false});
  // clang-format on
}

std::vector<IgnoredKey> build_ignored() {
  std::vector<IgnoredKey> t;
  add_ignored_runner_keys(t);
  add_ignored_hyper_keys(t);
  return t;
}

}  // namespace

const std::vector<IgnoredKey>& ignored_paddlerec_keys() {
  static const std::vector<IgnoredKey> table = [] {
    std::vector<IgnoredKey> t = build_ignored();
    for (const IgnoredKey& k : t) {
      GPUBOX_EXPECTS(find_key(k.name) == nullptr && !is_section(k.name),
                     "config key table: ", k.name, " is both a key and an ignored PaddleRec key");
    }
    return t;
  }();
  return table;
}

const std::vector<KeyAlias>& key_aliases() {
  using Kind = KeyAlias::Kind;
  const std::string h = "hyper_parameters.";
  // clang-format off
  static const std::vector<KeyAlias> aliases = {
      {"runner.init_model_path", "runner.model_init_path", Kind::kSame, "", "", "PaddleRec's online and offline-infer starting model (slot_dnn): a GPUBox save here", 0, ""},
      {h + "cross_num", h + "cross_layers", Kind::kSame, "", "", "PaddleRec dcn's and dcn_v2's number of cross layers", 0, ""},
      {h + "low_rank", h + "cross_rank", Kind::kSame, "", "", "PaddleRec dcn_v2's rank of the DCN-Mix experts (its plain cross layers are full rank)", 0, h + "cross_mixture"},
      {h + "is_Stacked", h + "dcn_structure", Kind::kBoolChoice, "stacked", "parallel", "PaddleRec dcn_v2's structure: True stacked, False parallel", 0, ""},
      {h + "layer_sizes", h + "fc_sizes", Kind::kSame, "", "", "PaddleRec slot_dnn's hidden layers", 0, ""},
      {h + "top_layer_sizes", h + "fc_sizes", Kind::kOutputLayerList, "", "", "PaddleRec dlrm's top MLP: its hidden layers, then the output layer (2: in PaddleRec's dlrm folder its two-class softmax, hyper_parameters.dlrm_output softmax2 unless set, elsewhere one logit; 1: one logit)", 0, ""},
      {h + "embedding_dim", h + "sparse_feature_dim", Kind::kOffset, "", "", "PaddleRec autoint's embedding width per key: sparse_feature_dim is one more (embed_w, its first-order weight, comes first)", 1, ""},
      {h + "emb_dim", h + "sparse_feature_dim", Kind::kSame, "", "", "PaddleRec slot_dnn's embedding width per key (1 wide weight + the embedding, as sparse_feature_dim)", 0, ""},
      {h + "slot_num", h + "sparse_inputs_slots", Kind::kOffset, "", "", "PaddleRec slot_dnn's sparse slots (2 ... slot_num + 1): sparse_inputs_slots is one more (the label counts as one)", 1, ""},
      {h + "reg", h + "sparse_optimizer.l1_decay", Kind::kSame, "", "", "PaddleRec logistic_regression's L1Decay of its weights (embed_w)", 0, ""},
      {h + "use_low_rank_mixture", h + "cross_mixture", Kind::kSame, "", "", "PaddleRec dcn_v2's switch to DCN-Mix (a gated mixture of low-rank experts per cross layer)", 0, ""},
      {h + "num_experts", h + "cross_experts", Kind::kSame, "", "", "PaddleRec dcn_v2's experts per DCN-Mix cross layer", 0, ""},
      {h + "l2_reg_cross", h + "cross_l2", Kind::kSame, "", "", "PaddleRec dcn's L2 on the cross layers (its net adds the sum of squares of x_l * w_l, without the coefficient; its dcn_v2 reads the key and adds nothing)", 0, ""},
  };
  // clang-format on
  return aliases;
}

const KeyAlias* find_alias(std::string_view name) {
  for (const KeyAlias& a : key_aliases()) {
    if (name == a.name) return &a;
  }
  return nullptr;
}

const IgnoredKey* find_ignored(std::string_view name) {
  for (const IgnoredKey& k : ignored_paddlerec_keys()) {
    if (name == k.name) return &k;
    if (k.section && name.size() > k.name.size() && name.compare(0, k.name.size(), k.name) == 0 &&
        name[k.name.size()] == '.') {
      return &k;
    }
  }
  return nullptr;
}

}  // namespace gpubox::config
