#!/usr/bin/env bash
# A Python venv for the project's tools, kept in the per-user cache and keyed by
# its inputs (the pip arguments, the files among them, the interpreter, this
# recipe), then linked at LINK. A fresh clone on a machine that built it once
# reuses it; a fresh machine builds it. Keys no longer asked for are removed.
#
#   .ci/venv.sh LINK PIP-INSTALL-ARGUMENTS...
#   .ci/venv.sh .venv -r requirements.txt
set -euo pipefail
link=$1
shift
python=${INFEROPS_VENV_PYTHON:-python3}
root=${INFEROPS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inferops-sglang}/venvs
recipe=1
name=$(basename "$link")
key=$({
  printf '%s\n' "$@"
  for arg in "$@"; do if [[ -f $arg ]]; then cat "$arg"; fi; done
  # the base interpreter, not the one a PATH with a venv first gives (make puts .venv/bin first)
  "$python" -c 'import os, sys; print(os.path.realpath(getattr(sys, "_base_executable", sys.executable)), sys.version)'
  echo "recipe $recipe"
} | sha256sum | cut -c1-12)
dir=$root/$name-$key
mkdir -p "$root"
exec 9>"$root/$name.lock"
flock 9
if [[ ! -f $dir/.inferops-stamp ]]; then
  rm -rf "$dir"
  "$python" -m venv "$dir"
  "$dir/bin/pip" install -q --disable-pip-version-check "$@" 2>&1 | grep -v "^WARNING: Location 'file://" || test "${PIPESTATUS[0]}" -eq 0
  touch "$dir/.inferops-stamp"
fi
for old in "$root/$name"-*; do
  if [[ -d $old && $old != "$dir" && $(basename "$old") =~ ^$name-[0-9a-f]{12}$ ]]; then rm -rf "$old"; fi
done
if [[ -d $link && ! -L $link ]]; then rm -rf "$link"; fi
ln -sfn "$dir" "$link"
touch "$dir/.stamp"
