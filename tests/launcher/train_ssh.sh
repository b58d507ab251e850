#!/usr/bin/env bash
# Real training over ssh: two hosts in network namespaces (lt-node1 10.200.0.1, lt-node2 10.200.0.2,
# each with its own sshd and hostname; scripts/ci/cluster.sh). From node1, a hostfile of both with
# slots=2 and `--nproc 2` runs a 2 × 2-rank data-parallel job (ranks 2-3 reach node2 through ssh and
# Open MPI's orted); its losses equal the one-rank run's within 1e-5 (relative) at every step —
# the same model and global batch (8 = 2 × 4 ranks, or 2 × 4 accumulation steps on one rank), so
# only the order of float sums differs. The same job stopped by SIGTERM mid-run (every rank on
# both hosts checkpoints, exit 75) and run again resumes on the same losses. Then failures a user can act on, with the training binary:
# a host that cannot be reached (ssh's own error), too few slots for the world, and a layout that
# does not match the hostfile's world. Skipped, with the reason, where the container does not
# permit network namespaces.
source "$(dirname "$0")/train_lib.sh"
command -v ssh >/dev/null && [[ -x /usr/sbin/sshd ]] || skip "ssh/sshd are not installed (scripts/setup.sh installs openssh-server openssh-client)"
prep_data
# 30 steps: dp = 4 and dp = 1 stay within 1e-5 of each other for ~40 steps of this recipe (the
# summation-order differences grow as training goes on).
write_recipe r.yaml 30

run_bounded one-rank "$LLMTRAIN" run r.yaml --set log.dir=one
expect_status 0
expect_out "llmtrain run launch: 1 rank(s)"

lt_lock ssh 200 || { fail "could not take the ssh lock"; finish; }
why=$(lt_hosts_unavailable)
[[ -n $why ]] && skip "two namespace hosts cannot be made here: $why"
cleanup_hooks+=(lt_hosts_stop lt_sshd_stop)
lt_sshd_start && lt_hosts_start || { fail "the namespace hosts did not start"; finish; }
echo "hosts up after $(elapsed)"

# on_node1 NAME HOSTFILE ARGS...: `llmtrain run r.yaml --nproc 2` with HOSTFILE and the ssh config,
# on node1, bounded.
on_node1() {
  local name=$1 hosts=$2
  shift 2
  local cmd=(lt_exec_in_node1 "$LLMTRAIN" run r.yaml --nproc 2 --set launch.hostfile="$hosts"
    --set launch.ssh.config="$LT_SSH_DIR/ssh_config" "$@")
  run_bounded "$name" bash -c "source '$SRC/scripts/ci/cluster.sh'; $(printf '%q ' "${cmd[@]}")"
}
accepted() { grep -c "Accepted publickey" "$LT_SSH_DIR/sshd-node2.log"; }

printf '%s.1 slots=2\n%s.2 slots=2\n' "$LT_NET" "$LT_NET" >hosts
before=$(accepted)
on_node1 2x2 hosts --set log.dir=two
expect_status 0
expect_out "[launcher] attempt 1 of 1: mpirun -np 4 --hostfile $WORK/hosts --map-by ppr:2:node"
expect_out "[rank 0] llmtrain run launch: 4 rank(s) = tp 1 × pp 1 × dp 4 = 4"
expect_out "[rank 0] done: 30 steps"
(($(accepted) >= before + 2)) && pass "2x2: node2's sshd accepted the pre-flight probe and mpirun's daemon" ||
  fail "2x2: node2's sshd accepted $(($(accepted) - before)) connection(s)"
res=$(compare_losses two one 2>&1) && pass "2x2: losses equal the one-rank run's at every step: $res" || fail "2x2: $res"
for r in 0 1 2 3; do
  [[ -f two/logs/rank_0000$r.log ]] && pass "2x2: rank_0000$r.log exists" || fail "2x2: no two/logs/rank_0000$r.log"
done

# SIGTERM to `llmtrain run` mid-run: the supervisor asks mpirun (SIGUSR1, forwarded to both hosts;
# each rank's relay makes it a SIGTERM); every rank checkpoints the same step and exits 75. The same
# command then resumes on both hosts and finishes on the one-rank run's losses.
cmd=(lt_exec_in_node1 "$LLMTRAIN" run r.yaml --nproc 2 --set launch.hostfile=hosts
  --set launch.ssh.config="$LT_SSH_DIR/ssh_config" --set log.dir=stopped)
start_job stop bash -c "source '$SRC/scripts/ci/cluster.sh'; $(printf '%q ' "${cmd[@]}")"  # becomes llmtrain
t0=$SECONDS
# (grep -c prints nothing while metrics.jsonl does not exist yet: count 0 then, not a syntax error.)
losses() { grep -c '"loss"' stopped/metrics.jsonl 2>/dev/null || true; }
until (($(losses) + 0 >= 2)) || ((SECONDS - t0 > 60 * LT_TIME_SCALE)); do sleep 0.05; done
(($(losses) + 0 >= 2)) || fail "stop: no 2 steps in stopped/metrics.jsonl within $((60 * LT_TIME_SCALE)) s"
kill -TERM "$job_pid"
finish_job stop 60
expect_status 75
expect_out "[launcher] SIGTERM received: asked every rank, through mpirun, to write a checkpoint and exit 75"
stop=$(grep -oE "\[rank 0\] stop requested \(signal\): writing a checkpoint at step [0-9]+" <<<"$out" | grep -oE '[0-9]+$')
((${stop:-30} >= 2 && ${stop:-30} < 30)) && pass "stop: the ranks stopped after step $stop of 30" || fail "stop: stop step '$stop'"
expect_out "the job stopped: every rank wrote its checkpoint and exited 75"
on_node1 resume hosts --set log.dir=stopped
expect_status 0
expect_out "[rank 0] resuming from $WORK/stopped/ckpt/step_$(printf %08d "${stop:-0}") at step $stop"
expect_out "[rank 0] done: 30 steps"
res=$(compare_losses stopped one 2>&1) && pass "stop+resume: losses equal the one-rank run's at every step: $res" ||
  fail "stop+resume: $res"

# --- failures a user can act on --------------------------------------------------------------------
# No host answers at 10.200.0.3: ssh's "No route to host" after the ARP timeout (~3 s).
printf '%s.1 slots=2\n%s.3 slots=2\n' "$LT_NET" "$LT_NET" >hosts.unreachable
on_node1 unreachable hosts.unreachable --set log.dir=f1
expect_status 1
expect_out "cannot be reached over ssh with the recipe's options:"
expect_out_re "$LT_NET.3: ssh exited 255: .*(No route to host|timed out)"
expect_out "command: ssh -o BatchMode=yes -o ConnectTimeout=10 -F $LT_SSH_DIR/ssh_config $LT_NET.3 true"
expect_out "hint: the launcher needs key-based, non-interactive ssh to every host"
expect_no "attempt 1 of"

printf '%s.1 slots=2\n%s.2 slots=1\n' "$LT_NET" "$LT_NET" >hosts.small
on_node1 few-slots hosts.small --set log.dir=f2
expect_status 2
expect_out "launch.procs_per_node is 2 (world 4 = 2 hosts × 2), but $WORK/hosts.small:2: host $LT_NET.2 has slots=1"
expect_out "hint: give every host slots=N with N ≥ launch.procs_per_node"

on_node1 world-vs-layout hosts --set log.dir=f3 --set parallel.dp=2
expect_status 2
expect_out "world size 4 (2 hosts in launch.hostfile × launch.procs_per_node 2) != tp 1 × pp 1 × dp 2 = 2"

echo "launcher_train_ssh took $(elapsed)"
finish
