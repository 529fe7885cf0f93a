// gpubox_serve's request bodies (serving/request_parser.hpp) through the public parser,
// JSON and slot text: any input gives instances or an error, never a crash, a sanitizer report
// or an exception; what it accepts is well formed (keys per slot add up, no key 0, at most
// max_instances instances, the dense width the model's).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "serving/request_parser.hpp"
#include "tests/fuzz/fuzz_check.hpp"

namespace {

const gpubox::serving::RequestParser& parser() {
  static const gpubox::serving::RequestParser instance = [] {
    gpubox::serving::ServingSpec spec;
    spec.slot_names = {"1", "2", "3", "user", "item"};
    spec.model.slots = 5;
    spec.model.dense_dim = 3;
    spec.label_name = "click";
    spec.dense_name = "dense_feature";
    return gpubox::serving::RequestParser(spec, 64);
  }();
  return instance;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (const auto form : {gpubox::serving::BodyForm::kJson, gpubox::serving::BodyForm::kSlotText}) {
    const auto parsed = parser().parse(body, form);
    if (!parsed.ok()) {
      FUZZ_CHECK(!parsed.status().message().empty(), "an error says what is wrong");
      continue;
    }
    const gpubox::dataset::InstanceBlock& block = parsed.value();
    FUZZ_CHECK(block.size() <= 64, "at most max_instances instances");
    FUZZ_CHECK(block.dense.size() == block.size() * 3, "dense_dim values per instance");
    FUZZ_CHECK(block.slot_sizes.size() == block.size() * 5, "a count per slot per instance");
    FUZZ_CHECK(
        block.key_begin.size() == block.size() + 1 && block.key_begin.back() == block.keys.size(),
        "key offsets cover the keys");
    for (std::size_t i = 0; i < block.size(); ++i) {
      FUZZ_CHECK(block.instance(i).num_keys() == block.key_begin[i + 1] - block.key_begin[i],
                 "slot counts add up to the instance's keys");
    }
    for (const uint64_t key : block.keys) FUZZ_CHECK(key != 0, "key 0 is padding, dropped");
  }
  return 0;
}
