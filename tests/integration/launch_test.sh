#!/usr/bin/env bash
# scripts/launch.sh (issue 16): servers and workers on loopback in every PS mode, PaddleRec's log
# names, and a failing worker ending the whole job (servers stopped, within a bound); Collective
# mode with --gpus (1 and 2 trainers, no servers); the PS trainers' cards (FLAGS_selected_gpus).
# Usage: launch_test.sh BUILD_DIR
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
export GPUBOX_BUILD_DIR="$1"
work="$(mktemp -d "${TMPDIR:-/tmp}/gpubox_launch_test.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "launch_test: $*" >&2; exit 1; }
# Fails unless the `want` servers launch.sh started for the job of out.txt (its "gpubox_server N
# on IP:PORT (pid P, ...)" lines) are gone: launch.sh waits for its servers, so a pid that is
# still a gpubox_server after the job is a leak (listening or not). Not the port: tests running
# beside this one may have been given the freed port since (their servers bind port 0 too).
servers_gone() {  # WHAT WANT
  local found=0 port pid command
  while read -r port pid; do
    found=$((found + 1))
    command="$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" || true)"
    if [[ "$command" == *gpubox_server* ]]; then
      fail "$1: gpubox_server pid $pid (port $port) still runs after the job"
    fi
  done < <(sed -n 's/^launch: gpubox_server [0-9]* on 127.0.0.1:\([0-9]*\) (pid \([0-9]*\),.*/\1 \2/p' out.txt)
  [ "$found" = "$2" ] || { cat out.txt; fail "$1: $found server lines in the launch output, not $2"; }
}

for mode in async sync geo; do
  rm -rf log
  # As PaddleRec runs fleetrun: its training script named too (GPUBox needs none).
  timeout 120 "$repo/scripts/launch.sh" --server_num 2 --worker_num 2 ../../../tools/static_ps_trainer.py \
    -o runner.sync_mode=$mode -o runner.epochs=1 -o runner.metrics_path= >out.txt 2>&1 ||
    { rc=$?; cat out.txt; fail "$mode: exit $rc"; }
  grep -q "static_ps_trainer.py: GPUBox needs no training script" out.txt || fail "$mode: no note on the script"
  grep -q "every worker finished" out.txt || fail "$mode: no 'every worker finished'"
  for f in log/serverlog.0 log/serverlog.1 log/workerlog.0 log/workerlog.1; do
    [ -s "$f" ] || fail "$mode: $f missing"
  done
  grep -q "^pass: 0" log/workerlog.1 || fail "$mode: worker 1 trained no pass"
  grep -q "runner.sync_mode $mode: trainer 1 of 2" log/workerlog.1 || fail "$mode: worker 1's mode"
done
servers_gone "$mode job" 2

# Saves (issue 16): 2 workers x 2 servers save each pass in the gpubox mode's format; run again
# with more epochs, the job (same reader: another is another job) resumes after the last save; --mode infer evaluates a save on its
# servers and --mode export writes it for gpubox_serve (export reads one sparse half: a save of
# one server). QueueDataset with runner.shuffle on warns naming the key.
rm -rf log saves
run_ps() { timeout 120 "$repo/scripts/launch.sh" "$@" -o runner.sync_mode=async \
  -o runner.metrics_path= -o runner.save_mode=checkpoint \
  >out.txt 2>&1 || { cat out.txt; tail -n 20 log/workerlog.*; fail "$* : exit"; }; }
run_ps --server_num 2 --worker_num 2 -o runner.model_save_path="$work/saves" -o runner.epochs=1 \
  -o runner.reader_type=QueueDataset
[ -f "$work/saves/0/MODEL_MANIFEST" ] || fail "no save of pass 0"
grep -q "runner.shuffle" log/workerlog.0 || fail "no warning naming runner.shuffle with QueueDataset"
run_ps --server_num 2 --worker_num 2 -o runner.model_save_path="$work/saves" -o runner.epochs=2 \
  -o runner.reader_type=QueueDataset
grep -q "^pass: 0" log/workerlog.0 && fail "the resumed job trained pass 0 again"
grep -q "^pass: 1" log/workerlog.1 || fail "the resumed job did not train pass 1"
[ -f "$work/saves/1/MODEL_MANIFEST" ] || fail "no save of pass 1"
data="$(sed -n 's/^  train_data_dir: "\([^"]*\)".*/\1/p' "$repo/configs/config_ps.yaml")"
run_ps --server_num 2 --worker_num 1 --mode infer --load "$work/saves/1" \
  --infer_data_dir "$repo/configs/$data"
grep -q "^infer: save: $work/saves/1, examples: [1-9]" log/workerlog.0 || fail "--mode infer: no result line"
run_ps --server_num 1 --worker_num 2 -o runner.model_save_path="$work/one" -o runner.epochs=1
"$GPUBOX_BUILD_DIR/bin/gpubox_train" --config "$repo/configs/config_ps.yaml" --mode export \
  --load "$work/one/0" --out "$work/serving" >out.txt 2>&1 || { cat out.txt; fail "--mode export"; }
[ -f "$work/serving/MANIFEST" ] || fail "--mode export wrote no MANIFEST"

# A job whose workers are killed (SIGKILL) after a save, run again, goes on after its newest save.
rm -rf log "$work/killed"
"$repo/scripts/launch.sh" --server_num 2 --worker_num 2 -o runner.sync_mode=async \
  -o runner.metrics_path= -o runner.model_save_path="$work/killed" -o runner.epochs=1000 \
  >out.txt 2>&1 &
job=$!
trap 'kill "$job" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 600); do [ -f "$work/killed/0/MODEL_MANIFEST" ] && break; sleep 0.1; done
[ -f "$work/killed/0/MODEL_MANIFEST" ] || { kill "$job"; wait "$job" || true; fail "no save to kill after"; }
for pid in $(ps -o pid=,args= --ppid "$job" | awk '$2 ~ /\/gpubox_train$/ { print $1 }'); do
  kill -KILL "$pid"
done
status=0
wait "$job" || status=$?
[ "$status" != 0 ] || fail "a job whose workers were killed exited 0"
trap 'rm -rf "$work"' EXIT
newest="$(ls "$work/killed" | grep -E '^[0-9]+$' | sort -n | tail -1)"
[ -f "$work/killed/$newest/MODEL_MANIFEST" ] || newest=$((newest - 1))  # killed while saving
run_ps --server_num 2 --worker_num 2 -o runner.model_save_path="$work/killed" \
  -o runner.epochs=$((newest + 2))
first="$(grep -m1 -oE '^pass: [0-9]+' log/workerlog.0)"
[ "$first" = "pass: $((newest + 1))" ] || fail "after the kill: first pass '$first', not $((newest + 1))"

# A worker that fails (no data) ends the job: non-zero status naming it, servers stopped.
rm -rf log
start=$SECONDS
status=0
timeout 120 "$repo/scripts/launch.sh" --server_num 1 --worker_num 2 -o runner.sync_mode=sync \
  -o runner.train_data_dir="$work/none" >out.txt 2>&1 || status=$?
[ "$status" != 0 ] && [ "$status" != 124 ] || { cat out.txt; fail "a failing worker: status $status"; }
grep -q "exited with status" out.txt || fail "the failure is not named"
grep -q "does not exist" out.txt || fail "the worker's error is not shown"
[ $((SECONDS - start)) -lt 60 ] || fail "took $((SECONDS - start)) s"
servers_gone "a failing worker's job" 1

# Two launchers in one folder: the second is refused naming the first's server log (both read
# their servers' ports from the same file and crossed servers: one job trained on the other's,
# or stopped it at its end), and the first goes on; launch.sh and run_gpubox.sh alike.
for launcher in launch run_gpubox; do
  rm -rf log
  if [ "$launcher" = launch ]; then
    first_args=(--server_num 1 --worker_num 1 -o runner.sync_mode=async) log_name=serverlog.0
  else
    first_args=(--servers 1 --config "$repo/configs/config_gpubox.yaml") log_name=pserver.0.log
  fi
  "$repo/scripts/$launcher.sh" "${first_args[@]}" -o runner.metrics_path= -o runner.epochs=1000 \
    >first.txt 2>&1 &
  job=$!
  trap 'kill "$job" 2>/dev/null; rm -rf "$work"' EXIT
  for _ in $(seq 1 300); do grep -qs "listening on" "log/$log_name" && break; sleep 0.1; done
  status=0
  timeout 60 "$repo/scripts/$launcher.sh" "${first_args[@]}" -o runner.metrics_path= \
    -o runner.epochs=1 >second.txt 2>&1 || status=$?
  [ "$status" = 2 ] || { cat second.txt; kill "$job"; fail "$launcher twice: the second exited $status"; }
  grep -q "log/$log_name is the log of another launcher's server" second.txt ||
    { cat second.txt; kill "$job"; fail "$launcher twice: the log not named"; }
  kill -0 "$job" 2>/dev/null || { cat first.txt; fail "$launcher twice: the first job ended"; }
  kill "$job"
  wait "$job" || true
  trap 'rm -rf "$work"' EXIT
done

# The launcher's mark (procs_hold_log) held by a live launcher kill -0 may not signal (another
# user's: EPERM; simulated by a kill that always fails) is that launcher's still, not taken over;
# one held by a gone process, or by a live one that is no launcher (its pid reused), is taken over.
mkdir -p marks
(
  source "$repo/scripts/lib/procs.sh"
  kill() { return 1; }
  (exec -a run_gpubox.sh sleep 30) &
  launcher=$!
  sleep 30 &
  other=$!
  echo "$launcher" >marks/a.log.launcher
  status=0
  (procs_hold_log probe marks/a.log) 2>held.txt || status=$?
  [ "$status" = 2 ] && grep -q "is the log of another launcher's server" held.txt ||
    { cat held.txt; fail "a mark whose launcher kill -0 cannot signal was taken over"; }
  echo "$other" >marks/c.log.launcher
  procs_hold_log probe marks/c.log
  [ "$(cat marks/c.log.launcher)" = "$$" ] || fail "a reused pid's mark was not taken over"
  command kill "$launcher" "$other"
  echo 999999999 >marks/b.log.launcher  # above pid_max: gone
  procs_hold_log probe marks/b.log
  [ "$(cat marks/b.log.launcher)" = "$$" ] || fail "a gone launcher's mark was not taken over"
) || exit 1

# A worker stopped (SIGSTOP: it ignores the launcher's SIGTERM): the other worker ends naming it,
# and the launcher kills what did not stop 5 s after its SIGTERM (it waited for the stopped
# worker for ever).
rm -rf log
"$repo/scripts/launch.sh" --server_num 1 --worker_num 2 -o runner.sync_mode=async \
  -o runner.metrics_path= -o runner.epochs=1000 -o runner.peer_timeout_s=2 >out.txt 2>&1 &
job=$!
trap 'kill "$job" 2>/dev/null; rm -rf "$work"' EXIT
stopped=""
for _ in $(seq 1 300); do
  for pid in $(ps -o pid=,args= --ppid "$job" | awk '$2 ~ /\/gpubox_train$/ { print $1 }'); do
    tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qx PADDLE_TRAINER_ID=1 && stopped=$pid
  done
  [ -n "$stopped" ] && break
  sleep 0.1
done
[ -n "$stopped" ] || { kill "$job"; fail "a stopped worker: worker 1 not found"; }
sleep 2  # into its passes
kill -STOP "$stopped"
start=$SECONDS
status=0
for _ in $(seq 1 600); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then
  kill -CONT "$stopped" 2>/dev/null || true
  fail "a stopped worker: the launcher still runs $((SECONDS - start)) s later"
fi
wait "$job" || status=$?
trap 'rm -rf "$work"' EXIT
[ "$status" != 0 ] || fail "a stopped worker: the job exited 0"
kill -0 "$stopped" 2>/dev/null && fail "a stopped worker: pid $stopped still runs"
servers_gone "a stopped worker's job" 1

# A PS trainer killed (SIGKILL) with no launcher beside it to notice (trainers on other
# machines): the other trainer ends within runner.peer_timeout_s and the exit grace (5 s),
# naming it, instead of waiting runner.collective_timeout_s (300 s) at its next barrier.
rm -rf log && mkdir -p log
bin="$GPUBOX_BUILD_DIR/bin"
"$bin/gpubox_server" --port 0 --bind 127.0.0.1 --config "$repo/configs/config_ps.yaml" >log/lost.server 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 600); do grep -q "listening on" log/lost.server && break; sleep 0.1; done
port="$(sed -n 's/^gpubox_server listening on [^ ]*:\([0-9]*\) .*/\1/p' log/lost.server)"
[ -n "$port" ] || { cat log/lost.server; fail "lost trainer: no server"; }
ps_trainer() {  # ID: a trainer of a 2-trainer async job that trains until stopped (run with &)
  exec env PADDLE_PSERVERS_IP_PORT_LIST="127.0.0.1:$port" PADDLE_TRAINERS_NUM=2 PADDLE_TRAINER_ID="$1" \
    POD_IP=127.0.0.1 "$bin/gpubox_train" --config "$repo/configs/config_ps.yaml" \
    -o runner.epochs=1000 -o runner.peer_timeout_s=2 -o runner.metrics_path= \
    -o runner.model_save_path= >"log/lost.$1" 2>&1
}
ps_trainer 0 &
survivor=$!
ps_trainer 1 &
victim=$!
for _ in $(seq 1 600); do grep -q "^pass: 1" log/lost.1 2>/dev/null && break; sleep 0.1; done
grep -q "^pass: 1" log/lost.1 || { cat log/lost.1; fail "lost trainer: trainer 1 trained no pass"; }
kill -KILL "$victim"
start=$SECONDS
status=0
timeout 60 tail --pid="$survivor" -f /dev/null || true
if kill -0 "$survivor" 2>/dev/null; then
  kill -KILL "$survivor"; tail -n 20 log/lost.0; fail "lost trainer: the survivor still ran 60 s later"
fi
wait "$survivor" || status=$?
[ "$status" != 0 ] || fail "lost trainer: the survivor exited 0"
grep -q "lost trainer 1 of 2" log/lost.0 || { tail -n 20 log/lost.0; fail "lost trainer: not named"; }
[ $((SECONDS - start)) -lt 30 ] || fail "lost trainer: the survivor took $((SECONDS - start)) s"
kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true
trap 'rm -rf "$work"' EXIT

# Collective mode as fleetrun --gpus=0,1 starts it: no servers; 1 trainer on both cards, then 2
# trainers of one card each (the shipped config_collective.yaml, saves included), logs as fleetrun's.
# They need 2 cards: simulated on the cpu build, GPUs on the cuda build (skipped with fewer). The
# GPUs counted are the engine's (cudaGetDeviceCount: CUDA_VISIBLE_DEVICES and MIG applied), from
# gpubox_bench devices where the build has it; else nvidia-smi's physical GPUs, capped by
# CUDA_VISIBLE_DEVICES (MIG instances not seen).
gpus=2
counted_by="the cpu build's simulated cards"
if grep -q '^GPUBOX_BACKEND:STRING=cuda' "$GPUBOX_BUILD_DIR/CMakeCache.txt" 2>/dev/null; then
  gpus=0
  if [ -x "$GPUBOX_BUILD_DIR/bin/gpubox_bench" ]; then
    counted_by="gpubox_bench devices (cudaGetDeviceCount)"
    # It fails when no GPU is visible: 0.
    gpus="$(timeout 60 "$GPUBOX_BUILD_DIR/bin/gpubox_bench" devices --json 2>/dev/null |
      sed -n 's/.*"gpus": \([0-9]*\).*/\1/p' || true)"
  elif command -v nvidia-smi >/dev/null; then
    counted_by="nvidia-smi -L (no gpubox_bench built; physical GPUs, MIG instances not seen)"
    gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
    if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
      visible="$(printf '%s' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c . || true)"
      [ "$visible" -ge "$gpus" ] || gpus="$visible"
    fi
  else
    counted_by="nothing (no gpubox_bench built, no nvidia-smi)"
  fi
  gpus="${gpus:-0}"
fi
if [ "$gpus" -ge 2 ]; then
  for workers in 1 2; do
    rm -rf log output
    timeout 120 "$repo/scripts/launch.sh" --gpus 0,1 --worker_num $workers -o runner.epochs=1 \
      -o runner.metrics_path= >out.txt 2>&1 || { rc=$?; cat out.txt; fail "--gpus x $workers: exit $rc"; }
    grep -q "every worker finished" out.txt || fail "--gpus x $workers: no 'every worker finished'"
    ! grep -q "gpubox_server" out.txt || fail "--gpus started a server"
    for ((w = 0; w < workers; w++)); do
      grep -q "Collective mode.*job's 2 cards" "log/workerlog.$w" || fail "workerlog.$w: not Collective on 2 cards"
    done
    grep -q "^pass: 0" log/workerlog.0 || fail "--gpus x $workers: no pass trained"
    [ -f output/model_collective/0/MODEL_MANIFEST ] || { ls -R output >&2 || true; fail "--gpus x $workers: no save"; }
  done
  grep -q "worker 1 of 2 on cards 1 " out.txt || fail "trainer 1 was not given card 1"
  # Worker 1 killed: launch.sh names it and exits with its status (worker 0, failing at once for
  # its lost peer, was named first: the workers were polled in index order).
  rm -rf log output
  "$repo/scripts/launch.sh" --gpus 0,1 --worker_num 2 -o runner.epochs=100000 -o runner.metrics_path= \
    -o runner.model_save_path= >out.txt 2>&1 &
  job=$!
  trap 'kill "$job" 2>/dev/null; rm -rf "$work"' EXIT
  for _ in $(seq 1 600); do grep -q "^pass: 1" log/workerlog.0 2>/dev/null && break; sleep 0.1; done
  grep -q "^pass: 1" log/workerlog.0 || { kill "$job"; cat out.txt; fail "killed worker: no pass 1"; }
  kill -KILL "$(ps -o pid=,args= --ppid "$job" | awk '$2 ~ /\/gpubox_train$/ { print $1 }' | sed -n 2p)"
  status=0
  timeout 60 tail --pid="$job" -f /dev/null || true
  wait "$job" || status=$?
  trap 'rm -rf "$work"' EXIT
  first="$(grep -m1 "exited with status" out.txt || true)"
  [[ "$first" == "launch: worker 1 exited with status 137"* ]] || { cat out.txt; fail "killed worker 1: first named '$first'"; }
  [ "$status" = 137 ] || { cat out.txt; fail "killed worker 1: launch.sh exited $status, not 137"; }
else
  echo "launch_test: SKIPPED Collective --gpus 0,1 (1 and 2 trainers): needs 2 GPUs, $gpus counted by $counted_by"
fi
status=0
"$repo/scripts/launch.sh" --gpus 0,1,2 --worker_num 2 >out.txt 2>&1 || status=$?
[ "$status" = 2 ] && grep -q "do not split evenly" out.txt || fail "3 cards over 2 trainers accepted"

# PS trainers' cards: FLAGS_selected_gpus is split over the trainers of the machine (each needs
# its own card), shared in turn when there are fewer cards than trainers, and not set at all when
# the launch was given none (a cpu trainer uses none). A stand-in gpubox_train shows what it got.
mkdir -p fake/bin
ln -sf "$GPUBOX_BUILD_DIR/bin/gpubox_server" fake/bin/gpubox_server
cat >fake/bin/gpubox_train <<'SH'
#!/usr/bin/env bash
for a in "$@"; do [ "$a" != --print_model_root ] || exit 1; done
echo "cards: ${FLAGS_selected_gpus-unset}"
SH
chmod +x fake/bin/gpubox_train
ps_cards() {  # FLAGS_selected_gpus (or "unset") -> the two workers' cards, one line each
  rm -rf log
  if [ "$1" = unset ]; then
    (unset FLAGS_selected_gpus; GPUBOX_BUILD_DIR="$work/fake" timeout 60 \
      "$repo/scripts/launch.sh" --server_num 1 --worker_num 2 >out.txt 2>&1)
  else
    FLAGS_selected_gpus="$1" GPUBOX_BUILD_DIR="$work/fake" timeout 60 \
      "$repo/scripts/launch.sh" --server_num 1 --worker_num 2 >out.txt 2>&1
  fi || { cat out.txt; fail "PS cards $1: exit"; }
  cat log/workerlog.0 log/workerlog.1
}
[ "$(ps_cards unset)" = "$(printf 'cards: unset\ncards: unset')" ] || fail "PS trainers given cards unasked"
[ "$(ps_cards 0,1,2,3)" = "$(printf 'cards: 0,1\ncards: 2,3')" ] || fail "PS trainers not given a block of cards each"
grep -q "worker 1 of 2 on cards 2,3 " out.txt || fail "PS worker 1's cards not named"
[ "$(ps_cards 5)" = "$(printf 'cards: 5\ncards: 5')" ] || fail "PS trainers do not share the one card"
status=0
FLAGS_selected_gpus=0,1,2 "$repo/scripts/launch.sh" --server_num 1 --worker_num 2 >out.txt 2>&1 || status=$?
[ "$status" = 2 ] && grep -q "do not split evenly over the 2 trainers" out.txt || fail "3 cards over 2 PS trainers accepted"

# Bad arguments: a clear error, nothing started.
status=0
"$repo/scripts/launch.sh" --server_num 0 --worker_num 2 >out.txt 2>&1 || status=$?
[ "$status" = 2 ] && grep -q "server_num" out.txt || fail "--server_num 0 accepted"
# A flag spelt with hyphens (it went on to the trainers, and the count was reported missing), a
# trainer id outside --workers (reported as no endpoint on POD_IP) and an endpoint listed twice
# (only the second server's 'Address already in use') are each named.
refused() {  # refused TEXT ARGS...: launch.sh exits 2 saying TEXT
  local text="$1"
  shift
  status=0
  "$@" >out.txt 2>&1 || status=$?
  [ "$status" = 2 ] && grep -q -- "$text" out.txt || { cat out.txt; fail "not refused with '$text': $*"; }
}
refused "--server-num: did you mean --server_num?" "$repo/scripts/launch.sh" --server-num 1 --worker_num 1
refused "PADDLE_TRAINER_ID='5' is not a trainer of this job: --workers lists 2, ids 0 to 1" \
  env TRAINING_ROLE=TRAINER PADDLE_TRAINER_ID=5 "$repo/scripts/launch.sh" \
  --servers 127.0.0.1:36001 --workers 127.0.0.1:36011,127.0.0.1:36012
refused "endpoint 127.0.0.1:36001 is listed twice" "$repo/scripts/launch.sh" \
  --servers 127.0.0.1:36001,127.0.0.1:36001 --workers 127.0.0.1:36011
# A count flag with no value (bash's "2: parameter null or not set") or with the next flag as
# its value: named.
refused "--server_num needs a value (see --help)" "$repo/scripts/launch.sh" --worker_num 1 --server_num
refused "--worker_num needs a value, not the flag --server_num" "$repo/scripts/launch.sh" \
  --worker_num --server_num 1
refused "--server_num needs a value (see --help)" "$repo/scripts/launch.sh" --server_num= \
  --worker_num=1
refused "--gpus 0,1,00 names card 00 twice" "$repo/scripts/launch.sh" --gpus 0,1,00 --worker_num 1
echo "launch_test: ok"
