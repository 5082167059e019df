#!/usr/bin/env bash
# What a new user does first, on a machine with nothing but Python and a compiler:
# a copy of the source tree, a new venv, the README's first command verbatim (a plain
# `pip install .`: no extras, no test dependencies, so nothing optional is there), then
# how long `import ringreduce` takes, printed. Fails when either command fails.
#
#   bash .ci/newcomer.sh
#
# RINGREDUCE_NEWCOMER_DIR keeps the work (the copy and the venv) in that folder; by
# default it is a temporary folder, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python}

if [ -n "${RINGREDUCE_NEWCOMER_DIR:-}" ]; then
  work=$RINGREDUCE_NEWCOMER_DIR
  rm -rf "$work" && mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
work=$(cd "$work" && pwd)
step() { echo "== newcomer.sh: $* ($(date +%T))"; }

# The project's files as they are now (tracked, and new ones not ignored), without this
# checkout's build folder or anything else a developer's tree has collected.
step "copying the source tree"
mkdir -p "$work/ringreduce"
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done |
  xargs -0 cp --parents -t "$work/ringreduce"

step "a new venv, with nothing in it"
"$python" -m venv "$work/venv"
# shellcheck disable=SC1091
source "$work/venv/bin/activate"
unset RANK WORLD_SIZE LOCAL_RANK RINGREDUCE_TRANSPORT PYTHONPATH

# The README's first command, read from the README itself so that the two cannot drift.
first=$(grep -m1 -E '^pip install \. && ringreduce bench' "$work/ringreduce/README.md")
first=${first%%#*}
step "the README's first command: $first"
(cd "$work/ringreduce" && eval "$first")

step "what it installed"
python -m pip list --format=freeze

step "python -X importtime -c 'import ringreduce'"
cd "$work"
python -X importtime -c "import ringreduce" 2>"$work/importtime.txt"
cat "$work/importtime.txt"
total=$(tail -n 1 "$work/importtime.txt" | awk -F'|' '{print $2}' | tr -d ' ')
echo "import ringreduce: $((total / 1000)) ms (cumulative, this run)"
step "done"
