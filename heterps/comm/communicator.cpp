#include "heterps/comm/communicator.hpp"

#include "common/error.hpp"
#include "heterps/comm/in_process_communicator.hpp"
#include "heterps/device/card.hpp"

#if defined(GPUBOX_BACKEND_CUDA)
#include "heterps/comm/nccl_communicator.hpp"
#endif

namespace gpubox::comm {

std::size_t size_of(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return sizeof(float);
    case DataType::kFloat64:
      return sizeof(double);
    case DataType::kInt32:
      return sizeof(int32_t);
    case DataType::kInt64:
      return sizeof(int64_t);
    case DataType::kUInt64:
      return sizeof(uint64_t);
    case DataType::kUInt8:
      return sizeof(uint8_t);
  }
  GPUBOX_FAIL("unknown communicator data type ", static_cast<int>(type));
}

const char* name_of(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kUInt64:
      return "uint64";
    case DataType::kUInt8:
      return "uint8";
  }
  return "unknown";
}

std::unique_ptr<CommGroup> make_in_process_group(int ranks, std::chrono::milliseconds timeout) {
  return std::make_unique<InProcessGroup>(ranks, timeout);
}

std::unique_ptr<CommGroup> make_group(device::CardSet& cards, std::chrono::milliseconds timeout) {
#if defined(GPUBOX_BACKEND_CUDA)
  return std::make_unique<NcclGroup>(cards, timeout);
#else
  GPUBOX_EXPECTS(cards.total_cards() == cards.num_local_cards(),
                 "the cpu backend's communicator spans one process (", cards.num_local_cards(),
                 " local cards); ", cards.total_cards(),
                 " cards over several trainers need the Gloo transport, not implemented yet");
  return make_in_process_group(cards.num_local_cards(), timeout);
#endif
}

}  // namespace gpubox::comm
