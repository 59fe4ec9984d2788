#!/usr/bin/env bash
# Real SGLang for the lab and the conformance tests, built from PyPI into a
# per-user cache outside the clone and reused while its inputs are unchanged:
#
#   venv-<release>-<key>/   a venv of real SGLang (0.5.11, the pinned release, and
#                           0.5.23, the newest supported), made with Debian's
#                           /usr/bin/python3 (the lab image's interpreter) with
#                           the sglang_runtime role's constraints file of the
#                           release (roles/sglang_runtime/files/constraints/
#                           sglang-<release>-cu130.txt, the lock the role
#                           installs with); key = lock + interpreter + recipe
#   libcuda-stub-<key>/     libcuda.so.1: a TEST DOUBLE of the NVIDIA driver
#                           library (libcuda_stub.c), so sgl_kernel imports on a
#                           machine without a GPU; every call says "no device"
#   tiny-model-<key>/       a deterministic tiny Qwen2 model with a locally
#                           trained tokenizer (tiny_model.py; no hub)
#   wheels/                 sglang-<release> wheels (--no-deps) of releases.txt,
#                           read by the simulator conformance tests
#
# Each part is complete when its .inferops-stamp exists; a part whose key
# changed is built anew and the old one removed. Stable names (venv-0.5.11,
# libcuda-stub, tiny-model) link to the current parts, and env.sh holds their
# paths (INFEROPS_REAL_*), which --print shows.
#
#   lab/real/build.sh             build what is missing, print the paths
#   lab/real/build.sh --print     print the paths of what is built; exit 1 if incomplete
#   lab/real/build.sh --lock REL  resolve REL anew from seed-REL.txt into the role's
#                                 constraints file of REL (then `make real` builds
#                                 its venv anew: its key changed)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=${INFEROPS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inferops-sglang}/real
python=${INFEROPS_REAL_PYTHON:-/usr/bin/python3}
VENV_RELEASES=(0.5.11 0.5.23)
recipe=1
# The one source of the locks: the constraints files the sglang_runtime role
# installs with, per SGLang release and CUDA build. PyPI's torch of these
# releases is the CUDA 13.0 build, so the lab's venvs are cu130.
constraints=$(cd "$here/../.." && pwd)/roles/sglang_runtime/files/constraints
cuda_tag=cu130
lockfile() { echo "$constraints/sglang-$1-$cuda_tag.txt"; }
# lock_of RELEASE: the constraints file, which must exist (except for --lock)
lock_of() {
  [[ -f "$(lockfile "$1")" ]] || { log "no constraints file $(lockfile "$1") (lab/real/build.sh --lock $1 makes it)"; exit 1; }
  lockfile "$1"
}
mkdir -p "$root"

log() { echo "real-sglang: $*" >&2; }
sha() { sha256sum | cut -c1-12; }
pyver() { "$python" -c 'import sys; print(sys.version.split()[0])'; }
# pip output without the machine's notes about local index folders it skips
quiet_pip() { "$@" 2>&1 | grep -v "^WARNING: Location 'file://" || return "${PIPESTATUS[0]}"; }

venv_key() { { cat "$(lock_of "$1")"; pyver; echo "venv recipe $recipe"; } | sha; }
stub_key() { { cat "$here/libcuda_stub.c"; gcc --version | head -1; } | sha; }
model_key() { { cat "$here/tiny_model.py"; venv_key 0.5.11; } | sha; }

# current NAME KEY: the keyed directory; drops other keys of NAME
current() {
  local name=$1 key=$2 dir
  for dir in "$root/$name"-*; do
    [[ -d "$dir" && "$dir" != "$root/$name-$key" ]] || continue
    [[ "$(basename "$dir")" =~ ^$name-[0-9a-f]{12}$ ]] || continue
    log "removing $(basename "$dir") (inputs changed)"
    rm -rf "$dir"
  done
  ln -sfn "$name-$key" "$root/$name"
  echo "$root/$name-$key"
}

build_venv() {
  local release=$1 dir start
  dir="$root/venv-$release-$(venv_key "$release")"
  [[ -f "$dir/.inferops-stamp" ]] && return 0
  rm -rf "$dir"
  start=$SECONDS
  log "building venv of sglang==$release in $dir (several minutes, about 10 GB)"
  "$python" -m venv "$dir"
  quiet_pip "$dir/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check \
    -c "$(lock_of "$release")" "sglang==$release"
  # The lock makes it import: prove it, with the driver stand-in
  LD_LIBRARY_PATH="$root/libcuda-stub" "$dir/bin/python" -c 'import sglang, sgl_kernel, sglang.srt.server_args' \
    || { log "sglang==$release does not import"; exit 1; }
  echo "sglang==$release built in $((SECONDS - start)) s" > "$dir/.inferops-stamp"
  log "$(cat "$dir/.inferops-stamp")"
}

build_stub() {
  local dir
  dir="$root/libcuda-stub-$(stub_key)"
  [[ -f "$dir/.inferops-stamp" ]] && return 0
  rm -rf "$dir" && mkdir -p "$dir"
  gcc -shared -fPIC -O2 -Wall -Werror -Wl,-soname,libcuda.so.1 -o "$dir/libcuda.so.1" "$here/libcuda_stub.c"
  ln -s libcuda.so.1 "$dir/libcuda.so"
  chmod -R a+rX "$dir"
  echo "libcuda.so.1 test double" > "$dir/.inferops-stamp"
}

build_model() {
  local dir
  dir="$root/tiny-model-$(model_key)"
  [[ -f "$dir/.inferops-stamp" ]] && return 0
  rm -rf "$dir"
  "$root/venv-0.5.11/bin/python" "$here/tiny_model.py" "$dir"
  chmod -R a+rX "$dir"
  echo "tiny model" > "$dir/.inferops-stamp"
}

fetch_wheels() {
  local release
  mkdir -p "$root/wheels"
  while read -r release; do
    compgen -G "$root/wheels/sglang-$release-*.whl" >/dev/null && continue
    log "downloading the sglang $release wheel"
    quiet_pip "$python" -m pip download -q --no-deps --no-cache-dir --disable-pip-version-check \
      -d "$root/wheels" "sglang==$release" >/dev/null
  done < <(grep -v '^\s*#' "$here/releases.txt" | grep -v '^\s*$')
}

paths() {
  local release
  echo "INFEROPS_REAL_ROOT=$root"
  for release in "${VENV_RELEASES[@]}"; do
    echo "INFEROPS_REAL_VENV_${release//./_}=$root/venv-$release-$(venv_key "$release")"
  done
  echo "INFEROPS_REAL_LIBCUDA_DIR=$root/libcuda-stub-$(stub_key)"
  echo "INFEROPS_REAL_MODEL=$root/tiny-model-$(model_key)"
  echo "INFEROPS_REAL_WHEELS=$root/wheels"
}

complete() {
  local release
  for release in "${VENV_RELEASES[@]}"; do
    [[ -f "$root/venv-$release-$(venv_key "$release")/.inferops-stamp" ]] || return 1
  done
  [[ -f "$root/libcuda-stub-$(stub_key)/.inferops-stamp" && -f "$root/tiny-model-$(model_key)/.inferops-stamp" ]]
}

lock() {
  local release=$1 tmp
  tmp=$(mktemp -d /var/tmp/inferops-lock.XXXXXX)
  trap 'rm -rf "$tmp"' RETURN
  "$python" -m venv "$tmp/venv"
  quiet_pip "$tmp/venv/bin/python" -m pip install -q --no-cache-dir -c "$here/seed-$release.txt" "sglang==$release"
  { grep '^#' "$here/seed-$release.txt"; echo "# Resolved $(date -u +%Y-%m-%d) by lab/real/build.sh --lock $release with $(pyver)."
    "$tmp/venv/bin/python" -m pip freeze --all | grep -v '^sglang=='; } > "$(lockfile "$release")"
}

case "${1:-}" in
  --print) complete || { paths; exit 1; }; paths; exit 0 ;;
  --lock) lock "${2:?--lock RELEASE}"; exit 0 ;;
  "") ;;
  *) echo "usage: lab/real/build.sh [--print | --lock RELEASE]" >&2; exit 2 ;;
esac

# What the build needs from Debian: gcc for the stub, venv/ensurepip for Debian's python3
need=()
command -v gcc >/dev/null 2>&1 || need+=(gcc)
"$python" -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
if ((${#need[@]})); then
  log "installing: ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# One build at a time per cache (a CI clone and a working tree share it)
exec 9>"$root/.lock"
flock 9
build_stub; current libcuda-stub "$(stub_key)" >/dev/null
for release in "${VENV_RELEASES[@]}"; do
  build_venv "$release"; current "venv-$release" "$(venv_key "$release")" >/dev/null
done
build_model; current tiny-model "$(model_key)" >/dev/null
fetch_wheels
paths | tee "$root/env.sh"
