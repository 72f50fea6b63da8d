#!/usr/bin/env bash
# The README's test command on Debian 13 (trixie, glibc 2.41), in a chroot built on this machine.
#
#   sudo bash scripts/debian13.sh [DIR] [PYTEST_ARGS...]   # DIR defaults to /var/tmp/nvrx-slo-trixie; args to -q
#   REUSE_CLONE=1 sudo bash scripts/debian13.sh DIR -q tests/test_x.py   # rerun one file, same clone and .venv
#
# Builds (once; later runs reuse it) a minbase trixie chroot from the mirror this machine's apt sources name,
# copies in a CPython 3.11 (default: pyenv's, PYDIR=...; without site-packages) at the same path and puts it
# first on PATH, bind-mounts /proc /sys /dev /dev/pts /dev/shm and the local wheel directories (/opt/wheels,
# /opt/pypi*, read-only) with this machine's pip config, so torch==2.13.0 is the local CPU build. Then, on a
# fresh clone of this repository's HEAD (committed state only) at /root/nvrx-slo, runs as root with CI=true:
# `bash scripts/test.sh -q` — which apt-installs trixie's prometheus (2.53), prometheus-alertmanager (0.28)
# and chromium, bootstraps .venv with pip's own resolution for glibc 2.41 / CPython 3.11 (NVRx 0.6.0) and
# runs pytest. Prints the NVRx version and the pytest summary; exits with pytest's status. Mounts are
# removed, and any process still running inside the chroot is ended, on exit.
#
# What it proves: the whole suite passes (or not) against what pip resolves on Debian 13 + CPython 3.11 —
# NVRx 0.6.0 as installed, with its compiled module on glibc 2.41 — and against trixie's Prometheus,
# Alertmanager and Chromium. What it does not: the kernel, CPU count and load are this machine's; the
# Python is this machine's build copied in (a CI runner's 3.11 may be built differently); Debian 13's own
# python3 (3.13, no NVRx wheel) is not used; torch is the local CPU 2.13.0 wheel; no GPU; NVRx 0.7.0
# (CPython 3.12) is not run.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "debian13: needs root (debootstrap, mount, chroot)" >&2; exit 2; }
ROOT=${1:-/var/tmp/nvrx-slo-trixie}; [ $# -gt 0 ] && shift
PYTEST_ARGS=("$@"); [ $# -gt 0 ] || PYTEST_ARGS=(-q)
ROOT=$(mkdir -p "$ROOT" && cd "$ROOT" && pwd -P)
[ "$ROOT" != / ] || { echo "debian13: DIR must not be /" >&2; exit 2; }
REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
HEAD=$(git -C "$REPO" rev-parse HEAD)
PYDIR=${PYDIR:-/root/.pyenv/versions/3.11.7}
[ -x "$PYDIR/bin/python3" ] || { echo "debian13: no Python at PYDIR=$PYDIR" >&2; exit 2; }
PYVER=$("$PYDIR/bin/python3" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
uris() { grep -hE '^[[:space:]]*(URIs:|deb[[:space:]])' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
           /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -oE 'https?://[^ ]+' || true; }
MIRROR=${MIRROR:-$(uris | grep -E '/debian/?$' | head -1)}
SECURITY=${SECURITY_MIRROR:-$(uris | grep -E '/debian-security/?$' | head -1)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}; SECURITY=${SECURITY:-http://deb.debian.org/debian-security}
# runtime libraries of the copied CPython (its lib-dynload modules, tkinter aside) and what the suite calls
PKGS=(ca-certificates git procps iproute2 tzdata libssl3t64 libffi8 zlib1g libbz2-1.0 liblzma5 libsqlite3-0
      libreadline8t64 libncursesw6 libuuid1 libexpat1 libgdbm6t64 libtirpc3t64 libnsl2 libcrypt1)
log() { echo "debian13: $*" >&2; }

mounted_under() { awk -v r="$ROOT" '$5 == r || index($5, r "/") == 1 {print $5}' /proc/self/mountinfo | sort -r; }
chroot_pids() {
    local p
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/root" 2>/dev/null)" = "$ROOT" ] && echo "${p#/proc/}"
    done
    return 0
}
cleanup() {
    local pids m
    pids=$(chroot_pids)
    if [ -n "$pids" ]; then
        log "ending processes left in the chroot: $(echo $pids)"
        kill -TERM $pids 2>/dev/null || true; sleep 2
        pids=$(chroot_pids); [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true; sleep 0.5
    fi
    for m in $(mounted_under); do umount "$m" 2>/dev/null || umount -l "$m" || log "could not unmount $m"; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cleanup   # what an interrupted earlier run may have left

# 1. the base system (debootstrap), redone only if it never finished
if [ ! -f "$ROOT/.debootstrap-done" ]; then
    [ -z "$(mounted_under)" ] || { log "mounts left under $ROOT; not removing it"; exit 1; }
    command -v debootstrap >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
    log "debootstrap trixie into $ROOT from $MIRROR"
    find "$ROOT" -mindepth 1 -maxdepth 1 -exec rm -rf --one-file-system {} +
    debootstrap --variant=minbase trixie "$ROOT" "$MIRROR" >"$ROOT.debootstrap.log" 2>&1 \
        || { tail -20 "$ROOT.debootstrap.log" >&2; exit 1; }
    touch "$ROOT/.debootstrap-done"
fi

# 2. this machine's network and pip settings, the local wheels, a policy that starts no daemons on install
for f in /etc/hosts /etc/resolv.conf /etc/pip.conf; do [ -f "$f" ] && cp -L "$f" "$ROOT$f"; done
for d in /etc/xdg/pip /root/.config/pip /root/.pip; do
    [ -d "$d" ] && { mkdir -p "$ROOT$d"; cp -rL "$d/." "$ROOT$d/"; }
done
cat > "$ROOT/etc/apt/sources.list" <<EOF
deb $MIRROR trixie main
deb $MIRROR trixie-updates main
deb $SECURITY trixie-security main
EOF
printf '#!/bin/sh\nexit 101\n' > "$ROOT/usr/sbin/policy-rc.d"; chmod 755 "$ROOT/usr/sbin/policy-rc.d"
mnt() { mkdir -p "$ROOT$2"; mount "${@:3}" "$1" "$ROOT$2"; }
mnt proc /proc -t proc
mnt /sys /sys --bind
mnt /dev /dev --bind
mnt /dev/pts /dev/pts --bind
mnt /dev/shm /dev/shm --bind
for d in /opt/wheels /opt/pypi /opt/pypi-more; do
    [ -d "$d" ] && { mnt "$d" "$d" --bind; mount -o remount,bind,ro "$ROOT$d"; }
done
PATH_IN=$PYDIR/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ENV_IN=(HOME=/root USER=root LOGNAME=root LANG=C.UTF-8 TERM=dumb CI=true PATH="$PATH_IN")
while IFS= read -r kv; do ENV_IN+=("$kv"); done < <(env | grep -E '^PIP_[A-Z_]+=' || true)
inside() { env -i "${ENV_IN[@]}" chroot "$ROOT" "$@"; }

# 3. packages and the Python, redone when the list or the Python changes
stamp=$(printf '%s\n' "${PKGS[@]}" "$PYDIR" "$("$PYDIR/bin/python3" -VV)" | sha256sum | cut -c1-16)
if [ "$(cat "$ROOT/.setup-stamp" 2>/dev/null)" != "$stamp" ]; then
    log "apt-get install in the chroot: ${PKGS[*]}"
    inside apt-get update -qq
    inside env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
    log "copying $PYDIR (without site-packages) into the chroot"
    rm -rf "$ROOT$PYDIR"; mkdir -p "$ROOT$(dirname "$PYDIR")"
    tar -C / --exclude="${PYDIR#/}/lib/python$PYVER/site-packages/*" -cf - "${PYDIR#/}" | tar -C "$ROOT" -xf -
    echo "$stamp" > "$ROOT/.setup-stamp"
fi
# this machine's own trust roots (an egress proxy's or a local registry's CA appended to its bundle, which
# Debian's ca-certificates lacks): every certificate of its bundle that is not one of its Debian CA files
rm -rf "$ROOT/usr/local/share/ca-certificates/host"; mkdir -p "$ROOT/usr/local/share/ca-certificates/host"
fp() { openssl x509 -noout -fingerprint -sha256 -in "$1" 2>/dev/null | cut -d= -f2; }
known=$(for f in /usr/share/ca-certificates/*/*.crt; do fp "$f"; done)
split=$(mktemp -d); trap 'rm -rf "$split"; cleanup' EXIT
awk -v d="$split" '/BEGIN CERT/{n++; f=sprintf("%s/%03d.crt", d, n)} f{print > f} /END CERT/{close(f); f=""}' \
    "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"
for f in "$split"/*.crt; do
    grep -qxF "$(fp "$f")" <<<"$known" || cp "$f" "$ROOT/usr/local/share/ca-certificates/host/"
done
inside update-ca-certificates >/dev/null 2>&1
log "trust roots added from this machine: $(ls "$ROOT/usr/local/share/ca-certificates/host" | wc -l)"
missing=$(inside sh -c "ldd $PYDIR/lib/python$PYVER/lib-dynload/*.so" 2>&1 | grep 'not found' | grep -v -E 'lib(tk|tcl|X)' | sort -u || true)
[ -z "$missing" ] || { log "libraries the copied Python lacks in the chroot:"; echo "$missing" >&2; exit 1; }
echo "== chroot: Debian $(cat "$ROOT/etc/debian_version"), $(inside ldd --version | head -1)"
echo "== python: $(inside python3 -VV | head -1) ($(inside sh -c 'command -v python3'))"
inside python3 -c 'import ssl, sqlite3, ctypes, lzma, bz2, zlib, readline, uuid; print("== python modules ok:", ssl.OPENSSL_VERSION, "sqlite", sqlite3.sqlite_version)'

# 4. a fresh clone of HEAD, unless REUSE_CLONE=1 and the clone is already at HEAD
CLONE=$ROOT/root/nvrx-slo
[ -z "$(git -C "$REPO" status --porcelain --untracked-files=no)" ] || log "uncommitted changes in $REPO are NOT tested (HEAD is)"
if [ "${REUSE_CLONE:-0}" = 1 ] && [ "$(git -C "$CLONE" rev-parse HEAD 2>/dev/null)" = "$HEAD" ]; then
    log "reusing $CLONE at $HEAD"
else
    rm -rf "$CLONE"
    git clone -q "$REPO" "$CLONE"
    git -C "$CLONE" checkout -q --detach "$HEAD"
fi
echo "== testing $HEAD: bash scripts/test.sh ${PYTEST_ARGS[*]}"
LOG=$ROOT/root/test-$(date +%Y%m%d-%H%M%S).log
set +e
inside bash -c 'cd /root/nvrx-slo && exec bash scripts/test.sh "$@"' test.sh "${PYTEST_ARGS[@]}" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
set -e
echo "== Debian $(cat "$ROOT/etc/debian_version"), $(inside ldd --version | head -1)"
echo "== $(inside /root/nvrx-slo/.venv/bin/python -VV 2>&1 | head -1)"
echo "== nvidia-resiliency-ext $(inside /root/nvrx-slo/.venv/bin/pip show nvidia-resiliency-ext 2>/dev/null | sed -n 's/^Version: //p')," \
     "torch $(inside /root/nvrx-slo/.venv/bin/pip show torch 2>/dev/null | sed -n 's/^Version: //p')"
echo "== $(inside promtool --version 2>&1 | head -1); $(inside prometheus-alertmanager --version 2>&1 | head -1)"
echo "== pytest: $(grep -E '(passed|failed|error|no tests ran).* in [0-9.]+s' "$LOG" | tail -1) (exit $rc; log $LOG)"
exit "$rc"
