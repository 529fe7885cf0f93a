#include "trainer/config/network_choice.hpp"

namespace gpubox::trainer {

std::string differences_from_paddlerec(config::ModelKind model) {
  switch (model) {
    case config::ModelKind::kDeepFefm:
      return "a dense feature's field vector is its value times a learned vector (PaddleRec's net "
             "looks up a key quantised from the value); the dense features' first-order weights "
             "start at 0 (PaddleRec's at a truncated normal); no dropout, no L2 decay";
    case config::ModelKind::kAutoint:
      return "a dense field's index and a sparse field's value are not read (PaddleRec's sample "
             "has 0 and 1 only); its dnn (fc_sizes) has no batch norm and a ReLU after every "
             "layer, where PaddleRec's has batch norm and no ReLU after the first";
    case config::ModelKind::kFlen:
      return "no batch norm and no dropout (PaddleRec's after its fc layers); its weights start "
             "at normals of Xavier's variance (PaddleRec's Xavier uniform); the embeddings step "
             "under hyper_parameters.sparse_optimizer (PaddleRec's under its dense Adagrad)";
    default:
      return "";
  }
}

}  // namespace gpubox::trainer
