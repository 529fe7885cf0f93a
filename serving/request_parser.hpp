// The body of a POST /predict, parsed into instances (InstanceBlock: keys grouped by slot in the
// model's slot order, dense values), as the dataset's parsers give them to the trainer.
//
// Two forms:
//   JSON (Content-Type application/json, or a body starting with '{'):
//     {"instances": [{"slots": {"1": [737395, ...], "2": ["306163"], ...}, "dense": [0.5, ...]},
//                    ...]}
//     or one instance alone: {"slots": {...}, "dense": [...]}.
//     Keys are whole numbers in [0, 2^64) or strings of digits (JSON numbers past 2^53 lose
//     precision in many clients); key 0 is padding and dropped, as the training parsers do. A
//     slot left out has no key. "dense" holds exactly the model's dense_dim numbers; it may be
//     left out only when dense_dim is 0.
//   Slot text (any other body): one instance per non-blank line, as in PaddleRec's slot data
//     (`click:1 dense_feature:0.5 ... 1:737395 ... 26:306163`), parsed by the dataset's own
//     line parser with the model's slot names, label name, dense name and token order. The
//     label may be left out (it is not used).
// A slot name the model does not have is an error naming it (serving does not skip it as
// training's ignore_unknown_slots does: a client with a wrong slot name must hear of it).
//
// Thread-safety: parse() is const and may run on any number of threads at once.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.hpp"
#include "dataset/dataset_types.hpp"
#include "dataset/instance_block.hpp"
#include "dataset/line_parser.hpp"
#include "serving/serving_model.hpp"

namespace gpubox::serving {

enum class BodyForm { kAuto, kJson, kSlotText };

class RequestParser {
 public:
  // `max_instances`: more instances in one body is an error (ResourceExhausted).
  RequestParser(const ServingSpec& spec, std::size_t max_instances);

  // InvalidArgument with a message for the client on bad input ("instance 2: unknown slot
  // 'x'", "line 3: bad_key: '12a'", "invalid JSON at byte 17: ..."); ResourceExhausted when
  // over max_instances.
  StatusOr<dataset::InstanceBlock> parse(std::string_view body, BodyForm form) const;

 private:
  StatusOr<dataset::InstanceBlock> parse_json(std::string_view body) const;
  StatusOr<dataset::InstanceBlock> parse_slot_text(std::string_view body) const;

  int num_slots_;
  int dense_dim_;
  std::size_t max_instances_;
  std::string slot_list_;  // "1, 2, ..., 26" for messages
  dataset::DatasetConfig text_config_;
  std::shared_ptr<const dataset::SlotIndex> slots_;
};

}  // namespace gpubox::serving
