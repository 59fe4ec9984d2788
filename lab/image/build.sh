#!/usr/bin/env bash
# Build the lab host image: a Debian 12 root filesystem with systemd as PID 1,
# made offline with mmdebstrap from this machine's own apt sources, imported
# into podman. The tag is a hash of this recipe, so the image is built once
# and reused until the recipe changes.
#
#   lab/image/build.sh            build if missing, print the image name
#   lab/image/build.sh --force    rebuild
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo="localhost/inferops-lab"
tag=$(cat "$here/build.sh" "$here/packages.txt" | sha256sum | cut -c1-12)
image="$repo:$tag"

if [[ "${1:-}" != "--force" ]] && podman image exists "$image"; then
  echo "$image"
  exit 0
fi

work=$(mktemp -d /var/tmp/inferops-lab-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
packages=$(grep -v '^\s*#' "$here/packages.txt" | grep -v '^\s*$' | paste -sd, -)
echo "building $image (mmdebstrap: $packages)" >&2
start=$SECONDS
mmdebstrap --quiet --variant=apt --include="$packages" \
  --customize-hook='echo -n > "$1/etc/machine-id"' \
  --customize-hook='rm -f "$1/etc/hostname"' \
  --customize-hook='chroot "$1" systemctl mask getty@tty1.service console-getty.service systemd-logind.service >/dev/null 2>&1 || true' \
  --customize-hook='chroot "$1" systemctl disable prometheus.service >/dev/null 2>&1 || true' \
  bookworm "$work/rootfs.tar" >&2
podman import --quiet --change 'CMD ["/sbin/init"]' --change 'STOPSIGNAL SIGRTMIN+3' \
  "$work/rootfs.tar" "$image" >/dev/null
podman tag "$image" "$repo:latest"
echo "built $image in $((SECONDS - start)) s" >&2
echo "$image"
