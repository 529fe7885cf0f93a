#!/usr/bin/env bash
# scripts/launch.sh (issue 16): servers and workers on loopback in every PS mode, PaddleRec's log
# names, and a failing worker ending the whole job (servers stopped, within a bound); Collective
# mode with --gpus (1 and 2 trainers, no servers).
# Usage: launch_test.sh BUILD_DIR
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
export GPUBOX_BUILD_DIR="$1"
work="$(mktemp -d "${TMPDIR:-/tmp}/gpubox_launch_test.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "launch_test: $*" >&2; exit 1; }
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

for mode in async sync geo; do
  rm -rf log
  timeout 120 "$repo/scripts/launch.sh" --server_num 2 --worker_num 2 -o runner.sync_mode=$mode \
    -o runner.epochs=1 -o runner.metrics_path= >out.txt 2>&1 || { cat out.txt; fail "$mode: exit $?"; }
  grep -q "every worker finished" out.txt || fail "$mode: no 'every worker finished'"
  for f in log/serverlog.0 log/serverlog.1 log/workerlog.0 log/workerlog.1; do
    [ -s "$f" ] || fail "$mode: $f missing"
  done
  grep -q "^pass: 0" log/workerlog.1 || fail "$mode: worker 1 trained no pass"
  grep -q "runner.sync_mode $mode: trainer 1 of 2" log/workerlog.1 || fail "$mode: worker 1's mode"
done
ports="$(sed -n 's/^launch: gpubox_server [0-9]* on 127.0.0.1:\([0-9]*\).*/\1/p' out.txt)"
for p in $ports; do ! port_in_use "$p" || fail "server port $p still served after the job"; done

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
ports="$(sed -n 's/^launch: gpubox_server [0-9]* on 127.0.0.1:\([0-9]*\).*/\1/p' out.txt)"
for p in $ports; do ! port_in_use "$p" || fail "server port $p still served after a failure"; done

# Collective mode as fleetrun --gpus=0,1 starts it: no servers; 1 trainer on both cards, then 2
# trainers of one card each (the shipped config_collective.yaml, saves included), logs as fleetrun's.
for workers in 1 2; do
  rm -rf log output
  timeout 120 "$repo/scripts/launch.sh" --gpus 0,1 --worker_num $workers -o runner.epochs=1 \
    -o runner.metrics_path= >out.txt 2>&1 || { cat out.txt; fail "--gpus x $workers: exit $?"; }
  grep -q "every worker finished" out.txt || fail "--gpus x $workers: no 'every worker finished'"
  ! grep -q "gpubox_server" out.txt || fail "--gpus started a server"
  for ((w = 0; w < workers; w++)); do
    grep -q "Collective mode.*job's 2 cards" "log/workerlog.$w" || fail "workerlog.$w: not Collective on 2 cards"
  done
  grep -q "^pass: 0" log/workerlog.0 || fail "--gpus x $workers: no pass trained"
  [ -f output/model_collective/0/MODEL_MANIFEST ] || { ls -R output >&2 || true; fail "--gpus x $workers: no save"; }
done
grep -q "worker 1 of 2 on cards 1 " out.txt || fail "trainer 1 was not given card 1"
status=0
"$repo/scripts/launch.sh" --gpus 0,1,2 --worker_num 2 >out.txt 2>&1 || status=$?
[ "$status" = 2 ] && grep -q "do not split evenly" out.txt || fail "3 cards over 2 trainers accepted"

# Bad arguments: a clear error, nothing started.
status=0
"$repo/scripts/launch.sh" --server_num 0 --worker_num 2 >out.txt 2>&1 || status=$?
[ "$status" = 2 ] && grep -q "server_num" out.txt || fail "--server_num 0 accepted"
echo "launch_test: ok"
