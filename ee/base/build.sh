#!/usr/bin/env bash
# Build the execution environment's base image locally (there is no container registry):
# a Debian 12 root filesystem made with mmdebstrap from this machine's apt sources
# (packages.txt), plus a wheelhouse of exactly the Python packages the EE's build installs
# (requirements.txt, every one pinned, downloaded here with this machine's pip) and a pip
# configuration that makes the build install from that wheelhouse alone, offline. The EE
# build removes both from its final image (execution-environment.yml). Imported into podman
# Python is a virtual environment of Debian's, /opt/python3, first on PATH (Debian disables
# ensurepip for its system Python, and ansible-builder's build runs it). Imported into podman
# as localhost/inferops-ee-base:<hash of this recipe> and tagged inferops-ee-base:bookworm,
# the name execution-environment.yml builds from; built once, reused until the recipe changes.
# What went in is recorded in the image: /usr/share/inferops-ee/{dpkg,wheels}.txt.
#
#   ee/base/build.sh            build if missing, print the image name
#   ee/base/build.sh --force    rebuild
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo="localhost/inferops-ee-base"
tag=$(cat "$here/build.sh" "$here/packages.txt" "$here/requirements.txt" | sha256sum | cut -c1-12)
image="$repo:$tag"

if [[ "${1:-}" != "--force" ]] && podman image exists "$image"; then
  podman tag "$image" "$repo:bookworm"
  echo "$image"
  exit 0
fi

work=$(mktemp -d /var/tmp/inferops-ee-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
start=$SECONDS
mkdir -p "$work/ee/wheels"
# --no-deps: the list is the whole closure, pinned; a missing dependency fails the EE build.
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$work/ee/wheels" -r "$here/requirements.txt" 2>&1 | { grep -v "^WARNING: Location" || true; } >&2
ls "$work/ee/wheels" >"$work/ee/wheels.txt"
printf '[global]\nno-index = true\nfind-links = /opt/inferops-ee/wheels\n' >"$work/ee/pip.conf"
packages=$(grep -v '^\s*#' "$here/packages.txt" | grep -v '^\s*$' | paste -sd, -)
echo "building $image (mmdebstrap: $packages; $(wc -l <"$work/ee/wheels.txt") wheels)" >&2
mmdebstrap --quiet --variant=apt --include="$packages" \
  --customize-hook="mkdir -p \"\$1/opt/inferops-ee\" \"\$1/usr/share/inferops-ee\"" \
  --customize-hook="copy-in $work/ee/wheels /opt/inferops-ee" \
  --customize-hook="copy-in $work/ee/pip.conf /etc" \
  --customize-hook="copy-in $work/ee/wheels.txt /usr/share/inferops-ee" \
  --customize-hook='chroot "$1" dpkg-query -W -f "\${Package}=\${Version}\n" >"$1/usr/share/inferops-ee/dpkg.txt"' \
  --customize-hook='chroot "$1" python3 -m venv /opt/python3' \
  --customize-hook='echo -n > "$1/etc/machine-id"' \
  bookworm "$work/rootfs.tar" >&2
podman import --quiet --change 'CMD ["/bin/bash"]' \
  --change 'ENV PATH=/opt/python3/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  "$work/rootfs.tar" "$image" >/dev/null
podman tag "$image" "$repo:bookworm"
echo "built $image in $((SECONDS - start)) s" >&2
echo "$image"
