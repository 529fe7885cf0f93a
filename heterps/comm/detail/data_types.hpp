// Element-type dispatch shared by the host-side communicators (in-process, Gloo).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/error.hpp"
#include "heterps/comm/communicator.hpp"

namespace gpubox::comm::detail {

// Calls f(T{}) for the element type `type` names; throws for an unknown one.
template <class F>
void visit_type(DataType type, F&& f) {
  switch (type) {
    case DataType::kFloat32:
      return f(float{});
    case DataType::kFloat64:
      return f(double{});
    case DataType::kInt32:
      return f(int32_t{});
    case DataType::kInt64:
      return f(int64_t{});
    case DataType::kUInt64:
      return f(uint64_t{});
    case DataType::kUInt8:
      return f(uint8_t{});
  }
  GPUBOX_FAIL("unknown communicator data type ", static_cast<int>(type));
}

// Integers add in their unsigned twin so overflow wraps (as NCCL does) instead of being
// undefined behaviour.
template <class T, bool = std::is_integral_v<T>>
struct SumTypeOf {
  using type = T;
};
template <class T>
struct SumTypeOf<T, true> {
  using type = std::make_unsigned_t<T>;
};
template <class T>
using SumType = typename SumTypeOf<T>::type;

}  // namespace gpubox::comm::detail
