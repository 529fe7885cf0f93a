#!/usr/bin/env bash
# scripts/run_gpubox.sh [--trainers T] [--servers S] [gpubox_train args...]
#
# PaddleRec-style launcher. With no arguments it builds GPUBox if needed and trains the shipped
# sample on configs/config_gpubox.yaml (the config of any command that gives none).
#   --trainers T   one job of T trainer processes on this machine (PADDLE_TRAINERS_NUM=T, ids
#                  0..T-1): FLAGS_selected_gpus' cards are split between them (a multiple of T
#                  cards; unset: one card each), they meet through a fresh rendezvous folder
#                  (GPUBOX_RENDEZVOUS, unless given) and share the servers. Trainer 0's output
#                  is shown; every trainer logs to log/worker.N.log. The failure of any trainer
#                  or server stops them all; the exit status is the first failure's (else 0).
#   --servers S    local gpubox_servers to start (PADDLE_PSERVER_NUMS=S; S >= 1: no servers is
#                  GPUBOX_LOCAL_TIER=1)
# Environment (PADDLE_* or GPUBOX_* names):
#   PADDLE_PSERVERS_IP_PORT_LIST  servers "ip:port,ip:port"; unset: PADDLE_PSERVER_NUMS (default 1)
#                                 local gpubox_servers are started on ports the kernel picks.
#                                 Set with TRAINING_ROLE unset (what PaddleRec's
#                                 tools/run_gpubox.sh exports): the endpoints of this machine
#                                 that nobody serves yet are started, as PaddleRec starts them
#   PADDLE_TRAINERS_NUM           trainer processes in the job (default PADDLE_TRAINERS, else
#                                 OMPI_COMM_WORLD_SIZE (mpirun), else SLURM_NTASKS (srun), else 1)
#   PADDLE_TRAINER_ID             this trainer's id (default OMPI_COMM_WORLD_RANK, else
#                                 SLURM_PROCID, else 0)
#   GPUBOX_RENDEZVOUS             where several trainers meet: file:///shared/dir, a folder every
#                                 trainer reaches, fresh per job (--trainers makes one)
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
# same command resumes from the last complete save (runner.resume: auto; docs/operations.md,
# "Durability and resume").
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
# shellcheck source=scripts/lib/procs.sh
source "$repo/scripts/lib/procs.sh"
source "$repo/scripts/lib/config_args.sh"  # (config_flag)

# --help and --version answer at once: no folder made, no build, no server started.
for arg in "$@"; do
  case "$arg" in
    --help | -h)
      sed -n '2,/^$/s/^# \{0,1\}//p' "$0" | sed '/^!/d'
      echo
      if [ -x "${GPUBOX_BUILD_DIR:-$repo/build}/bin/gpubox_train" ]; then
        echo "gpubox_train's own options (everything after the launcher's options goes to it):"
        "${GPUBOX_BUILD_DIR:-$repo/build}/bin/gpubox_train" --help
      else
        echo "gpubox_train --help lists its options once built (scripts/build.sh)."
      fi
      exit 0 ;;
    --version)
      echo "run_gpubox.sh: the GPUBox launcher of $repo"
      if [ -x "${GPUBOX_BUILD_DIR:-$repo/build}/bin/gpubox_train" ]; then
        "${GPUBOX_BUILD_DIR:-$repo/build}/bin/gpubox_train" --version
      else
        echo "gpubox_train: not built yet (scripts/build.sh)"
      fi
      exit 0 ;;
  esac
done

# This script's own options come first; the rest goes to gpubox_train.
local_trainers=""
trainers_flag=0
servers_flag=0
twice() {  # twice FLAG: a second value was taken silently (the last won), as no binary does
  echo "run_gpubox: $1 is given twice: give it once" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --trainers | --trainers=*) [ "$trainers_flag" = 0 ] || twice --trainers ;;
    --servers | --servers=*) [ "$servers_flag" = 0 ] || twice --servers ;;
  esac
  case "$1" in
    --trainers) local_trainers="${2:-}"; trainers_flag=1; shift; [ $# -gt 0 ] && shift ;;
    --trainers=*) local_trainers="${1#*=}"; trainers_flag=1; shift ;;
    --servers) export PADDLE_PSERVER_NUMS="${2:-}"; servers_flag=1; shift; [ $# -gt 0 ] && shift ;;
    --servers=*) export PADDLE_PSERVER_NUMS="${1#*=}"; servers_flag=1; shift ;;
    *) break ;;
  esac
done
if [ "$servers_flag" = 1 ] && [ "${GPUBOX_LOCAL_TIER:-0}" != 0 ]; then
  case "${GPUBOX_LOCAL_TIER}" in
    1 | [Tt]rue | TRUE | [Yy]es | YES | [Oo]n | ON)
      echo "run_gpubox: --servers $PADDLE_PSERVER_NUMS and GPUBOX_LOCAL_TIER=$GPUBOX_LOCAL_TIER contradict (the host tier inside the trainer starts no server): give one" >&2
      exit 2 ;;
  esac
fi
if [ "$trainers_flag" = 1 ] && ! [[ "$local_trainers" =~ ^[1-9][0-9]*$ ]]; then
  echo "run_gpubox: --trainers takes a positive number, got '$local_trainers'" >&2
  exit 2
fi
# The servers to start: a count, refused when it is none (GPUBOX_LOCAL_TIER=1 says that) or not
# a number, rather than training with another host tier than asked.
check_server_count() {  # check_server_count WHAT VALUE
  if ! [[ "$2" =~ ^[1-9][0-9]*$ ]]; then
    echo "run_gpubox: $1 takes a positive number of servers, got '$2' (GPUBOX_LOCAL_TIER=1 runs the host tier inside the trainer)" >&2
    exit 2
  fi
}
if [ "$servers_flag" = 1 ]; then check_server_count --servers "$PADDLE_PSERVER_NUMS"; fi
env_or() {  # env_or NAME DEFAULT: $PADDLE_NAME, else $GPUBOX_NAME, else DEFAULT
  local paddle="PADDLE_$1" gpubox="GPUBOX_$1"
  if [ -n "${!paddle:-}" ]; then echo "${!paddle}"; elif [ -n "${!gpubox:-}" ]; then echo "${!gpubox}"; else echo "$2"; fi
}
servers="$(env_or PSERVERS_IP_PORT_LIST "")"
# Cluster launchers: mpirun (OMPI_*) and srun (SLURM_*) start the processes; GPUBox does the rest.
# PADDLE_TRAINERS: PaddleRec's scripts' count; Paddle's cloud launcher's address list is not one.
paddle_trainers="${PADDLE_TRAINERS:-}"
# An address list (a host's name alone starts with a letter), not a count.
case "$paddle_trainers" in *[,.:]* | [A-Za-z]*) paddle_trainers="" ;; esac
trainers_num="$(env_or TRAINERS_NUM "${paddle_trainers:-${OMPI_COMM_WORLD_SIZE:-${SLURM_NTASKS:-1}}}")"
pserver_nums="${PADDLE_PSERVER_NUMS:-${GPUBOX_PSERVER_NUMS:-1}}"
trainer_id="$(env_or TRAINER_ID "${OMPI_COMM_WORLD_RANK:-${SLURM_PROCID:-0}}")"
pod_ip="${POD_IP:-${GPUBOX_POD_IP:-127.0.0.1}}"
selected="${FLAGS_selected_gpus:-${GPUBOX_SELECTED_GPUS:-}}"
if [ -n "$local_trainers" ]; then
  trainers_num="$local_trainers"
  trainer_id=0
  # One card each unless told: simulated cards on the cpu build, GPUs 0..T-1 on cuda.
  if [ -z "$selected" ]; then selected="$(seq -s, 0 $((local_trainers - 1)))"; fi
fi
selected="${selected:-0}"
if [ -n "$local_trainers" ] && [ "$local_trainers" -gt 1 ]; then
  # A card named twice would go to two trainers (two processes on one GPU), where one trainer
  # refuses the same list; said before any server starts.
  seen_cards=","
  IFS=',' read -r -a listed_cards <<<"$selected"
  for card in "${listed_cards[@]}"; do
    card="${card// /}"
    case "$seen_cards" in
      *",$card,"*)
        echo "run_gpubox: FLAGS_selected_gpus=$selected names card $card twice: each card goes to one trainer" >&2
        exit 2 ;;
    esac
    seen_cards="$seen_cards$card,"
  done
fi
role="${TRAINING_ROLE:-${GPUBOX_TRAINING_ROLE:-}}"
role="${role^^}"  # PaddleRec writes PSERVER and TRAINER; pserver is the same role
case "$role" in
  "" | PSERVER | TRAINER) ;;
  *) echo "run_gpubox: TRAINING_ROLE='${TRAINING_ROLE:-${GPUBOX_TRAINING_ROLE:-}}': expected PSERVER or TRAINER (or unset: servers and trainers here)" >&2; exit 2 ;;
esac
case "${GPUBOX_LOCAL_TIER:-0}" in
  1 | [Tt]rue | TRUE | [Yy]es | YES | [Oo]n | ON) local_tier=1 ;;
  0 | [Ff]alse | FALSE | [Nn]o | NO | [Oo]ff | OFF) local_tier=0 ;;
  *) echo "run_gpubox: GPUBOX_LOCAL_TIER='$GPUBOX_LOCAL_TIER': 1 (the host tier inside the trainer, no servers) or 0 (servers)" >&2; exit 2 ;;
esac
# The job's counts and this trainer's id, whole numbers (the trainer names a bad one too; the
# comparisons below would fail on it first).
for pair in "trainers:$trainers_num" "trainer id:$trainer_id"; do
  case "${pair#*:}" in
    '' | *[!0-9]*) echo "run_gpubox: the job's ${pair%%:*} '${pair#*:}' (from PADDLE_TRAINERS_NUM / PADDLE_TRAINERS / PADDLE_TRAINER_ID or their GPUBOX_*, OMPI_COMM_WORLD_*, SLURM_* names) is not a whole number" >&2; exit 2 ;;
  esac
done
build_dir="${GPUBOX_BUILD_DIR:-$repo/build}"
bin="$build_dir/bin"

if [ ! -x "$bin/gpubox_train" ] || [ ! -x "$bin/gpubox_server" ]; then
  echo "run_gpubox: building GPUBox (first run)"
  "$repo/scripts/setup.sh"
  "$repo/scripts/build.sh" cpu >/dev/null
fi

args=("$@")
config=""
overrides=()  # the trainer's -o key=value: servers read the same config, overrides included
for ((i = 0; i < ${#args[@]}; i++)); do
  config_flag "${args[$i]}" "${args[$((i + 1))]-}"
  case "$config_flag_kind" in
    config) config="$config_flag_value" ;;
    override) overrides+=(-o "$config_flag_value") ;;
  esac
  i=$((i + config_flag_used - 1))
done
# No --config (-m) given: the shipped one, -o's and other arguments included (with -o alone the
# servers started and every trainer then stopped: "--config is required").
if [ -z "$config" ]; then
  config="$repo/configs/config_gpubox.yaml"
  args=(--config "$config" "${args[@]}")
fi

mkdir -p log
server_pids=()
server_extra=()  # flags every server of this script gets besides its own
token_dir=""
rendezvous_dir=""
cleanup() {
  procs_stop_all
  for pid in "${server_pids[@]:-}"; do
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  done
  for pid in "${server_pids[@]:-}"; do
    [ -n "$pid" ] && wait "$pid" 2>/dev/null || true
  done
  procs_release_logs
  if [ -n "$token_dir" ]; then rm -rf "$token_dir"; fi
  if [ -n "$rendezvous_dir" ]; then rm -rf "$rendezvous_dir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

port_in_use() { (exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null; }  # PORT [IP]
is_this_machine() { [ "$1" = "$pod_ip" ] || [ "$1" = 127.0.0.1 ] || [ "$1" = localhost ]; }
is_loopback() { case "$1" in 127.* | localhost | ::1) return 0 ;; esac; return 1; }
same_host() { [ "$1" = "$2" ] || { is_loopback "$1" && is_loopback "$2"; }; }  # IP IP

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

# start_server INDEX PORT SHARD_ID SHARD_NUM: starts one gpubox_server, waits until it listens;
# sets listened_port to the port it reports (the kernel's choice when PORT is 0).
start_server() {
  local index=$1 port=$2 shard_id=$3 shard_num=$4
  local logf="log/pserver.$index.log"
  procs_hold_log run_gpubox "$logf"
  local server_args=(--port "$port" --bind "${bind_ip:-$pod_ip}" --shard_id "$shard_id" --shard_num "$shard_num")
  if [ -n "$config" ]; then server_args+=(--config "$config" "${overrides[@]}"); fi
  if [ -n "$model_root" ]; then server_args+=(--data_dir "$model_root"); fi
  if [ -n "$token_file" ]; then server_args+=(--auth_token_file "$token_file"); fi
  server_args+=("${server_extra[@]}")
  procs_start "gpubox_server $index" "$logf" "$bin/gpubox_server" "${server_args[@]}"
  server_pids+=("$(procs_pid "gpubox_server $index")")
  # A server that is alive keeps its chance (under load its start has taken over 10 s); one that
  # exits is reported at once.
  local waited=0
  listened_port="$(procs_wait_for_port "${server_pids[-1]}" "$logf")" || waited=$?
  [ "$waited" = 0 ] && return 0
  if [ "$waited" = 1 ]; then
    echo "run_gpubox: gpubox_server $index failed to start; see $logf:" >&2
  else
    echo "run_gpubox: gpubox_server $index (pid ${server_pids[-1]}) did not write its 'gpubox_server listening on' line to $logf within $procs_port_wait_s s; its last lines:" >&2
  fi
  tail -n 20 "$logf" >&2
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
  # They exit when every trainer of the job ended it (PaddleRec's servers stop after the
  # workers' stop_worker).
  server_extra=(--exit_when_job_ends)
  for i in "${!endpoints[@]}"; do
    ip="${endpoints[$i]%:*}"; port="${endpoints[$i]##*:}"
    if same_host "$ip" "$pod_ip" && { [ -z "${PADDLE_PORT:-}" ] || [ "$PADDLE_PORT" = "$port" ]; }; then
      bind_ip="$ip" start_server "$i" "$port" "$i" "${#endpoints[@]}"
    fi
  done
  if [ "${#server_pids[@]}" -eq 0 ]; then
    echo "run_gpubox: TRAINING_ROLE=PSERVER: no endpoint of PADDLE_PSERVERS_IP_PORT_LIST=$servers is this machine's (POD_IP=$pod_ip${PADDLE_PORT:+, PADDLE_PORT=$PADDLE_PORT}): nothing to serve; set POD_IP to the address the list names for this machine${PADDLE_PORT:+ and PADDLE_PORT to one of its ports}" >&2
    exit 2
  fi
  echo "run_gpubox: servers running until their job's trainers finish (Ctrl-C to stop)"
  status=0
  for pid in "${server_pids[@]}"; do wait "$pid" || status=$?; done
  exit "$status"
fi

if [ "$role" = "TRAINER" ] && [ -z "$servers" ] && [ "$local_tier" != "1" ]; then
  echo "run_gpubox: TRAINING_ROLE=TRAINER runs a trainer against servers started elsewhere: set PADDLE_PSERVERS_IP_PORT_LIST to them (or GPUBOX_LOCAL_TIER=1 for the host tier inside the trainer, or leave TRAINING_ROLE unset for servers started here)" >&2
  exit 2
fi
if [ -z "$servers" ] && [ "$role" != "TRAINER" ] && [ "$local_tier" != "1" ]; then
  check_server_count PADDLE_PSERVER_NUMS "$pserver_nums"
  make_token
  # Port 0: the kernel picks a free port at bind time, so two jobs started side by side never
  # race for one (a probe-then-bind did, under parallel tests).
  for ((i = 0; i < pserver_nums; i++)); do
    start_server "$i" 0 "$i" "$pserver_nums"
    servers="${servers:+$servers,}127.0.0.1:$listened_port"
    echo "run_gpubox: gpubox_server on 127.0.0.1:$listened_port (log/pserver.$i.log)"
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
if [ "$trainers_num" -gt 1 ] && [ -z "$local_trainers" ] && [ -z "${GPUBOX_RENDEZVOUS:-}" ]; then
  echo "run_gpubox: PADDLE_TRAINERS_NUM=$trainers_num: the trainers meet through a rendezvous store; set GPUBOX_RENDEZVOUS=file:///shared/dir (a folder every trainer reaches, fresh for this job)" >&2
  exit 2
fi

# plot_hint LOG: the command that plots the metrics file the trainer of LOG appended to.
plot_hint() {
  local metrics
  metrics="$(sed -n 's/.*runner.metrics_path: appending to \(.*\)$/\1/p' "$1" | tail -n 1)"
  if [ -n "$metrics" ]; then
    echo "run_gpubox: plot the metrics: $repo/scripts/plot_metrics.sh $metrics --out log/plots"
  fi
}

if [ -n "$local_trainers" ] && [ "$local_trainers" -gt 1 ]; then
  # Several trainers here: split the cards, a fresh rendezvous folder, one process each.
  IFS=',' read -r -a cards <<<"$selected"
  if [ $(( ${#cards[@]} % local_trainers )) -ne 0 ]; then
    echo "run_gpubox: FLAGS_selected_gpus=$selected (${#cards[@]} cards) cannot be split evenly between $local_trainers trainers" >&2
    exit 2
  fi
  per=$(( ${#cards[@]} / local_trainers ))
  if [ -z "${GPUBOX_RENDEZVOUS:-}" ]; then
    rendezvous_dir="$(mktemp -d "${TMPDIR:-/tmp}/gpubox_rendezvous.XXXXXX")"
    export GPUBOX_RENDEZVOUS="file://$rendezvous_dir"
  fi
  workers=()
  for ((t = 0; t < local_trainers; t++)); do
    mine="$(IFS=,; echo "${cards[*]:$((t * per)):$per}")"
    procs_start "trainer $t" "log/worker.$t.log" \
      env PADDLE_TRAINER_ID="$t" FLAGS_selected_gpus="$mine" "$bin/gpubox_train" "${args[@]}"
    workers+=("trainer $t")
    echo "run_gpubox: trainer $t of $local_trainers on cards $mine (log/worker.$t.log)"
  done
  tail -n +1 -f --pid="$(procs_pid "trainer 0")" "log/worker.0.log" &
  status=0
  procs_wait_for "${workers[@]}" || status=$?
  [ "$status" != 0 ] || plot_hint log/worker.0.log
  exit "$status"
fi
status=0
# In the background, waited for: a TERM or INT sent to this script reaches the trainer at once
# (bash runs a trap only after the foreground command ends, so the job trained on to its last
# pass and the script exited 143 after it). An INT is passed on as TERM: a background job of a
# script ignores SIGINT (Ctrl-C in a terminal reached the trainer and left it training).
exec {shown}> >(tee "log/worker.$trainer_id.log")
tee_pid=$!
"$bin/gpubox_train" "${args[@]}" >&"$shown" 2>&1 &
trainer_pid=$!
# The trainer's last lines through tee before the script goes on (not `wait` alone: that waits
# for the servers too).
trainer_done() { exec {shown}>&-; wait "$tee_pid" 2>/dev/null || true; }
stop_trainer() {
  kill "-$1" "$trainer_pid" 2>/dev/null || true
  wait "$trainer_pid" 2>/dev/null || true
  trainer_done
  exit "$2"
}
trap 'stop_trainer TERM 130' INT
trap 'stop_trainer TERM 143' TERM
wait "$trainer_pid" || status=$?
trainer_done
[ "$status" != 0 ] || plot_hint "log/worker.$trainer_id.log"
exit "$status"
