#include "serving/request_parser.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/enum_names.hpp"
#include "common/json.hpp"
#include "dataset/paddlerec_readers.hpp"

namespace gpubox::serving {
namespace {

using nlohmann::json;

// At most this many slot names in a message ("1, 2, ..., 26" stays readable).
constexpr std::size_t kListedSlots = 32;

bool parse_key(const json& value, uint64_t* key) {
  if (value.is_number_unsigned()) {
    *key = value.get<uint64_t>();
    return true;
  }
  if (value.is_number_integer()) {  // a signed value: only its non-negative part is a key
    const int64_t v = value.get<int64_t>();
    if (v < 0) return false;
    *key = static_cast<uint64_t>(v);
    return true;
  }
  if (!value.is_string()) return false;
  const std::string& text = value.get_ref<const std::string&>();
  if (text.empty() || text.size() > 20) return false;
  uint64_t out = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return false;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (out > (UINT64_MAX - digit) / 10) return false;
    out = out * 10 + digit;
  }
  *key = out;
  return true;
}

// The deepest nesting of arrays and objects in `body` (strings skipped). A request needs 5
// ({"instances": [{"slots": {"1": [...]}}]}); deeper bodies are refused before they are parsed,
// so a body of nested brackets cannot make the parser build a deep tree.
int nesting_depth(std::string_view body) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

constexpr int kMaxDepth = 8;

// Finds the first key repeated within one JSON object while the parser reads the body (the
// parser itself keeps the last value of a repeated key, silently). Used as the parse callback.
class DuplicateKeyFinder {
 public:
  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start: {
        // A container is named by the key it is the value of, or, inside a list, by the list's.
        std::string name;
        if (!open_.empty()) name = open_.back().is_object ? last_key_ : open_.back().name;
        open_.push_back({event == json::parse_event_t::object_start, {}, std::move(name)});
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!open_.empty()) open_.pop_back();
        break;
      case json::parse_event_t::key:
        last_key_ = parsed.get<std::string>();
        if (!open_.empty() && !open_.back().keys.insert(last_key_).second && duplicate_.empty()) {
          const std::string& under = open_.back().name;
          duplicate_ = "duplicate JSON key " + gpubox::json_quote(last_key_) +
                       (under.empty() ? std::string(" in the top-level object")
                                      : " in an object under " + gpubox::json_quote(under)) +
                       ": each key may appear once per object";
        }
        break;
      default:
        break;
    }
    return true;
  }
  // "" when no key repeated.
  const std::string& duplicate() const { return duplicate_; }

 private:
  struct Container {
    bool is_object = false;
    std::set<std::string> keys;  // of an object, so far
    std::string name;
  };
  std::vector<Container> open_;  // the containers being parsed, innermost last
  std::string last_key_;
  std::string duplicate_;
};

// One dense value: a JSON number within float range (beyond it the float would be inf), through
// the transform training applied (as the slot text's parser applies it).
bool dense_value(const json& v, config::DenseTransform transform, float* out) {
  if (!v.is_number()) return false;
  const double d = v.get<double>();
  if (!std::isfinite(d) || std::fabs(d) > static_cast<double>(FLT_MAX)) return false;
  if (transform == config::DenseTransform::kNone || transform == config::DenseTransform::kAuto) {
    *out = static_cast<float>(d);
    return true;
  }
  return dataset::transformed_dense(d, transform, out);
}

std::string shown(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 64) text = text.substr(0, 61) + "...";
  return text;
}

// The body as a JSON object, refused when nested too deep, malformed or repeating a key.
StatusOr<json> parse_document(std::string_view body) {
  if (nesting_depth(body) > kMaxDepth) {
    return Status::InvalidArgument("JSON nested deeper than " + std::to_string(kMaxDepth) +
                                   " levels; a request needs 5");
  }
  json doc;
  DuplicateKeyFinder duplicates;
  try {
    doc = json::parse(body.begin(), body.end(), std::ref(duplicates));
  } catch (const json::exception& e) {
    // e.what() = "[json.exception.parse_error.101] parse error at line 1, column 5: ...", or
    // out_of_range.406 for a number past a double's range.
    std::string what = e.what();
    if (const auto at = what.find("] "); at != std::string::npos) what = what.substr(at + 2);
    return Status::InvalidArgument("invalid JSON: " + what);
  }
  if (!duplicates.duplicate().empty()) return Status::InvalidArgument(duplicates.duplicate());
  if (!doc.is_object()) {
    return Status::InvalidArgument(
        "the body must be a JSON object: {\"instances\": [...]} or "
        "{\"slots\": {...}, \"dense\": [...]}");
  }
  return doc;
}

// An instance's "slots" object into `keys` (one list per slot; key 0 is no key).
Status read_slots(const json& value, const std::string& at, const dataset::SlotIndex& slots,
                  const std::string& slot_list, std::vector<std::vector<uint64_t>>* keys) {
  if (!value.is_object()) {
    return Status::InvalidArgument(at + "\"slots\" must map slot names to lists of keys");
  }
  for (const auto& [name, list_of_keys] : value.items()) {
    const int slot = slots.find(name);
    if (slot < 0) {
      return Status::InvalidArgument(at + "unknown slot " + gpubox::json_quote(name) +
                                     " (the model's slots: " + slot_list + ")");
    }
    if (!list_of_keys.is_array()) {
      return Status::InvalidArgument(at + "slot " + gpubox::json_quote(name) +
                                     " must be a list of keys");
    }
    for (const json& k : list_of_keys) {
      uint64_t key = 0;
      if (!parse_key(k, &key)) {
        // A float (1e3, 5.0) is refused even when whole: past 2^53 a float has lost the key's
        // digits, so no float is taken as a key (it was called "not a whole number").
        return Status::InvalidArgument(
            at + "slot " + gpubox::json_quote(name) + ": key " + shown(k) +
            (k.is_number_float()
                 ? " is a JSON float (written with '.' or an exponent): a key is an integer "
                   "or a string of digits (a float has lost a key's digits past 2^53)"
                 : " is not a whole number in [0, 2^64) or a string of digits"));
      }
      if (key != 0) (*keys)[static_cast<std::size_t>(slot)].push_back(key);
    }
  }
  return Status::OK();
}

// An instance's "dense" list into `dense` (its size is the model's dense_dim).
Status read_dense(const json& value, const std::string& at, config::DenseTransform transform,
                  std::vector<float>* dense) {
  if (!value.is_array() || value.size() != dense->size()) {
    return Status::InvalidArgument(at + "\"dense\" must be a list of " +
                                   std::to_string(dense->size()) + " numbers");
  }
  for (std::size_t d = 0; d < dense->size(); ++d) {
    const json& v = value[d];
    if (!dense_value(v, transform, &(*dense)[d])) {
      return Status::InvalidArgument(
          at + "dense value " + std::to_string(d) + " (" + shown(v) +
          ") is not a finite number within float range (|v| <= 3.4028235e38)" +
          (transform == config::DenseTransform::kNone
               ? std::string()
               : std::string(", or not one the model's dense transform (") +
                     name_of(config::kDenseTransformNames, transform) + ") takes"));
    }
  }
  return Status::OK();
}

}  // namespace

RequestParser::RequestParser(const ServingSpec& spec, std::size_t max_instances)
    : num_slots_(spec.model.slots),
      dense_dim_(spec.model.dense_dim),
      max_instances_(max_instances) {
  for (std::size_t s = 0; s < spec.slot_names.size() && s < kListedSlots; ++s) {
    slot_list_ += (s ? ", " : "") + spec.slot_names[s];
  }
  if (spec.slot_names.size() > kListedSlots) slot_list_ += ", ...";
  text_config_.data_format = dataset::DataFormat::kSlot;
  text_config_.slots = spec.slot_names;
  text_config_.dense_dim = spec.model.dense_dim;
  text_config_.label_name = spec.label_name;
  text_config_.dense_name = spec.dense_name;
  text_config_.feasign_first = spec.feasign_first;
  text_config_.dense_transform = spec.dense_transform;
  text_config_.ignore_unknown_slots = false;
  throw_if_error(dataset::validate(text_config_));
  slots_ = std::make_shared<const dataset::SlotIndex>(text_config_.slots);
}

StatusOr<dataset::InstanceBlock> RequestParser::parse(std::string_view body, BodyForm form) const {
  // An editor's UTF-8 byte order mark is no part of the first line, as in training's files (it
  // was an invisible "unknown slot" in the 400's message).
  if (body.substr(0, 3) == "\xEF\xBB\xBF") body.remove_prefix(3);
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    // A POST without Content-Length or chunked encoding has no body: its text then came as a
    // "next request" answered 400, after a 200 with no prediction for this one.
    return Status::InvalidArgument(
        "the request holds no instance: an empty body (a POST sends its lines with a "
        "Content-Length or chunked encoding)");
  }
  if (form == BodyForm::kAuto) {
    const std::size_t first = body.find_first_not_of(" \t\r\n");
    form = first != std::string_view::npos && body[first] == '{' ? BodyForm::kJson
                                                                 : BodyForm::kSlotText;
  }
  return form == BodyForm::kJson ? parse_json(body) : parse_slot_text(body);
}

StatusOr<dataset::InstanceBlock> RequestParser::parse_json(std::string_view body) const {
  StatusOr<json> doc = parse_document(body);
  if (!doc.ok()) return doc.status();
  const json* list = nullptr;
  json single;
  if (const auto it = doc->find("instances"); it != doc->end()) {
    if (doc->size() != 1) {
      return Status::InvalidArgument("a body with \"instances\" holds nothing else");
    }
    if (!it->is_array()) return Status::InvalidArgument("\"instances\" must be a list");
    list = &*it;
  } else {
    single = json::array({std::move(*doc)});
    list = &single;
  }
  if (list->size() > max_instances_) {
    return Status::ResourceExhausted(std::to_string(list->size()) +
                                     " instances in one request; at most " +
                                     std::to_string(max_instances_));
  }
  dataset::InstanceBlock out(num_slots_, dense_dim_);
  std::vector<std::vector<uint64_t>> keys(static_cast<std::size_t>(num_slots_));
  std::vector<uint64_t> grouped;
  std::vector<uint32_t> sizes(static_cast<std::size_t>(num_slots_));
  std::vector<float> dense(static_cast<std::size_t>(dense_dim_));
  for (std::size_t i = 0; i < list->size(); ++i) {
    const json& instance = (*list)[i];
    const std::string at = "instance " + std::to_string(i) + ": ";
    if (!instance.is_object()) {
      return Status::InvalidArgument(at + "must be an object with \"slots\" and \"dense\"");
    }
    for (auto& slot_keys : keys) slot_keys.clear();
    bool has_dense = false;
    for (const auto& [field, value] : instance.items()) {
      if (field == "slots") {
        GPUBOX_RETURN_IF_ERROR(read_slots(value, at, *slots_, slot_list_, &keys));
      } else if (field == "dense") {
        GPUBOX_RETURN_IF_ERROR(read_dense(value, at, text_config_.dense_transform, &dense));
        has_dense = true;
      } else {
        return Status::InvalidArgument(at + "unknown field " + gpubox::json_quote(field) +
                                       " (an instance has \"slots\" and \"dense\")");
      }
    }
    if (!has_dense && dense_dim_ > 0) {
      return Status::InvalidArgument(at + "\"dense\" (" + std::to_string(dense_dim_) +
                                     " numbers) is missing");
    }
    grouped.clear();
    for (int s = 0; s < num_slots_; ++s) {
      const auto& slot_keys = keys[static_cast<std::size_t>(s)];
      grouped.insert(grouped.end(), slot_keys.begin(), slot_keys.end());
      sizes[static_cast<std::size_t>(s)] = static_cast<uint32_t>(slot_keys.size());
    }
    out.append(0.0f, dense.data(), grouped.data(), grouped.size(), sizes.data());
  }
  return out;
}

StatusOr<dataset::InstanceBlock> RequestParser::parse_slot_text(std::string_view body) const {
  dataset::LineParser parser(text_config_, slots_);
  // A line without its label gets "<label_name>:0" (the label is not used).
  const std::string no_label = text_config_.feasign_first ? "0:" + text_config_.label_name + " "
                                                          : text_config_.label_name + ":0 ";
  dataset::InstanceBlock out(num_slots_, dense_dim_);
  std::string with_label;
  std::size_t line_no = 0;
  for (std::size_t begin = 0; begin < body.size();) {
    std::size_t end = body.find('\n', begin);
    if (end == std::string_view::npos) end = body.size();
    const std::string_view line = body.substr(begin, end - begin);
    begin = end + 1;
    ++line_no;
    dataset::ParseResult result = parser.parse(line, &out);
    if (result.blank) {
      // Blank lines at the end are the body's trailing newlines; one before a line would move
      // every prediction after it off its line (they are one per line, in order).
      if (body.find_first_not_of(" \t\r\n", std::min(begin, body.size())) ==
          std::string_view::npos) {
        break;
      }
      return Status::InvalidArgument("line " + std::to_string(line_no) +
                                     " is blank: the predictions are one per line, in order, "
                                     "and a blank line has none (remove it)");
    }
    if (result.reason == dataset::ParseReason::kBadLabel && result.note != nullptr) {
      with_label = no_label;
      with_label.append(line);
      result = parser.parse(with_label, &out);
    }
    const std::string at = "line " + std::to_string(line_no) + ": ";
    if (result.reason == dataset::ParseReason::kUnknownSlot) {
      return Status::InvalidArgument(at + "unknown slot in '" + std::string(result.token) +
                                     "' (the model's slots: " + slot_list_ + ")");
    }
    if (!result.ok()) {
      return Status::InvalidArgument(at + name_of(dataset::kParseReasonNames, result.reason) +
                                     ": " + dataset::describe(result));
    }
    if (out.size() > max_instances_) {
      return Status::ResourceExhausted("more than " + std::to_string(max_instances_) +
                                       " instances in one request");
    }
  }
  return out;
}

}  // namespace gpubox::serving
