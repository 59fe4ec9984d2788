#!/usr/bin/env bash
# Prepare this machine (Debian 12, root) to run the lab: podman with runc,
# mmdebstrap, and a containers.conf that works without raising RLIMIT_NOFILE.
# Idempotent: does nothing when everything is already in place.
set -euo pipefail
need=()
for cmd in podman runc mmdebstrap; do
  command -v "$cmd" >/dev/null 2>&1 || need+=("$cmd")
done
# The provisioning tests build a signed apt repository and tiny shared libraries
command -v dpkg-scanpackages >/dev/null 2>&1 || need+=(dpkg-dev)
command -v gpg >/dev/null 2>&1 || need+=(gnupg)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
# molecule/deploy's fault matrix deploys over SSH with pipelining (podman exec has none)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
if ((${#need[@]})); then
  echo "installing: ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
conf=/etc/containers/containers.conf
want='# inferops-lab
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"'
if [[ "$(cat "$conf" 2>/dev/null)" != "$want" ]]; then
  mkdir -p /etc/containers
  [[ -f "$conf" ]] && ! grep -q '^# inferops-lab' "$conf" && cp "$conf" "$conf.orig"
  printf '%s\n' "$want" > "$conf"
fi
