#!/usr/bin/env bash
# `llmtrain run` with launch.hostfile: mpirun over ssh, against a real key-only sshd the test starts
# on loopback (scripts/ci/cluster.sh; port 22022, its own ssh_config). Open MPI takes 127.0.0.2 for
# another host, so a job there really goes through ssh (its ranks are children of orted). Also every
# pre-flight failure of a hostfile launch: malformed hostfile (file:line), too few slots, an ssh
# option Open MPI cannot pass, an unreadable identity, a host that refuses the connection and one
# whose host key is unknown (with ssh's own error). The two-host job is tests/launcher/ssh_hosts.sh.
source "$(dirname "$0")/lib.sh"
command -v ssh >/dev/null && [[ -x /usr/sbin/sshd ]] || skip "ssh/sshd are not installed (scripts/setup.sh installs openssh-server openssh-client)"
lt_lock ssh 200 || { fail "could not take the ssh lock"; finish; }
cleanup_hooks+=(lt_sshd_stop)
lt_sshd_start || { fail "sshd did not start"; finish; }
RUN=$WORK/run
CFG=$LT_SSH_DIR/ssh_config
printf '# one "remote" host\n127.0.0.2 slots=2\n' >"$WORK/hosts"
RUN_SSH=("$LLMTRAIN" run "$RECIPE" --set log.dir="$RUN" --set launch.hostfile="$WORK/hosts" --nproc 2)

accepted() { grep -c "Accepted publickey" "$LT_SSH_DIR/sshd.log"; }
before=$(accepted)
run_bounded ssh-1x2 "${RUN_SSH[@]}" --set launch.ssh.config="$CFG" -- "$JOB" --steps 3
expect_status 0
expect_out "--hostfile $WORK/hosts --map-by ppr:2:node --bind-to none --mca plm_rsh_agent 'ssh -o BatchMode=yes -F $CFG'"
expect_count 2 "parent orted,"
expect_out "[rank 1] finished 3 steps"
(($(accepted) >= before + 2)) && pass "ssh-1x2: sshd accepted the pre-flight probe and mpirun's daemon" ||
  fail "ssh-1x2: sshd accepted $(($(accepted) - before)) connection(s)"

run_bounded ssh-dry-run "${RUN_SSH[@]}" --set launch.ssh.config="$CFG" --dry-run
expect_status 2; expect_out "cannot run: "  # the recipe's data is not here: the plan is printed, the run would stop
expect_out "launch: mpirun over ssh, 2 rank(s) per node"
expect_out "world: 2 ranks"

# --- pre-flight: nothing starts ------------------------------------------------------------------
printf '127.0.0.2 slots=2\nnode2 slot=2\n' >"$WORK/hosts.bad"
run_bounded bad-hostfile "${RUN_SSH[@]}" --set launch.hostfile="$WORK/hosts.bad" -- "$JOB"
expect_status 2
expect_out "error: $WORK/hosts.bad:2: unknown field 'slot=2' for host node2"
expect_out "host [slots=N] [max_slots=N]"

run_bounded missing-hostfile "${RUN_SSH[@]}" --set launch.hostfile="$WORK/nowhere" -- "$JOB"
expect_status 2
expect_out "error: launch.hostfile: cannot read $WORK/nowhere: No such file or directory"

printf '127.0.0.2 slots=1\n' >"$WORK/hosts.small"
run_bounded few-slots "${RUN_SSH[@]}" --set launch.hostfile="$WORK/hosts.small" -- "$JOB"
expect_status 2
expect_out "launch.procs_per_node is 2 (world 2 = 1 hosts × 2), but $WORK/hosts.small:1: host 127.0.0.2 has slots=1"

mkdir -p "$WORK/with space" && cp "$CFG" "$WORK/with space/cfg"
run_bounded space-in-config "${RUN_SSH[@]}" --set launch.ssh.config="$WORK/with space/cfg" -- "$JOB"
expect_status 2
expect_out "contains a space, which Open MPI cannot pass to ssh"

run_bounded no-identity "${RUN_SSH[@]}" --set launch.ssh.identity="$WORK/no-key" -- "$JOB"
expect_status 2
expect_out "launch.ssh.identity $WORK/no-key: cannot read it: No such file or directory"

run_bounded refused "${RUN_SSH[@]}" --set launch.ssh.config="$CFG" --set launch.ssh.port=22099 -- "$JOB"
expect_status 1
expect_out "1 of 1 host(s) in $WORK/hosts cannot be reached over ssh with the recipe's options:"
expect_out_re "127.0.0.2: ssh exited 255: .*Connection refused"
expect_out "command: ssh -o BatchMode=yes -o ConnectTimeout=10 -p 22099 -F $CFG 127.0.0.2 true"
expect_out "hint: the launcher needs key-based, non-interactive ssh to every host"

# Port and identity without the config file: the host key is unknown and ssh will not ask.
run_bounded host-key env HOME="$WORK" "${RUN_SSH[@]}" --set launch.ssh.port="$LT_SSH_PORT" \
  --set launch.ssh.identity="$LT_SSH_DIR/id" -- "$JOB"
expect_status 1
expect_out "Host key verification failed"
expect_out "StrictHostKeyChecking"
[[ -d $RUN/logs ]] && grep -q "attempt 2" "$RUN/logs/launcher.log" && fail "a pre-flight failure started a job" ||
  pass "pre-flight failures started nothing"

echo "launcher_ssh took $(elapsed)"
finish
