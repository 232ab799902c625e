#!/bin/sh
# Quick start on a fresh machine: install what gpulayer's build needs (Bun, uv),
# build the single binary, then run the example job twice: the first run builds
# its environment (task.prepare: miss), the second reuses it (task.prepare: hit).
set -eu
cd "$(dirname "$0")/.."

if ! command -v bun >/dev/null 2>&1; then
  echo "installing Bun (npm install -g bun)" >&2
  npm install -g bun >/dev/null
fi
if ! command -v uv >/dev/null 2>&1; then
  echo "installing uv (python3 -m pip install uv)" >&2
  python3 -m pip install -q uv
fi
bun install --frozen-lockfile >/dev/null
bun run build >&2

export GPULAYER_HOME="${GPULAYER_HOME:-$PWD/.gpulayer-home}"
echo "== first run: the environment is built ==" >&2
./dist/gpulayer job run -f examples/hello/job.yaml
echo "== second run: the environment is reused ==" >&2
./dist/gpulayer job run -f examples/hello/job.yaml
id=$(./dist/gpulayer job list --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
./dist/gpulayer job status "$id"
