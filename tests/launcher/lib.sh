# Helpers for the launcher tests, on top of tests/e2e/lib.sh (run_cmd, expect_*, finish) and
# scripts/ci/cluster.sh (Slurm, sshd, namespace hosts). Each test sources this with the build and
# source dirs as $1 and $2.
#
#   start_job NAME CMD...        runs CMD in the background, output in $WORK/NAME.out; $job_pid
#   wait_out NAME REGEX SECONDS  waits until NAME's output matches REGEX (fails the test on timeout)
#   finish_job NAME SECONDS      waits for the background job (killing it after SECONDS); sets
#                                $status and $out like run_cmd
#   rank_pid NAME RANK           the pid rank RANK of launch_job printed
#   run_bounded NAME CMD...      run_cmd with CMD under `timeout` (90 s, then SIGKILL 10 s later)
#   skip REASON                  reports the test as skipped (ctest SKIP_RETURN_CODE 77)
#
# Every bound above is multiplied by LT_TIME_SCALE (default 4): the seconds written in the tests are
# what a fast, idle machine needs, and a bound only decides how long a FAILING test takes to say
# so, never whether a passing one passes. A machine 3× slower that also shares its one core with
# other work (ssh, orted and four MPI ranks starting on a busy core) still passes.
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/lib.sh"
source "$SRC/scripts/ci/cluster.sh"
LT_TIME_SCALE=${LT_TIME_SCALE:-4}
JOB=$BUILD/tests/launch_job
RECIPE=$SRC/recipes/tiny.yaml
T0=$SECONDS
job_pid=
cleanup_hooks=()
# On exit: a job still running is killed (the supervisor's death takes mpirun and the ranks with
# it), then every hook runs (daemons stop), then the scratch folder goes.
on_exit() {
  [[ -n $job_pid ]] && kill -0 "$job_pid" 2>/dev/null && kill -KILL "$job_pid" 2>/dev/null && sleep 2
  local h
  for h in "${cleanup_hooks[@]}"; do eval "$h"; done
  # LLMTRAIN_TEST_KEEP=1 keeps the scratch folder (logs, checkpoints) for a look after a failure.
  if [[ ${LLMTRAIN_TEST_KEEP:-0} == 1 ]]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap on_exit EXIT

skip() {
  echo "SKIPPED: $*"
  exit 77
}

# --foreground: timeout signals only CMD (llmtrain's supervisor), once; without it, it would also
# signal its own process group, so CMD would get every signal twice.
run_bounded() {
  local name=$1
  shift
  run_cmd "$name" timeout --foreground -k 10 $((90 * LT_TIME_SCALE)) "$@"
}

start_job() {
  local name=$1
  shift
  "$@" >"$WORK/$name.out" 2>&1 &
  job_pid=$!
  last_name=$name
}

wait_out() {
  local name=$1 regex=$2 seconds=$(($3 * LT_TIME_SCALE)) t0=$SECONDS
  until grep -qE -- "$regex" "$WORK/$name.out" 2>/dev/null; do
    if ((SECONDS - t0 >= seconds)); then
      fail "$name: no /$regex/ in the output within ${seconds}s; output:
$(cat "$WORK/$name.out")"
      return 1
    fi
    sleep 0.1
  done
}

finish_job() {
  local name=$1 seconds=$(($2 * LT_TIME_SCALE)) t0=$SECONDS
  while kill -0 "$job_pid" 2>/dev/null; do
    if ((SECONDS - t0 >= seconds)); then
      fail "$name: still running after ${seconds}s; killing it"
      kill -KILL "$job_pid" 2>/dev/null
      break
    fi
    sleep 0.1
  done
  wait "$job_pid"
  status=$?
  out=$(cat "$WORK/$name.out")
  last_name=$name
}

rank_pid() { grep -oE "rank $2 of [0-9]+: .* pid [0-9]+" "$WORK/$1.out" | tail -1 | grep -oE 'pid [0-9]+' | cut -d' ' -f2; }

# expect_count N REGEX: the output has exactly N lines matching REGEX.
expect_count() {
  local n
  n=$(grep -cE -- "$2" <<<"$out")
  [[ $n == "$1" ]] && pass "$last_name: $1 line(s) match /$2/" || fail "$last_name: expected $1 line(s) matching /$2/, found $n; output:
$out"
}
expect_no() { grep -qE -- "$1" <<<"$out" && fail "$last_name: unexpected /$1/ in output:
$out" || pass "$last_name: no /$1/"; }

elapsed() { echo "$((SECONDS - T0))s"; }
