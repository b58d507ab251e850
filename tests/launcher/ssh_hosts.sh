#!/usr/bin/env bash
# A 2 × 2-rank job across two hosts: network namespaces lt-node1 and lt-node2 joined by a veth pair
# (10.200.0.1, 10.200.0.2), each with its own sshd and hostname (scripts/ci/cluster.sh).
# `llmtrain run` runs on node1 with a hostfile of both: ranks 0-1 start on node1 (children of
# mpirun), ranks 2-3 on node2 over ssh (children of orted). Then SIGTERM to `llmtrain run`: the
# supervisor asks mpirun, which forwards SIGUSR1 to every rank on both hosts, whose relay turns it
# into SIGTERM — all four checkpoint and exit 75. Skipped, with the reason, where the container does
# not permit network namespaces.
source "$(dirname "$0")/lib.sh"
command -v ssh >/dev/null && [[ -x /usr/sbin/sshd ]] || skip "ssh/sshd are not installed (scripts/setup.sh installs openssh-server openssh-client)"
lt_lock ssh 200 || { fail "could not take the ssh lock"; finish; }
why=$(lt_hosts_unavailable)
[[ -n $why ]] && skip "two namespace hosts cannot be made here: $why"
cleanup_hooks+=(lt_hosts_stop lt_sshd_stop)
lt_sshd_start && lt_hosts_start || { fail "the namespace hosts did not start"; finish; }
echo "hosts up after $(elapsed)"
RUN=$WORK/run
CKPT=$RUN/ckpt
printf '%s.1 slots=2\n%s.2 slots=2\n' "$LT_NET" "$LT_NET" >"$WORK/hosts"
RUN_2X2=(lt_exec_in_node1 "$LLMTRAIN" run "$RECIPE" --set log.dir="$RUN" --set launch.hostfile="$WORK/hosts" --nproc 2
  --set launch.ssh.config="$LT_SSH_DIR/ssh_config")

run_bounded 2x2 bash -c "source '$SRC/scripts/ci/cluster.sh'; $(printf '%q ' "${RUN_2X2[@]}") -- '$JOB' --steps 3"
expect_status 0
expect_out "[launcher] attempt 1 of 1: mpirun -np 4 --hostfile $WORK/hosts --map-by ppr:2:node"
for r in 0 1; do expect_out_re "\[rank $r\] rank $r of 4: local $r of 2, host node1, pid [0-9]+, parent mpirun,"; done
for r in 2 3; do expect_out_re "\[rank $r\] rank $r of 4: local $((r - 2)) of 2, host node2, pid [0-9]+, parent orted,"; done
expect_count 4 "finished 3 steps"
for r in 0 1 2 3; do
  grep -q "^finished 3 steps" "$RUN/logs/rank_0000$r.log" && pass "2x2: rank_0000$r.log" || fail "2x2: rank_0000$r.log"
done

# SIGTERM reaches every rank on both hosts; all checkpoint and exit 75.
rm -rf "$RUN"
# (lt_exec_in_node1 execs: $job_pid becomes llmtrain's pid.)
start_job sigterm bash -c "source '$SRC/scripts/ci/cluster.sh'; $(printf '%q ' "${RUN_2X2[@]}") -- '$JOB' --steps 500 --ckpt-dir '$CKPT'"
wait_out sigterm '\[rank 0\] step 3 done' 60
[[ $(cat /proc/$job_pid/comm) == llmtrain ]] && pass "sigterm: the background pid is llmtrain" || fail "sigterm: pid $job_pid is $(cat /proc/$job_pid/comm)"
kill -TERM "$job_pid"
finish_job sigterm 60
expect_status 75
expect_out "[launcher] SIGTERM received: asked every rank, through mpirun, to write a checkpoint and exit 75"
expect_count 4 "stopping after step [0-9]+ \(signal 15\): checkpoint written, exit 75"
expect_out "the job stopped: every rank wrote its checkpoint and exited 75"

echo "launcher_ssh_hosts took $(elapsed)"
finish
