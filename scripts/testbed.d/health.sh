# shellcheck shell=bash
# scripts/testbed.d/health.sh - sourced by scripts/testbed: what is unhealthy in a running
# testbed, part by part, and the repair of each part alone.
#
# `up` on a running testbed used to restart it from scratch when any check failed (a node left
# DOWN by a fault test was enough), ending a running JupyterHub, the Slurm associations added
# since, and other users' jobs. Now each problem names its own repair: a dead daemon started
# again (slurmctld from its saved state, slurmdbd on the same database), a DOWN or DRAINED node
# resumed, a missing association added, a missing route or file written; problems without one
# (a network namespace gone) are reported with the advice to restart, which only happens when
# asked (`up --restart`).

PROBLEMS=()   # what is wrong, in words
FIXES=()      # for each problem: the command that repairs that part ("" if none does)

# problem TEXT [FIX...]
problem() {
  PROBLEMS+=("$1")
  shift
  FIXES+=("$*")
}

# the nodes as "name|state|reason" lines (sinfo -N lists a node once per partition)
node_states() { in_login sinfo -h -N -o '%N|%T|%E' 2>/dev/null | sort -u; }

# what is missing of the accounts, QOS and associations the tests expect (empty: nothing)
missing_associations() {
  local have qos users
  have=$(in_login sacctmgr -n -P show assoc where cluster=jsrtest format=account,user,qos \
    2>/dev/null) || { echo "sacctmgr does not answer"; return 0; }
  for users in "physics|${TEST_USERS[0]}" "chemistry|${TEST_USERS[1]}" "physics|${TEST_USERS[1]}"; do
    grep -q "^$users|" <<<"$have" || echo "association ${users/|/ of }"
    grep -q "^$users|.*short" <<<"$have" || echo "QOS short for ${users/|/ of }"
  done
  qos=$(in_login sacctmgr -n -P show qos where name=short format=name,maxwall 2>/dev/null)
  [[ $qos == "short|00:10:00" ]] || echo "QOS short (MaxWall 10 min)"
}

# check_health VERBOSE: fill PROBLEMS (and FIXES) for the testbed with the current settings;
# with VERBOSE=1 print a report. 0 if healthy.
check_health() {
  local verbose=$1 i pid f out node state reason missing
  PROBLEMS=() FIXES=()
  say() { ((verbose)) && printf '%s\n' "$*"; return 0; }

  say "flavour:   $FLAVOUR (Slurm ${SLURM_VERSION:-?}, profile ${PROFILE:-permissive}${ROOT:+, root $ROOT})"
  say "settings:  nodes=$NODES solo=$SOLO gpus=$GPUS"
  say "daemons:"
  if pid=$(daemon_pid /run/munge/munged.pid munged); then
    say "  munged     pid $pid$([[ -e $R$RUN/munged.ours ]] && echo ' (started by testbed)')"
  fi
  munge_works || problem "munge does not work" ensure_munge
  if ((ROOTED)) && ! mntns_alive; then
    problem "the mount namespace of the root is gone ($MNTNS)"
  fi
  laptop_handle_ok || problem "no handle on the laptop namespace ($LAPTOP_NETNS)" \
    bind_laptop_handle
  if pid=$(daemon_pid "$DB_PID" mariadbd); then say "  mariadbd   pid $pid ($LOGIN_NS, 127.0.0.1:$DB_PORT)"
  else problem "mariadbd is not running" repair_mariadb; fi
  if pid=$(daemon_pid "$SLURMDBD_PID" slurmdbd); then say "  slurmdbd   pid $pid ($LOGIN_NS, $CTL_IP:6819)"
  else problem "slurmdbd is not running" start_slurmdbd; fi
  if pid=$(daemon_pid "$RUN/slurmctld.pid" slurmctld); then say "  slurmctld  pid $pid"
  else problem "slurmctld is not running" repair_slurmctld; fi
  for ((i = 1; i <= $(all_nodes); i++)); do
    if pid=$(daemon_pid "$RUN/slurmd.node$i.pid" slurmd); then say "  slurmd     pid $pid (node$i)"
    else problem "slurmd of node$i is not running" start_slurmd "$i"; fi
  done
  if pid=$(daemon_pid "$SSHD_PID" sshd); then say "  sshd       pid $pid ($LOGIN_NS, $SSH_IP:$SSH_PORT)"
  else problem "sshd is not running" start_sshd; fi

  [[ -e $NETNS/$LOGIN_NS ]] || problem "network namespace $LOGIN_NS is missing"
  for ((i = 1; i <= $(all_nodes); i++)); do
    [[ -e $NETNS/$(node_ns "$i") ]] || problem "network namespace $(node_ns "$i") is missing"
  done
  ip link show "$HOST_VETH" >/dev/null 2>&1 || problem "veth $HOST_VETH is missing"
  # (grep -q on a pipe: `ip` may get SIGPIPE, and under pipefail a route that is there fails)
  out=$(ip route show type unreachable 2>/dev/null)
  grep -q "^unreachable $CLUSTER_NET" <<<"$out" ||
    problem "no unreachable route for $CLUSTER_NET in the host namespace" \
      ip route replace unreachable "$CLUSTER_NET"
  [[ $(grep -c " $HOSTS_TAG\$" "$R/etc/hosts") == "$(all_nodes)" ]] ||
    problem "/etc/hosts lines missing" repair_hosts
  for f in "${SLURM_CMDS[@]}"; do
    [[ -x $R$BIN/$f ]] || { problem "wrapper $BIN/$f is missing" write_wrappers; break; }
  done
  [[ -s $R$ENV_FILE ]] || problem "$ENV_FILE is missing" repair_env_file

  if [[ -e $NETNS/$LOGIN_NS ]] && { ((!ROOTED)) || mntns_alive; }; then
    [[ $(login_sysctl net.ipv4.ip_forward 2>/dev/null) == 0 ]] ||
      problem "$LOGIN_NS forwards packets" login_sysctl net.ipv4.ip_forward 0
    if out=$(node_summary 2>&1); then
      say "sinfo:" && say "  ${out//$'\n'/$'\n'  }"
      while IFS='|' read -r node state reason; do
        case ${state%%[*~#!%\$@^-]*} in
          idle | mixed | allocated | completing | planned | reserved) ;;
          down | drained | draining | drain | fail | failing)
            problem "$node is $state${reason:+ ($reason)}" resume_node "$node" ;;
          *) problem "$node is $state${reason:+ ($reason)}" ;;
        esac
        # not responding ("idle*"): its slurmd is dead (above) or not yet registered
        [[ $state == *'*' && ${state%%'*'*} != down ]] &&
          problem "$node does not respond ($state)" resume_node "$node"
      done < <(node_states)
    else
      problem "sinfo fails: $out"
    fi
    if daemon_pid "$SLURMDBD_PID" slurmdbd >/dev/null; then
      missing=$(missing_associations)
      if [[ -n $missing ]]; then
        problem "accounting lacks: ${missing//$'\n'/, }" load_associations
      else
        say "accounting: cluster jsrtest, accounts ${ACCOUNTS[*]}, QOS normal and short: ok"
      fi
    fi
  fi
  if ((${#PROBLEMS[@]} == 0 || verbose)) && ip link show "$HOST_VETH" >/dev/null 2>&1; then
    if out=$(ssh_alice squeue -h 2>&1); then
      say "sshd:      ssh ${TEST_USERS[0]}@$SSH_IP squeue -h: ok"
    else
      problem "ssh ${TEST_USERS[0]}@$SSH_IP squeue -h fails: $out"
    fi
  fi
  ((${#PROBLEMS[@]} == 0))
}

# ------------------------------------------------------------------ the repairs of one part

repair_mariadb() {
  [[ -d $R$DB_DIR/mysql ]] || { log "the database $DB_DIR is gone: only a restart makes it anew"; return 1; }
  start_mariadb
}

# slurmctld from its saved state (jobs, nodes), as after a site's upgrade; until it answers
repair_slurmctld() {
  local i
  start_slurmctld
  for ((i = 0; i < 300; i++)); do
    in_login sinfo -h >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

resume_node() { in_login scontrol update nodename="$1" state=resume; }

repair_hosts() { hosts_remove; hosts_add; }

repair_env_file() { env_lines | write_file "$R$ENV_FILE" 0644; }

# repair DRY_RUN: say what is unhealthy and repair each part that has a repair, in the order
# found (daemons before the nodes and associations that need them); up to three rounds, as a
# part may only show once another answers again (a DOWN node once slurmctld runs), and none
# once a round changed nothing. 0 if healthy at the end.
repair() {
  local dry_run=$1 round i wait before='' now
  for ((round = 1; round <= 3; round++)); do
    now=$(printf '%s\n' "${PROBLEMS[@]}")
    [[ $now != "$before" ]] || break   # the last round's repairs did not help
    before=$now
    log "unhealthy:"
    for i in "${!PROBLEMS[@]}"; do
      if [[ -n ${FIXES[$i]} ]]; then log "  - ${PROBLEMS[$i]} -> repair: ${FIXES[$i]}"
      else log "  - ${PROBLEMS[$i]} (no repair of its own)"; fi
    done
    ((dry_run)) && return 1
    [[ -n $(printf '%s' "${FIXES[@]}") ]] || break
    for i in "${!PROBLEMS[@]}"; do
      [[ -n ${FIXES[$i]} ]] || continue
      # shellcheck disable=SC2086  # a command and its words
      ${FIXES[$i]} >/dev/null || log "repair failed: ${FIXES[$i]}"
    done
    # restarted daemons register, resumed nodes turn idle: checked after 1, 2, 4, 8 and 15 s
    for wait in 1 1 2 4 7; do
      sleep "$wait"
      check_health 0 && { log "healthy again (round $round)"; return 0; }
    done
  done
  log "still unhealthy:"
  for i in "${!PROBLEMS[@]}"; do log "  - ${PROBLEMS[$i]}"; done
  log "restart everything (every job and association of the testbed lost):" \
    "${0##*/}${ROOT:+ --flavour $FLAVOUR} up --restart"
  return 1
}
