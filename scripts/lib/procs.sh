# scripts/lib/procs.sh: the process bookkeeping of GPUBox's launchers, sourced by bash scripts
# (run_gpubox.sh; any other launcher may source it too). Needs bash >= 5.1 (wait -n -p).
#
#   procs_start NAME LOG CMD...   runs CMD in the background, output to LOG; remembers it as NAME
#   procs_wait_for NAME...        waits until every process named has exited. Returns 0 when all
#                                 exited with 0; as soon as any process started here (named or
#                                 not, e.g. a server) exits otherwise, or a non-named one exits at
#                                 all, says which (and its log) and returns its status (1 when it
#                                 was 0), leaving the rest to procs_stop_all
#   procs_stop_all                TERM to every process still running, KILL after 5 s, reaped
#   procs_pid NAME                the pid of NAME
#   procs_listened_port LOG       the port of the first '^gpubox_server listening on ADDR:PORT ...'
#                                 line of LOG (a server started with --port 0 says there which
#                                 port the kernel gave it); "" while there is none
#   procs_wait_for_port PID LOG   waits for that line while PID lives and prints its port; returns 1
#                                 when PID exits first, 2 when PID still has not said it listens
#                                 after $procs_port_wait_s seconds of the clock (a hung start: under
#                                 load a start has taken over 10 s). A line read half-written (a
#                                 read of a file being appended to is not atomic with the write)
#                                 is waited for like a line not there yet. LOG must have been
#                                 emptied before PID started (procs_start does): a line of an
#                                 earlier run there would be taken for PID's
# Callers stop everything on exit: trap procs_stop_all EXIT (and INT/TERM that exit).

declare -gA procs_pid_of=() procs_log_of=() procs_name_of=()
: "${procs_port_wait_s:=180}"  # a caller (or its environment) may set it first

procs_start() {
  local name=$1 log=$2
  shift 2
  # Emptied here, before the start: the child opens (and truncates) LOG only once it runs, and a
  # line an earlier run left there would meanwhile be read as this one's (procs_wait_for_port).
  : >"$log"
  "$@" >"$log" 2>&1 &
  procs_pid_of[$name]=$!
  procs_log_of[$name]=$log
  procs_name_of[$!]=$name
}

procs_pid() { echo "${procs_pid_of[$1]}"; }

procs_wait_for() {
  local -A pending=()
  local name pid status
  for name in "$@"; do pending[${procs_pid_of[$name]}]=$name; done
  while [ "${#pending[@]}" -gt 0 ]; do
    status=0
    wait -n -p pid "${!procs_name_of[@]}" || status=$?
    [ -n "${pid:-}" ] || return 1  # nothing left to wait for
    name="${procs_name_of[$pid]}"
    unset "procs_name_of[$pid]"
    if [ -n "${pending[$pid]:-}" ] && [ "$status" -eq 0 ]; then
      unset "pending[$pid]"
      continue
    fi
    echo "run_gpubox: $name (pid $pid) exited with status $status; stopping the others (see ${procs_log_of[$name]})" >&2
    # A peer's death is often what made this one fail: name the others that are gone too.
    sleep 0.2
    local other other_status
    for other in "${!procs_name_of[@]}"; do
      if ! kill -0 "$other" 2>/dev/null; then
        other_status=0
        wait "$other" 2>/dev/null || other_status=$?
        echo "run_gpubox: ${procs_name_of[$other]} (pid $other) exited too, with status $other_status (see ${procs_log_of[${procs_name_of[$other]}]})" >&2
        unset "procs_name_of[$other]"
      fi
    done
    [ "$status" -ne 0 ] || status=1
    return "$status"
  done
  return 0
}

# WHO LOG: marks LOG, the log file of a server this launcher starts and reads the port of, as
# this launcher's ("LOG.launcher" holds its pid, made with O_EXCL) until procs_release_logs. A
# second launcher in the same folder truncated the same file and read its port from the other's
# server: two jobs crossed their servers (one stopping the other's at its end). Refused, exit 2,
# naming the file, while the mark's launcher lives; a mark whose launcher is gone is taken over.
procs_held_logs=()
# procs_is_launcher PID: whether PID is a live launcher (launch.sh, run_gpubox.sh). kill -0 fails
# on another user's live process too (EPERM), and a pid reused since (a reboot) is alive but no
# launcher: /proc's command line tells both apart, kill -0 where /proc cannot be read.
procs_is_launcher() {
  local command
  if command="$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline")"; then
    [[ "$command" == *launch.sh* || "$command" == *run_gpubox.sh* ]]
  else
    [ ! -d /proc/self ] && kill -0 "$1" 2>/dev/null
  fi
}
procs_hold_log() {
  local mark="$2.launcher" holder
  for _ in 1 2; do
    if (set -C && echo "$$" >"$mark") 2>/dev/null; then
      procs_held_logs+=("$mark")
      return 0
    fi
    holder="$(cat "$mark" 2>/dev/null || true)"
    if [ -n "$holder" ] && [ "$holder" != "$$" ] && procs_is_launcher "$holder"; then
      echo "$1: $(pwd)/$2 is the log of another launcher's server (pid $holder, a job started from this folder, runs): each launcher reads its servers' ports from its logs here; start this job from another folder (or, if pid $holder is no launcher of this folder's, remove $(pwd)/$mark)" >&2
      exit 2
    fi
    [ "$holder" = "$$" ] && return 0
    rm -f "$mark"  # its launcher ended without removing it
  done
  echo "$1: cannot mark $(pwd)/$2 as this launcher's ($mark)" >&2
  exit 2
}

# Removes the marks procs_hold_log made (the launcher's end).
procs_release_logs() {
  [ "${#procs_held_logs[@]}" -eq 0 ] || rm -f "${procs_held_logs[@]}"
  procs_held_logs=()
}

# SIGTERM to the pids given, SIGKILL to those alive 5 s later (a stopped or stuck child ignores
# TERM: the launcher waited for it for ever), then their statuses reaped.
procs_stop_pids() {
  local pid
  for pid in "$@"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 50); do
    local alive=0
    for pid in "$@"; do [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 1 ] || break
    sleep 0.1
  done
  for pid in "$@"; do [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true; done
  for pid in "$@"; do [ -n "$pid" ] && wait "$pid" 2>/dev/null || true; done
}

procs_stop_all() {
  procs_stop_pids "${!procs_name_of[@]}"
  procs_name_of=()
}

procs_listened_port() {
  # The output file may not exist for a moment after a start: nothing yet, not a failure (under
  # `set -o pipefail -e`, sed's status on a missing file ended the caller).
  [ -f "$1" ] || return 0
  sed -n 's/^gpubox_server listening on [^ ]*:\([0-9]*\) .*/\1/p' "$1" | head -n 1
}

procs_wait_for_port() {
  local pid=$1 log=$2 port
  local deadline=$((SECONDS + procs_port_wait_s))
  while [ "$SECONDS" -lt "$deadline" ]; do
    port="$(procs_listened_port "$log")"
    if [ -n "$port" ]; then
      echo "$port"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 2
}
