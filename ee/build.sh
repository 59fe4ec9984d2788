#!/usr/bin/env bash
# Build the execution environment (make ee): the base image (ee/base/build.sh), the
# collection's tarball from this tree (tools/build_collection.sh), then ansible-builder
# (pinned in requirements.txt) with podman, from execution-environment.yml. Prints the
# image, its size and each step's time.
#
#   ee/build.sh
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
version=$(sed -n 's/^version: *//p' galaxy.yml)
image="inferops-sglang-ee:$version"
start=$SECONDS
base=$(ee/base/build.sh)
t_base=$((SECONDS - start))
tools/build_collection.sh .cache/ee/build >&2
rm -rf .cache/ee/collection && mkdir -p .cache/ee/collection
mv .cache/ee/build/inferops-sglang-"$version".tar.gz .cache/ee/collection/
t_collection=$((SECONDS - start - t_base))
ansible-builder build -f execution-environment.yml -c .cache/ee/context -t "$image" \
  --container-runtime podman -v 1 >&2
t_build=$((SECONDS - start - t_base - t_collection))
size=$(podman image inspect "$image" --format '{{.Size}}')
echo "$image: $((size / 1024 / 1024)) MiB; base $base ${t_base} s, collection ${t_collection} s, ansible-builder ${t_build} s"
