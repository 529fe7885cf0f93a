#!/bin/sh
# sh tests/scripts/run_gpubox_test.sh REPO BUILD_DIR
# scripts/run_gpubox.sh as PaddleRec users start it, under sh (dash) from another folder:
#  1. `sh run_gpubox.sh -m CONFIG` with the in-process host tier: trains, prints PaddleRec's
#     epoch line, logs to ./log/worker.0.log and says how to plot the metrics;
#  2. the variables PaddleRec's tools/run_gpubox.sh exports (a server list, no TRAINING_ROLE):
#     the named server is started on its port with the trainer's config and overrides (in every
#     spelling gpubox_train takes), the trainer uses it, and it is stopped at the end;
#  3. --trainers 2 --servers 1: two trainer processes (one card each) and a server, trainer 0's
#     lines shown, log/worker.0.log and log/worker.1.log, every process stopped at the end; cards
#     that cannot be split between the trainers are refused;
#  4. run twice in the same folder with a server and saves (the shipped config's
#     model_save_path): the first run's sparse halves land in its saves (not under the server's
#     --data_dir a second time), and the second run resumes from them and trains on; the same
#     finished job run a third time trains again from the start;
#  5. TRAINING_ROLE=PSERVER and TRAINING_ROLE=TRAINER started apart (as PaddleRec's launcher
#     does): the server exits with status 0 once its job's trainer finished;
#  0. --help and --version print and exit, making no folder and starting no server; a count of
#     trainers or servers that is not a positive number is refused naming it (exit 2), as are
#     launcher variables that would run something else than asked (0c);
#  6. a server's "listening on" line read half-written is waited for, not a failed start;
#  8. SIGTERM (SIGINT) to the launcher stops its trainer at once, exit 143 (130).
set -eu
repo="$1"
build="$2"
work="$(mktemp -d "${TMPDIR:-/tmp}/gpubox_run_test_XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
cd "$work"
config="$repo/configs/config_gpubox.yaml"
export GPUBOX_BUILD_DIR="$build" FLAGS_selected_gpus=0

# 0. --help and --version answer and exit: no folder made, no server started.
sh "$repo/scripts/run_gpubox.sh" --help >out0.txt 2>&1 </dev/null || { cat out0.txt; fail "--help exited nonzero"; }
grep -q -- "--trainers T" out0.txt || { cat out0.txt; fail "--help does not describe the launcher"; }
grep -q "usage: gpubox_train" out0.txt || { cat out0.txt; fail "--help does not show gpubox_train's options"; }
sh "$repo/scripts/run_gpubox.sh" -m "$config" --version >out0v.txt 2>&1 </dev/null || fail "--version exited nonzero"
grep -q "^gpubox_train .*backend" out0v.txt || { cat out0v.txt; fail "--version printed no version"; }
[ ! -e log ] && [ ! -e output ] || fail "--help or --version made a folder"
# 0b. A count of trainers or servers that is not a positive number (missing, 0, a word, the next
#     flag taken as it) is refused naming it, exit 2, before any folder, server or training: a
#     server count of 0 trained with the in-process tier instead, and 'abc' failed as an unbound
#     bash variable.
for bad in "--servers 0" "--servers=-1" "--servers abc" "--servers" "--trainers" "--trainers=0"; do
  status=0
  # shellcheck disable=SC2086  # the words of $bad are the arguments
  GPUBOX_LOCAL_TIER=0 timeout 60 sh "$repo/scripts/run_gpubox.sh" $bad --config "$config" \
    >out0b.txt 2>&1 </dev/null || status=$?
  [ "$status" = 2 ] || { cat out0b.txt; fail "'$bad' exited $status, not 2"; }
  grep -q "^run_gpubox: ${bad%%[ =]*} takes a positive number" out0b.txt ||
    { cat out0b.txt; fail "'$bad': no error naming the flag"; }
  if [ -e log ] || [ -e output ]; then fail "'$bad' made a folder"; fi
done
status=0
PADDLE_PSERVER_NUMS=abc GPUBOX_LOCAL_TIER=0 timeout 60 sh "$repo/scripts/run_gpubox.sh" \
  --config "$config" >out0b.txt 2>&1 </dev/null || status=$?
[ "$status" = 2 ] || { cat out0b.txt; fail "PADDLE_PSERVER_NUMS=abc exited $status, not 2"; }
grep -q "^run_gpubox: PADDLE_PSERVER_NUMS takes a positive number of servers, got 'abc'" out0b.txt ||
  { cat out0b.txt; fail "PADDLE_PSERVER_NUMS=abc: no error naming it"; }
# 0c. Launcher variables that would run something else than asked are refused naming them
#     (exit 2): a PSERVER role none of whose listed endpoints is this machine's (it said its
#     servers were running and exited 0, serving nothing), a TRAINER role with no servers (it
#     trained alone on the in-process tier), a GPUBOX_LOCAL_TIER other than a yes or no, a
#     trainer count that is not a number (bash's own noise first).
refused() {  # refused NAME TEXT ENV...: run_gpubox.sh under ENV exits 2 printing TEXT
  name="$1" text="$2"
  shift 2
  status=0
  env "$@" timeout 60 sh "$repo/scripts/run_gpubox.sh" --config "$config" >out0c.txt 2>&1 </dev/null ||
    status=$?
  [ "$status" = 2 ] || { cat out0c.txt; fail "$name exited $status, not 2"; }
  grep -q -- "$text" out0c.txt || { cat out0c.txt; fail "$name: no error saying '$text'"; }
  if grep -q "integer expression\|servers running until" out0c.txt; then cat out0c.txt; fail "$name: went on"; fi
}
refused "PSERVER on another port" "no endpoint of PADDLE_PSERVERS_IP_PORT_LIST=127.0.0.1:45678 is this machine's (POD_IP=127.0.0.1, PADDLE_PORT=45679)" \
  TRAINING_ROLE=PSERVER PADDLE_PSERVERS_IP_PORT_LIST=127.0.0.1:45678 POD_IP=127.0.0.1 PADDLE_PORT=45679
refused "TRAINER without servers" "TRAINING_ROLE=TRAINER runs a trainer against servers started elsewhere: set PADDLE_PSERVERS_IP_PORT_LIST" \
  TRAINING_ROLE=TRAINER GPUBOX_LOCAL_TIER=0
refused "GPUBOX_LOCAL_TIER=maybe" "GPUBOX_LOCAL_TIER='maybe': 1" GPUBOX_LOCAL_TIER=maybe
refused "TRAINING_ROLE=foo" "TRAINING_ROLE='foo': expected PSERVER or TRAINER" TRAINING_ROLE=foo
refused_args() {  # refused_args NAME TEXT ARGS...: run_gpubox.sh ARGS exits 2 printing TEXT
  name="$1" text="$2"
  shift 2
  status=0
  timeout 60 sh "$repo/scripts/run_gpubox.sh" "$@" --config "$config" >out0c.txt 2>&1 </dev/null ||
    status=$?
  [ "$status" = 2 ] || { cat out0c.txt; fail "$name exited $status, not 2"; }
  grep -q -- "$text" out0c.txt || { cat out0c.txt; fail "$name: no error saying '$text'"; }
}
refused_args "--trainers twice" "--trainers is given twice" --trainers 2 --trainers=3
# (In subshells: an assignment before a function call outlives it in some shells.)
(GPUBOX_LOCAL_TIER=1 && export GPUBOX_LOCAL_TIER && refused_args "--servers with the local tier" "contradict" --servers 2) || exit 1
(FLAGS_selected_gpus=0,0 && export FLAGS_selected_gpus && refused_args "a card twice between trainers" "names card 0 twice" --trainers 2) || exit 1
refused "PADDLE_TRAINERS_NUM=abc" "the job's trainers 'abc'" PADDLE_TRAINERS_NUM=abc GPUBOX_LOCAL_TIER=1

# 1.
GPUBOX_LOCAL_TIER=1 timeout 120 sh "$repo/scripts/run_gpubox.sh" -m "$config" -o runner.epochs=1 \
  -o runner.model_save_path= -o runner.metrics_path=log/m.jsonl >out1.txt 2>&1 </dev/null ||
  { cat out1.txt; fail "sh run_gpubox.sh -m exited nonzero"; }
grep -q "^Epoch: 0, using time: .* example/sec\. auc: " out1.txt || { cat out1.txt; fail "no PaddleRec epoch line"; }
grep -q "^Epoch: 0, " log/worker.0.log || fail "log/worker.0.log misses the run"
[ ! -e log/pserver.0.log ] || fail "GPUBOX_LOCAL_TIER=1 started a server"
grep -q "scripts/plot_metrics.sh $work/log/m.jsonl --out log/plots" out1.txt || { cat out1.txt; fail "no plot hint"; }
[ -s log/m.jsonl ] || fail "no metrics written"
# Without -m (--config) but with -o: the shipped config (its trainer stopped, "--config is
# required", after the servers started).
GPUBOX_LOCAL_TIER=1 timeout 120 sh "$repo/scripts/run_gpubox.sh" -o runner.epochs=1 \
  -o runner.model_save_path= -o runner.metrics_path= >out1c.txt 2>&1 </dev/null ||
  { cat out1c.txt; fail "run_gpubox.sh -o ... without a config exited nonzero"; }
grep -q "^Epoch: 0, " out1c.txt || { cat out1c.txt; fail "-o without a config: no epoch line"; }

# 1b. The cpu build's trainer runs itself again (OMP_WAIT_POLICY) under its own name: ps, top
#     and pgrep see gpubox_train, not "exe".
"$build/bin/gpubox_train" --config "$config" -o runner.epochs=100000 -o runner.model_save_path= \
  -o runner.metrics_path= >out1b.txt 2>&1 </dev/null &
trainer=$!
named=""
for _ in $(seq 1 600); do  # up to 60 s: a first pass next to another test on a loaded machine
  if [ "$(cat /proc/$trainer/comm 2>/dev/null)" = "gpubox_train" ] && grep -q "^pass: " out1b.txt; then
    named=yes; break
  fi
  sleep 0.1
done
kill "$trainer" 2>/dev/null; wait "$trainer" 2>/dev/null || true
[ -n "$named" ] || { cat out1b.txt; fail "the training process is not named gpubox_train"; }

# 2.
port="$(python3 "$repo/tests/scripts/free_port.py")"  # below the ephemeral range
rm -rf log
env GPUBOX_LOCAL_TIER=0 PADDLE_PSERVERS_IP_PORT_LIST="127.0.0.1:$port" PADDLE_PSERVER_NUMS=1 \
  PADDLE_TRAINERS=1 PADDLE_TRAINERS_NUM=1 PADDLE_TRAINER_ID=0 POD_IP=127.0.0.1 \
  timeout 120 sh "$repo/scripts/run_gpubox.sh" -config "$config" --o=runner.epochs=1 \
  -orunner.model_save_path= -o runner.metrics_path= --o runner.host_memory_mb=900 \
  >out2.txt 2>&1 </dev/null ||
  { cat out2.txt; cat log/pserver.0.log 2>/dev/null; fail "PaddleRec's exports: exited nonzero"; }
# The server reads the trainer's config and overrides in the spellings gpubox_train takes
# (-config, --o=, -okey=value: it ran on its defaults under them, exit 0).
grep -q "memory limit 900 MiB (runner.host_memory_mb)" log/pserver.0.log ||
  { cat log/pserver.0.log; fail "the server did not get --o runner.host_memory_mb=900"; }
grep -q "gpubox_server on 127.0.0.1:$port" out2.txt || { cat out2.txt; fail "the listed server was not started"; }
grep -q "listening on 127.0.0.1:$port" log/pserver.0.log || fail "log/pserver.0.log: not listening on $port"
grep -q "^Epoch: 0, " out2.txt || { cat out2.txt; fail "no training"; }
# Stopped on exit: the port is free again.
python3 -c "import socket, sys; s = socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $port)) == 0)" ||
  fail "the server still listens after the launcher exited"
# 3.
rm -rf log
env -u FLAGS_selected_gpus GPUBOX_LOCAL_TIER=0 timeout 120 bash "$repo/scripts/run_gpubox.sh" \
  --trainers 2 --servers 1 --config "$config" -o runner.epochs=1 -o runner.model_save_path= \
  -o runner.metrics_path=log/m.jsonl >out3.txt 2>&1 </dev/null ||
  { cat out3.txt; cat log/worker.1.log 2>/dev/null; fail "--trainers 2 exited nonzero"; }
grep -q "^Epoch: 0, " out3.txt || { cat out3.txt; fail "--trainers 2: no epoch line"; }
grep -q "trainer 1 of 2 on cards 1 (log/worker.1.log)" out3.txt || { cat out3.txt; fail "no trainer 1"; }
grep -q '"trainer": 1' log/m.trainer1.jsonl || fail "trainer 1 wrote no metrics line"
grep -q "plot the metrics: .*plot_metrics.sh .*log/m.jsonl" out3.txt ||
  { cat out3.txt; fail "--trainers 2: no plot hint"; }
[ -s log/worker.1.log ] && [ -s log/pserver.0.log ] || fail "--trainers 2: logs missing"
port3="$(sed -n 's/^run_gpubox: gpubox_server on 127.0.0.1:\([0-9]*\) .*/\1/p' out3.txt)"
[ -n "$port3" ] || { cat out3.txt; fail "--servers 1 started no server"; }
python3 -c "import socket, sys; s = socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $port3)) == 0)" ||
  fail "--trainers 2: the server still listens after the launcher exited"
FLAGS_selected_gpus=0,1,2 timeout 60 bash "$repo/scripts/run_gpubox.sh" --trainers 2 \
  --config "$config" >out4.txt 2>&1 </dev/null && fail "3 cards split between 2 trainers"
grep -q "cannot be split evenly between 2 trainers" out4.txt || { cat out4.txt; fail "no reason given"; }
# 4.
rm -rf log output
for epochs in 1 2; do
  env GPUBOX_LOCAL_TIER=0 timeout 120 sh "$repo/scripts/run_gpubox.sh" --config "$config" \
    -o runner.epochs=$epochs -o runner.metrics_path= >out5.$epochs.txt 2>&1 </dev/null ||
    { cat out5.$epochs.txt; cat log/pserver.0.log 2>/dev/null; fail "run $epochs with saves exited nonzero"; }
  [ -s output/model_dnn/0/sparse/MANIFEST ] || { find output; fail "run $epochs: no sparse half in output/model_dnn/0"; }
  [ ! -e output/model_dnn/output ] || { find output; fail "run $epochs: a save landed under the server's data_dir twice"; }
done
grep -q "runner.resume: resuming from pass 0 (output/model_dnn/0" out5.2.txt || { cat out5.2.txt; fail "the second run did not resume"; }
grep -q "^Epoch: 1, " out5.2.txt || { cat out5.2.txt; fail "the second run did not train"; }
grep -q "^pass: 1, .* created: 0," out5.2.txt || { cat out5.2.txt; fail "the second run's rows were not the save's"; }
[ -s output/model_dnn/1/sparse/MANIFEST ] || { find output; fail "the second run saved no sparse half"; }
# Another job into the same saves is refused at start, the message alone on the user's line (no
# assertion expression, no source location: those go to the log line above it).
"$build/bin/gpubox_train" --config "$config" -o runner.train_batch_size=7 -o runner.metrics_path= \
  >out5.x.txt 2>&1 </dev/null && fail "another job resumed the saves"
grep -q "^gpubox_train: runner.resume: .* is of another job than this one: runner.train_batch_size: saved 512, now 7" out5.x.txt ||
  { cat out5.x.txt; fail "no refusal naming the batch size"; }
grep "^gpubox_train: " out5.x.txt | grep -q "expected:\|\.cpp:" && { cat out5.x.txt; fail "the user's line carries the code's location"; }
# The same finished job run again trains again from the start (it prints an AUC again).
env GPUBOX_LOCAL_TIER=0 timeout 120 sh "$repo/scripts/run_gpubox.sh" --config "$config" \
  -o runner.epochs=2 -o runner.metrics_path= >out5.3.txt 2>&1 </dev/null ||
  { cat out5.3.txt; fail "the third run exited nonzero"; }
grep -q "ends this job (all its 2 passes saved): training it again from the start" out5.3.txt ||
  { cat out5.3.txt; fail "the third run did not say it trains the finished job again"; }
grep -q "^Epoch: 0, .* auc: 0\.[0-9]" out5.3.txt && grep -q "^Epoch: 1, " out5.3.txt ||
  { cat out5.3.txt; fail "the third run did not train both passes"; }
# 5.
rm -rf log
port6="$(python3 "$repo/tests/scripts/free_port.py")"  # below the ephemeral range
# roles ROLE SECONDS: the launcher in that role, under `timeout SECONDS`, which it becomes (exec):
# the role's pid is timeout's, which leads a process group of its own holding the launcher and
# its server, so that one kill of the group stops them all.
roles() { exec env PADDLE_PSERVERS_IP_PORT_LIST="127.0.0.1:$port6" PADDLE_TRAINERS_NUM=1 \
  PADDLE_TRAINER_ID=0 POD_IP=127.0.0.1 TRAINING_ROLE="$1" timeout "$2" bash \
  "$repo/scripts/run_gpubox.sh" --config "$config" -o runner.epochs=1 -o runner.model_save_path= \
  -o runner.metrics_path= </dev/null; }
# The trainer is started once the server says it listens (it binds first): not after a fixed
# count of polls, which a loaded machine outlasted (the trainer then failed to reach it in its
# 30 s). Fails naming what was waited for, with the server's log, if the launcher exits first or
# the server has not said so in $listen_wait_s s of the clock (then the launcher and its server
# are stopped, freeing the port). The server's timeout is that wait, the trainer's 120 s and its
# grace after the trainer (10 s) with a margin, so that the wait eats none of the trainer's time,
# and the launcher's own wait for the line (procs_port_wait_s, 180 s) is longer: a slow start
# ends with this test's message, well inside ctest's TIMEOUT (tests/scripts/CMakeLists.txt).
listen_wait_s=60
roles PSERVER $((listen_wait_s + 120 + 30)) >out6.s.txt 2>&1 &
server_script=$!
server_failed() {  # server_failed WHY: the launcher's output and the server's log, then fail
  kill -- -"$server_script" 2>/dev/null || true
  wait "$server_script" 2>/dev/null || true
  cat out6.s.txt
  if [ -f log/pserver.0.log ]; then tail -n 20 log/pserver.0.log; fi
  fail "waiting for log/pserver.0.log to say 'listening on 127.0.0.1:$port6': $1"
}
deadline=$(($(date +%s) + listen_wait_s))
until grep -q "listening on 127.0.0.1:$port6 " log/pserver.0.log 2>/dev/null; do
  kill -0 "$server_script" 2>/dev/null || server_failed "TRAINING_ROLE=PSERVER exited first"
  [ "$(date +%s)" -lt "$deadline" ] || server_failed "not within $listen_wait_s s"
  sleep 0.1
done
(roles TRAINER 120) >out6.t.txt 2>&1 || { cat out6.t.txt; fail "TRAINING_ROLE=TRAINER exited nonzero"; }
grep -q "^Epoch: 0, " out6.t.txt || { cat out6.t.txt; fail "TRAINING_ROLE=TRAINER: no epoch line"; }
# The trainer has gone: the server follows within its grace (10 s), well before its timeout.
status=0
wait "$server_script" || status=$?
[ "$status" = 0 ] || { cat out6.s.txt log/pserver.0.log; fail "TRAINING_ROLE=PSERVER ended with status $status"; }
grep -q "trainers ended it; exiting" log/pserver.0.log || { cat log/pserver.0.log; fail "the server did not exit with its job"; }
# 6. A server's "listening on" line read half-written (its port not there yet) is waited for:
#    the launcher failed the job with "no port in its 'listening on' line" (seen under load). A
#    stand-in server writes the line in two halves, 0.5 s apart, then exits.
fake="$work/fake_build"
mkdir -p "$fake/bin"
ln -s "$build/bin/gpubox_train" "$fake/bin/gpubox_train"
cat >"$fake/bin/gpubox_server" <<'EOF'
#!/bin/sh
printf 'gpubox_server listening on 127.0.0.1:'
sleep 0.5
printf '45678 (shard 0 of 1, row stride 18)\n'
sleep 0.5
EOF
chmod +x "$fake/bin/gpubox_server"
rm -rf log
env GPUBOX_BUILD_DIR="$fake" TRAINING_ROLE=PSERVER PADDLE_PSERVERS_IP_PORT_LIST=127.0.0.1:45678 \
  POD_IP=127.0.0.1 timeout 60 bash "$repo/scripts/run_gpubox.sh" --config "$config" \
  >out7.txt 2>&1 </dev/null || { cat out7.txt log/pserver.0.log; fail "a half-written listening line failed the launcher"; }
grep -q "servers running until" out7.txt || { cat out7.txt; fail "the server was not waited for"; }
#    POD_IP=localhost is the list's 127.0.0.1 (a string compare found no endpoint to serve).
rm -rf log
env GPUBOX_BUILD_DIR="$fake" TRAINING_ROLE=PSERVER PADDLE_PSERVERS_IP_PORT_LIST=127.0.0.1:45678 \
  POD_IP=localhost timeout 60 bash "$repo/scripts/run_gpubox.sh" --config "$config" \
  >out7.txt 2>&1 </dev/null || { cat out7.txt; fail "POD_IP=localhost: the launcher failed"; }
[ -s log/pserver.0.log ] || { cat out7.txt; fail "POD_IP=localhost started no server for 127.0.0.1"; }
# 8. SIGTERM or SIGINT to the launcher stops its trainer at once (bash held the trap until the
#    foreground trainer ended: the job trained on to its last pass, then the script exited 143;
#    and a trainer started in the background ignores SIGINT, so passing INT on stopped nothing).
#    `env --default-signal=INT`: the launcher as a terminal starts it, INT not ignored (a
#    script's background job ignores it, and a shell cannot trap what it was started ignoring).
stop_launcher_with() {
  local signal=$1 expected=$2
  rm -rf log
  GPUBOX_LOCAL_TIER=1 env --default-signal=INT bash "$repo/scripts/run_gpubox.sh" --config "$config" -o runner.epochs=1000000 \
    -o runner.model_save_path= -o runner.metrics_path= -o runner.test_data_dir= >out8.txt 2>&1 </dev/null &
  launcher=$!
  for _ in $(seq 600); do grep -q "^pass: 0" out8.txt && break; sleep 0.1; done
  grep -q "^pass: 0" out8.txt || { kill -9 "$launcher"; cat out8.txt; fail "the long job trained no pass"; }
  kill "-$signal" "$launcher"
  status=0
  for _ in $(seq 100); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$launcher" 2>/dev/null; then
    kill -9 "$launcher"
    pkill -9 -f "gpubox_train --config $config -o runner.epochs=1000000"
    fail "SIG$signal: the launcher still runs 10 s later"
  fi
  wait "$launcher" || status=$?
  [ "$status" = "$expected" ] || { cat out8.txt; fail "SIG$signal: the launcher exited $status, not $expected"; }
  pgrep -f "gpubox_train --config $config -o runner.epochs=1000000" >/dev/null &&
    fail "SIG$signal: the trainer outlived its launcher"
  return 0
}
stop_launcher_with TERM 143
stop_launcher_with INT 130
echo "PASS"
