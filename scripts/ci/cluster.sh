#!/usr/bin/env bash
# Real cluster components on one machine, for tests and for trying the launcher by hand (Debian 12,
# root, no systemd): a single-node Slurm cluster (munge + slurmctld + slurmd), a key-only sshd on
# loopback, and two "hosts" in network namespaces joined by a veth pair, each with its own sshd
# and hostname. Everything lives in private folders and ports; nothing in /etc is touched.
#
# Source it for the functions, or run it:
#   scripts/ci/cluster.sh slurm-start | slurm-stop      (then: export SLURM_CONF=$LT_SLURM_DIR/slurm.conf)
#   scripts/ci/cluster.sh sshd-start  | sshd-stop       (ssh -F $LT_SSH_DIR/ssh_config 127.0.0.1)
#   scripts/ci/cluster.sh hosts-start | hosts-stop      (ip netns exec lt-node1 ssh -F ... 10.200.0.2)
#   scripts/ci/cluster.sh stop-all
#
# Functions (each idempotent, each wait bounded; they return nonzero with a message on failure):
#   lt_slurm_start / lt_slurm_stop         cluster "lt" with node $(hostname -s): CPUs=$LT_SLURM_CPUS (4;
#                                          SlurmdParameters=config_overrides lets it exceed the real
#                                          cores), KillWait=$LT_SLURM_KILLWAIT (30 s: time for a
#                                          checkpoint between SIGTERM and SIGKILL), MpiDefault=pmix,
#                                          requeued jobs eligible again after ~6 s (cred_expire=5)
#   lt_slurm_job_state JOB                 prints the job's state (RUNNING, COMPLETED, ...)
#   lt_slurm_wait_state JOB STATE SECONDS [RESTARTS]
#                                          waits until JOB is in STATE (a regex; with RESTARTS, also
#                                          requeued that many times); prints the state reached;
#                                          nonzero on timeout
#   lt_sshd_start / lt_sshd_stop           sshd on 127.0.0.1 and 127.0.0.2 (which Open MPI takes for
#                                          another host), port $LT_SSH_PORT (22022), root by key only;
#                                          clients use `ssh -F $LT_SSH_DIR/ssh_config`; log: sshd.log
#   lt_hosts_start / lt_hosts_stop         namespaces lt-node1/lt-node2 at 10.200.0.1/.2, hostnames
#                                          node1/node2, sshd on $LT_SSH_PORT in each (needs lt_sshd_start's keys)
#   lt_exec_in_node1 CMD...                replaces the calling shell with CMD in lt-node1, hostname
#                                          node1 (the pid stays CMD's: `bash -c '...; lt_exec_in_node1 CMD' &`)
#   lt_lock NAME SECONDS                   takes a machine-wide lock (fd 9) so concurrent test runs
#                                          (other worktrees) do not share daemons and ports
#
# The stop functions remove the state folders (logs included) unless LT_KEEP=1.
#
# Facts these rely on (measured): daemons start in ~0.3 s; `srun` waits forever for CPUs it cannot
# get; scancel SIGTERMs the batch shell and every step; a requeued job waits cred_expire + 1 s.
LT_SLURM_DIR=${LT_SLURM_DIR:-/tmp/llmtrain-slurm}
LT_SLURM_CPUS=${LT_SLURM_CPUS:-4}
LT_SLURM_KILLWAIT=${LT_SLURM_KILLWAIT:-30}
LT_SLURM_PORT=${LT_SLURM_PORT:-16817}
LT_SSH_DIR=${LT_SSH_DIR:-/tmp/llmtrain-ssh}
LT_SSH_PORT=${LT_SSH_PORT:-22022}
LT_NET=${LT_NET:-10.200.0}

lt_say() { echo "[cluster] $*" >&2; }

# lt_wait SECONDS CMD...: retries CMD (each try bounded to 5 s) every 0.1 s until it succeeds;
# nonzero after SECONDS.
lt_wait() {
  local seconds=$1 t0=$SECONDS
  shift
  until timeout -k 2 5 "$@" >/dev/null 2>&1; do
    ((SECONDS - t0 >= seconds)) && return 1
    sleep 0.1
  done
}

lt_lock() {
  local name=$1 seconds=${2:-300}
  exec 9>"/tmp/llmtrain-$name.lock"
  flock -w "$seconds" 9 || { lt_say "another test holds /tmp/llmtrain-$name.lock for more than ${seconds}s"; return 1; }
}

# lt_kill_pidfile FILE...: stops the processes the pid files name, by those pids only (all at
# once, then waits up to 5 s for them, then SIGKILL).
lt_kill_pidfile() {
  local f p pids=()
  for f in "$@"; do
    [[ -s $f ]] && p=$(<"$f") && kill "$p" 2>/dev/null && pids+=("$p")
    rm -f "$f"
  done
  for p in "${pids[@]}"; do
    lt_wait 5 bash -c "! kill -0 $p" || kill -KILL "$p" 2>/dev/null
  done
  return 0
}

lt_slurm_missing() {
  local p
  for p in munged mungekey slurmctld slurmd sinfo sbatch srun scontrol squeue scancel; do
    command -v "$p" >/dev/null 2>&1 || [[ -x /usr/sbin/$p ]] || { echo "$p"; return 0; }
  done
  return 1
}

lt_slurm_stop() {
  local d=$LT_SLURM_DIR
  if [[ -f $d/slurm.conf && -s $d/slurmctld.pid ]] && kill -0 "$(<"$d/slurmctld.pid")" 2>/dev/null; then
    # Jobs of this private cluster only (its own slurm.conf), so that no slurmstepd outlives it.
    SLURM_CONF=$d/slurm.conf timeout 10 scancel --quiet --full --user=root 2>/dev/null
    lt_wait 10 bash -c "[[ -z \$(SLURM_CONF=$d/slurm.conf squeue -h -t running,completing 2>/dev/null) ]]"
  fi
  lt_kill_pidfile "$d/slurmd.pid" "$d/slurmctld.pid" "$d/munge/munged.pid"
  [[ ${LT_KEEP:-0} == 1 ]] || rm -rf "$d"
}

lt_slurm_start() {
  local d=$LT_SLURM_DIR host missing
  if missing=$(lt_slurm_missing); then lt_say "Slurm/munge program missing: $missing (scripts/setup.sh installs slurm-wlm munge)"; return 1; fi
  lt_slurm_stop
  host=$(hostname -s)
  rm -rf "$d"
  mkdir -p "$d/munge" "$d/ctld" "$d/spool" "$d/log"
  chmod 755 "$d" "$d/munge"  # munged insists on a socket folder everyone can traverse
  mungekey --create --keyfile="$d/munge/munge.key" >/dev/null 2>&1 || { lt_say "mungekey failed"; return 1; }
  chmod 400 "$d/munge/munge.key"
  # Every daemon starts with fd 9 closed: it must not inherit the test's lock (lt_lock), or a daemon
  # left behind by a killed test would hold the lock and block every later test.
  PATH=$PATH:/usr/sbin timeout 20 munged 9>&- --socket="$d/munge/munge.sock" --key-file="$d/munge/munge.key" \
    --pid-file="$d/munge/munged.pid" --log-file="$d/munge/munged.log" --seed-file="$d/munge/munged.seed" ||
    { lt_say "munged did not start: $(tail -3 "$d/munge/munged.log" 2>/dev/null)"; return 1; }
  lt_wait 10 bash -c "munge -S $d/munge/munge.sock -n </dev/null | unmunge -S $d/munge/munge.sock" ||
    { lt_say "munge does not answer"; return 1; }
  cat >"$d/slurm.conf" <<CONF
ClusterName=lt
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=${LT_SLURM_PORT}
SlurmdPort=$((LT_SLURM_PORT + 1))
AuthType=auth/munge
CredType=cred/munge
# cred_expire (minimum 5): also how long a requeued job waits before it may start again
AuthInfo=socket=$d/munge/munge.sock,cred_expire=5
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$d/ctld
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=pmix
ReturnToService=2
SlurmdParameters=config_overrides
MailProg=/bin/true
MinJobAge=3600
KillWait=${LT_SLURM_KILLWAIT}
NodeName=${host} NodeAddr=127.0.0.1 CPUs=${LT_SLURM_CPUS} RealMemory=1000 State=UNKNOWN
PartitionName=lt Nodes=${host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  export SLURM_CONF=$d/slurm.conf
  timeout 20 /usr/sbin/slurmctld -f "$SLURM_CONF" 9>&- || { lt_say "slurmctld did not start: $(tail -3 "$d/log/slurmctld.log")"; return 1; }
  timeout 20 /usr/sbin/slurmd -f "$SLURM_CONF" 9>&- || { lt_say "slurmd did not start: $(tail -3 "$d/log/slurmd.log")"; return 1; }
  lt_wait 20 bash -c "sinfo -h -N -o %T | grep -qxE 'idle|mixed|allocated'" || {
    lt_say "the node did not come up: $(sinfo -h -N -o '%N %T %E' 2>&1) $(tail -3 "$d/log/slurmd.log")"
    return 1
  }
}

lt_slurm_job_state() { timeout 10 scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }

lt_slurm_wait_state() {
  local job=$1 want=$2 seconds=$3 restarts=${4:-} t0=$SECONDS state r
  while :; do
    state=$(lt_slurm_job_state "$job")
    r=$(timeout 10 scontrol show job "$job" 2>/dev/null | grep -o 'Restarts=[0-9]*' | cut -d= -f2)
    if [[ $state =~ ^($want)$ ]] && [[ -z $restarts || $r == "$restarts" ]]; then
      echo "$state"
      return 0
    fi
    if ((SECONDS - t0 >= seconds)); then
      echo "$state"
      lt_say "job $job: waited ${seconds}s for state $want${restarts:+ after $restarts restart(s)}; it is ${state:-unknown} (restarts ${r:-?})"
      return 1
    fi
    sleep 0.2
  done
}

lt_sshd_stop() {
  lt_kill_pidfile "$LT_SSH_DIR/sshd.pid"
  # The keys and configs go too, once no namespace host's sshd uses them.
  [[ ${LT_KEEP:-0} == 1 || -e $LT_SSH_DIR/sshd-node1.pid || -e $LT_SSH_DIR/sshd-node2.pid ]] || rm -rf "$LT_SSH_DIR"
  return 0
}

lt_sshd_start() {
  local d=$LT_SSH_DIR
  command -v ssh >/dev/null && [[ -x /usr/sbin/sshd ]] ||
    { lt_say "ssh or sshd missing (scripts/setup.sh installs openssh-server openssh-client)"; return 1; }
  lt_sshd_stop
  mkdir -p "$d" /run/sshd
  chmod 700 "$d"
  [[ -f $d/hostkey ]] || ssh-keygen -q -t ed25519 -N '' -f "$d/hostkey"
  [[ -f $d/id ]] || ssh-keygen -q -t ed25519 -N '' -f "$d/id"
  cp "$d/id.pub" "$d/authorized_keys"
  cat >"$d/sshd_config" <<CONF
Port ${LT_SSH_PORT}
ListenAddress 127.0.0.1
ListenAddress 127.0.0.2
HostKey $d/hostkey
PidFile $d/sshd.pid
AuthorizedKeysFile $d/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
LogLevel INFO
CONF
  cat >"$d/ssh_config" <<CONF
Host *
  Port ${LT_SSH_PORT}
  User root
  IdentityFile $d/id
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  BatchMode yes
  LogLevel ERROR
CONF
  timeout 20 /usr/sbin/sshd -f "$d/sshd_config" -E "$d/sshd.log" 9>&- || { lt_say "sshd did not start: $(tail -3 "$d/sshd.log")"; return 1; }
  lt_wait 10 ssh -F "$d/ssh_config" 127.0.0.1 true || { lt_say "sshd does not answer: $(tail -3 "$d/sshd.log")"; return 1; }
}

lt_hosts_stop() {
  local n
  lt_kill_pidfile "$LT_SSH_DIR/sshd-node1.pid" "$LT_SSH_DIR/sshd-node2.pid"
  ip netns del lt-node1 2>/dev/null
  ip netns del lt-node2 2>/dev/null
  return 0
}

# Why two namespace hosts cannot be made here ("" when they can).
lt_hosts_unavailable() {
  command -v ip >/dev/null && command -v unshare >/dev/null || { echo "ip or unshare missing (iproute2, util-linux)"; return; }
  local err
  if ! err=$(ip netns add lt-probe 2>&1); then echo "network namespaces are not permitted here: $err"; return; fi
  if ! err=$(ip netns exec lt-probe unshare --uts true 2>&1); then
    ip netns del lt-probe 2>/dev/null
    echo "UTS namespaces are not permitted here: $err"
    return
  fi
  if ! err=$(ip link add lt-probe-a type veth peer name lt-probe-b 2>&1); then
    ip netns del lt-probe 2>/dev/null
    echo "veth pairs are not permitted here: $err"
    return
  fi
  ip link del lt-probe-a 2>/dev/null
  ip netns del lt-probe 2>/dev/null
}

lt_hosts_start() {
  local d=$LT_SSH_DIR n
  [[ -f $d/sshd_config ]] || { lt_say "run lt_sshd_start first (keys and configs)"; return 1; }
  lt_hosts_stop
  ip netns add lt-node1 && ip netns add lt-node2 || return 1
  ip link add lt-veth1 type veth peer name lt-veth2 || return 1
  ip link set lt-veth1 netns lt-node1 && ip link set lt-veth2 netns lt-node2 || return 1
  for n in 1 2; do
    ip -n "lt-node$n" addr add "$LT_NET.$n/24" dev "lt-veth$n" &&
      ip -n "lt-node$n" link set lo up && ip -n "lt-node$n" link set "lt-veth$n" up || return 1
    # Its own hostname: Open MPI names shared-memory segments after it, so two "hosts" with one
    # name would collide.
    ip netns exec "lt-node$n" unshare --uts sh -c "hostname node$n; exec /usr/sbin/sshd -f $d/sshd_config \
      -o ListenAddress=$LT_NET.$n -o PidFile=$d/sshd-node$n.pid -E $d/sshd-node$n.log" 9>&- ||
      { lt_say "sshd in lt-node$n did not start: $(tail -3 "$d/sshd-node$n.log")"; return 1; }
  done
  lt_wait 10 ip netns exec lt-node1 ssh -F "$d/ssh_config" "$LT_NET.2" true &&
    lt_wait 10 ip netns exec lt-node2 ssh -F "$d/ssh_config" "$LT_NET.1" true ||
    { lt_say "the namespace hosts do not answer ssh: $(tail -3 "$d"/sshd-node*.log)"; return 1; }
}

lt_exec_in_node1() {
  local cmd
  printf -v cmd '%q ' "$@"
  exec ip netns exec lt-node1 unshare --uts sh -c "hostname node1; exec $cmd"
}

lt_stop_all() {
  lt_slurm_stop
  lt_hosts_stop
  lt_sshd_stop
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -u
  case ${1:-} in
    slurm-start) lt_slurm_start && echo "export SLURM_CONF=$LT_SLURM_DIR/slurm.conf" ;;
    slurm-stop) lt_slurm_stop ;;
    sshd-start) lt_sshd_start && echo "ssh -F $LT_SSH_DIR/ssh_config 127.0.0.1" ;;
    sshd-stop) lt_sshd_stop ;;
    hosts-start) lt_sshd_start && lt_hosts_start && echo "ip netns exec lt-node1 ssh -F $LT_SSH_DIR/ssh_config $LT_NET.2" ;;
    hosts-stop) lt_hosts_stop ;;
    stop-all) lt_stop_all ;;
    *) sed -n '2,/^LT_SLURM_DIR/p' "$0" | sed '$d'; exit 2 ;;
  esac
fi
