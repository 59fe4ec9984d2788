#!/usr/bin/env bash
# Build the collection's documentation site from the code (make docs, part of make lint):
# antsibull-docs renders every module, plugin and role entry point of this working tree,
# then Sphinx builds the HTML with every warning an error. Output: .cache/docs-site/html.
#
#   docs/site/build.sh [OUTPUT_DIR]
set -euo pipefail
site=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$site/../.." && pwd)
out=${1:-$repo/.cache/docs-site}
rm -rf "$out"
mkdir -p "$out/rst"
chmod og-w "$out/rst"  # antsibull-docs wants its destination writable by itself only
cp "$site/index.rst" "$out/rst/index.rst"
export ANSIBLE_COLLECTIONS_PATH="$repo/collections" INFEROPS_DOCS_WORK="$out"
antsibull-docs --config-file "$site/antsibull-docs.cfg" collection --fail-on-error --use-current \
  --dest-dir "$out/rst" inferops.sglang
sphinx-build -q -W --keep-going -b html -c "$site" "$out/rst" "$out/html"
echo "docs site: $out/html/index.html ($(du -sh "$out/html" | cut -f1))"
