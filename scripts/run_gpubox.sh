#!/usr/bin/env bash
# scripts/run_gpubox.sh [gpubox_train args...]
#
# PaddleRec-style launcher. With no arguments it builds GPUBox if needed and trains the shipped
# sample on configs/config_gpubox.yaml. Environment (PADDLE_* or GPUBOX_* names):
#   PADDLE_PSERVERS_IP_PORT_LIST  servers "ip:port,ip:port"; unset: PADDLE_PSERVER_NUMS (default 1)
#                                 local gpubox_servers are started on free ports (29011 up).
#                                 Set with TRAINING_ROLE unset (what PaddleRec's
#                                 tools/run_gpubox.sh exports): the endpoints of this machine
#                                 that nobody serves yet are started, as PaddleRec starts them
#   PADDLE_TRAINERS_NUM           trainer processes in the job (default PADDLE_TRAINERS, else 1)
#   PADDLE_TRAINER_ID             this trainer's id (default 0)
#   POD_IP                        this machine's address (default 127.0.0.1)
#   FLAGS_selected_gpus           cards of this trainer, e.g. "0,1" (cpu build: simulated cards)
#   TRAINING_ROLE                 PSERVER (servers only: this machine's endpoints, or only
#                                 PADDLE_PORT's when set), TRAINER (trainer only, servers given),
#                                 or unset: both
#   GPUBOX_LOCAL_TIER=1           no servers: the host tier runs inside the trainer
#   GPUBOX_AUTH_TOKEN_FILE        the servers' token (a file shared with the trainers); unset
#                                 when this script starts both: a fresh random token (0600, in a
#                                 temporary folder removed on exit) for the servers and trainer
# Logs: ./log/pserver.N.log and ./log/worker.N.log. Servers started here are stopped on exit or
# Ctrl-C; the exit status is the trainer's. The config may be named as PaddleRec's trainers
# name it (-m FILE) or as gpubox_train does (--config FILE). Servers get the folder holding the
# trainer's saves (gpubox_train --print_model_root) as --data_dir. Run again after a crash, the
# same command resumes from the last complete save (runner.resume: auto; README "Durability and
# resume").
#
# PaddleRec's docs run their launcher with `sh`: under sh (dash), this script runs itself again
# with bash, which it needs (arrays, PIPESTATUS).
if [ -z "${BASH_VERSION:-}" ]; then
  if ! command -v bash >/dev/null 2>&1; then
    echo "run_gpubox: needs bash, which is not installed" >&2
    exit 2
  fi
  exec bash "$0" "$@"
fi
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
env_or() {  # env_or NAME DEFAULT: $PADDLE_NAME, else $GPUBOX_NAME, else DEFAULT
  local paddle="PADDLE_$1" gpubox="GPUBOX_$1"
  if [ -n "${!paddle:-}" ]; then echo "${!paddle}"; elif [ -n "${!gpubox:-}" ]; then echo "${!gpubox}"; else echo "$2"; fi
}
servers="$(env_or PSERVERS_IP_PORT_LIST "")"
trainers_num="$(env_or TRAINERS_NUM "${PADDLE_TRAINERS:-1}")"
pserver_nums="${PADDLE_PSERVER_NUMS:-${GPUBOX_PSERVER_NUMS:-1}}"
trainer_id="$(env_or TRAINER_ID 0)"
pod_ip="${POD_IP:-${GPUBOX_POD_IP:-127.0.0.1}}"
selected="${FLAGS_selected_gpus:-${GPUBOX_SELECTED_GPUS:-0}}"
role="${TRAINING_ROLE:-${GPUBOX_TRAINING_ROLE:-}}"
local_tier="${GPUBOX_LOCAL_TIER:-0}"
build_dir="${GPUBOX_BUILD_DIR:-$repo/build}"
bin="$build_dir/bin"

if [ ! -x "$bin/gpubox_train" ] || [ ! -x "$bin/gpubox_server" ]; then
  echo "run_gpubox: building GPUBox (first run)"
  "$repo/scripts/setup.sh"
  "$repo/scripts/build.sh" cpu >/dev/null
fi

args=("$@")
if [ ${#args[@]} -eq 0 ]; then
  args=(--config "$repo/configs/config_gpubox.yaml")
fi
config=""
overrides=()  # the trainer's -o key=value: servers read the same config, overrides included
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --config | -m | --config_yaml) if [ $((i + 1)) -lt ${#args[@]} ]; then config="${args[$((i + 1))]}"; fi ;;
    --config=* | --config_yaml=*) config="${args[$i]#*=}" ;;
  esac
  if [ "${args[$i]}" = "-o" ] && [ $((i + 1)) -lt ${#args[@]} ]; then overrides+=(-o "${args[$((i + 1))]}"); fi
  case "${args[$i]}" in -o?*=*) overrides+=("${args[$i]}") ;; esac
done

mkdir -p log
server_pids=()
token_dir=""
cleanup() {
  for pid in "${server_pids[@]:-}"; do
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  done
  for pid in "${server_pids[@]:-}"; do
    [ -n "$pid" ] && wait "$pid" 2>/dev/null || true
  done
  if [ -n "$token_dir" ]; then rm -rf "$token_dir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

port_in_use() { (exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null; }  # PORT [IP]
is_this_machine() { [ "$1" = "$pod_ip" ] || [ "$1" = 127.0.0.1 ] || [ "$1" = localhost ]; }

# The token the servers started here require: $GPUBOX_AUTH_TOKEN_FILE when given, else (when
# the trainer runs here too) a fresh random one that only this job knows.
token_file="${GPUBOX_AUTH_TOKEN_FILE:-}"
make_token() {
  [ -n "$token_file" ] && return 0
  token_dir="$(mktemp -d "${TMPDIR:-/tmp}/gpubox_token.XXXXXX")"  # mode 0700
  token_file="$token_dir/token"
  (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$token_file")
  export GPUBOX_AUTH_TOKEN_FILE="$token_file"
}

# The folder that holds every save the trainer writes or reads: the servers' --data_dir, since
# their SAVE and LOAD paths must stay inside it ("" when the command saves and loads nothing).
model_root=""
if [ "$role" != "TRAINER" ]; then
  model_root="$("$bin/gpubox_train" "${args[@]}" --print_model_root 2>/dev/null || true)"
  if [ -n "$model_root" ]; then mkdir -p "$model_root"; fi
fi

# start_server INDEX PORT SHARD_ID SHARD_NUM: starts one gpubox_server, waits until it listens.
start_server() {
  local index=$1 port=$2 shard_id=$3 shard_num=$4
  local logf="log/pserver.$index.log"
  local server_args=(--port "$port" --bind "${bind_ip:-$pod_ip}" --shard_id "$shard_id" --shard_num "$shard_num")
  if [ -n "$config" ]; then server_args+=(--config "$config" "${overrides[@]}"); fi
  if [ -n "$model_root" ]; then server_args+=(--data_dir "$model_root"); fi
  if [ -n "$token_file" ]; then server_args+=(--auth_token_file "$token_file"); fi
  "$bin/gpubox_server" "${server_args[@]}" >"$logf" 2>&1 &
  server_pids+=($!)
  for _ in $(seq 1 100); do
    if grep -q "listening on" "$logf" 2>/dev/null; then return 0; fi
    if ! kill -0 "${server_pids[-1]}" 2>/dev/null; then
      echo "run_gpubox: gpubox_server $index failed to start; see $logf:" >&2
      tail -n 20 "$logf" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "run_gpubox: gpubox_server $index did not report listening within 10 s; see $logf" >&2
  return 1
}

if [ "$role" = "PSERVER" ]; then
  # Servers only: this machine's endpoints from the list (those whose ip is POD_IP).
  [ -n "$servers" ] || { echo "run_gpubox: TRAINING_ROLE=PSERVER needs PADDLE_PSERVERS_IP_PORT_LIST" >&2; exit 2; }
  case "$pod_ip" in
    127.*|localhost|::1) ;;
    *) [ -n "$token_file" ] || { echo "run_gpubox: TRAINING_ROLE=PSERVER on POD_IP=$pod_ip needs a token the trainers share: set GPUBOX_AUTH_TOKEN_FILE to a file (mode 600) they can read too" >&2; exit 2; } ;;
  esac
  IFS=',' read -r -a endpoints <<<"$servers"
  for i in "${!endpoints[@]}"; do
    ip="${endpoints[$i]%:*}"; port="${endpoints[$i]##*:}"
    if [ "$ip" = "$pod_ip" ] && { [ -z "${PADDLE_PORT:-}" ] || [ "$PADDLE_PORT" = "$port" ]; }; then
      start_server "$i" "$port" "$i" "${#endpoints[@]}"
    fi
  done
  echo "run_gpubox: servers running (Ctrl-C to stop)"
  wait
  exit 0
fi

if [ -z "$servers" ] && [ "$role" != "TRAINER" ] && [ "$local_tier" != "1" ]; then
  make_token
  port=29010
  for ((i = 0; i < pserver_nums; i++)); do
    port=$((port + 1))
    while port_in_use "$port"; do port=$((port + 1)); done
    start_server "$i" "$port" "$i" "$pserver_nums"
    servers="${servers:+$servers,}127.0.0.1:$port"
    echo "run_gpubox: gpubox_server on 127.0.0.1:$port (log/pserver.$i.log)"
  done
elif [ -n "$servers" ] && [ -z "$role" ]; then
  # PaddleRec's launcher exports the list and starts its servers itself (TRAINING_ROLE is set
  # per process inside it): start this machine's endpoints that are not served yet. When this
  # job starts every one of them, they get a token only this job knows (as above).
  IFS=',' read -r -a endpoints <<<"$servers"
  to_start=()
  for i in "${!endpoints[@]}"; do
    ip="${endpoints[$i]%:*}"; port="${endpoints[$i]##*:}"
    if is_this_machine "$ip" && ! port_in_use "$port" "$ip"; then to_start+=("$i"); fi
  done
  if [ "${#to_start[@]}" -eq "${#endpoints[@]}" ]; then make_token; fi
  for i in "${to_start[@]}"; do
    ip="${endpoints[$i]%:*}"; port="${endpoints[$i]##*:}"
    bind_ip="$ip" start_server "$i" "$port" "$i" "${#endpoints[@]}"
    echo "run_gpubox: gpubox_server on $ip:$port (log/pserver.$i.log), from PADDLE_PSERVERS_IP_PORT_LIST"
  done
fi

export PADDLE_PSERVERS_IP_PORT_LIST="$servers" PADDLE_TRAINERS_NUM="$trainers_num" \
       PADDLE_TRAINER_ID="$trainer_id" FLAGS_selected_gpus="$selected"
status=0
"$bin/gpubox_train" "${args[@]}" 2>&1 | tee "log/worker.$trainer_id.log" || status=${PIPESTATUS[0]}
if [ "$status" = 0 ]; then
  metrics="$(sed -n 's/.*runner.metrics_path: appending to \(.*\)$/\1/p' "log/worker.$trainer_id.log" | tail -n 1)"
  if [ -n "$metrics" ]; then
    echo "run_gpubox: plot the metrics: $repo/scripts/plot_metrics.sh $metrics --out log/plots"
  fi
fi
exit "$status"
