// oneDNN implementation of trainer/nn/linear_gemms.hpp (cpu backend).
//
// Each GEMM is a matmul primitive on strided row-major memory descriptors, made once per batch
// size (a binary post-op takes no runtime dimensions) with a user scratchpad:
//   forward:  src X [B x in], weights W [in x out], bias [1 x out], post-op eltwise ReLU.
//   weights:  src X^T [in x B] (X with swapped strides), weights dZ [B x out] -> dW; and a
//             second matmul ones[1 x B] x dZ -> db (oneDNN has no bias-gradient post-op).
//   data:     src dZ [B x out], weights W^T [out x dx_cols] (W's first dx_cols rows, strides
//             swapped), runtime output scale alpha; with input_is_relu the ReLU mask as post-ops.
//
// The mask as post-ops. oneDNN 2.x has no select post-op, and a binary post-op combines the
// accumulator d with one tensor, so d * 1(X > 0) is built from X >= 0 (a ReLU output) as
//     -2^64 * min(-min(2^-64 d, X), X)  =  2^64 * clamp(2^-64 d, -X, X)
// with 2^-64 folded into the output scale and the post-ops binary min(X), eltwise linear(-1),
// binary min(X), binary mul by a scalar -2^64. It is exactly 0 where X == 0 and exactly d
// wherever |d| <= 2^64 X and 2^-64 d is normal (a power-of-two scale, min and negation are
// exact): every case but an activation below 2^-64 |d| (a pre-activation within ~1e-19 of the
// kink for unit gradients), where it gives a value of the same sign and smaller magnitude than
// d, and a gradient below 2^-62 in magnitude, whose scaled value is subnormal (it comes back a
// multiple of 2^-85). The chain holds a single eltwise post-op on purpose: oneDNN 2.6's gemm:jit
// applies every eltwise_linear of a chain with the first one's alpha (seen on AVX2: two linears
// of 2^-64 and -2^64 gave 2^-191 d).
// oneDNN applies post-ops inside the GEMM's epilogue only in its brgemm kernels; gemm:jit runs them
// as a pass of its own over each thread's block of the output, which made a 256x128 fp32 input
// gradient twice as slow. gemm:jit is what every input gradient here got on the machines seen
// (oneDNN 2.6; AVX2, AVX-512 and avx512_core_bf16, fp32 and hardware bf16 alike: the runtime output
// scale keeps fp32 off brgemm). A plan over fp32 rows whose chain lands outside brgemm
// (Plan::mask_after) therefore runs the GEMM with the output scale alone and masks dX in one pass
// of ours after it, in the same task (ReluMask; one launch, as cuBLASLt's epilogue): the same GEMM
// kernel and sums, alpha dZ W^T rounded once either way (the chain's 2^-64 and 2^64 are exact but
// for the subnormal case above, which this path gets exact), so the same values wherever the chain
// is exact; a masked entry is +0 where the chain's was -0 (emulated bf16's GEMMs are over fp32
// copies, so they take this path too). Hardware bf16 keeps the chain: there gemm:jit's pass was the
// cheaper one (a loaded 2-core avx512_core_bf16 machine, batch 512, best of 25: about 100 against
// 111 us for 256x128, 700-790 against 960 us for 512x256 with a bf16 mask pass after; the results
// bit-equal but for the chain's inexact corners), except where oneDNN 2.6 runs the chain on its
// reference kernel (ref:any: a binary post-op whose X rows are strided unlike dX's, x_ld != dx_ld),
// which takes the mask after as well, over bf16 rows. On AMX, bf16 input gradients run without
// the runtime scale, on AMX's brgemm (make_data).
//
// bf16 (Blas::bf16() == kHardware): X, W, dZ and the hidden outputs are bf16 memory, dW/db/bias
// fp32; oneDNN accumulates in fp32. Under kEmulated the same bf16 buffers are converted to fp32
// copies before each GEMM and its bf16 output rounded after it (see blas.hpp): the numerics of
// the bf16 path on a CPU without it, at a cost.
#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/detail/gemm_backend.hpp"
#include "trainer/nn/detail/input_grad_pass.hpp"
#include "trainer/nn/linear_gemms.hpp"

namespace gpubox::trainer {
namespace {

using dnnl::memory;
using dims = dnnl::memory::dims;

// Scales of the mask chain (see the file comment).
constexpr float kMaskScaleDown = 0x1p-64f;
constexpr float kMaskScaleUp = 0x1p64f;
// The post-op indices of the mask chain that read X, and the one that reads the scalar.
constexpr int kMaskMinFirst = 0;
constexpr int kMaskMinSecond = 2;
constexpr int kMaskScaleUpOp = 3;
// Plans kept per layer: the training batch, the last (smaller) batch of a pass, the evaluation
// batch, and one spare.
constexpr std::size_t kPlansKept = 4;

memory::data_type dnnl_type(ElementType t) {
  return t == ElementType::kBf16 ? memory::data_type::bf16 : memory::data_type::f32;
}

// A row-major [rows x cols] matrix with row stride ld; transposed: the [cols x rows] view of it.
memory::desc matrix(int64_t rows, int64_t cols, int64_t ld, memory::data_type type) {
  return memory::desc(dims{rows, cols}, type, dims{ld, 1});
}
memory::desc transposed(int64_t rows, int64_t cols, int64_t ld, memory::data_type type) {
  return memory::desc(dims{cols, rows}, type, dims{1, ld});
}

struct ToFloat {
  const Bf16* in;
  float* out;
  GPUBOX_HD void operator()(std::size_t i) const { out[i] = to_float(in[i]); }
};
// Item i of rows * cols: the first `cols` entries of each row of stride `ld`, rounded to bf16
// (an emulated GEMM's fp32 result into its bf16 output; the entries past `cols` in a row are
// another piece's, left as they are).
struct ToBf16Rows {
  const float* in;
  Bf16* out;
  int64_t ld;
  int64_t cols;
  GPUBOX_HD void operator()(std::size_t i) const {
    const auto at = static_cast<int64_t>(i) / cols * ld + static_cast<int64_t>(i) % cols;
    out[at] = to_bf16(in[at]);
  }
};

// The first `cols` entries of each of `rows` rows (stride `ld`) of an emulated GEMM's fp32
// result, rounded into its bf16 output.
void round_rows_to_bf16(const device::Stream& stream, std::size_t rows, int64_t cols, int64_t ld,
                        const float* in, void* out) {
  device::parallel_for(stream, rows * static_cast<std::size_t>(cols),
                       ToBf16Rows{in, static_cast<Bf16*>(out), ld, cols});
}

// A primitive with one memory object per argument, made with it: a call only points them at its
// operands (set_data_handle) and executes, so it allocates nothing.
struct Gemm {
  dnnl::matmul primitive;
  std::string impl;
  std::unordered_map<int, memory> args;

  Gemm() = default;
  // `post_op_src`: the descriptor of the mask chain's X (oneDNN 2.6 answers the exec_arg_md
  // query for a binary post-op's input with an empty descriptor); its scalar is a [1 x 1].
  Gemm(const dnnl::matmul::primitive_desc& pd, const dnnl::engine& engine,
       const std::vector<int>& arg_ids, const memory::desc& post_op_src = memory::desc())
      : primitive(pd), impl(pd.impl_info_str()) {
    for (int id : arg_ids) {
      memory::desc md;
      if (id == (DNNL_ARG_ATTR_MULTIPLE_POST_OP(kMaskScaleUpOp) | DNNL_ARG_SRC_1)) {
        md = memory::desc(dims{1, 1}, memory::data_type::f32, dims{1, 1});
      } else if (id >= DNNL_ARG_ATTR_MULTIPLE_POST_OP_BASE) {
        md = post_op_src;
      } else if (id == DNNL_ARG_SCRATCHPAD) {
        md = pd.scratchpad_desc();
      } else if (id == DNNL_ARG_ATTR_OUTPUT_SCALES) {
        md = memory::desc(dims{1}, memory::data_type::f32, memory::format_tag::a);
      } else {
        md = pd.query_md(dnnl::query::exec_arg_md, id);
      }
      args.emplace(id, memory(md, engine, nullptr));
    }
  }
  void run(dnnl::stream& stream, std::initializer_list<std::pair<int, const void*>> operands) {
    for (const auto& [id, ptr] : operands) args.at(id).set_data_handle(const_cast<void*>(ptr));
    primitive.execute(stream, args);
  }
};

}  // namespace

struct LinearGemms::Plans {
  std::string name;  // the layer's (errors name it)
  // An input-gradient GEMM: without a runtime output scale (alpha applied after it, or 1), or
  // with one (`scaled`: alpha read at execution).
  struct Data {
    Gemm gemm;
    bool mask_after = false;  // input_is_relu: no mask chain, ReluMask follows it
    bool scaled = false;
    bool made = false;
  };
  struct Plan {
    int64_t batch = 0;
    Gemm forward, weights, bias_grad;
    Data data;  // alpha == 1, or fp32 dX rows (alpha applied by the pass after it)
    // An unscaled plan's bf16 dX rows with alpha != 1 (a pass after a bf16 GEMM would round
    // twice): the GEMM into fp32 rows (out32), which the pass after it scales, masks and rounds
    // into dX.
    Data data_f32;
  };
  std::vector<Plan> plans;  // most recently made first
  // The batch of the last non-empty forward (-1 before one): a consumer's backward_data demands
  // its producer's, as cuBLASLt's DRELU reads the mask that forward recorded.
  int64_t last_forward_batch = -1;
  // `ones` holds the ones row of db = 1^T dZ, in the GEMMs' input type.
  device::device_buffer<char> ones;
  float alpha = 1.0f;                   // backward_data's runtime output scale, read at execution
  float mask_scale_up = -kMaskScaleUp;  // the mask chain's last factor (a post-op input)
  // kEmulated: fp32 copies of the bf16 operands, and fp32 results before their rounding.
  bool emulated = false;
  device::device_buffer<float> x32, w32, dz32, out32;
};

int fast_dx_cols(int wanted, int in) {
  GPUBOX_EXPECTS(wanted >= 0 && wanted <= in, "dX columns ", wanted, " of a layer over ", in);
  return std::min(in, (wanted + 15) / 16 * 16);
}

LinearGemms::LinearGemms(Blas& blas, const LinearGemmSpec& spec)
    : blas_(&blas), spec_(spec), plans_(std::make_unique<Plans>()) {
  plans_->name = spec.name;
  GPUBOX_EXPECTS(spec.in > 0 && spec.out > 0 && spec.dx_cols >= 0 && spec.dx_cols <= spec.in,
                 "layer ", spec.name, ": bad shape ", spec.in, " x ", spec.out, ", dx columns ",
                 spec.dx_cols);
  GPUBOX_EXPECTS(spec.x_ld >= spec.in && spec.y_ld >= spec.out && spec.dz_ld >= spec.out &&
                     spec.dx_ld >= spec.dx_cols,
                 "layer ", spec.name, ": a row stride is shorter than its row");
  // oneDNN's mask reads X and could cover any columns, but cuBLASLt's DRELU covers whole rows
  // (linear_gemms_cublaslt.cpp): refused here too, so that the cpu build refuses what a GPU does.
  GPUBOX_EXPECTS(!spec.input_is_relu || spec.dx_cols == spec.in, "layer ", spec.name,
                 ": the ReLU mask covers whole input rows");
  const bool wants_bf16 = spec.input == ElementType::kBf16 || spec.output == ElementType::kBf16 ||
                          spec.dx == ElementType::kBf16;
  GPUBOX_EXPECTS(!wants_bf16 || blas.bf16() != Bf16Support::kNone, "layer ", spec.name,
                 ": bf16 GEMMs asked for on a CPU without them (", blas.isa(), ")");
  plans_->emulated = wants_bf16 && blas.bf16() == Bf16Support::kEmulated;
  device::Card& card = blas.card();
  plans_->ones = card.make_buffer<char>(0);
  for (auto* b : {&plans_->x32, &plans_->w32, &plans_->dz32, &plans_->out32}) {
    *b = card.make_buffer<float>(0);
  }
}

LinearGemms::~LinearGemms() = default;
LinearGemms::LinearGemms(LinearGemms&& other) noexcept = default;
LinearGemms& LinearGemms::operator=(LinearGemms&& other) noexcept = default;

namespace {
// What a plan's primitives read and write, in the types the primitives see (fp32 everywhere
// under emulation).
struct PlanTypes {
  memory::data_type input, output, dx;
  bool unscaled_dx = false;  // the input gradient's GEMM without a runtime scale (make_data)
};

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// Layer `s`'s input-gradient GEMM for `rows` rows, by `make` (make_plan's). Unscaled, it has no
// runtime output scale: oneDNN 2.6 keeps a matmul with one on gemm:jit, which on an AMX machine
// ran a bf16 512-wide layer's dX 8x slower than the AMX brgemm it gets without (750 against 90
// us); alpha is then 1, or applied to fp32 dX rows by the pass after it (one rounding, as
// oneDNN's; bf16 dX rows: Plan::data_f32), and the mask chain's 2^-64 a static scale (brgemm
// takes that). Only bf16 GEMMs on AMX go unscaled (prepare): fp32's brgemm there was 2-13% faster
// than gemm:jit for dX alone (layer bench) and no faster end to end (dcn, within the machine's
// noise), so fp32 keeps its kernels and bits; bf16 without AMX is not measured. fp32 rows mask
// after the GEMM (exact; see the file comment), and so do rows whose chain oneDNN would run on its
// reference kernel (ref:any: X's rows strided unlike dX's).
template <class Make>
LinearGemms::Plans::Data make_data(Make& make, const LinearGemmSpec& s, const PlanTypes& t,
                                   int64_t rows, bool scaled) {
  const auto f32 = memory::data_type::f32;
  const dnnl::matmul::desc desc(matrix(rows, s.out, s.dz_ld, t.input),
                                transposed(s.dx_cols, s.out, s.out, t.input),
                                matrix(rows, s.dx_cols, s.dx_ld, t.dx));
  std::vector<int> args = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD};
  if (scaled) args.push_back(DNNL_ARG_ATTR_OUTPUT_SCALES);
  auto attr_of = [&](bool chain) {
    dnnl::primitive_attr attr = user_scratchpad();
    if (scaled) {
      attr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
    } else if (chain) {
      attr.set_output_scales(0, {kMaskScaleDown});
    }
    return attr;
  };
  LinearGemms::Plans::Data data;
  data.scaled = scaled;
  data.made = true;
  const bool fp32_rows = t.input == f32 && t.dx == f32;
  if (s.input_is_relu && !fp32_rows) {
    const memory::desc mask = matrix(rows, s.dx_cols, s.x_ld, t.input);
    dnnl::primitive_attr attr = attr_of(true);
    dnnl::post_ops ops;
    ops.append_binary(dnnl::algorithm::binary_min, mask);  // kMaskMinFirst
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_linear, -1.0f, 0.0f);
    ops.append_binary(dnnl::algorithm::binary_min, mask);  // kMaskMinSecond
    ops.append_binary(dnnl::algorithm::binary_mul,
                      memory::desc(dims{1, 1}, f32, dims{1, 1}));  // kMaskScaleUpOp
    attr.set_post_ops(ops);
    std::vector<int> chain_args = args;
    for (int op : {kMaskMinFirst, kMaskMinSecond, kMaskScaleUpOp}) {
      chain_args.push_back(DNNL_ARG_ATTR_MULTIPLE_POST_OP(op) | DNNL_ARG_SRC_1);
    }
    data.gemm = make(desc, attr, chain_args, mask);
    if (data.gemm.impl.rfind("ref", 0) != 0) return data;
  }
  data.gemm = make(desc, attr_of(false), args);
  data.mask_after = s.input_is_relu;
  return data;
}

// The four primitives of layer `s` for `rows` rows; `scratch` grows to the largest scratchpad
// any of them asks for.
LinearGemms::Plans::Plan make_plan(const dnnl::engine& engine, const LinearGemmSpec& s,
                                   const PlanTypes& t, int64_t rows, std::size_t* scratch) {
  const auto f32 = memory::data_type::f32;
  auto make = [&](const dnnl::matmul::desc& desc, const dnnl::primitive_attr& attr,
                  const std::vector<int>& args, const memory::desc& post_op_src = {}) {
    const dnnl::matmul::primitive_desc pd(desc, attr, engine);
    *scratch = std::max(*scratch, pd.scratchpad_desc().get_size());
    return Gemm(pd, engine, args, post_op_src);
  };
  LinearGemms::Plans::Plan plan;
  {
    dnnl::primitive_attr attr = user_scratchpad();
    if (s.relu) {
      dnnl::post_ops ops;
      ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
      attr.set_post_ops(ops);
    }
    plan.forward = make(
        dnnl::matmul::desc(matrix(rows, s.in, s.x_ld, t.input), matrix(s.in, s.out, s.out, t.input),
                           matrix(1, s.out, s.out, f32), matrix(rows, s.out, s.y_ld, t.output)),
        attr, {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD});
  }
  const std::vector<int> plain_args = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST,
                                       DNNL_ARG_SCRATCHPAD};
  plan.weights = make(
      dnnl::matmul::desc(transposed(rows, s.in, s.x_ld, t.input),
                         matrix(rows, s.out, s.dz_ld, t.input), matrix(s.in, s.out, s.out, f32)),
      user_scratchpad(), plain_args);
  plan.bias_grad =
      make(dnnl::matmul::desc(matrix(1, rows, rows, t.input), matrix(rows, s.out, s.dz_ld, t.input),
                              matrix(1, s.out, s.out, f32)),
           user_scratchpad(), plain_args);
  if (s.dx_cols == 0) return plan;
  plan.data = make_data(make, s, t, rows, /*scaled=*/!t.unscaled_dx);
  if (t.unscaled_dx && t.dx != f32) {
    PlanTypes into_f32 = t;
    into_f32.dx = f32;
    plan.data_f32 = make_data(make, s, into_f32, rows, /*scaled=*/false);
  }
  return plan;
}

// The buffers a plan for `rows` rows uses besides its operands: the ones row of the bias
// gradient (in the GEMMs' input type) and, under emulation, the fp32 copies.
void size_plan_buffers(LinearGemms::Plans& p, const LinearGemmSpec& s, device::Card& card,
                       int64_t rows, bool f32_dx_rows) {
  const std::size_t ones_bytes =
      static_cast<std::size_t>(rows) * (p.emulated ? 4 : element_bytes(s.input));
  if (p.ones.size() < ones_bytes) {
    std::vector<char> host(ones_bytes);
    for (int64_t i = 0; i < rows; ++i) {
      if (!p.emulated && s.input == ElementType::kBf16) {
        reinterpret_cast<Bf16*>(host.data())[i] = to_bf16(1.0f);
      } else {
        reinterpret_cast<float*>(host.data())[i] = 1.0f;
      }
    }
    p.ones = device::to_device(host, card.memory(), card.stream());
  }
  if (p.emulated) {
    const auto n = static_cast<std::size_t>(rows);
    p.x32.resize_discard(n * s.x_ld);
    p.w32.resize_discard(static_cast<std::size_t>(s.in) * s.out);
    p.dz32.resize_discard(n * s.dz_ld);
    p.out32.resize_discard(n * std::max(s.y_ld, s.dx_ld));
  } else if (f32_dx_rows) {
    p.out32.resize_discard(static_cast<std::size_t>(rows) * s.dx_ld);
  }
}
}  // namespace

void LinearGemms::prepare(int64_t batch) {
  GPUBOX_EXPECTS(batch >= 0, "layer ", spec_.name, ": negative batch ", batch);
  Plans& p = *plans_;
  for (std::size_t i = 0; i < p.plans.size(); ++i) {
    if (p.plans[i].batch == batch) {
      std::rotate(p.plans.begin(), p.plans.begin() + static_cast<std::ptrdiff_t>(i),
                  p.plans.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      return;
    }
  }
  Blas::Backend& backend = blas_->backend();
  const LinearGemmSpec& s = spec_;
  PlanTypes t =
      p.emulated ? PlanTypes{memory::data_type::f32, memory::data_type::f32, memory::data_type::f32}
                 : PlanTypes{dnnl_type(s.input), dnnl_type(s.output), dnnl_type(s.dx)};
  // bf16 GEMMs on AMX (make_data); GPUBOX_UNSCALED_INPUT_GRADIENT=1 takes the path on any CPU
  // and precision, =0 on none (its tests compare the two on any CPU).
  const char* forced = std::getenv("GPUBOX_UNSCALED_INPUT_GRADIENT");
  const std::string force = forced != nullptr ? forced : "";
  t.unscaled_dx = force == "1" || (force != "0" && t.input == memory::data_type::bf16 &&
                                   backend.isa.find("amx") != std::string::npos);
  const int64_t rows = std::max<int64_t>(batch, 1);  // primitives for an empty batch are unused
  std::size_t scratch = 0;
  Plans::Plan plan;
  // One thread under Backend::one_thread_gemms also here: some kernels fix their partition when
  // the primitive is made.
  run_gemm(backend, [&] { plan = make_plan(backend.engine, s, t, rows, &scratch); });
  plan.batch = batch;
  // The buffers the plan uses, sized now (before the step's collectives).
  if (backend.scratchpad.size() < scratch) backend.scratchpad.resize_discard(scratch);
  size_plan_buffers(p, s, blas_->card(), rows, plan.data_f32.made);
  p.plans.insert(p.plans.begin(), std::move(plan));
  if (p.plans.size() > kPlansKept) p.plans.pop_back();
}

namespace {
LinearGemms::Plans::Plan& plan_for(LinearGemms::Plans& p, int64_t batch, const std::string& name) {
  for (auto& plan : p.plans) {
    if (plan.batch == batch) return plan;
  }
  GPUBOX_FAIL("layer ", name, ": no GEMM plan for batch ", batch, " (prepare() it first)");
}

// Executes one of the plan's GEMMs now, or at each replay of a step graph capturing the stream
// (step_graph.hpp): the plan is looked up when it runs (prepare() may reorder the plans between a
// capture and its replays), and `run` gets it with the card's library state.
template <class Run>
void execute(const device::Stream& stream, const char* what, LinearGemms::Plans* p,
             Blas::Backend* backend, int64_t batch, Run run) {
  plan_for(*p, batch, p->name);  // a missing plan fails at the call, not only at a replay
  count_gemm_launch(stream);
  device::enqueue(stream, what, [p, backend, batch, run] {
    run_gemm(*backend, [&] { run(plan_for(*p, batch, p->name), *backend); });
  });
}
}  // namespace

void LinearGemms::forward(const void* x, const void* w, const float* bias,
                          const Bf16* /*bias_bf16: cuBLASLt's*/, void* y, int64_t batch) {
  if (batch == 0) return;
  Plans& p = *plans_;
  const device::Stream& stream = blas_->stream();
  const auto n = static_cast<std::size_t>(batch);
  if (p.emulated) {
    device::parallel_for(stream, n * spec_.x_ld,
                         ToFloat{static_cast<const Bf16*>(x), p.x32.data()});
    device::parallel_for(stream, p.w32.size(), ToFloat{static_cast<const Bf16*>(w), p.w32.data()});
    x = p.x32.data();
    w = p.w32.data();
  }
  void* out = p.emulated && spec_.output == ElementType::kBf16 ? p.out32.data() : y;
  execute(stream, "layer forward GEMM", &p, &blas_->backend(), batch,
          [x, w, bias, out](Plans::Plan& plan, Blas::Backend& backend) {
            plan.forward.run(backend.stream, {{DNNL_ARG_SRC, x},
                                              {DNNL_ARG_WEIGHTS, w},
                                              {DNNL_ARG_BIAS, bias},
                                              {DNNL_ARG_DST, out},
                                              {DNNL_ARG_SCRATCHPAD, backend.scratchpad.data()}});
          });
  p.last_forward_batch = batch;
  if (out != y) {
    round_rows_to_bf16(stream, n, spec_.out, spec_.y_ld, p.out32.data(), y);
  }
}

void LinearGemms::backward_weights(const void* x, const void* dz, float* dw, float* db,
                                   int64_t batch) {
  const device::Stream& stream = blas_->stream();
  if (batch == 0) {
    device::memset_bytes_async(dw, 0, sizeof(float) * spec_.in * spec_.out, stream);
    device::memset_bytes_async(db, 0, sizeof(float) * spec_.out, stream);
    return;
  }
  Plans& p = *plans_;
  const auto n = static_cast<std::size_t>(batch);
  if (p.emulated) {
    device::parallel_for(stream, n * spec_.x_ld,
                         ToFloat{static_cast<const Bf16*>(x), p.x32.data()});
    device::parallel_for(stream, n * spec_.dz_ld,
                         ToFloat{static_cast<const Bf16*>(dz), p.dz32.data()});
    x = p.x32.data();
    dz = p.dz32.data();
  }
  const void* ones = p.ones.data();
  execute(stream, "layer weight-gradient GEMM", &p, &blas_->backend(), batch,
          [x, dz, dw, db, ones](Plans::Plan& plan, Blas::Backend& backend) {
            plan.weights.run(backend.stream, {{DNNL_ARG_SRC, x},
                                              {DNNL_ARG_WEIGHTS, dz},
                                              {DNNL_ARG_DST, dw},
                                              {DNNL_ARG_SCRATCHPAD, backend.scratchpad.data()}});
            plan.bias_grad.run(backend.stream, {{DNNL_ARG_SRC, ones},
                                                {DNNL_ARG_WEIGHTS, dz},
                                                {DNNL_ARG_DST, db},
                                                {DNNL_ARG_SCRATCHPAD, backend.scratchpad.data()}});
          });
}

void LinearGemms::backward_data(const void* dz, const void* w, const void* x,
                                const LinearGemms* producer, float alpha, void* dx, int64_t batch) {
  GPUBOX_EXPECTS(!spec_.input_is_relu || producer != nullptr, "layer ", spec_.name,
                 ": the ReLU mask needs the layer that produced the input");
  if (batch == 0 || spec_.dx_cols == 0) return;
  Plans& p = *plans_;
  // oneDNN masks by X itself, but the cuda build reads the mask the producer's forward recorded
  // for this batch (linear_gemms_cublaslt.cpp): the same checks here, so that a caller whose
  // producer records no such mask, or never ran (nor prepared) it for this batch, fails on the
  // cpu as it would on a GPU.
  if (spec_.input_is_relu) {
    const LinearGemmSpec& ps = producer->spec_;
    GPUBOX_EXPECTS(ps.relu && ps.out == spec_.in, "layer ", spec_.name, ": its producer ", ps.name,
                   " records no matching ReLU mask");
    plan_for(*producer->plans_, batch, ps.name);
    GPUBOX_EXPECTS(producer->plans_->last_forward_batch == batch, "layer ", spec_.name,
                   ": its producer ", ps.name, " ran no forward of batch ", batch,
                   " before it (its last: ", producer->plans_->last_forward_batch,
                   "): the ReLU mask is that forward's");
  }
  const device::Stream& stream = blas_->stream();
  const auto n = static_cast<std::size_t>(batch);
  if (p.emulated) {
    device::parallel_for(stream, n * spec_.dz_ld,
                         ToFloat{static_cast<const Bf16*>(dz), p.dz32.data()});
    device::parallel_for(stream, p.w32.size(), ToFloat{static_cast<const Bf16*>(w), p.w32.data()});
    if (spec_.input_is_relu) {
      device::parallel_for(stream, n * spec_.x_ld,
                           ToFloat{static_cast<const Bf16*>(x), p.x32.data()});
      x = p.x32.data();
    }
    dz = p.dz32.data();
    w = p.w32.data();
  }
  // The plan's GEMM: runtime-scaled (oneDNN reads the scale from p.alpha when it runs: set there,
  // from this call's value; the chain's scale-down rides on it), or unscaled, alpha then applied
  // by the pass after it, to fp32 rows: dX's own, or for bf16 dX rows those of data_f32, which the
  // pass rounds into dX (make_data).
  const Plans::Plan& chosen = plan_for(p, batch, p.name);
  const bool via_f32 = alpha != 1.0f && chosen.data_f32.made;
  const Plans::Data& data = via_f32 ? chosen.data_f32 : chosen.data;
  const bool bf16_out = !p.emulated && spec_.dx == ElementType::kBf16 && !via_f32;
  void* out = via_f32 || (p.emulated && spec_.dx == ElementType::kBf16) ? p.out32.data() : dx;
  const bool scaled = data.scaled;
  const bool chain = spec_.input_is_relu && !data.mask_after;
  const float after = scaled ? 1.0f : alpha;
  // The pass after the GEMM, in its own task, as cuBLASLt's epilogue masks inside its GEMM: one
  // launch either way, so the step's counts are the same on both backends.
  const bool pass = data.mask_after || after != 1.0f || via_f32;
  const detail::MaskPass mask{data.mask_after ? x : nullptr,
                              spec_.x_ld,
                              out,
                              spec_.dx_ld,
                              spec_.dx_cols,
                              !p.emulated && spec_.input == ElementType::kBf16,
                              bf16_out,
                              after,
                              via_f32 ? static_cast<Bf16*>(dx) : nullptr};
  GPUBOX_EXPECTS(after == 1.0f || !bf16_out, "layer ", spec_.name, ": alpha ", alpha,
                 " after a GEMM into bf16 rows");
  const float runtime_scale = chain ? alpha * kMaskScaleDown : alpha;
  Plans* plans = &p;
  execute(stream, "layer input-gradient GEMM", plans, &blas_->backend(), batch,
          [dz, w, out, x, via_f32, scaled, chain, runtime_scale, plans, pass, mask, n](
              Plans::Plan& plan, Blas::Backend& backend) {
            Gemm& gemm = via_f32 ? plan.data_f32.gemm : plan.data.gemm;
            plans->alpha = runtime_scale;
            for (const auto& [id, ptr] : {std::pair<int, const void*>{DNNL_ARG_SRC, dz},
                                          {DNNL_ARG_WEIGHTS, w},
                                          {DNNL_ARG_DST, out},
                                          {DNNL_ARG_SCRATCHPAD, backend.scratchpad.data()}}) {
              gemm.args.at(id).set_data_handle(const_cast<void*>(ptr));
            }
            if (scaled) gemm.args.at(DNNL_ARG_ATTR_OUTPUT_SCALES).set_data_handle(&plans->alpha);
            if (chain) {
              for (int op : {kMaskMinFirst, kMaskMinSecond}) {
                gemm.args.at(DNNL_ARG_ATTR_MULTIPLE_POST_OP(op) | DNNL_ARG_SRC_1)
                    .set_data_handle(const_cast<void*>(x));
              }
              gemm.args.at(DNNL_ARG_ATTR_MULTIPLE_POST_OP(kMaskScaleUpOp) | DNNL_ARG_SRC_1)
                  .set_data_handle(&plans->mask_scale_up);
            }
            gemm.primitive.execute(backend.stream, gemm.args);
            if (pass) mask(static_cast<int64_t>(n));
          });
  if (out != dx && !via_f32) {
    round_rows_to_bf16(stream, n, spec_.dx_cols, spec_.dx_ld, p.out32.data(), dx);
  }
}

std::string LinearGemms::describe(int64_t batch) const {
  const Plans::Plan& plan = plan_for(*plans_, batch, spec_.name);
  const Blas::Backend& backend = blas_->backend();
  std::string line = "forward " + plan.forward.impl + " + bias" + (spec_.relu ? " + relu" : "") +
                     ", weight grad " + plan.weights.impl + " (+ bias grad)";
  if (spec_.dx_cols > 0) {
    line += ", input grad " + plan.data.gemm.impl +
            (!spec_.input_is_relu   ? ""
             : plan.data.mask_after ? ", relu mask after"
                                    : " + relu mask");
    if (plan.data_f32.made) {
      line += " (alpha != 1: " + plan.data_f32.gemm.impl + " into fp32 rows, rounded after)";
    }
  }
  line += " (oneDNN, " + backend.isa + ", " + element_type_name(spec_.input);
  if (plans_->emulated) line += " emulated in fp32: GPUBOX_BF16_EMULATION=1";
  if (backend.one_thread_gemms) line += ", one thread a GEMM: GPUBOX_REPRODUCIBLE_GEMMS=1";
  return line + ")";
}

}  // namespace gpubox::trainer
