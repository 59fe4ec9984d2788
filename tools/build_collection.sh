#!/usr/bin/env bash
# Build the collection's tarball as a release is built (docs/release.md), from this working
# tree's files that git would commit (tracked, and untracked but not ignored), then install it
# into an empty collections path, offline. galaxy.yml's build_ignore keeps the lab, the tests,
# the project's own files and the caches out.
#
#   tools/build_collection.sh OUT
#     OUT/inferops-sglang-<version>.tar.gz
#     OUT/collections/ansible_collections/inferops/sglang   (the installed copy)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:?usage: tools/build_collection.sh OUT}")
rm -rf "$out"
mkdir -p "$out/src" "$out/collections"
git -C "$repo" ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' path; do
      [[ "$path" == collections/* ]] && continue
      [[ -e "$repo/$path" || -L "$repo/$path" ]] && printf '%s\0' "$path"
    done \
  | tar -C "$repo" --null -cf - -T - | tar -C "$out/src" -xf -
ansible-galaxy collection build "$out/src" --output-path "$out" >/dev/null
rm -rf "$out/src"
tarball=$(echo "$out"/inferops-sglang-*.tar.gz)
ANSIBLE_COLLECTIONS_PATH="$out/collections" ansible-galaxy collection install --offline -p "$out/collections" "$tarball" >/dev/null
echo "$tarball: $(( $(stat -c %s "$tarball") / 1024 )) KiB, $(tar -tzf "$tarball" | grep -vc '/$') files"
echo "installed: $out/collections/ansible_collections/inferops/sglang"
