// PaddleRec's table_parameters (its ps/table accessor config, as slot_dnn's configs write it):
//
//   table_parameters:
//     <table>:                          one sparse table (GPUBox has one)
//       table_class, shard_num
//       accessor:
//         accessor_class, fea_dim, embedx_dim, embedx_threshold
//         embed_sgd_param:  { name: <rule>, <rule block>: { learning_rate, initial_g2sum,
//         embedx_sgd_param:                   initial_range, weight_bounds, beta1_decay_rate, ... }
//         } ctr_accessor_param: { nonclk_coeff, click_coeff, show_click_decay_rate, ... }
//
// read as the keys of GPUBox's sparse rule (hyper_parameters.sparse_optimizer.*), which is
// Paddle's CtrDymf accessor with its sparse SGD rules (ARCHITECTURE §4).
#include "common/config/detail/paddlerec_tables.hpp"

#include <yaml-cpp/yaml.h>

#include <string>
#include <utility>
#include <vector>

namespace gpubox::config::detail {
namespace {

const std::string kSo = "hyper_parameters.sparse_optimizer.";

// PaddleRec's sparse rule names (ps/table/sparse_sgd_rule.h) -> sparse_optimizer.class.
constexpr std::pair<const char*, const char*> kRuleNames[] = {
    {"SparseNaiveSGDRule", "sgd"},
    {"SparseAdaGradSGDRule", "adagrad"},
    {"SparseAdamSGDRule", "adam"},
    {"SparseSharedAdamSGDRule", "shared_adam"},
};

// What one leaf means, by its path under the table ('*': the rule block's own name, which
// PaddleRec's configs name after the rule: adagrad, naive, adam). `key` empty: no effect, `note`
// says why.
struct Leaf {
  std::string path;
  std::string key;
  std::string note;
};

const std::vector<Leaf>& leaves() {
  static const std::vector<Leaf> table = [] {
    std::vector<Leaf> t = {
        {"table_class", "",
         "PaddleRec's table kind; GPUBox's host tier is one sparse table in memory (a RocksDB "
         "tier under it: runner.rocksdb_path)"},
        {"shard_num", "runner.host_table_shards", ""},
        {"accessor.accessor_class", "",
         "PaddleRec's row accessor; GPUBox's row is CtrDymfAccessor's (show, click, embed_w, "
         "embedx), its rule hyper_parameters.sparse_optimizer.*"},
        {"accessor.fea_dim", "",
         "PaddleRec's pulled width (embedx_dim + 3: show, click, embed_w); GPUBox derives it "
         "from sparse_feature_dim"},
        {"accessor.embedx_threshold", kSo + "embedx_threshold", ""},
    };
    for (const char* leaf : {"nonclk_coeff", "show_click_decay_rate", "delete_threshold",
                             "delete_after_unseen_days", "show_scale"}) {
      t.push_back({std::string("accessor.ctr_accessor_param.") + leaf, kSo + leaf, ""});
    }
    t.push_back({"accessor.ctr_accessor_param.click_coeff", kSo + "clk_coeff", ""});
    for (const char* leaf : {"base_threshold", "delta_threshold", "delta_keep_days"}) {
      t.push_back({std::string("accessor.ctr_accessor_param.") + leaf, "",
                   "PaddleRec's save filter (which rows a base or delta save writes); GPUBox's "
                   "saves write every row (runner.save_mode delta: those changed since the last)"});
    }
    t.push_back({"accessor.ctr_accessor_param.ssd_unseenday_threshold", "",
                 "PaddleRec's SSD table's days before a row goes to disk; GPUBox's is "
                 "runner.cold_after_days (with runner.rocksdb_path)"});
    for (const auto& [part, prefix] : {std::pair<const char*, const char*>{"embed_sgd_param", ""},
                                       {"embedx_sgd_param", "mf_"}}) {
      const std::string block = std::string("accessor.") + part + ".*.";
      for (const char* leaf : {"learning_rate", "initial_g2sum", "initial_range"}) {
        t.push_back({block + leaf, kSo + prefix + leaf, ""});
      }
      // Adam's decays are one setting for both parts in GPUBox: they must agree.
      for (const char* leaf : {"beta1_decay_rate", "beta2_decay_rate", "ada_epsilon"}) {
        t.push_back({block + leaf, kSo + leaf, ""});
      }
    }
    return t;
  }();
  return table;
}

std::vector<std::string> split(const std::string& path) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (std::size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', start)) {
    parts.push_back(path.substr(start, dot - start));
    start = dot + 1;
  }
  parts.push_back(path.substr(start));
  return parts;
}

bool matches(const std::string& pattern, const std::string& path) {
  const std::vector<std::string> p = split(pattern), q = split(path);
  if (p.size() != q.size()) return false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (p[i] != "*" && p[i] != q[i]) return false;
  }
  return true;
}

struct Walker {
  std::vector<TableSetting>* settings;
  std::vector<TableNote>* notes;
  int* error_line;

  Status fail(const std::string& from, int line, const std::string& what) const {
    *error_line = line;
    return Status::InvalidArgument(from + ": " + what);
  }

  // The rule name of embed_sgd_param / embedx_sgd_param.
  Status rule_name(const std::string& from, const YAML::Node& value, int line) const {
    const std::string name = value.IsScalar() ? value.Scalar() : "";
    for (const auto& [paddle, gpubox] : kRuleNames) {
      if (name == paddle) {
        settings->push_back({from, kSo + "class", YAML::Node(gpubox), line});
        return Status::OK();
      }
    }
    if (name == "StdAdaGradSGDRule") {
      return fail(from, line,
                  "StdAdaGradSGDRule (a g2sum per dimension) is not built; GPUBox's adagrad "
                  "shares one g2sum per part, as SparseAdaGradSGDRule");
    }
    return fail(from, line,
                "unknown sparse rule '" + name +
                    "' (GPUBox builds SparseNaiveSGDRule, SparseAdaGradSGDRule, "
                    "SparseAdamSGDRule, SparseSharedAdamSGDRule)");
  }

  // One leaf: `path` is under the table, `from` the whole dotted name.
  Status leaf(const std::string& path, const std::string& from, const YAML::Node& value,
              int line) const {
    if (matches("accessor.embed_sgd_param.name", path) ||
        matches("accessor.embedx_sgd_param.name", path)) {
      return rule_name(from, value, line);
    }
    const bool embedx = path.rfind("accessor.embedx_sgd_param.", 0) == 0;
    if (matches("accessor.embed_sgd_param.*.weight_bounds", path) ||
        matches("accessor.embedx_sgd_param.*.weight_bounds", path)) {
      if (!value.IsSequence() || value.size() != 2) {
        return fail(from, line, "expected a list of two bounds [min, max]");
      }
      const std::string prefix = kSo + (embedx ? "mf_" : "");
      settings->push_back({from, prefix + "min_bound", value[0], line});
      settings->push_back({from, prefix + "max_bound", value[1], line});
      return Status::OK();
    }
    if (path == "accessor.embedx_dim") {
      long long dim = 0;
      if (!value.IsScalar() || !YAML::convert<long long>::decode(value, dim)) {
        return fail(from, line, "expected an integer");
      }
      // sparse_feature_dim counts the wide weight embed_w too.
      settings->push_back(
          {from, "hyper_parameters.sparse_feature_dim", YAML::Node(std::to_string(dim + 1)), line});
      return Status::OK();
    }
    for (const Leaf& l : leaves()) {
      if (!matches(l.path, path)) continue;
      if (l.key.empty()) {
        notes->push_back({from, l.note});
      } else {
        settings->push_back({from, l.key, value, line});
      }
      return Status::OK();
    }
    return fail(from, line,
                "not a PaddleRec table setting GPUBox knows (it reads table_class, shard_num and "
                "the accessor's accessor_class, fea_dim, embedx_dim, embedx_threshold, "
                "embed_sgd_param, embedx_sgd_param and ctr_accessor_param)");
  }

  Status walk(const YAML::Node& node, const std::string& path, const std::string& from) const {
    for (const auto& item : node) {
      const int line = item.first.Mark().line + 1;
      const std::string name = item.first.Scalar();
      const std::string sub = path.empty() ? name : path + "." + name;
      if (item.second.IsMap()) {
        GPUBOX_RETURN_IF_ERROR(walk(item.second, sub, from + "." + name));
      } else {
        GPUBOX_RETURN_IF_ERROR(leaf(sub, from + "." + name, item.second, line));
      }
    }
    return Status::OK();
  }
};

}  // namespace

std::vector<TableLeafDoc> table_parameter_docs() {
  std::string rules;
  for (const auto& [paddle, gpubox] : kRuleNames) {
    rules += (rules.empty() ? "" : ", ") + std::string(paddle) + " = " + gpubox;
  }
  std::vector<TableLeafDoc> out = {
      {"accessor.embed_sgd_param.name, accessor.embedx_sgd_param.name", kSo + "class",
       rules + " (one rule for both parts)"},
      {"accessor.embed_sgd_param.*.weight_bounds", kSo + "min_bound, " + kSo + "max_bound", ""},
      {"accessor.embedx_sgd_param.*.weight_bounds", kSo + "mf_min_bound, " + kSo + "mf_max_bound",
       ""},
      {"accessor.embedx_dim", "hyper_parameters.sparse_feature_dim", "embedx_dim + 1"},
  };
  for (const Leaf& l : leaves()) out.push_back({l.path, l.key, l.note});
  return out;
}

Status translate_table_parameters(const YAML::Node& section, std::vector<TableSetting>* settings,
                                  std::vector<TableNote>* notes, int* error_line) {
  *error_line = section.Mark().line + 1;
  if (section.IsNull()) return Status::OK();
  if (!section.IsMap()) {
    return Status::InvalidArgument("table_parameters: expected a map of tables");
  }
  const Walker walker{settings, notes, error_line};
  std::string first;
  for (const auto& table : section) {
    const std::string name = "table_parameters." + table.first.Scalar();
    const int line = table.first.Mark().line + 1;
    if (!first.empty()) {
      return walker.fail(name, line, "a second table: GPUBox has one sparse table (" + first + ")");
    }
    first = name;
    if (!table.second.IsMap()) return walker.fail(name, line, "expected a map of table settings");
    GPUBOX_RETURN_IF_ERROR(walker.walk(table.second, "", name));
  }
  return Status::OK();
}

}  // namespace gpubox::config::detail
