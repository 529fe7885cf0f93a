#!/usr/bin/env bash
# gpu_check.sh — the first-GPU-run checklist. Run inside an unpacked GPUBox CUDA bundle
# (scripts/bundle_cuda.sh makes it) on a GPU machine; one command checks that machine end to end
# and writes everything under one output folder (--out):
#   device/     1. nvidia-smi (summary, -q, topo -m)
#               2. the shared libraries of bin/ resolve (bundle lib/ + the driver, cuBLAS, NCCL),
#                  then `gpubox_bench devices`: the peer-access matrix GPUBox grants
#                  (cudaMemPoolSetAccess between every pair of GPUs that can)
#   tests/      3. the CUDA build's unit tests (every bin/*_test, GPUBOX_DEVICE_CHECK=1); tests
#                  needing more GPUs than the machine has skip and say so
#   gemm_fallback/ 3b. the layer tests (trainer_nn_test, trainer_dropout_test) again with
#                  GPUBOX_FORCE_GEMM_FALLBACK=1: every layer GEMM a plain cublasGemmEx plus the
#                  element-wise kernels, the path taken where cuBLASLt has no algorithm
#   sanitizer/  4. compute-sanitizer memcheck, racecheck, initcheck and synccheck over the step
#                  tests (hash table, card store, row pool, HeterComm, segment reduce, dense
#                  model, metrics, step accounting; --sanitizer-tests), and memcheck on a 2-GPU
#                  training run on data with varying keys (needs 2 GPUs). Source lines in the
#                  reports need a build with -lineinfo (GPUBOX_CUDA_LINEINFO, on in bundle_cuda.sh's build)
#   nccl/       5. a 2-card training run with NCCL_DEBUG=INFO (needs 2 GPUs): the transports
#                  NCCL chose go to nccl/transports.txt and must all be P2P on one node (not SHM,
#                  not NET), over NVLink (graph type NVL) when nvidia-smi topo shows NVLink
#   nsys/       6. an nsys profile of one training pass on Zipf data, 1 GPU (when nsys exists),
#                  with its kernel / API / memcpy summaries (--cuda-graph-trace=node: a replayed
#                  step graph's kernels one by one) and the time per GPUBox NVTX range (the step's
#                  phases, begin_pass, end_pass, the next pass's card work: host time, the
#                  enqueue of each; docs/operations.md)
#   step/       7. `gpubox_bench step --json` per card count: host syncs, allocations, copies,
#                  launches and collectives per training step (limits: 0 syncs, <= 1 pipeline
#                  wait, 0 allocations, 0 pageable copies, 4 collectives; the same per
#                  evaluation step; no allocation or pinned regrowth in any step
#                  of the first pass either), step time p50/p99, the card memory
#                  high-water mark and examples/s; then an evaluation keeping its predictions:
#                  1 graph launch a step, every prediction back, 2 graphs captured a card
#   bench/      8. a benchmark per card count: gpubox_train on generated data with
#                  FLAGS_selected_gpus=0 / 0,1 / 0,1,2,3 / ... up to the GPUs present: cards,
#                  examples/s, per card, scaling ips(C) / (C * ips(1)), AUC, step time p50/p99,
#                  card memory high-water mark (the device layer's; with a GPU also nvidia-smi's
#                  memory.used, sampled) (results.tsv)
#   varying/    9. training on data whose keys per line vary (gpubox_data gen --keys_per_slot,
#                  --keys-per-slot) on 1 card and on the most cards, every step's buffers sized
#                  before the pass (pass_step_allocations 0); with --soak S also a soak run on
#                  the most cards for S seconds, pass after pass, on that data
#   predictions/ 10. an evaluation keeping its predictions (gpubox_train --mode infer
#                  --predictions_out, of a pass trained and saved on item 9's data) on 1 card and
#                  on the most, on item 9's data and on data whose last batch is empty on the last
#                  card: with step graphs, without (GPUBOX_STEP_GRAPHS=0: the same exactly) and on
#                  a cpu build (--cpu-bin: every prediction within 1e-4)
#   summary.txt one line per item: PASS, FAIL or SKIP with the reason. Works on 1 GPU (what
#               needs more is skipped) and on 8.
# A training run whose output stays silent for --hang-timeout seconds, or any run or test past its
# limit, is stopped after the stacks of every thread of it (gdb, else eu-stack, plus the kernel's view
# of each thread), the kernel's NVIDIA Xid lines (dmesg) and nvidia-smi are written next to its
# log (<log>.hang.txt); it counts as FAIL.
#
# usage: scripts/gpu_check.sh [--cards 1,2,4] [--lines N] [--epochs E] [--batch B] [--max-steps S]
#                             [--out DIR] [--skip-tests] [--skip-sanitizer] [--skip-nccl]
#                             [--skip-nsys] [--skip-step] [--skip-bench] [--skip-predictions]
#                             [--skip-gemm-fallback]
#                             [--cpu-bin DIR] [--test-timeout S]
#                             [--sanitizer-timeout S] [--run-timeout S] [--keep-data]
#                             [--no-link] [--bin DIR] [--keys-per-slot MIN:MAX] [--skip-varying]
#                             [--soak S] [--hang-timeout S] [--sanitizer-tests LIST] [--tests LIST]
#                             [--dry-run]
#   --cards LIST      card counts to benchmark (default: 1, 2, 4, ... and the number of GPUs present)
#   --lines N         training lines generated (default 1000000; held-out test set: N/10 more)
#   --epochs E        passes over the data per run (default 2; the table shows the last pass, whose
#                     keys are already on the cards, and the test AUC after it)
#   --batch B         instances per card per step (default 2048, runner.train_batch_size)
#   --max-steps S     refuse runs longer than S steps on one card (default 5000)
#   --out DIR         the output folder (default ./gpu_check.<UTC time>)
#   --skip-*          leave out an item (it shows as SKIP in summary.txt)
#   --test-timeout S  limit per test binary (default 600); --sanitizer-timeout S: per sanitized
#                     test binary (default 3600); --run-timeout S: per training run (default 900)
#   --keep-data       keep the generated data (default: deleted on exit; it lives under --out)
#   --no-link         do not create the tests' compiled-in source path (see below); those tests are skipped
#   --bin DIR         take the binaries from DIR instead of the bundle's bin/ (e.g. a cpu build, with
#                     --cards: then the "cards" are simulated, no GPU is needed, and the items that
#                     need a GPU are skipped)
#   --cpu-bin DIR     a cpu build's binaries (its gpubox_train, `--version` says backend cpu): item
#                     10's reference predictions (default: the bundle's cpu-bin/ when present, or
#                     --bin itself when that is a cpu build; none: that comparison is skipped)
#   --keys-per-slot MIN:MAX  keys in each slot of a line of item 9's data (default 0:3)
#   --soak S          item 9 also trains on the most cards for S seconds, pass after pass, and
#                     reports step times and memory of the first and last pass (default 0: none)
#   --hang-timeout S  seconds a gpubox_train run may print nothing before it counts as hung
#                     (default 300; tests, sanitized runs, nsys, gpubox_bench: only their limit)
#   --sanitizer-tests LIST  comma-separated test binaries item 4 sanitizes (default: the step's)
#   --tests LIST      comma-separated test binaries item 3 runs, in that order (default: every bin/*_test,
#                     by name); a short lease runs the step's tests first this way
#   --dry-run         run what needs no GPU (data, training and step counts on --bin's simulated
#                     cards) and print the commands of what needs one instead of running them
# Some tests open files through absolute paths of the machine that built the bundle (its source
# folder's configs/, its build-cuda/bin/ tools); test_paths.txt lists them. When that source folder
# does not exist here, a symlink to the bundle is made in its place for the run and removed on exit.
# Exit status: 0 when no item failed (skipped items are fine).
set -euo pipefail

usage() { sed -n '/^# usage:/,/^# Exit status/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }
die() { echo "gpu_check: error: $*" >&2; exit 1; }
note() { echo "gpu_check: $*"; }

root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/lib/gpu_check_lib.sh
. "$root/scripts/lib/gpu_check_lib.sh"
bin="$root/bin"
custom_bin=0
cards_arg=""
lines=1000000
epochs=2
batch=2048
max_steps=5000
out=""
run_tests=1
run_sanitizer=1
run_nccl=1
run_nsys=1
run_step=1
run_bench=1
test_timeout=600
sanitizer_timeout=3600
run_timeout=900
keep_data=0
link=1
keys_per_slot="0:3"
soak_seconds=0
hang_timeout=300
only_tests=""
sanitizer_tests="hash_table_test,hash_table_wait_free_test,card_store_test,row_pool_test,device_test,key_dedup_test,heter_comm_test,segment_reduce_test,trainer_nn_test,trainer_metrics_test,step_accounting_test"
dry_run=0
run_varying=1
run_predictions=1
run_gemm_fallback=1
gemm_fallback_tests="trainer_nn_test,trainer_dropout_test"
cpu_bin=""
need_value() { (($2 >= 2)) || die "$1 needs a value"; }
while (($#)); do
  case "$1" in
    --cards) need_value "$1" $#; cards_arg="$2"; shift 2 ;;
    --lines) need_value "$1" $#; lines="$2"; shift 2 ;;
    --epochs) need_value "$1" $#; epochs="$2"; shift 2 ;;
    --batch) need_value "$1" $#; batch="$2"; shift 2 ;;
    --max-steps) need_value "$1" $#; max_steps="$2"; shift 2 ;;
    --out) need_value "$1" $#; out="$2"; shift 2 ;;
    --skip-tests) run_tests=0; shift ;;
    --skip-sanitizer) run_sanitizer=0; shift ;;
    --skip-nccl) run_nccl=0; shift ;;
    --skip-nsys) run_nsys=0; shift ;;
    --skip-step) run_step=0; shift ;;
    --skip-bench) run_bench=0; shift ;;
    --skip-predictions) run_predictions=0; shift ;;
    --skip-gemm-fallback) run_gemm_fallback=0; shift ;;
    --cpu-bin) need_value "$1" $#; cpu_bin="$2"; shift 2 ;;
    --test-timeout) need_value "$1" $#; test_timeout="$2"; shift 2 ;;
    --sanitizer-timeout) need_value "$1" $#; sanitizer_timeout="$2"; shift 2 ;;
    --run-timeout) need_value "$1" $#; run_timeout="$2"; shift 2 ;;
    --keep-data) keep_data=1; shift ;;
    --no-link) link=0; shift ;;
    --bin) need_value "$1" $#; bin="$2"; custom_bin=1; shift 2 ;;
    --keys-per-slot) need_value "$1" $#; keys_per_slot="$2"; shift 2 ;;
    --soak) need_value "$1" $#; soak_seconds="$2"; shift 2 ;;
    --hang-timeout) need_value "$1" $#; hang_timeout="$2"; shift 2 ;;
    --sanitizer-tests) need_value "$1" $#; sanitizer_tests="$2"; shift 2 ;;
    --tests) need_value "$1" $#; only_tests="$2"; shift 2 ;;
    --skip-varying) run_varying=0; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "gpu_check: unknown argument '$1'" >&2; usage ;;
  esac
done
for pair in "--lines:$lines" "--epochs:$epochs" "--batch:$batch" "--max-steps:$max_steps" \
            "--test-timeout:$test_timeout" "--sanitizer-timeout:$sanitizer_timeout" \
            "--run-timeout:$run_timeout" "--hang-timeout:$hang_timeout"; do
  [[ "${pair#*:}" =~ ^[1-9][0-9]*$ ]] || die "${pair%%:*} must be a positive whole number, got '${pair#*:}'"
done
[[ "$soak_seconds" =~ ^[0-9]+$ ]] || die "--soak must be a whole number of seconds, got '$soak_seconds'"
[[ "$keys_per_slot" =~ ^[0-9]+(:[0-9]+)?$ ]] || die "--keys-per-slot must look like 0:3, got '$keys_per_slot'"
[[ "$sanitizer_tests" =~ ^[A-Za-z0-9_]+(,[A-Za-z0-9_]+)*$ ]] || die "--sanitizer-tests must look like a_test,b_test, got '$sanitizer_tests'"
if ((dry_run)) && [ -z "$cards_arg" ] && ! command -v nvidia-smi >/dev/null 2>&1; then cards_arg="1,2"; fi
if [ -n "$cards_arg" ]; then
  [[ "$cards_arg" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "--cards must look like 1,2,4, got '$cards_arg'"
fi
if ((!custom_bin)) && [ ! -d "$bin" ]; then
  die "no bin/ in $root: run the copy of this script inside a bundle (scripts/bundle_cuda.sh makes one), or give --bin DIR"
fi
[ -d "$bin" ] || die "--bin '$bin' is not a folder"
bin="$(cd "$bin" && pwd)"
for t in gpubox_train gpubox_data gpubox_bench; do [ -x "$bin/$t" ] || die "$bin/$t is missing"; done
# Item 10's reference: a cpu build's gpubox_train.
backend_of() { "$1/gpubox_train" --version 2>/dev/null | sed -n 's/.*backend \([a-z]*\).*/\1/p' | head -n 1 || true; }
if [ -z "$cpu_bin" ]; then
  if [ -x "$root/cpu-bin/gpubox_train" ]; then
    cpu_bin="$root/cpu-bin"
  elif [ "$(backend_of "$bin")" = cpu ]; then
    cpu_bin="$bin"
  fi
elif [ ! -x "$cpu_bin/gpubox_train" ]; then
  die "--cpu-bin '$cpu_bin' has no gpubox_train"
fi
# One that does not run here (a library missing) or is no cpu build: item 10 says so and skips it.
cpu_bin_problem=""
if [ -n "$cpu_bin" ]; then
  cpu_bin="$(cd "$cpu_bin" && pwd)"
  if [ "$(backend_of "$cpu_bin")" != cpu ]; then
    cpu_bin_problem="$cpu_bin/gpubox_train is no cpu build that runs here: $("$cpu_bin/gpubox_train" --version 2>&1 | head -n 1 || true)"
    echo "gpu_check: warning: --cpu-bin: $cpu_bin_problem" >&2
    cpu_bin=""
  fi
fi
[ -f "$root/configs/config_synthetic.yaml" ] || die "$root/configs/config_synthetic.yaml is missing (not a GPUBox bundle?)"
[ -n "$out" ] || out="$PWD/gpu_check.$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out" || die "--out '$out': cannot create the folder"
out="$(cd "$out" && pwd)"
data="$out/data"
summary="$out/summary.txt"
: > "$summary"

# The items, phase by phase (scripts/gpu_check/*.sh).
parts="$root/scripts/gpu_check"
for part in common device tests gemm_fallback sanitizer nccl nsys step bench varying predictions; do
  [ -f "$parts/$part.sh" ] || die "$parts/$part.sh is missing (copy scripts/gpu_check/ with gpu_check.sh)"
done
# shellcheck source=scripts/gpu_check/common.sh
. "$parts/common.sh"
# shellcheck source=scripts/gpu_check/device.sh
. "$parts/device.sh"
# shellcheck source=scripts/gpu_check/tests.sh
. "$parts/tests.sh"
# shellcheck source=scripts/gpu_check/gemm_fallback.sh
. "$parts/gemm_fallback.sh"
# shellcheck source=scripts/gpu_check/sanitizer.sh
. "$parts/sanitizer.sh"
# shellcheck source=scripts/gpu_check/nccl.sh
. "$parts/nccl.sh"
# shellcheck source=scripts/gpu_check/nsys.sh
. "$parts/nsys.sh"

# Card counts of the step counts and the benchmark.
if [ -n "$cards_arg" ]; then
  IFS=, read -r -a counts <<<"$cards_arg"
else
  counts=()
  for ((c = 1; c <= ngpu; c *= 2)); do counts+=("$c"); done
  ((ngpu == 0)) || [ "${counts[-1]}" = "$ngpu" ] || counts+=("$ngpu")
fi
if ((ngpu > 0)); then
  for c in "${counts[@]}"; do ((c <= ngpu)) || die "--cards asks for $c cards, but nvidia-smi lists $ngpu GPUs"; done
fi

# shellcheck source=scripts/gpu_check/step.sh
. "$parts/step.sh"
# shellcheck source=scripts/gpu_check/bench.sh
. "$parts/bench.sh"
# shellcheck source=scripts/gpu_check/varying.sh
. "$parts/varying.sh"
# shellcheck source=scripts/gpu_check/predictions.sh
. "$parts/predictions.sh"

echo
echo "================ summary ($summary)"
cat "$summary"
if ((failures)); then
  echo "gpu_check: FAILED ($failures item(s); details in $out)"
  exit 1
fi
echo "gpu_check: all passed (skipped items say why)"
