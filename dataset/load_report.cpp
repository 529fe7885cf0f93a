#include "dataset/load_report.hpp"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dataset/line_parser.hpp"

namespace gpubox::dataset {
namespace {

std::string files_text(std::size_t n) { return std::to_string(n) + (n == 1 ? " file" : " files"); }

// The notes grouped by key(note) ("": left out), in the order each key first comes: the first
// note of each and how many share it.
template <class Key>
std::vector<std::pair<const FormatNote*, std::size_t>> grouped(const std::vector<FormatNote>& notes,
                                                               const Key& key) {
  std::vector<std::pair<const FormatNote*, std::size_t>> groups;
  std::map<std::string, std::size_t> index;
  for (const FormatNote& n : notes) {
    const std::string k = key(n);
    if (k.empty()) continue;
    const auto [it, fresh] = index.try_emplace(k, groups.size());
    if (fresh) groups.emplace_back(&n, 0);
    ++groups[it->second].second;
  }
  return groups;
}

// "FILE" or "FILE (and N files more)" for a group's first note.
std::string where_text(const FormatNote& first, std::size_t count) {
  return first.file + (count > 1 ? " (and " + files_text(count - 1) + " more)" : "");
}

void report_formats(const LoadStats& stats, LoadMessages* out) {
  // The inputs whose first lines a format accepts; inputs without a line (empty files, a reader
  // that wrote nothing) had no format to find.
  std::vector<const FormatNote*> read;
  for (const FormatNote& n : stats.formats) {
    if (n.sample_parsed > 0) read.push_back(&n);
  }
  bool detected = false;
  bool same = true;
  for (const FormatNote* n : read) {
    detected = detected || n->detected;
    same = same && n->format == read.front()->format;
  }
  if (detected && same) {
    out->info.push_back("data format: " + read.front()->format + " (runner.data_format auto, " +
                        "recognised from the first lines of " +
                        (read.size() == 1 ? read.front()->file : files_text(read.size())) + ")");
  } else if (detected) {
    out->info.push_back("data format (runner.data_format auto) differs between files:");
    for (std::size_t i = 0; i < read.size() && i < kMaxFilesNamed; ++i) {
      out->info.push_back("  " + read[i]->file + ": " + read[i]->format);
    }
    if (read.size() > kMaxFilesNamed) {
      out->info.push_back("  ... and " + files_text(read.size() - kMaxFilesNamed) + " more");
    }
  }
  // Inputs whose first lines two formats read alike: the one taken is a guess, said once per pair.
  for (const auto& [first, count] : grouped(stats.formats, [](const FormatNote& n) {
         return n.sample_parsed == 0 || n.tie.empty() ? std::string() : n.format + "|" + n.tie;
       })) {
    out->warnings.push_back(
        where_text(*first, count) + ": runner.data_format auto read its first " +
        std::to_string(first->sample_parsed) + " lines alike as " + first->format +
        " (taken: tried first) and as " + first->tie +
        "; if they are the latter, set it (a wrong reading shifts the fields: keys read as dense "
        "values and dense values as keys)");
  }
  // Inputs whose first lines no format accepts: one warning per distinct hint, naming its first
  // file and how many share it.
  for (const auto& [first, count] : grouped(stats.formats, [](const FormatNote& n) {
         return n.sample_lines == 0 || n.sample_parsed > 0
                    ? std::string()
                    : (n.detected ? "auto:" : "set:") + n.hint;
       })) {
    const std::string where = where_text(*first, count);
    std::string what = first->detected ? "no GPUBox format accepts its first lines"
                                       : "its first " + std::to_string(first->sample_lines) +
                                             " lines are not " + first->format;
    if (!first->hint.empty()) what += "; " + first->hint;
    out->warnings.push_back(where + ": " + what);
  }
}

// The config's slots that held no key, by name ("#i" where the config names none).
std::string empty_slots(const LoadStats& stats, std::size_t* count) {
  std::string names;
  *count = 0;
  for (std::size_t s = 0; s < stats.slot_keys.size(); ++s) {
    if (stats.slot_keys[s] != 0) continue;
    if (++*count > kMaxSlotsNamed) continue;
    const std::string name =
        s < stats.slot_names.size() ? printable(stats.slot_names[s]) : "#" + std::to_string(s);
    names += (names.empty() ? "" : ", ") + name;
  }
  if (*count > kMaxSlotsNamed) names += ", ...";
  return names;
}

}  // namespace

bool no_key_in_any_slot(const LoadStats& stats) {
  if (stats.slot_counted_instances == 0 || stats.slot_keys.empty()) return false;
  for (std::uint64_t keys : stats.slot_keys) {
    if (keys != 0) return false;
  }
  return true;
}

LoadMessages load_messages(const LoadStats& stats) {
  LoadMessages out;
  LoadMessages formats;
  report_formats(stats, &formats);
  out.info = std::move(formats.info);
  if (stats.cached_files > 0) {
    out.info.push_back(std::to_string(stats.cached_instances) + " instances of " +
                       files_text(stats.cached_files) + " from the pass data cache" +
                       (stats.cached_unique_keys ? ", their unique keys with them" : "") +
                       " (parsed in an earlier epoch; the files' sizes and modification times "
                       "unchanged)");
  }
  if (!stats.cache_note.empty()) out.info.push_back(stats.cache_note);
  if (stats.zero_keys_dropped > 0) {
    out.info.push_back(std::to_string(stats.zero_keys_dropped) +
                       " padding keys (feasign 0) dropped, as Paddle's DataFeed drops them; "
                       "their instances are kept");
  }
  // The skipped slots, named in the note below and in the no-key warning.
  std::string unknown_names;
  for (const std::string& n : stats.unknown_slot_names) {
    unknown_names += (unknown_names.empty() ? "" : ", ") + printable(n);  // a data file's bytes
  }
  if (stats.unknown_slot_names.size() == kMaxUnknownSlotNames) unknown_names += ", ...";
  std::uint64_t kept_keys = 0;
  for (const std::uint64_t keys : stats.slot_keys) kept_keys += keys;
  if (stats.unknown_slot_tokens > kept_keys && kept_keys > 0) {
    // Most of the data skipped: slot names that match the data's in a few tokens only (keys
    // written feasign:slot, another slot list) trained on almost nothing, said at INFO.
    out.warnings.push_back(
        std::to_string(stats.unknown_slot_tokens) + " tokens of slots the config does not have " +
        "were skipped, more than the " + std::to_string(kept_keys) +
        " keys read in its slots (slots " + unknown_names +
        "): do the config's slot names (hyper_parameters.slot_names, or sparse_inputs_slots' "
        "1..N) and runner.slot_token_order match the data's?");
  } else if (stats.unknown_slot_tokens > 0) {
    out.info.push_back(std::to_string(stats.unknown_slot_tokens) +
                       " tokens of slots the config does not have were skipped, as PaddleRec's "
                       "readers skip them (slots " +
                       unknown_names + "; runner.ignore_unknown_slots: false rejects such lines)");
  }
  std::size_t empty = 0;
  const std::string names = empty_slots(stats, &empty);
  if (stats.slot_counted_instances > 0 && empty > 0) {
    const std::string of = std::to_string(stats.slot_counted_instances) + " instances read";
    const std::string unknown =
        stats.unknown_slot_tokens > 0
            ? "; the lines hold slots the config does not have: " + unknown_names + " (" +
                  std::to_string(stats.unknown_slot_tokens) + " tokens skipped)"
            : std::string();
    if (no_key_in_any_slot(stats)) {
      out.warnings.push_back("none of the config's " + std::to_string(stats.slot_keys.size()) +
                             " sparse slots holds a key in the " + of +
                             ": the slot names (hyper_parameters.slot_names, or "
                             "sparse_inputs_slots' 1..N) do not match the data's" +
                             unknown);
    } else {
      // A note, not a warning: a config of many slots (slot_dnn's 300) meets files that fill
      // some of them.
      out.info.push_back("sparse slots " + names + " (" + std::to_string(empty) +
                         " of the config's " + std::to_string(stats.slot_keys.size()) +
                         ") hold no key in any of the " + of +
                         ": they train nothing in this load (does the config name slots the "
                         "data does not fill?)" +
                         unknown);
    }
  }
  if (stats.skipped_lines() > 0) {
    out.warnings.push_back("skipped " + std::to_string(stats.skipped_lines()) +
                           " malformed lines of " + std::to_string(stats.lines));
    for (const ParseErrorRecord& e : stats.errors) out.warnings.push_back("  " + e.to_string());
  }
  // What the rejected inputs look like, after the lines they cost.
  out.warnings.insert(out.warnings.end(), formats.warnings.begin(), formats.warnings.end());
  return out;
}

}  // namespace gpubox::dataset
