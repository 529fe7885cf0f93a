// SparseTable::save / load (the folder layout is described in sparse_table.hpp).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/config/slot_dims.hpp"
#include "common/hash.hpp"
#include "common/logging.hpp"
#include "common/thread_annotations.hpp"
#include "table/io/save_dir.hpp"
#include "table/parallel.hpp"
#include "table/row_codec.hpp"
#include "table/sparse_table.hpp"
#include "table/unseen_along.hpp"

namespace gpubox::table {
namespace {

constexpr const char* kSparseKind = "sparse";
// Bytes of a part file a load reads at a time, per thread (its records parsed then padded to
// the widest record: a few times this in memory): thousands of records, far above any one.
constexpr std::size_t kLoadChunkBytes = std::size_t{8} << 20;

std::string part_name(uint32_t shard) { return "part-" + std::to_string(shard); }
std::string delete_name(uint32_t shard) { return "delete-" + std::to_string(shard); }
std::string unseen_name(uint32_t shard) { return "unseen-" + std::to_string(shard); }
// A delta whose loader must replay the shrinks it records: another mode than "delta", so that
// an engine from before it refuses the save by name instead of loading unaged rows.
constexpr const char* kDeltaWithShrinks = "delta+shrinks";

const char* field_names(RecordKind kind) {
  return kind == RecordKind::kModel ? "show,click,slot,embed_w,mf_size,embedx_w[mf_dim]"
                                    : "full_row[stride]";
}

// A listed file, parsed; pass 1 parses every file and drops the result, pass 2 applies (an
// unseen file is read along with its part file, UnseenAlong).
enum class PartKind { kRows, kDeletions, kUnseen };
struct PartFile {
  const io::ManifestFile* entry = nullptr;
  PartKind kind = PartKind::kRows;
  // A part file's unseen-<shard> (with unseen_files): its rows' days, read along with them.
  const io::ManifestFile* unseen = nullptr;
};

// The records of a listed part (or deletion) file, a chunk at a time (kLoadChunkBytes), to
// `on_records`, with a part file's rows' unseen days read along from its unseen-<shard> (null
// without one): what SparseTable::load verifies in a first pass and applies in a second. The
// record counts are checked against the MANIFEST at the end. An unseen file alone reads nothing.
using PartRecords = std::function<Status(const std::vector<uint64_t>&, const std::vector<float>&,
                                         const std::vector<float>*)>;
Status stream_part(io::FileEnv* fs, const std::string& path, const PartFile& f, SaveForm form,
                   const RecordShape& shape, const PartRecords& on_records) {
  if (f.kind == PartKind::kUnseen) return Status::OK();  // read along with its part file
  RecordShape keys_only;
  keys_only.fixed = 0;
  const RecordShape& file_shape = f.kind == PartKind::kRows ? shape : keys_only;
  std::unique_ptr<UnseenAlong> along;
  if (f.unseen != nullptr) {
    along = std::make_unique<UnseenAlong>(*f.unseen, form, path + "/" + f.unseen->name);
    GPUBOX_RETURN_IF_ERROR(along->open(fs, path, kLoadChunkBytes));
  }
  const std::string file = path + "/" + f.entry->name;
  std::vector<uint64_t> keys;
  std::vector<float> recs, days;
  RecordChunk at;
  uint64_t records = 0;
  GPUBOX_RETURN_IF_ERROR(io::read_verified_chunks(
      fs, path, *f.entry, kLoadChunkBytes,
      [&](const char* data, std::size_t n, bool last) -> StatusOr<std::size_t> {
        keys.clear();
        recs.clear();
        at.last = last;
        auto took = parse_record_chunk(form, data, n, file_shape, file, at, &keys, &recs);
        if (!took.ok()) return took.status();
        at.byte += took->bytes;
        at.line += took->lines;
        records += keys.size();
        if (along != nullptr) GPUBOX_RETURN_IF_ERROR(along->take(keys, &days));
        GPUBOX_RETURN_IF_ERROR(on_records(keys, recs, along != nullptr ? &days : nullptr));
        return took->bytes;
      }));
  if (records != f.entry->records) {
    return Status::Corruption(file + ": " + std::to_string(records) + " records, MANIFEST says " +
                              std::to_string(f.entry->records));
  }
  return along != nullptr ? along->finish() : Status::OK();
}

// slot_dims as a save's MANIFEST records it: "slot:dim" by ascending slot, comma-separated.
std::map<int32_t, int32_t> slot_dims_map(const SlotDims& dims) {
  std::map<int32_t, int32_t> out;
  for (int32_t i = 0; i < dims.count; ++i) out[dims.slot[i]] = dims.dim[i];
  return out;
}

std::string slot_dims_text(const SlotDims& dims) {
  std::string text;
  for (const auto& [slot, dim] : slot_dims_map(dims)) {
    text += (text.empty() ? "" : ",") + std::to_string(slot) + ":" + std::to_string(dim);
  }
  return text;
}

StatusOr<std::map<int32_t, int32_t>> parse_slot_dims(const std::string& text,
                                                     const std::string& where) {
  auto items = config::parse_slot_dims_text(text, where);
  if (!items.ok()) return items.status();
  std::map<int32_t, int32_t> out;
  for (const config::SlotDim& item : *items) out[item.slot] = item.dim;
  return out;
}

}  // namespace

// A save's rows have the widths its slot_dims gave (none recorded: every row mf_dim wide); this
// table must give every slot the same width, or the saved rows would not fit it.
Status SparseTable::check_slot_dims(const io::Manifest& manifest, const std::string& where) const {
  std::map<int32_t, int32_t> saved;
  auto saved_default = manifest.get_int("mf_dim");
  if (auto text = manifest.properties.find("slot_dims"); text != manifest.properties.end()) {
    auto parsed = parse_slot_dims(text->second, where);
    if (!parsed.ok()) return parsed.status().with_context("load");
    saved = std::move(parsed).value();
    saved_default = manifest.get_int("slot_dims_default");
  }
  if (!saved_default.ok()) return saved_default.status().with_context("load " + where);
  const std::map<int32_t, int32_t> mine = slot_dims_map(optimizer_.slot_dims);
  const auto width = [](const std::map<int32_t, int32_t>& dims, int32_t slot, int64_t dflt) {
    const auto it = dims.find(slot);
    return it != dims.end() ? int64_t{it->second} : dflt;
  };
  std::map<int32_t, int32_t> slots = saved;
  slots.insert(mine.begin(), mine.end());
  for (const auto& [slot, unused] : slots) {
    const int64_t was = width(saved, slot, *saved_default);
    const int64_t is = width(mine, slot, optimizer_.mf_dim);
    if (was == is) continue;
    return Status::InvalidArgument(
        "load " + where + ": slot " + std::to_string(slot) + " was saved with embedx width " +
        std::to_string(was) + ", this config gives it " + std::to_string(is) +
        " (hyper_parameters.slot_dims and sparse_feature_dim must be those of the save)");
  }
  if (*saved_default != optimizer_.mf_dim) {
    return Status::InvalidArgument(
        "load " + where +
        ": the slots not in hyper_parameters.slot_dims were saved with embedx "
        "width " +
        std::to_string(*saved_default) + ", this config gives them " +
        std::to_string(optimizer_.mf_dim) + " (mf_dim = sparse_feature_dim - 1)");
  }
  return Status::OK();
}

Status SparseTable::save(const std::string& path, SaveKind mode, SaveForm form, io::FileEnv* env) {
  io::FileEnv* const fs = env != nullptr ? env : env_;
  if (mode == SaveKind::kNone) return Status::InvalidArgument("save " + path + ": save mode none");
  MutexLock lock(io_mu_);
  // A table that holds part of a save (its load failed while applying it) is no model anyone
  // trained: saved, it would be taken for one by every later load and resume.
  if (!partly_loaded_.empty()) {
    return Status::InvalidArgument("save " + path + ": this table holds only part of " +
                                   partly_loaded_ +
                                   " (its load failed while applying it): load a base or "
                                   "checkpoint save first");
  }
  // Rows changed from here on carry a later epoch and belong to the next delta.
  const uint32_t epoch = epochs_.current.fetch_add(1);
  // From the first save on, deletions are remembered for deltas; set before any shard is
  // snapshotted, so a row deleted during this save is in the next delta's deletions.
  epochs_.track_deletions.store(true);
  const DeltaRows delta_rows{epochs_.saved_through.load(), next_delta_every_row_};
  auto staged = io::StagedSave::begin(fs, path, kSparseKind);
  if (!staged.ok()) return staged.status().with_context("save " + path);
  GPUBOX_RETURN_IF_ERROR(
      for_shards(rows_now() >= kParallelKeys, [&](uint32_t s) {
        ShardSnapshot snap;
        GPUBOX_RETURN_IF_ERROR(
            shards_[s]->snapshot(mode, form, delta_rows, &snap, [fs] { fs->note_progress(); }));
        GPUBOX_RETURN_IF_ERROR((*staged)->add_file(part_name(s), snap.part, snap.rows));
        if (mode != SaveKind::kCheckpoint) {
          GPUBOX_RETURN_IF_ERROR((*staged)->add_file(unseen_name(s), snap.unseen, snap.rows));
        }
        if (mode == SaveKind::kDelta) {
          GPUBOX_RETURN_IF_ERROR((*staged)->add_file(delete_name(s), snap.deletes, snap.deleted));
        }
        return Status::OK();
      }).with_context("save " + path));
  const RecordKind kind = mode == SaveKind::kCheckpoint ? RecordKind::kFullRow : RecordKind::kModel;
  std::map<std::string, std::string> props = {
      {"mode", name_of(kSaveKindNames, mode)},
      {"form", name_of(kSaveFormNames, form)},
      {"shards", std::to_string(shards_.size())},
      {"optimizer", std::to_string(static_cast<int>(optimizer_.optimizer.kind))},
      {"mf_dim", std::to_string(layout_.mf_dim)},
      {"embed_state_dim", std::to_string(layout_.embed_state_dim)},
      {"embedx_state_dim", std::to_string(layout_.embedx_state_dim)},
      {"stride", std::to_string(layout_.stride())},
      {"sparse_storage", name_of(kSparseStorageNames, layout_.storage)},
      {"record_floats", std::to_string(record_floats(kind, layout_))},
      {"fields", field_names(kind)},
      {"day", std::to_string(day_.load())},
  };
  if (mode != SaveKind::kCheckpoint) props["unseen_files"] = "1";
  if (mode == SaveKind::kDelta) add_shrinks(delta_rows.every_row, &props);
  // Rows of other widths than mf_dim's (the widest class's): their records are shorter.
  if (optimizer_.slot_dims.count > 0) {
    props["slot_dims"] = slot_dims_text(optimizer_.slot_dims);
    props["slot_dims_default"] = std::to_string(optimizer_.mf_dim);
  }
  // The save is in place from the commit's rename on. A commit that fails or throws after it (the
  // parent folder's sync) leaves it there, perhaps not durably: the shrinks it holds must not be
  // replayed again by the next delta, nor must that delta leave them out when it applies onto
  // the save before. So the next delta holds every row until the bookkeeping below is done: set
  // before the commit (a throw leaves it set), restored when the commit failed with the save surely
  // not in place (StagedSave::may_be_in_place).
  const bool every_row_before = next_delta_every_row_;
  next_delta_every_row_ = true;
  const Status committed = (*staged)->commit(kSparseKind, props);
  if (!committed.ok()) {
    if (!(*staged)->may_be_in_place()) next_delta_every_row_ = every_row_before;
    return committed.with_context("save " + path);
  }
  epochs_.saved_through.store(epoch);
  shrinks_since_save_.clear();
  next_delta_every_row_ = false;
  for (auto& shard : shards_) shard->forget_deletions(epoch);
  return Status::OK();
}

// A delta's MANIFEST: the shrinks since the previous save for its loader to replay, or that it
// holds every row (`every_row`: a shrink failed part way, there is nothing whole to replay).
void SparseTable::add_shrinks(bool every_row, std::map<std::string, std::string>* props) const {
  if (every_row) {
    (*props)["every_row"] = "1";
    return;
  }
  if (shrinks_since_save_.empty()) return;
  (*props)["mode"] = kDeltaWithShrinks;
  (*props)["shrinks"] = std::to_string(shrinks_since_save_.size());
  std::string rates;
  for (float rate : shrinks_since_save_) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.9g", rate);  // 9 digits: reads back to the same float
    rates += (rates.empty() ? "" : ",") + std::string(text);
  }
  (*props)["shrink_decay_rates"] = rates;
}

namespace {

// How a save's MANIFEST says its files are to be read.
struct SavedSparse {
  SaveKind mode = SaveKind::kNone;
  SaveForm form = SaveForm::kBinary;
  RecordKind kind = RecordKind::kModel;
  int64_t day = 0;
  int64_t shards = 0;
  bool unseen_files = false;
  std::vector<float> shrinks;  // delta+shrinks: the decay rates to replay, in order
};

// A delta+shrinks MANIFEST's shrinks and shrink_decay_rates.
StatusOr<std::vector<float>> read_shrinks(const io::Manifest& manifest, const std::string& where) {
  auto count = manifest.get_int("shrinks");
  if (!count.ok()) return count.status();
  auto text = manifest.get("shrink_decay_rates");
  if (!text.ok()) return text.status();
  std::vector<float> rates;
  std::size_t begin = 0;
  while (begin <= text->size() && !text->empty()) {
    const std::size_t comma = std::min(text->find(',', begin), text->size());
    const std::string item = text->substr(begin, comma - begin);
    char* end = nullptr;
    const float rate = std::strtof(item.c_str(), &end);
    if (item.empty() || end != item.c_str() + item.size() || !(rate >= 0.0f && rate <= 1.0f)) {
      return Status::Corruption(where + ": shrink_decay_rates item '" + item +
                                "' is not a decay rate in [0, 1]");
    }
    rates.push_back(rate);
    begin = comma + 1;
  }
  if (*count < 1 || static_cast<std::size_t>(*count) != rates.size()) {
    return Status::Corruption(where + ": shrinks " + std::to_string(*count) + " but " +
                              std::to_string(rates.size()) + " shrink_decay_rates");
  }
  return rates;
}

StatusOr<SavedSparse> read_saved_sparse(const io::Manifest& manifest, const std::string& where) {
  auto context = [&](const Status& st) { return st.with_context("load " + where); };
  SavedSparse saved;
  auto mode_text = manifest.get("mode");
  if (!mode_text.ok()) return context(mode_text.status());
  const bool with_shrinks = *mode_text == kDeltaWithShrinks;
  auto mode =
      with_shrinks ? StatusOr<SaveKind>(SaveKind::kDelta) : parse_enum(kSaveKindNames, *mode_text);
  if (!mode.ok() || *mode == SaveKind::kNone) {
    return context(Status::Corruption("unknown save mode '" + *mode_text + "'"));
  }
  saved.mode = *mode;
  if (with_shrinks) {
    auto shrinks = read_shrinks(manifest, where);
    if (!shrinks.ok()) return context(shrinks.status());
    saved.shrinks = std::move(shrinks).value();
  }
  auto form_text = manifest.get("form");
  if (!form_text.ok()) return context(form_text.status());
  auto form = parse_enum(kSaveFormNames, *form_text);
  if (!form.ok()) return context(Status::Corruption("form: " + form.status().message()));
  saved.form = *form;
  saved.kind = saved.mode == SaveKind::kCheckpoint ? RecordKind::kFullRow : RecordKind::kModel;
  saved.unseen_files = saved.kind == RecordKind::kModel && manifest.get("unseen_files").ok();
  auto day = manifest.get_int("day");
  if (!day.ok()) return context(day.status());
  saved.day = *day;
  auto shards = manifest.get_int("shards");
  if (!shards.ok()) return context(shards.status());
  saved.shards = *shards;
  return saved;
}

// Every part (and, for a delta, every deletion file; with unseen_files, every unseen file) of
// the save, each of which must be listed.
StatusOr<std::vector<PartFile>> listed_files(const io::Manifest& manifest, const SavedSparse& saved,
                                             const std::string& where) {
  std::vector<PartFile> files;
  for (int64_t s = 0; s < saved.shards; ++s) {
    std::size_t rows_at = 0;  // the shard's part file's place in `files`
    for (PartKind kind : {PartKind::kRows, PartKind::kDeletions, PartKind::kUnseen}) {
      if (kind == PartKind::kDeletions && saved.mode != SaveKind::kDelta) continue;
      if (kind == PartKind::kUnseen && !saved.unseen_files) continue;
      const std::string name = kind == PartKind::kRows        ? part_name(s)
                               : kind == PartKind::kDeletions ? delete_name(s)
                                                              : unseen_name(s);
      const io::ManifestFile* entry = nullptr;
      for (const auto& f : manifest.files) {
        if (f.name == name) entry = &f;
      }
      if (entry == nullptr) {
        return Status::Corruption("load " + where + ": " + name + " is not listed");
      }
      if (kind == PartKind::kRows) rows_at = files.size();
      if (kind == PartKind::kUnseen) files[rows_at].unseen = entry;
      files.push_back(PartFile{entry, kind});
    }
  }
  return files;
}

}  // namespace

Status SparseTable::check_saved_layout(const io::Manifest& manifest, RecordKind kind,
                                       const std::string& where) const {
  // The layout must match the table's (a checkpoint also needs the same optimizer). The storage
  // need not: records hold fp32 values (row_codec.hpp), rounded here to this table's storage.
  // A save from before sparse_storage existed was fp32.
  if (auto storage_text = manifest.get("sparse_storage"); storage_text.ok()) {
    const std::string saved = *storage_text;
    if (!parse_enum(kSparseStorageNames, saved).ok()) {
      return Status::Corruption("load " + where + ": unknown sparse_storage '" + saved + "'");
    }
    if (saved != name_of(kSparseStorageNames, layout_.storage)) {
      GPUBOX_LOG(INFO) << "load " << where << ": saved with sparse_storage " << saved
                       << ", this table keeps " << name_of(kSparseStorageNames, layout_.storage)
                       << ": the saved values are converted (rounded to nearest even when "
                          "narrowing)";
    }
  }
  // Every slot's width must match the table's too.
  GPUBOX_RETURN_IF_ERROR(check_slot_dims(manifest, where));
  struct Expect {
    const char* key;
    int64_t value;
  };
  if (kind == RecordKind::kFullRow) {
    // First: a rule's rows differ in width too, and the rule is what the user can change.
    auto saved = manifest.get_int("optimizer");
    if (!saved.ok()) return saved.status().with_context("load " + where);
    const auto mine = optimizer_.optimizer.kind;
    if (*saved != static_cast<int64_t>(mine)) {
      const auto saved_kind = static_cast<SparseOptimizerKind>(*saved);
      const bool known =
          std::any_of(std::begin(kSparseOptimizerKindNames), std::end(kSparseOptimizerKindNames),
                      [&](const auto& e) { return e.value == saved_kind; });
      const std::string saved_name =
          known ? name_of(kSparseOptimizerKindNames, saved_kind) : std::to_string(*saved);
      return Status::InvalidArgument(
          "load " + where + ": its rows were saved under sparse_optimizer.class " + saved_name +
          ", this table's rows step under " + name_of(kSparseOptimizerKindNames, mine) +
          " (a PaddleRec models/rank config that names no sparse rule takes its optimizer's, "
          "as the start line says); to load it, -o hyper_parameters.sparse_optimizer.class=" +
          saved_name);
    }
  }
  std::vector<Expect> expects = {{"mf_dim", layout_.mf_dim},
                                 {"record_floats", record_floats(kind, layout_)}};
  for (const Expect& e : expects) {
    auto v = manifest.get_int(e.key);
    if (!v.ok()) return v.status().with_context("load " + where);
    if (*v != e.value) {
      return Status::InvalidArgument("load " + where + ": saved " + e.key + " " +
                                     std::to_string(*v) + " does not match this table's " +
                                     std::to_string(e.value));
    }
  }
  return Status::OK();
}

Status SparseTable::load(const std::string& path, io::FileEnv* env) {
  io::FileEnv* const fs = env != nullptr ? env : env_;
  MutexLock lock(io_mu_);
  auto manifest = io::read_manifest(fs, path, kSparseKind);
  if (!manifest.ok()) return manifest.status().with_context("load");
  const std::string where = path + "/" + io::kManifestName;
  auto saved = read_saved_sparse(*manifest, where);
  if (!saved.ok()) return saved.status();
  const bool delta = saved->mode == SaveKind::kDelta;
  GPUBOX_RETURN_IF_ERROR(check_base_of(path, delta));
  GPUBOX_RETURN_IF_ERROR(check_saved_layout(*manifest, saved->kind, where));
  auto listed = listed_files(*manifest, *saved, where);
  if (!listed.ok()) return listed.status();
  const std::vector<PartFile>& files = *listed;
  if (saved->kind == RecordKind::kModel && !saved->unseen_files) {
    GPUBOX_LOG(INFO) << "load " << where << ": saved without unseen days (an older save): its "
                     << (delta ? "new " : "") << "rows start unseen for 0 days";
  }

  const RecordShape shape = record_shape(saved->kind, optimizer_);
  uint64_t total_records = 0;
  for (const PartFile& f : files) total_records += f.entry->records;
  const int threads = total_records >= kParallelKeys ? config_.threads : 1;
  // Pass 1 reads and parses every file without touching the table: a corrupt or partial save
  // is refused before anything already in the table is lost. Pass 2 applies. Both stream each
  // file in chunks (kLoadChunkBytes): a load holds a chunk per thread, not its files. A table
  // that holds nothing (a start from a save, the usual load) has nothing to lose: it is read
  // once, applied as read, and emptied again if the save fails part way.
  const bool nothing_to_lose = !delta && rows_now() == 0;
  auto read_file = [&](const PartFile& f, const PartRecords& on_records) {
    return stream_part(fs, path, f, saved->form, shape, on_records);
  };
  const PartRecords check_only = [](const auto&, const auto&, const auto*) { return Status::OK(); };
  if (!nothing_to_lose) {
    GPUBOX_RETURN_IF_ERROR(run_parallel(files.size(), threads, [&](std::size_t i) {
                             return read_file(files[i], check_only);
                           }).with_context("load"));
  }
  const RecordKind kind = saved->kind;
  // A base's clear of the table, or a delta's deletions, then its shrinks replayed on the rows
  // left, then its rows, each with its unseen days (UnseenAlong; a save without unseen files
  // leaves a row's as its record does: 0 for a new row, as they were for one held).
  const auto apply = [&](PartKind what) {
    return run_parallel(files.size(), threads, [&](std::size_t i) {
      if (files[i].kind != what) return Status::OK();
      return read_file(files[i], [&](const auto& keys, const auto& recs, const auto* days) {
        return what == PartKind::kDeletions ? apply_deletions(keys)
                                            : apply_part(kind, keys, recs, days);
      });
    });
  };
  return apply_load(path, saved->day, nothing_to_lose, fs, [&] {
    io_mu_.assert_held();  // apply_load calls it with io_mu_ held, as load does
    Status applied = delta ? apply(PartKind::kDeletions) : clear_for_load(fs);
    if (applied.ok()) applied = replay_shrinks(saved->shrinks, fs);
    if (applied.ok()) applied = apply(PartKind::kRows);
    return applied;
  });
}

Status SparseTable::apply_load(const std::string& path, int64_t day, bool nothing_to_lose,
                               io::FileEnv* fs, const std::function<Status()>& apply) {
  // The table holds part of the save from its first change until the last step ends whole: set
  // first, so that a step that fails or throws (bad_alloc) leaves it set.
  partly_loaded_ = path;
  const Status applied = apply();
  if (!applied.ok()) {
    if (!nothing_to_lose) {
      return applied.with_context(
          "load " + path +
          " (verified, then failed while applying it: the table holds part of it)");
    }
    GPUBOX_RETURN_IF_ERROR(clear_for_load(fs));
    return applied.with_context("load");
  }
  partly_loaded_.clear();
  day_.store(day);
  epochs_.track_deletions.store(true);
  // The table is the save now: shrinks before the load are in no delta of it.
  shrinks_since_save_.clear();
  next_delta_every_row_ = false;
  return Status::OK();
}

// Each shard cleared is a step (a server's LOAD shows it as progress: a disk tier's clear can take
// long). A shard's clear is not split further: its maps are freed at once and a disk tier's rows
// dropped by one range deletion (DiskTier::clear_shard).
Status SparseTable::clear_for_load(io::FileEnv* fs) {
  return for_shards(rows_now() >= kParallelKeys, [&](uint32_t s) {
    const Status cleared = shards_[s]->clear();
    fs->note_progress();
    return cleared;
  });
}

// A delta applies onto the save before it: a table that holds only part of a save refuses it.
Status SparseTable::check_base_of(const std::string& path, bool delta) const {
  if (!delta || partly_loaded_.empty()) return Status::OK();
  return Status::InvalidArgument(
      "load " + path +
      ": a delta applies onto the save before it, and this table holds only part of " +
      partly_loaded_ +
      " (its load failed while applying it): load a base or checkpoint save first");
}

Status SparseTable::replay_shrinks(const std::vector<float>& decay_rates, io::FileEnv* fs) {
  if (decay_rates.empty()) return Status::OK();
  // It walks every row the table holds, however few the delta's records: the live table's
  // shrinks aged every row, and the delta holds only those changed since (the rows it does hold
  // are written over after this). One pass a shard ages a row by every day at once, the shard's
  // rows in storage order (SparseShard::replay_shrinks).
  return for_shards(rows_now() >= kParallelKeys, [&](uint32_t s) {
    const Status aged = shards_[s]->replay_shrinks(decay_rates, [fs] { fs->note_progress(); });
    fs->note_progress();
    return aged;
  });
}

Status SparseTable::apply_part(RecordKind kind, const std::vector<uint64_t>& keys,
                               const std::vector<float>& recs, const std::vector<float>* days) {
  const int32_t floats = record_floats(kind, layout_);
  std::vector<uint32_t> offsets, pos;
  group(keys.data(), keys.size(), &offsets, &pos);
  std::vector<uint64_t> shard_keys;
  std::vector<float> shard_recs, shard_days;
  for (uint32_t s = 0; s < shards_.size(); ++s) {
    const uint32_t begin = offsets[s], end = offsets[s + 1];
    if (begin == end) continue;
    shard_keys.resize(end - begin);
    shard_recs.resize(std::size_t(end - begin) * floats);
    if (days != nullptr) shard_days.resize(end - begin);
    for (uint32_t j = begin; j < end; ++j) {
      shard_keys[j - begin] = keys[pos[j]];
      std::copy_n(recs.data() + std::size_t(pos[j]) * floats, floats,
                  shard_recs.data() + std::size_t(j - begin) * floats);
      if (days != nullptr) shard_days[j - begin] = (*days)[pos[j]];
    }
    GPUBOX_RETURN_IF_ERROR(shards_[s]->load_records(kind, shard_keys.data(), shard_recs.data(),
                                                    days != nullptr ? shard_days.data() : nullptr,
                                                    shard_keys.size()));
  }
  return Status::OK();
}

Status SparseTable::apply_deletions(const std::vector<uint64_t>& keys) {
  std::vector<uint32_t> offsets, pos;
  group(keys.data(), keys.size(), &offsets, &pos);
  std::vector<uint64_t> shard_keys;
  for (uint32_t s = 0; s < shards_.size(); ++s) {
    const uint32_t begin = offsets[s], end = offsets[s + 1];
    if (begin == end) continue;
    shard_keys.resize(end - begin);
    for (uint32_t j = begin; j < end; ++j) shard_keys[j - begin] = keys[pos[j]];
    GPUBOX_RETURN_IF_ERROR(shards_[s]->load_deletions(shard_keys.data(), shard_keys.size()));
  }
  return Status::OK();
}

}  // namespace gpubox::table
