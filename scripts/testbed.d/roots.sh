# shellcheck shell=bash
# scripts/testbed.d/roots.sh - sourced by scripts/testbed: the root of a flavour that is not the
# host's own Slurm (a Debian release's Slurm, Python, MariaDB and OpenSSH in a debootstrap tree,
# cached between runs) and the mount namespace its processes live in.
#
# Every process of such a flavour runs in one persistent mount namespace of its own ($MNTNS),
# whose root IS the flavour's root (pivot_root, not chroot: job_container/tmpfs moves each step
# into the job's mount namespace with setns(), which resets a process's root to its namespace's
# root; a chrooted step found itself in the host's / and its script missing). Mounted in there:
# /proc, /sys (recursively: slurmd needs /sys/fs/cgroup), the flavour's own cgroup v1 subtrees
# over /sys/fs/cgroup/<controller> (two flavours' slurmd would otherwise share slurm_node1/…),
# /dev with a tmpfs of its own on /dev/shm (Ray's object stores), this checkout at its own path,
# and handles on the login and laptop network namespaces; nothing else of the host. Nothing of
# it is mounted in the host's namespace: the root is a plain directory there, safe to delete,
# and `down` ends the namespace with its last process. Its processes also share a cgroup
# namespace ($CGNS) rooted at the flavour's subtrees: a job's /proc/self/cgroup then names the
# path below /sys/fs/cgroup/<controller> where its limits are, as on a site.

# ROOT, RELEASE, FLAVOUR, MNTNS, CGNS, CGROUP_NAME, ROOT_LOG, VENV, HOST_VENV, CHECKOUT, RUN: the
# flavour's, set by scripts/testbed
readonly ROOTS=${JSR_TESTBED_ROOTS:-/var/cache/jsr-testbed/roots}
readonly MIRROR=${JSR_DEBIAN_MIRROR:-http://deb.debian.org/debian}
readonly MNT_DIR=/run/jsr-testbed-ns          # host side: the mount namespaces' handles
# What a root holds: the Slurm daemons and clients, MariaDB for slurmdbd, OpenSSH for the
# login node, Python for the project's venv; acl for the ACL trust tests.
readonly ROOT_PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server
  openssh-server openssh-client python3 python3-venv iproute2 procps util-linux ca-certificates
  acl)
# A change to how roots are built: bump it and every cached root is built anew.
readonly ROOT_RECIPE_VERSION=1
# The cgroup v1 controllers Slurm's cgroup/v1 plugin uses; the flavour gets a subtree of each.
readonly CGROUP_CONTROLLERS=(cpuset memory devices freezer cpuacct cpu pids)

# the recipe of $ROOT: anything that changes what debootstrap gives
root_recipe() {
  printf '%s\n' "version $ROOT_RECIPE_VERSION" "release $RELEASE" "mirror $MIRROR" \
    "packages ${ROOT_PACKAGES[*]}" | sha256sum | cut -c1-16
}

# a root is a plain directory in the host's mount namespace: nothing may be mounted below it
# before it is deleted (a bind of /sys or of the checkout would be deleted with it)
root_has_mounts() {
  local dir=$1
  awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { found = 1 } END { exit !found }' \
    /proc/self/mountinfo
}

delete_tree() {
  [[ -e $1 ]] || return 0
  root_has_mounts "$1" && die "something is mounted below $1: not deleting it"
  rm -rf --one-file-system "$1"
}

# ensure_root: the flavour's root, built when missing or when its recipe changed (debootstrap
# into $ROOT.build, then renamed: an interrupted build is never taken for a root)
ensure_root() {
  local want have t0
  want=$(root_recipe)
  # shellcheck disable=SC2153  # ROOT: set by scripts/testbed
  have=$(cat "$ROOT/.jsr-root-recipe" 2>/dev/null || true)
  [[ $have == "$want" ]] && return 0
  command -v debootstrap >/dev/null || die "debootstrap is missing (scripts/setup --tests installs it)"
  mntns_alive && die "$ROOT is in use (its mount namespace $MNTNS exists): down first"
  t0=$(now_ms)
  log "building the $RELEASE root $ROOT (debootstrap, about a minute)"
  install -d -m 0755 "$ROOTS" "$(dirname "$ROOT_LOG")"
  delete_tree "$ROOT.build"
  if ! debootstrap --variant=minbase --include="$(IFS=,; echo "${ROOT_PACKAGES[*]}")" \
    "$RELEASE" "$ROOT.build" "$MIRROR" >"$ROOT_LOG" 2>&1; then
    tail -n 20 "$ROOT_LOG" >&2
    die "debootstrap $RELEASE failed (log: $ROOT_LOG)"
  fi
  # no init system in there: maintainer scripts of later installs start no service
  printf '#!/bin/sh\nexit 101\n' >"$ROOT.build/usr/sbin/policy-rc.d"
  chmod 0755 "$ROOT.build/usr/sbin/policy-rc.d"
  echo "$want" >"$ROOT.build/.jsr-root-recipe"
  delete_tree "$ROOT"
  mv "$ROOT.build" "$ROOT"
  log "root $ROOT built in $(since "$t0") ($(du -sh --one-file-system "$ROOT" | cut -f1))"
}

# ------------------------------------------------------------ the mount namespace

mntns_alive() { [[ -e $MNTNS ]] && mountpoint -q "$MNTNS" 2>/dev/null; }

# the controllers this machine mounts as cgroup v1 hierarchies of their own
cgroup_v1_controllers() {
  local c
  for c in "${CGROUP_CONTROLLERS[@]}"; do
    [[ $(findmnt -n -o FSTYPE "/sys/fs/cgroup/$c" 2>/dev/null) == cgroup ]] && echo "$c"
  done
  return 0
}

# the flavour's subtree of each controller, jsr-<flavour> at the hierarchy's root
ensure_cgroup_subtrees() {
  local c dir
  while read -r c; do
    dir=/sys/fs/cgroup/$c/$CGROUP_NAME
    [[ -d $dir ]] || mkdir "$dir"
    if [[ $c == cpuset ]]; then  # a new cpuset has no CPUs nor memory nodes
      [[ -n $(<"$dir/cpuset.cpus") ]] || cat /sys/fs/cgroup/cpuset/cpuset.cpus >"$dir/cpuset.cpus"
      [[ -n $(<"$dir/cpuset.mems") ]] || cat /sys/fs/cgroup/cpuset/cpuset.mems >"$dir/cpuset.mems"
    fi
  done < <(cgroup_v1_controllers)
}

# the cgroups Slurm left in the flavour's subtrees, deepest first (those still holding a
# process stay)
remove_cgroup_subtrees() {
  local c
  while read -r c; do
    [[ -d /sys/fs/cgroup/$c/$CGROUP_NAME ]] || continue
    find "/sys/fs/cgroup/$c/$CGROUP_NAME" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done < <(cgroup_v1_controllers)
}

# The CPU to make the flavour's mount namespace on. Linux (6.18 here) hands namespace ids out
# in batches per CPU, and refuses to bind-mount a mount namespace whose id is not above the
# binder's (mnt_ns_loop: "wrong fs type", EINVAL). job_container/tmpfs binds each job's new
# namespace from slurmstepd, in the flavour's: made on the other CPU, with ids from a lower
# batch, a job failed to start ("ns base mount failed: Invalid argument", then "launch failed
# requeued held"), always on one CPU, never on the other. Made on the CPU whose batch is
# lowest, the flavour's namespace is below every later one. Empty when the kernel has no
# NS_GET_MNTNS_ID (older kernels number namespaces in order).
lowest_id_cpu() {
  python3 - <<'EOF'
import os, subprocess
probe = ("import fcntl, os, struct; fd = os.open('/proc/self/ns/mnt', os.O_RDONLY); "
         "print(struct.unpack('Q', fcntl.ioctl(fd, 0x8008B705, bytes(8)))[0])")  # NS_GET_MNTNS_ID
ids = {}
for cpu in sorted(os.sched_getaffinity(0)):
    done = subprocess.run(["taskset", "-c", str(cpu), "unshare", "-m", "python3", "-c", probe],
                          capture_output=True, text=True)
    if done.returncode == 0 and done.stdout.strip().isdigit():
        ids[cpu] = int(done.stdout)
if ids:
    print(min(ids, key=ids.get))
EOF
}

# mntns_up: the flavour's mount namespace (see the top of this file), unless it exists
mntns_up() {
  mntns_alive && return 0
  install -d -m 0755 "$MNT_DIR"
  # the file that holds a mount namespace must not be on a shared mount; flavours start side
  # by side (.ci/run), and a second bind over the first would hide the handles made on it
  (
    flock -w 60 8 || die "cannot lock $MNT_DIR.lock"
    if ! mountpoint -q "$MNT_DIR"; then
      mount --bind "$MNT_DIR" "$MNT_DIR"
      mount --make-private "$MNT_DIR"
    fi
  ) 8>"$MNT_DIR.lock"
  touch "$MNTNS" "$CGNS"
  ensure_cgroup_subtrees
  install -d -m 0755 "$ROOT$CHECKOUT" "$ROOT$RUN"
  local binds=() c pin=()
  c=$(lowest_id_cpu)
  [[ -z $c ]] || pin=(taskset -c "$c")
  while read -r c; do
    binds+=("mount --bind /sys/fs/cgroup/$c/$CGROUP_NAME $ROOT/sys/fs/cgroup/$c")
  done < <(cgroup_v1_controllers)
  install -d -m 0700 "$ROOT/.jsr-oldroot"
  # the namespaces' creator in the flavour's subtrees: their roots (a subshell, moved alone)
  (
    while read -r c; do
      echo "$BASHPID" >"/sys/fs/cgroup/$c/$CGROUP_NAME/cgroup.procs"
    done < <(cgroup_v1_controllers)
    exec "${pin[@]}" unshare --cgroup="$CGNS" --mount="$MNTNS" --propagation private sh -euc "
    mount --bind '$ROOT' '$ROOT'
    mount -t proc proc '$ROOT/proc'
    mount --rbind /sys '$ROOT/sys'
    $(printf '%s\n' "${binds[@]}")
    mount --rbind /dev '$ROOT/dev'
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs '$ROOT/dev/shm'
    mount --bind '$CHECKOUT' '$ROOT$CHECKOUT'
    cd '$ROOT'
    pivot_root . .jsr-oldroot
    umount -l /.jsr-oldroot
  "
  ) || die "cannot set up the mount namespace of $FLAVOUR"
}

# bind_handle NETNS_FILE INNER_PATH: a handle on a network namespace (the host's when
# NETNS_FILE is empty) inside the root, for nsenter from there: /proc/self/ns/net of a process
# that entered it, as the host's /run/netns is not seen in there
bind_handle() {
  [[ -e $ROOT$2 ]] || install -m 0644 /dev/null "$ROOT$2"
  nsenter --mount="$MNTNS" --cgroup="$CGNS" ${1:+--net="$1"} -- sh -c \
    "! mountpoint -q '$2' || umount '$2'; mount --bind /proc/self/ns/net '$2'"
}

mntns_down() {
  local f
  for f in "$MNTNS" "$CGNS"; do
    if [[ -e $f ]] && mountpoint -q "$f"; then
      umount "$f" 2>/dev/null || log "warning: cannot unmount $f"
    fi
    rm -f "$f"
  done
}

# PIDs of every process inside the flavour's mount namespace (each process it started)
pids_in_mntns() {
  mntns_alive || return 0
  local want id path pid
  want=$(stat -Lc %d:%i "$MNTNS")
  while read -r id path; do
    [[ $id == "$want" ]] || continue
    pid=${path#/proc/}
    pid=${pid%%/*}
    [[ $pid != "$$" ]] && echo "$pid"
  done < <(stat -Lc '%d:%i %n' /proc/[0-9]*/ns/mnt 2>/dev/null || true)
}

# ------------------------------------------------------------ running inside the root

# in_root [--net=NETNS] CMD...: CMD in the root's mount namespace (whose / is the root), from
# its /, and in NETNS
in_root() {
  local net=()
  [[ ${1-} == --net=* ]] && { net=("$1"); shift; }
  nsenter --mount="$MNTNS" --cgroup="$CGNS" "${net[@]}" -- "$@"
}

# host_ca_bundle FILE: every CA this machine's own pip may trust, in one file: the system's
# bundle and whatever pip's settings and the certificate variables name (a site's TLS proxy may
# sign PyPI's certificate, and its CA may be in only one of them)
host_ca_bundle() {
  local out=$1 f seen=() pip_cert
  pip_cert=$("$HOST_VENV/bin/python" -m pip config get global.cert 2>/dev/null || true)
  : >"$out"
  for f in /etc/ssl/certs/ca-certificates.crt "${PIP_CERT-}" "${SSL_CERT_FILE-}" \
    "${REQUESTS_CA_BUNDLE-}" "$pip_cert"; do
    [[ -n $f && -f $f && -r $f ]] || continue
    f=$(readlink -f "$f")
    [[ " ${seen[*]} " == *" $f "* ]] && continue
    seen+=("$f")
    cat "$f" >>"$out"
    echo >>"$out"
  done
  [[ -s $out ]] || die "no CA bundle on this machine (/etc/ssl/certs/ca-certificates.crt)"
}

# this machine's CAs trusted in the root too (pip of the venv's build, of scripts/pack-venv,
# of the hub's venv in there), system-wide and as $HOST_CA_IN_ROOT for pip
readonly HOST_CA_IN_ROOT=/etc/ssl/certs/jsr-host-ca.crt
trust_host_cas() {
  local mine=/usr/local/share/ca-certificates/jsr-host-bundle.crt bundle
  bundle=$(mktemp)
  host_ca_bundle "$bundle"
  install -m 0644 "$bundle" "$ROOT$HOST_CA_IN_ROOT"
  if ! cmp -s "$bundle" "$ROOT$mine"; then
    install -D -m 0644 "$bundle" "$ROOT$mine"
    in_root update-ca-certificates >/dev/null 2>&1 ||
      log "warning: update-ca-certificates failed in the root"
  fi
  rm -f "$bundle"
}

# checkout_seen_in_root: this checkout, as its processes see it (the bind of mntns_up)
checkout_seen_in_root() { in_root test -r "$CHECKOUT/pyproject.toml"; }

# what the host and the root say of the checkout's path, when the root does not see it
describe_checkout_mounts() {
  {
    echo "host: $(stat -c '%F %U:%G %a' "$CHECKOUT" 2>&1); real path $(readlink -f "$CHECKOUT")"
    findmnt -T "$CHECKOUT" -o TARGET,SOURCE,FSTYPE,PROPAGATION 2>&1 | sed 's/^/host: /'
    in_root sh -c "stat -c '%F %U:%G %a' '$CHECKOUT'; ls -la '$CHECKOUT' | head -n 5;
      findmnt -T '$CHECKOUT' -o TARGET,SOURCE,FSTYPE,PROPAGATION" 2>&1 | sed 's/^/root: /'
  } >&2
}

# ensure_checkout_in_root: the root sees this checkout, or its namespace is made anew (once,
# when nothing runs in it), or the reason is printed
ensure_checkout_in_root() {
  checkout_seen_in_root && return 0
  log "the root's namespace does not show $CHECKOUT:"
  describe_checkout_mounts
  [[ -z $(pids_in_mntns) ]] || die "$FLAVOUR's root runs processes: down first"
  log "making the root's mount namespace anew"
  mntns_down
  mntns_up
  checkout_seen_in_root && return 0
  describe_checkout_mounts
  die "the root's namespace does not show $CHECKOUT (its bind in mntns_up)"
}

# ------------------------------------------------------------ the project's venv in the root

# the Ray version of the host's venv (the one the package pins), else of pyproject.toml
ray_version() {
  local v
  if [[ -n ${JSR_RAY_VERSION-} ]]; then echo "$JSR_RAY_VERSION"; return; fi
  v=$("$HOST_VENV/bin/python" -c 'import ray; print(ray.__version__)' 2>/dev/null) ||
    v=$(sed -n 's/.*"ray\[default\]>=\([0-9.]*\),.*/\1/p' "$CHECKOUT/pyproject.toml")
  [[ -n $v ]] || die "cannot tell which Ray to install (set JSR_RAY_VERSION)"
  echo "$v"
}

venv_recipe() {
  printf '%s\n' "ray $1" "checkout $CHECKOUT" "$(sha256sum <"$CHECKOUT/pyproject.toml")" \
    "$(in_root /usr/bin/python3 -V 2>&1)" | sha256sum | cut -c1-16
}

# ensure_root_venv: $VENV in the root, from the root's python3 (Ray and the tests' tools, this
# checkout editable), when missing or when its recipe changed. The labextension's build output
# already in the checkout is shipped as it is (skip-if-exists in pyproject.toml): the root has
# no Node.js.
ensure_root_venv() {
  local ray want stamp=$ROOT$VENV/.jsr-venv t0 site
  ray=$(ray_version)
  want=$(venv_recipe "$ray")
  [[ $(cat "$stamp" 2>/dev/null) == "$want" ]] && return 0
  [[ -e $CHECKOUT/jupyter_slurm_ray/labextension/static/style.js ]] ||
    die "the labextension is not built in $CHECKOUT (scripts/setup builds it into the host's venv)"
  t0=$(now_ms)
  install -d -m 0755 "$(dirname "$ROOT_LOG")"
  log "building $VENV in the root: ray $ray, ${CHECKOUT}[test] (editable)"
  ensure_checkout_in_root
  local before
  before=$(wc -l <"$ROOT_LOG" 2>/dev/null || echo 0)
  echo "--- $(date -Is) building $VENV: ray $ray, ${CHECKOUT}[test]" >>"$ROOT_LOG"
  [[ -e $ROOT/etc/resolv.conf && ! -L $ROOT/etc/resolv.conf ]] || rm -f "$ROOT/etc/resolv.conf"
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
  rm -rf "${ROOT:?}$VENV"
  install -d -m 0755 "$ROOT$(dirname "$VENV")"
  # a clean environment: this shell's certificate variables name the host's files; pip trusts
  # this machine's CAs (trust_host_cas)
  local ca=$HOST_CA_IN_ROOT
  local pip=(in_root env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 "PIP_CERT=$ca"
    "SSL_CERT_FILE=$ca" "REQUESTS_CA_BUNDLE=$ca" PIP_DISABLE_PIP_VERSION_CHECK=1
    "$VENV/bin/pip" install -q)
  {
    in_root /usr/bin/python3 -m venv "$VENV" &&
      "${pip[@]}" -U pip &&
      "${pip[@]}" "ray[default,data,train,tune]==$ray" -e "${CHECKOUT}[test]"
  } >>"$ROOT_LOG" 2>&1 || {
    tail -n "+$((before + 1))" "$ROOT_LOG" | tail -n 40 >&2
    die "building the root's venv failed (log: $ROOT_LOG)"
  }
  # as scripts/setup does for the host's venv: the deferred imports (client/deferral.py)
  site=$(in_root "$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  in_root env -C "$CHECKOUT" "$VENV/bin/python" -m jupyter_slurm_ray.client.deferral \
    >"$ROOT$site/jupyter_slurm_ray_deferred.pth"
  chmod -R a+rX "$ROOT$(dirname "$VENV")"
  echo "$want" >"$stamp"
  log "venv built in $(since "$t0"): $(in_root "$VENV/bin/python" -c \
    'import ray, sys; print("ray", ray.__version__, "python", sys.version.split()[0])')"
}
