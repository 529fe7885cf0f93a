#!/usr/bin/env bash
# scripts/fault_check.sh: replays the abuse of issue #12 (items 1-11) and the network items of
# issue #30 (rows 30.N) against live gpubox_server processes and the live trainer on loopback and
# prints a table, probe -> held / failed; exits non-zero when any probe failed. Every loop is bounded (a few hundred connections, 20k requests, a dozen
# short training runs); about a minute in all. The client side of each server probe is
# build/bin/gpubox_fault_probe (tests/table/server/fault_probe*.cpp); the trainer rows (items 7-11)
# drive gpubox_train and gpubox_data on generated data; row 30.11 cuts the link between two
# trainers in network namespaces of its own (root only; skipped otherwise).
#   scripts/fault_check.sh [--only server|trainer]   (GPUBOX_FAULT_KEEP=1 keeps the work folder)
set -euo pipefail
only=""
case "${1:-}" in
  --only) only="${2:-}" ;;
  --only=*) only="${1#--only=}" ;;
  "") ;;
  *) echo "fault_check: unknown argument '$1' (use --only server|trainer)" >&2; exit 2 ;;
esac
repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/lib/procs.sh
source "$repo/scripts/lib/procs.sh"  # (procs_listened_port)
cd "$repo"
build_dir="${GPUBOX_BUILD_DIR:-build}"
if [ ! -f "$build_dir/CMakeCache.txt" ]; then scripts/setup.sh && scripts/build.sh cpu >/dev/null; fi
cmake --build "$build_dir" -j "${GPUBOX_JOBS:-2}" \
  --target gpubox_server gpubox_fault_probe gpubox_train gpubox_data >/dev/null
bin_dir="$(cd "$build_dir/bin" && pwd)"  # absolute: the trainer rows run in their own folder
server_bin="$bin_dir/gpubox_server"
probe_bin="$bin_dir/gpubox_fault_probe"
train_bin="$bin_dir/gpubox_train"
data_bin="$bin_dir/gpubox_data"

work="$(mktemp -d "${TMPDIR:-/tmp}/gpubox_fault_check.XXXXXX")"
pids=()
cleanup() {  # SIGTERM: the servers stop gracefully
  for pid in "${pids[@]:-}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]:-}"; do [ -n "$pid" ] && wait "$pid" 2>/dev/null || true; done
  if [ "${GPUBOX_FAULT_KEEP:-0}" = 1 ]; then echo "fault_check: work folder kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
cat >"$work/config.yaml" <<'YAML'
hyper_parameters:
  sparse_feature_dim: 5
  sparse_optimizer:
    class: adagrad
YAML

# start_server NAME NOFILE [flags...]: starts a server in $work/NAME (data/ its --data_dir) with
# `ulimit -n NOFILE` (0: unchanged); sets $pid and $port.
start_server() {
  local name=$1 nofile=$2
  shift 2
  mkdir -p "$work/$name/data"
  (
    if [ "$nofile" != 0 ]; then ulimit -n "$nofile"; fi
    exec "$server_bin" --port 0 --config "$work/config.yaml" --data_dir "$work/$name/data" "$@"
  ) >"$work/$name/out" 2>"$work/$name/log" &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 1 100); do
    port="$(procs_listened_port "$work/$name/out")"
    if [ -n "$port" ]; then
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "fault_check: server $name did not start; see below" >&2
  cat "$work/$name/log" >&2
  return 1
}

rows=()
failures=0
# record ITEM PROBE RESULT-LINE
record() {
  local item=$1 probe=$2 line=$3
  local verdict="${line%%:*}" detail="${line#*: }"
  [ "$verdict" = held ] || [ "$verdict" = skipped ] || { verdict=failed; failures=$((failures + 1)); }
  rows+=("$(printf '%-5s  %-22s  %-6s  %s' "$item" "$probe" "$verdict" "$detail")")
}
# probe ITEM NAME PROBE [flags...]: runs gpubox_fault_probe against server NAME ($pid, $port).
probe() {
  local item=$1 name=$2 what=$3
  shift 3
  local line
  line="$("$probe_bin" "$what" --endpoint "127.0.0.1:$port" --pid "$pid" --log "$work/$name/log" \
          --data_dir "$work/$name/data" "$@" 2>>"$work/$name/probe.err" || true)"
  record "$item" "$what" "${line:-failed: the probe printed nothing (see $work/$name/probe.err)}"
}

if [ "$only" != trainer ]; then
# 1: connections over the cap (default cap under 256 descriptors: 192), idle timeout.
start_server capped 256 --idle_timeout_s 2
probe 1 capped over_cap --idle_timeout_s 2
# 30.10: at the cap a client reads "server at its connection cap (N)", not a reset.
probe 30.10 capped cap_message
# 1: out of descriptors (a cap above the limit, so accept() itself fails).
start_server nofds 256 --max_connections 1000 --idle_timeout_s 0
probe 1 nofds out_of_fds

start_server plain 0
plain_pid=$pid plain_port=$port
(umask 077 && od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$work/token")  # 128 bits
start_server guarded 0 --auth_token_file "$work/token"
guarded_pid=$pid guarded_port=$port

pid=$plain_pid port=$plain_port
probe 3 plain forged_lengths
pid=$guarded_pid port=$guarded_port
probe 3 guarded forged_lengths --token "$(cat "$work/token")"
pid=$plain_pid port=$plain_port
probe 2 plain barrier_leavers
probe 4 plain retry_cache
probe 5 plain paths
pid=$guarded_pid port=$guarded_port
probe 5 guarded token_required

# 5: without a token the server says so and refuses a non-loopback bind.
if grep -q "no --auth_token_file: any local process can use this server" "$work/plain/log" &&
   ! grep -q "no --auth_token_file" "$work/guarded/log"; then
  no_token="held: a server without a token warns at start; one with a token does not"
else
  no_token="failed: the no-token warning is missing (or printed with a token)"
fi
record 5 no_token_warning "$no_token"
if "$server_bin" --port 0 --bind 0.0.0.0 --config "$work/config.yaml" >/dev/null 2>"$work/bind.err"; then
  record 5 loopback_only "failed: --bind 0.0.0.0 without a token started"
elif grep -q loopback "$work/bind.err"; then
  record 5 loopback_only "held: --bind 0.0.0.0 without a token refused: $(grep -o 'without a token[^(]*' "$work/bind.err" | head -1)"
else
  record 5 loopback_only "failed: refused without saying why: $(head -c 200 "$work/bind.err")"
fi

pid=$plain_pid port=$plain_port
probe 6 plain nonfinite

# Issue #30's data items: paths resolved beneath data_dir's descriptor, bounded reads of saves,
# the memory limit, finite results.
start_server race 0 --table_shards 2  # a save of a few ms: many race the swaps
probe 30.1 race save_race
pid=$plain_pid port=$plain_port
probe 30.4 plain big_part
start_server small 0 --memory_mb 16
probe 30.5 small memory_limit
pid=$plain_pid port=$plain_port
probe 30.6 plain finite_results
# ---- issue #30, the network items: deadlines, slots, the in-flight budget, AUTH ----------------
# 30.2: clients dripping bytes are cut at their frame deadline; an unauthenticated flood does not
# keep a trainer out.
start_server dripped 0 --frame_deadline_s 1
probe 30.2 dripped drip --frame_deadline_s 1
start_server flooded 0 --auth_token_file "$work/token" --max_connections 32 --auth_timeout_s 60
probe 30.2 flooded auth_flood --token "$(cat "$work/token")"
# 30.3: slow senders cannot starve the in-flight budget; the refused read "server busy".
start_server budget 0 --max_inflight_mb 4 --frame_deadline_s 1
probe 30.3 budget budget_starve --frame_deadline_s 1
# 30.8: token guesses slowed and logged (a server of their own: the guesses slow 127.0.0.1 there),
# a captured exchange not replayable, short tokens refused.
start_server guessed 0 --auth_token_file "$work/token"
probe 30.8 guessed token_guess --token "$(cat "$work/token")"
pid=$guarded_pid port=$guarded_port
probe 30.8 guarded auth_replay --token "$(cat "$work/token")"
# 32: a connection speaks for one client id (proved by AUTH, else its first frame's): a frame in
# another client's name is refused and closed; one client's writes never drop another's.
probe 32 guarded client_ids --token "$(cat "$work/token")"
pid=$plain_pid port=$plain_port
probe 32 plain client_ids
# 32: a local client taking a new id and a new loopback address on every connection is one host
# (every loopback address is one): it is held to that host's share of the held dense writes, and
# trainers of its own host, at 127.0.0.1 and at another loopback address, write while it holds
# them open and after it left.
start_server rotated 0 --dense_write_max_idle_s 8
probe 32 rotated rotating_ids --dense_write_max_idle_s 8
(umask 077 && echo "0123456789abcdef0123456789abcde" >"$work/short_token")  # 31 characters
if "$server_bin" --port 0 --config "$work/config.yaml" --auth_token_file "$work/short_token" \
     >/dev/null 2>"$work/short_token.err"; then
  record 30.8 short_token "failed: a server started with a 31-character token"
elif grep -q "has 31 characters; at least 32" "$work/short_token.err"; then
  record 30.8 short_token "held: a 31-character token refused at start: $(grep -o 'has 31 characters[^(]*' "$work/short_token.err" | head -1)"
else
  record 30.8 short_token "failed: refused without saying why: $(head -c 200 "$work/short_token.err")"
fi
mkdir -p "$work/restart/data"
record 8 restart "$("$probe_bin" restart --server_binary "$server_bin" --config "$work/config.yaml" \
                     --data_dir "$work/restart/data" --log "$work/restart.log" || true)"
fi  # the server probes

# ---- The trainer (items 7-11): gpubox_train and gpubox_data on generated data ----------------
if [ "$only" != server ]; then
t="$work/trainer"
mkdir -p "$t"
"$data_bin" gen --out "$t/train" --lines 6000 --files 2 --seed 3 --vocab 2000 >/dev/null
"$data_bin" gen --out "$t/test" --lines 2000 --files 1 --seed 3 --vocab 2000 --first_line 6000 >/dev/null
# The default model (26 slots, 13 dense values), small, with the servers' row layout.
cat >"$t/config.yaml" <<'YAML'
runner:
  train_data_dir: train
  test_data_dir: test
  metrics_path: ""
  train_batch_size: 64
  epochs: 3
  thread_num: 2
  print_interval: 1
  save_mode: checkpoint
hyper_parameters:
  sparse_feature_dim: 5
  fc_sizes: [16, 8]
  sparse_optimizer:
    class: adagrad
YAML
# trainer_start NAME SAVE ENDPOINT [VAR=value ...] [-- gpubox_train args]: a trainer in the
# background (output in $t/NAME.out, pid in $tpid) saving under $t/SAVE, against ENDPOINT ("":
# the in-process host tier).
trainer_start() {
  local name=$1 save=$2 endpoint=$3
  shift 3
  local vars=() args=()
  while (($#)) && [ "$1" != -- ]; do vars+=("$1"); shift; done
  if (($#)); then shift; args=("$@"); fi
  (cd "$t" && exec env -u GPUBOX_AUTH_TOKEN_FILE PADDLE_PSERVERS_IP_PORT_LIST="$endpoint" \
     FLAGS_selected_gpus=0,1 "${vars[@]}" "$train_bin" --config config.yaml --threads_per_card 1 \
     -o "runner.model_save_path=$t/$save" "${args[@]}") >"$t/$name.out" 2>&1 &
  tpid=$!
  pids+=("$tpid")
}
# trainer_run NAME SAVE ENDPOINT ...: the same in the foreground; sets $trc.
trainer_run() { trainer_start "$@"; trc=0; wait "$tpid" || trc=$?; }
# wait_for FILE TEXT SECONDS: until FILE holds TEXT (0) or the time is up (1).
wait_for() {
  local i
  for ((i = 0; i < $3 * 100; i++)); do grep -qF -- "$2" "$1" 2>/dev/null && return 0; sleep 0.01; done
  return 1
}
# tserver_start NAME PORT [flags]: a server for the trainer rows (data_dir $t); sets $spid, $sport.
tserver_start() {
  local name=$1 want=$2
  shift 2
  "$server_bin" --port "$want" --config "$t/config.yaml" --data_dir "$t" "$@" \
    >"$t/$name.server.out" 2>&1 &
  spid=$!
  pids+=("$spid")
  wait_for "$t/$name.server.out" "gpubox_server listening on" 10 || { echo "fault_check: server $name did not start" >&2; cat "$t/$name.server.out" >&2; return 1; }
  sport="$(procs_listened_port "$t/$name.server.out")"
}
# server_replace PID NAME PORT: kills server PID with -9 and starts NAME on its PORT, empty.
server_replace() {
  kill -9 "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  tserver_start "$2" "$3"
}
final_auc() { { grep -o 'epoch: 2, test auc: [0-9.]*' "$1" || true; } | tail -1 | awk '{print $5}'; }
tail1() { { grep -v '^pass [0-9]*: [0-9]*/' "$1" || true; } | tail -1 | cut -c1-160; }

# 7: the trainer and a token-protected server.
(umask 077 && od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$t/token")  # 128 bits
tserver_start token 0 --auth_token_file "$t/token"
token_port=$sport
trainer_run token_none none "127.0.0.1:$token_port" -- -o runner.epochs=1
if [ "$trc" -ne 0 ] && grep -q "they need a token: set runner.auth_token_file or GPUBOX_AUTH_TOKEN_FILE" "$t/token_none.out"; then
  record 7 trainer_without_token "held: refused at connect, saying which setting takes the token"
else
  record 7 trainer_without_token "failed: exit $trc: $(tail1 "$t/token_none.out")"
fi
trainer_run token_env with_token "127.0.0.1:$token_port" GPUBOX_AUTH_TOKEN_FILE="$t/token" -- \
  -o runner.epochs=1 -o "runner.auth_token_file=$t/not_there"
if [ "$trc" -eq 0 ] && grep -q "^pass: 0," "$t/token_env.out"; then
  record 7 trainer_with_token "held: GPUBOX_AUTH_TOKEN_FILE (winning over runner.auth_token_file) trained a pass"
else
  record 7 trainer_with_token "failed: exit $trc: $(tail1 "$t/token_env.out")"
fi
: >"$t/empty_token"
cp "$t/token" "$t/open_token"
chmod 644 "$t/open_token"
trainer_run token_missing x "127.0.0.1:$token_port" -- -o runner.epochs=1 -o "runner.auth_token_file=$t/not_there"
m1=$(grep -c "runner.auth_token_file '$t/not_there': it does not exist" "$t/token_missing.out" || true)
trainer_run token_empty x "127.0.0.1:$token_port" GPUBOX_AUTH_TOKEN_FILE="$t/empty_token" -- -o runner.epochs=1
m2=$(grep -c "GPUBOX_AUTH_TOKEN_FILE '$t/empty_token' is empty" "$t/token_empty.out" || true)
trainer_run token_open token_open_save "127.0.0.1:$token_port" GPUBOX_AUTH_TOKEN_FILE="$t/open_token" -- -o runner.epochs=1
m3=$(grep -c "'$t/open_token' is readable by other users (mode 0644)" "$t/token_open.out" || true)
if [ "$m1" -ge 1 ] && [ "$m2" -ge 1 ] && [ "$m3" -ge 1 ] && [ "$trc" -eq 0 ]; then
  record 7 token_file_checks "held: a missing or empty token file is an error naming it; a 0644 one is used with a warning naming it"
else
  record 7 token_file_checks "failed: missing named: $m1, empty named: $m2, 0644 warned: $m3 (exit $trc)"
fi
kill "$spid" 2>/dev/null || true

# Reference: an uninterrupted 3-pass run (fresh server).
tserver_start ref 0
trainer_run reference reference "127.0.0.1:$sport"
ref_auc="$(final_auc "$t/reference.out")"
kill "$spid" 2>/dev/null || true

# 8: a server killed -9 and restarted on its port while pass 1 (the second) trains is repaired in
# the run: pass 1 dropped from the cards, pass 0's save reloaded, pass 1 trained again.
tserver_start mid 0
mid_port=$sport mid_pid=$spid
trainer_start mid mid "127.0.0.1:$mid_port"
wait_for "$t/mid.out" "pass 1: 3/" 60 || true
server_replace "$mid_pid" mid_again "$mid_port"
trc=0
wait "$tpid" || trc=$?
if [ "$trc" -eq 0 ] && grep -q "pass 1: server 127.0.0.1:$mid_port restarted" "$t/mid.out" &&
   grep -q "The pass's rows on the cards are dropped: reloading the last complete save (pass 0," "$t/mid.out" &&
   [ "$(final_auc "$t/mid.out")" = "$ref_auc" ]; then
  record 8 restart_mid_pass "held: pass 1 dropped and trained again from pass 0's save after 127.0.0.1:$mid_port restarted (test auc $ref_auc as uninterrupted)"
else
  record 8 restart_mid_pass "failed: exit $trc, auc $(final_auc "$t/mid.out") vs $ref_auc: $(tail1 "$t/mid.out")"
fi
kill "$spid" 2>/dev/null || true

# 8: a server restarted between passes (the trainer held at pass 1's save) is reloaded in the run.
tserver_start between 0
b_port=$sport b_pid=$spid
trainer_start between between "127.0.0.1:$b_port"
wait_for "$t/between.server.out" "saved to $t/between/1/sparse" 60 || true
kill -STOP "$tpid" 2>/dev/null || true
server_replace "$b_pid" between_again "$b_port"
kill -CONT "$tpid" 2>/dev/null || true
trc=0
wait "$tpid" || trc=$?
if [ "$trc" -eq 0 ] && grep -q "No pass was open: reloading the last complete save" "$t/between.out" &&
   [ "$(final_auc "$t/between.out")" = "$ref_auc" ]; then
  record 8 restart_between_passes "held: reloaded the last save into the restarted server and trained on (test auc $ref_auc)"
else
  record 8 restart_between_passes "failed: exit $trc, auc $(final_auc "$t/between.out") vs $ref_auc: $(tail1 "$t/between.out")"
fi
kill "$spid" 2>/dev/null || true

# 9: the trainer killed -9 in pass 1, its second (and its server: the machine went down), then rerun.
tserver_start killed 0
killed_pid=$spid
trainer_start killed killed "127.0.0.1:$sport"
wait_for "$t/killed.out" "pass 1: 3/" 60 || true
kill -9 "$tpid" "$killed_pid" 2>/dev/null || true
wait "$tpid" 2>/dev/null || true
tserver_start killed_again 0
trainer_run killed_rerun killed "127.0.0.1:$sport"
if grep -q "^pass: 1," "$t/killed.out"; then
  record 9 trainer_killed_resume "failed: pass 1 ended before the kill (the probe did not interrupt it)"
elif [ "$trc" -eq 0 ] && grep -q "resuming from pass 0 (" "$t/killed_rerun.out" &&
     [ "$(final_auc "$t/killed_rerun.out")" = "$ref_auc" ]; then
  record 9 trainer_killed_resume "held: killed -9 in pass 1, the rerun resumed from pass 0: test auc $ref_auc, as uninterrupted"
else
  record 9 trainer_killed_resume "failed: exit $trc, auc $(final_auc "$t/killed_rerun.out") vs $ref_auc: $(tail1 "$t/killed_rerun.out")"
fi
kill "$spid" 2>/dev/null || true

# 9: halves of two saves in one folder (what a crash between them left), a folder without its
# model manifest: --mode infer --load refuses both, naming what differs.
cp -r "$t/reference/2" "$t/mixed"
rm -rf "$t/mixed/dense"
cp -r "$t/reference/1/dense" "$t/mixed/dense"
trainer_run infer_mixed x "" -- --mode infer --load "$t/mixed"
mixed_rc=$trc
cp -r "$t/reference/2" "$t/no_manifest"
rm -f "$t/no_manifest/MODEL_MANIFEST"
trainer_run infer_nomanifest x "" -- --mode infer --load "$t/no_manifest"
if [ "$mixed_rc" -ne 0 ] && grep -q "do not match its MODEL_MANIFEST (saved after 3 passes): dense/MANIFEST has digest" "$t/infer_mixed.out" &&
   [ "$trc" -ne 0 ] && grep -q "$t/no_manifest/MODEL_MANIFEST is missing" "$t/infer_nomanifest.out"; then
  record 9 infer_mixed_halves "held: refused, naming the dense half that differs / the missing MODEL_MANIFEST"
else
  record 9 infer_mixed_halves "failed: $(tail1 "$t/infer_mixed.out") / $(tail1 "$t/infer_nomanifest.out")"
fi

# 10: a pass without a valid instance, a data folder without data files.
mkdir -p "$t/bad_data" "$t/no_data"
: >"$t/bad_data/empty-part"
echo "click:1 oops" >"$t/bad_data/malformed-part"
trainer_run empty_pass x "" -- -o "runner.train_data_dir=$t/bad_data" -o runner.epochs=1
e1=$trc
trainer_run no_data x "" -- -o "runner.train_data_dir=$t/no_data" -o runner.epochs=1
if [ "$e1" -ne 0 ] && grep -q "pass 0: no valid instance in 2 file(s)" "$t/empty_pass.out" &&
   [ "$trc" -ne 0 ] && grep -q "holds no data file" "$t/no_data.out" && [ ! -e "$t/x/0" ]; then
  record 10 no_valid_instance "held: an error naming the pass and its files, nothing saved; an empty folder is an error"
else
  record 10 no_valid_instance "failed: $(tail1 "$t/empty_pass.out") / $(tail1 "$t/no_data.out")"
fi

# 11: gpubox_data stat loads as the trainer does: a minimal config reads every line (the
# trainer's defaults), a misspelt key names the right one, a huge max_line_bytes is refused.
printf 'runner:\n  train_data_dir: train\n' >"$t/minimal.yaml"
printf 'runner:\n  train_data_dir: train\n  strict_prase: true\n' >"$t/typo.yaml"
stat_out="$(cd "$t" && "$data_bin" stat --config minimal.yaml 2>&1 || true)"
typo_out="$(cd "$t" && "$data_bin" stat --config typo.yaml 2>&1 || true)"
big_out="$(cd "$t" && "$data_bin" stat --config minimal.yaml -o runner.max_line_bytes=1e12 2>&1 || true)"
if grep -q "lines: 6000, instances: 6000" <<<"$stat_out" &&
   grep -q "did you mean 'runner.strict_parse'" <<<"$typo_out" &&
   grep -q "runner.max_line_bytes: 1e12 is out of range" <<<"$big_out"; then
  record 11 stat_like_trainer "held: 6000 of 6000 lines with a minimal config; strict_prase names strict_parse; max_line_bytes=1e12 refused by key"
else
  record 11 stat_like_trainer "failed: $(grep -m1 lines: <<<"$stat_out") / $(tail -1 <<<"$typo_out") / $(tail -1 <<<"$big_out")"
fi

# 30.11: a job over two network namespaces (this check's own, joined by a veth pair; root only)
# whose link is cut mid-pass: both trainers end within seconds naming the other side's address,
# and the rerun resumes from the last complete save (tests/scripts/netns_partition_test.sh).
netns_rc=0
netns_out="$(bash "$repo/tests/scripts/netns_partition_test.sh" "$repo" "${bin_dir%/bin}" 2>&1)" ||
  netns_rc=$?
if [ "$netns_rc" -eq 0 ]; then
  record 30.11 link_cut_mid_pass "held: $(sed -n 's/^partition: //p' <<<"$netns_out"), naming the peer's address; $(sed -n 's/^rerun: //p' <<<"$netns_out")"
elif [ "$netns_rc" -eq 77 ]; then
  record 30.11 link_cut_mid_pass "skipped: $(sed -n 's/^SKIPPED: //p' <<<"$netns_out")"
else
  record 30.11 link_cut_mid_pass "failed: $(grep -m1 FAILED <<<"$netns_out")"
fi
fi  # the trainer rows

printf '%-5s  %-22s  %-6s  %s\n' item probe result detail
printf '%s\n' "${rows[@]}"
if ((failures)); then
  echo "fault_check: $failures probe(s) failed"
  exit 1
fi
echo "fault_check: every probe held"
