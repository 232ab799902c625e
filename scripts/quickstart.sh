#!/bin/sh
# Quick start on a fresh machine: install what gpulayer's build needs (Bun),
# build the single binary, then run the example job twice and say what each
# run's task.prepare did: built (and by which installer) or reused. No uv to
# install: without one on PATH, gpulayer installs its pinned uv from the
# package index the machine's pip uses, and takes the fast path.
set -eu
cd "$(dirname "$0")/.."

if ! command -v bun >/dev/null 2>&1; then
  echo "installing Bun (npm install -g bun)" >&2
  npm install -g bun >/dev/null
fi
bun install --frozen-lockfile >/dev/null
bun run build >&2

export GPULAYER_HOME="${GPULAYER_HOME:-$PWD/.gpulayer-home}"
# What the last job's task.prepare did, from its own record.
prepared() {
  ./dist/gpulayer job list --json | python3 -c '
import json, subprocess, sys
job = json.load(sys.stdin)[0]
status = json.loads(subprocess.run(["./dist/gpulayer", "job", "status", job["id"], "--json"], capture_output=True, text=True, check=True).stdout)
done = [e["data"] for e in status["events"] if e["type"] == "task.prepare.finished"][-1]
how = " by " + done["installer_path"] if done["status"] == "built" and done.get("installer_path") else ""
print(done["status"] + how)'
}
for run in first second; do
  echo "== $run run ==" >&2
  ./dist/gpulayer job run -f examples/hello/job.yaml
  echo "== $run run: the environment was $(prepared) ==" >&2
done
id=$(./dist/gpulayer job list --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
./dist/gpulayer job status "$id"
