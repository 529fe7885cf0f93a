#!/usr/bin/env bash
# scripts/gpu_check.sh where no GPU is: its watchdog, NCCL-transport and topology readers
# (scripts/lib/gpu_check_lib.sh) on made-up runs and NCCL logs with known answers, then the whole
# checklist as --dry-run on this build's cpu binaries (simulated cards): the varying-keys data
# and its training runs, a short soak, step times and card memory in the step counts and the
# benchmark table, an evaluation keeping its predictions (gpubox_train --mode infer
# --predictions_out with graphs, eagerly and on the cpu build, an empty last batch included;
# the predictions files' comparison on made-up files), and the commands of the GPU-only items
# (compute-sanitizer's four tools, the sanitized 2-GPU run, nsys with each graph node traced, the
# layer tests on the GEMM fallback) printed instead of run.
# shellcheck-clean (scripts/gpu_check/*.sh followed from gpu_check.sh) where shellcheck exists.
#   tests/scripts/gpu_check_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src="$(cd "$1" && pwd)"
build="$(cd "$2" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
expect_grep() {  # PATTERN FILE WHAT
  grep -qE -- "$1" "$2" || { fail "$3: no line matches /$1/ in $2"; sed 's/^/    | /' "$2" | tail -n 40 >&2; }
}

# ---- shellcheck -----------------------------------------------------------------------------------
if command -v shellcheck >/dev/null 2>&1; then
  (cd "$src" && shellcheck -x scripts/gpu_check.sh scripts/lib/gpu_check_lib.sh scripts/gpu_lease_check.sh) > "$work/shellcheck.txt" 2>&1 ||
    { fail "shellcheck"; cat "$work/shellcheck.txt" >&2; }
else
  echo "shellcheck is not installed: not checked"
fi

# ---- the library --------------------------------------------------------------------------------
# shellcheck source=scripts/lib/gpu_check_lib.sh
. "$src/scripts/lib/gpu_check_lib.sh"

# NCCL's transports (NCCL_DEBUG=INFO lines as NCCL 2.2x prints them).
nccl_log() {  # FILE TRANSPORT GRAPH_TYPE
  {
    echo "host:1:1 [0] NCCL INFO Pattern 4, crossNic 0, nChannels 2, bw 40.000000/40.000000, type $3, sameChannels 1"
    for ch in 00 01; do
      echo "host:1:1 [0] NCCL INFO Channel $ch/0 : 0[0] -> 1[1] via $2"
      echo "host:1:1 [1] NCCL INFO Channel $ch/0 : 1[1] -> 0[0] via $2"
    done
    echo "host:1:1 [0] NCCL INFO Connected all rings"
  } > "$1"
}
check_nccl() {  # WANT_STATUS NVLINK FILE WHAT
  local rc=0
  gc_nccl_transports "$3" "$2" > "$work/transports.txt" || rc=$?
  [ "$rc" = "$1" ] || { fail "$4: gc_nccl_transports returned $rc, want $1"; cat "$work/transports.txt" >&2; }
}
nccl_log "$work/p2p.log" P2P/CUMEM/read NVL/PIX
check_nccl 0 1 "$work/p2p.log" "P2P over NVLink"
expect_grep '^P2P/CUMEM/read x4$' "$work/transports.txt" "the P2P connections counted"
expect_grep '^graph: NVL/PIX$' "$work/transports.txt" "the graph type named"
nccl_log "$work/shm.log" SHM/direct/direct PIX/PIX
check_nccl 1 0 "$work/shm.log" "SHM on one node"
expect_grep '^SHM/direct/direct x4$' "$work/transports.txt" "the SHM connections named"
nccl_log "$work/net.log" NET/Socket/0 SYS/SYS
check_nccl 1 0 "$work/net.log" "NET on one node"
nccl_log "$work/pcie.log" P2P/IPC PIX/PIX
check_nccl 0 0 "$work/pcie.log" "PCIe P2P without NVLink"
check_nccl 1 1 "$work/pcie.log" "PCIe P2P although the GPUs have NVLink"
# One process driving both GPUs (as gpubox_train does): "P2P/direct pointer".
nccl_log "$work/direct.log" "P2P/direct pointer/read" NVL/PIX
check_nccl 0 1 "$work/direct.log" "P2P/direct pointer in one process"
expect_grep '^P2P/direct x4$' "$work/transports.txt" "the in-process P2P connections counted"
echo "NCCL INFO Bootstrap : Using eth0" > "$work/none.log"
check_nccl 2 0 "$work/none.log" "no connection line"
# Older format: bus ids, "[send]" markers.
echo "NCCL INFO Channel 00 : 0[3000] -> 1[4000] [send] via NET/IB/0" > "$work/old.log"
check_nccl 1 0 "$work/old.log" "NET in the older format"

printf '\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV18\t0-63\nGPU1\tNV18\t X \t0-63\n' > "$work/topo_nv.txt"
printf '\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPIX\t0-63\nGPU1\tPIX\t X \t0-63\n\nLegend:\n  NV#  = Connection traversing a bonded set of # NVLinks\n' > "$work/topo_pix.txt"
gc_topo_has_nvlink "$work/topo_nv.txt" || fail "NV18 in nvidia-smi topo -m is NVLink"
if gc_topo_has_nvlink "$work/topo_pix.txt"; then fail "PIX (and the legend's NV#) is not NVLink"; fi

printf '{"pass": 0, "step_ms_p99": 4.5, "ips": 10}\n{"epoch": 0}\n{"pass": 1, "step_ms_p99": 3.25, "ips": 12}\n' > "$work/m.jsonl"
[ "$(gc_last_pass_number "$work/m.jsonl" step_ms_p99)" = 3.25 ] || fail "gc_last_pass_number: the last pass's value"
[ -z "$(gc_last_pass_number "$work/none.log" step_ms_p99)" ] || fail "gc_last_pass_number: nothing without a pass line"

printf '{"pass": 0, "pass_step_allocations": 0, "pass_step_frees": 0, "pass_step_pinned_allocations": 0}\n' > "$work/clean.jsonl"
[ -z "$(gc_step_allocations "$work/clean.jsonl")" ] || fail "gc_step_allocations: a clean pass flagged"
printf '{"pass": 1, "pass_step_allocations": 64, "pass_step_frees": 0, "pass_step_pinned_allocations": 3}\n' >> "$work/clean.jsonl"
[ "$(gc_step_allocations "$work/clean.jsonl")" = " pass 1 pass_step_allocations 64; pass 1 pass_step_pinned_allocations 3;" ] ||
  fail "gc_step_allocations: got '$(gc_step_allocations "$work/clean.jsonl")'"
[ "$(gc_step_allocations "$work/none.log")" = " no pass line;" ] || fail "gc_step_allocations: no pass line"

# Predictions files (label prediction a line): the same text, within a tolerance, or not.
printf '0 0.5\n1 0.25\n0 0.125\n' > "$work/p.txt"
cp "$work/p.txt" "$work/p_same.txt"
printf '0 0.5\n1 0.25002\n0 0.125\n' > "$work/p_near.txt"
printf '0 0.5\n1 0.25\n0 0.126\n' > "$work/p_far.txt"
printf '0 0.5\n0 0.25\n0 0.125\n' > "$work/p_label.txt"
printf '0 0.5\n1 0.25\n' > "$work/p_short.txt"
gc_compare_predictions "$work/p.txt" "$work/p_same.txt" 0 > "$work/cmp.txt" || fail "the same predictions differ"
[ ! -s "$work/cmp.txt" ] || fail "the same predictions: '$(cat "$work/cmp.txt")'"
if gc_compare_predictions "$work/p.txt" "$work/p_near.txt" 0 > "$work/cmp.txt"; then fail "0.25 and 0.25002 are not the same text"; fi
expect_grep '^differ from line 2$' "$work/cmp.txt" "the first differing line"
gc_compare_predictions "$work/p.txt" "$work/p_near.txt" 1e-4 > "$work/cmp.txt" || fail "2e-5 apart is within 1e-4: $(cat "$work/cmp.txt")"
expect_grep '^max \|difference\| 2e-05$' "$work/cmp.txt" "the largest difference within the tolerance"
if gc_compare_predictions "$work/p.txt" "$work/p_far.txt" 1e-4 > "$work/cmp.txt"; then fail "1e-3 apart passed a 1e-4 tolerance"; fi
expect_grep '^max \|difference\| 0.001 > 0.0001 at line 3$' "$work/cmp.txt" "a difference over the tolerance, and where"
if gc_compare_predictions "$work/p.txt" "$work/p_label.txt" 1e-4 > "$work/cmp.txt"; then fail "different labels passed"; fi
expect_grep 'labels differ from line 2' "$work/cmp.txt" "different labels named"
if gc_compare_predictions "$work/p.txt" "$work/p_short.txt" 1e-4 > "$work/cmp.txt"; then fail "a short file passed"; fi
expect_grep '^3 lines against 2' "$work/cmp.txt" "a missing line named"

# The watchdog: a status passes through; silence is a hang (125) and a run past its limit a
# timeout (124), both stopped after every thread's stack and the Xid lines were written; a soak's
# planned end is no failure.
rc=0
gc_run_watched 30 5 "$work/exit3.log" sh -c 'echo hello; exit 3' || rc=$?
[ "$rc" = 3 ] || fail "a run's own status: got $rc, want 3"
expect_grep '^hello$' "$work/exit3.log" "the run's output"
start=$SECONDS
rc=0
gc_run_watched 60 2 "$work/hang.log" sh -c 'echo started; exec sleep 60' || rc=$?
[ "$rc" = 125 ] || fail "a silent run: got $rc, want 125"
((SECONDS - start < 30)) || fail "a silent run was stopped after $((SECONDS - start))s, want ~2"
[ -f "$work/hang.log.hang.txt" ] || fail "no stack dump next to the hung run's log"
expect_grep '^==== pid [0-9]+: sleep 60' "$work/hang.log.hang.txt" "the hung process named"
expect_grep '^---- threads \(kernel view\)' "$work/hang.log.hang.txt" "every thread's kernel state"
expect_grep '^== kernel log: NVIDIA Xid lines' "$work/hang.log.hang.txt" "the Xid lines"
expect_grep 'no output for 2s' "$work/hang.log" "the log says why it was stopped"
hung_pid="$(sed -n 's/^==== pid \([0-9]*\):.*/\1/p' "$work/hang.log.hang.txt" | head -n 1)"
if [ -n "$hung_pid" ] && kill -0 "$hung_pid" 2>/dev/null; then fail "the hung run (pid $hung_pid) is still running"; fi
rc=0
gc_run_watched 2 0 "$work/limit.log" sh -c 'while :; do echo tick; sleep 0.2; done' || rc=$?
[ "$rc" = 124 ] || fail "a run past its limit: got $rc, want 124"
expect_grep '^==== pid ' "$work/limit.log.hang.txt" "stacks of a run past its limit"
rc=0
GC_LIMIT_ENDS_RUN=1 gc_run_watched 2 0 "$work/soak.log" sh -c 'while :; do echo tick; sleep 0.2; done' || rc=$?
[ "$rc" = 0 ] || fail "a soak's planned end: got $rc, want 0"
[ ! -e "$work/soak.log.hang.txt" ] || fail "a soak's planned end dumped stacks"

# ---- the checklist, dry run on the cpu build ----------------------------------------------------
for tool in gpubox_train gpubox_data gpubox_bench dataset_generator_test; do
  [ -x "$build/bin/$tool" ] || { echo "$build/bin/$tool is not built"; exit 1; }
done
rc=0
(cd "$work" && "$src/scripts/gpu_check.sh" --dry-run --bin "$build/bin" --cards 1,2 --lines 2000 --epochs 1 \
   --batch 200 --skip-tests --sanitizer-tests dataset_generator_test --keys-per-slot 0:3 --soak 6 \
   --keep-data --out "$work/check") > "$work/check.log" 2>&1 || rc=$?
[ "$rc" = 0 ] || { fail "gpu_check.sh --dry-run exited $rc"; tail -n 40 "$work/check.log" >&2; }
summary="$work/check/summary.txt"
for tool in memcheck racecheck initcheck synccheck; do
  expect_grep "would run: compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 97 .*/dataset_generator_test" "$work/check.log" "$tool over the step tests"
  expect_grep "^SKIP +$tool dataset_generator_test +dry run" "$summary" "$tool recorded as a dry run"
done
expect_grep 'would run: env FLAGS_selected_gpus=0\\?,1 compute-sanitizer --tool memcheck .*gpubox_train .*runner.train_data_dir=.*/varying' \
  "$work/check.log" "memcheck on a 2-GPU training run on the varying-keys data"
expect_grep 'would run: nsys profile --trace=cuda\\?,nvtx' "$work/check.log" "the nsys profile (NVTX traced)"
expect_grep 'would run: nsys profile .*--cuda-graph-trace=node ' "$work/check.log" "a replayed step graph's kernels traced one by one"
# Item 3b: the layer tests with every layer GEMM on the fallback.
for t in trainer_nn_test trainer_dropout_test; do
  expect_grep "would run: env GPUBOX_FORCE_GEMM_FALLBACK=1 GPUBOX_DEVICE_CHECK=1 .*/$t " "$work/check.log" "$t on the GEMM fallback"
  expect_grep "^SKIP +GEMM fallback $t +dry run" "$summary" "$t on the GEMM fallback recorded as a dry run"
done
expect_grep '^PASS +2-card run' "$summary" "the 2-card run on simulated cards"
expect_grep '^SKIP +NCCL transports +simulated cards' "$summary" "no NCCL transports without NCCL"
expect_grep '^PASS +step counts, 2 card\(s\) .*step p50/p99 [0-9.]+/[0-9.]+ ms, card memory [0-9.]+ MiB' "$summary" "step times and memory in the step counts"
expect_grep '^PASS +benchmark, 2 card\(s\)' "$summary" "the benchmark"
expect_grep '^PASS +varying keys, 1 card\(s\) +no step allocated' "$summary" "varying keys on 1 card"
expect_grep '^PASS +varying keys, 2 card\(s\) +no step allocated' "$summary" "varying keys on 2 cards"
expect_grep '^PASS +soak, 2 card\(s\) +[1-9][0-9]* passes; step p99 first/last pass [0-9.]+/[0-9.]+ ms; card memory' "$summary" "the soak"
# The step counts' evaluation keeps its predictions (gpubox_bench step: 512 x 20 a card), one
# graph per upload buffer a card.
expect_grep '^PASS +step counts, 2 card\(s\) .*evaluation 1 graph launch of [0-9.]+ nodes \(4 captured, 20480 predictions kept\)' \
  "$summary" "the step counts' evaluation keeping its predictions"
# Item 10: --mode infer --predictions_out on the varying-keys data (1000 lines) and on the edge
# data (1 card: 2 x 200 + 1 lines; 2 cards: 2 x 2 x 200 + 1, none in the last card's last batch),
# with graphs, eagerly and on the cpu build (--bin itself here).
for want in "1 card\(s\), varying +1000" "1 card\(s\), edge +401" "2 card\(s\), varying +1000" "2 card\(s\), edge +801"; do
  expect_grep "^PASS +predictions, $want predictions; graphs = eager exactly; against the cpu build: max \|difference\| 0 <= 1e-4" \
    "$summary" "predictions, $want"
done
[ "$(grep -c . "$work/check/predictions/edge.2.graphs.txt")" = 801 ] || fail "edge.2.graphs.txt has no line per instance"
# results.tsv: the step-time and memory columns hold numbers for every card count.
awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
  { if (!($col["step_ms_p50"] > 0 && $col["step_ms_p99"] >= $col["step_ms_p50"] && $col["card_memory_peak_mb"] > 0)) bad = 1; n++ }
  END { exit !(n == 2 && !bad && ("gpu_memory_used_mib" in col)) }' "$work/check/results.tsv" ||
  { fail "results.tsv's step time and memory columns"; cat "$work/check/results.tsv" >&2; }
# The varying-keys data: slot tokens per line vary (0 to 3 keys in each of 26 slots).
distinct="$(head -n 200 "$work/check/data/varying/part-00000" | awk '{ print NF }' | sort -u | wc -l)"
((distinct > 5)) || fail "the varying-keys data has $distinct distinct token counts per line"

# --tests runs the named binaries in that order; a name that is no binary is a failure, not a skip.
rc=0
(cd "$work" && "$src/scripts/gpu_check.sh" --bin "$build/bin" --cards 1 --skip-sanitizer --skip-nccl --skip-nsys \
   --skip-step --skip-bench --skip-varying --tests dataset_generator_test,no_such_test --out "$work/only") \
   > "$work/only.log" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "--tests with a missing binary exited $rc, want 1"
expect_grep '^dataset_generator_test +ok ' "$work/only.log" "the named test ran"
expect_grep '^SKIP +GEMM fallback trainer_nn_test +no GPU' "$work/only/summary.txt" "no GEMM fallback to force without a GPU"
expect_grep '^FAIL +test no_such_test +--tests names .*no_such_test, which is not an executable' "$work/only/summary.txt" \
  "the missing test named"
[ "$(grep -cE '^[a-z_]+_test +(ok|FAILED) ' "$work/only.log")" = 1 ] || fail "--tests ran other binaries too"

if ((failures)); then
  echo "gpu_check_test: $failures failure(s)"
  exit 1
fi
echo "gpu_check_test: all passed"
