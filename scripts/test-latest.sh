#!/usr/bin/env bash
# `make test-latest`: the fast layer on the newest releases that pyproject.toml's ranges allow, in a throwaway
# virtualenv (no lock). Prints the versions it ran with, then pytest's own summary.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${1:-python3}"
venv="$(mktemp -d)"
trap 'rm -rf "$venv"' EXIT
"$python" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q -e '.[test]' -e ./lab -r requirements-build.in
"$venv/bin/migrate" --version -v
# Names compared as pip normalises them (lower case, '-' for '_' and '.'); pip itself is not in the lock.
normalised() { awk -F'==' '{ n = tolower($1); gsub(/[._]/, "-", n); print n "==" $2 }' | sort; }
# Every installed distribution (pip's own listing options change between its releases; the metadata does not).
"$venv/bin/python" -c 'import importlib.metadata as m; print("\n".join(f"{d.name}=={d.version}" for d in m.distributions()))' \
    | grep -v -E '^(migrate|migrate-lab|pip)==' >"$venv/versions.txt"
if diff <(grep -E '^[A-Za-z0-9_.-]+==' requirements.lock | sed 's/ .*//' | normalised) \
        <(normalised <"$venv/versions.txt") >"$venv/diff.txt"; then
    echo "test-latest: the newest releases are those of requirements.lock"
else
    echo "test-latest: newer than requirements.lock (< lock, > newest):"
    grep -E '^[<>]' "$venv/diff.txt" || true
fi
"$venv/bin/pytest" -q -m "not lab" -n 2 -p no:cacheprovider
