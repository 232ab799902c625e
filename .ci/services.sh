#!/usr/bin/env bash
# Container engines for the tests; sourced by .ci/run (idempotent: safe to source again).
# - Docker: start dockerd when `docker info` does not answer, and wait for it.
# - Podman: runc as the runtime and no default ulimits (crun and the default
#   ulimits fail on some cgroup layouts); loopback registries are plain HTTP.
# Tests start their own registry on 127.0.0.1 (test/fixtures/registry.ts).

gpulayer_services_docker() {
  command -v dockerd >/dev/null 2>&1 || return 0
  if docker info >/dev/null 2>&1; then return 0; fi
  local log=${GPULAYER_DOCKERD_LOG:-/tmp/gpulayer-dockerd.log}
  # No bridge and no iptables: CI boxes (containers themselves) rarely allow them.
  # Containers then run with --network host or none (gpulayer's default is host).
  nohup dockerd --iptables=false --bridge=none >"$log" 2>&1 &
  local _
  for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "services.sh: dockerd did not answer within 30 s; its log ($log):" >&2
  tail -n 20 "$log" >&2 || true
  return 1
}

# Add KEY = VALUE under [SECTION] of a TOML file unless KEY is already set there.
gpulayer_toml_set() {
  local file=$1 section=$2 key=$3 value=$4
  mkdir -p "$(dirname "$file")"
  touch "$file"
  if awk -v s="[$section]" -v k="$key" '
      /^[[:space:]]*\[/ { gsub(/[[:space:]]/, ""); insec = ($0 == s); next }
      insec && $0 ~ "^[[:space:]]*" k "[[:space:]]*=" { found = 1 }
      END { exit found ? 0 : 1 }' "$file"; then
    return 0
  fi
  if grep -q "^[[:space:]]*\[$section\][[:space:]]*$" "$file"; then
    # Insert right after the section header.
    local tmp
    tmp=$(mktemp)
    awk -v s="[$section]" -v line="$key = $value" '
      { print }
      { t = $0; gsub(/[[:space:]]/, "", t) }
      t == s && !done { print line; done = 1 }' "$file" >"$tmp"
    cat "$tmp" >"$file"
    rm -f "$tmp"
  else
    printf '\n[%s]\n%s = %s\n' "$section" "$key" "$value" >>"$file"
  fi
}

gpulayer_services_podman() {
  command -v podman >/dev/null 2>&1 || return 0
  local conf=/etc/containers/containers.conf
  gpulayer_toml_set "$conf" containers default_ulimits '[]'
  if command -v runc >/dev/null 2>&1; then
    gpulayer_toml_set "$conf" engine runtime '"runc"'
  fi
  # Loopback registries are plain HTTP: the tests say so in their own registries.conf (test/fixtures/registry.ts).
  podman info >/dev/null 2>&1 || echo "services.sh: podman info fails; podman tests will fail" >&2
}

gpulayer_services_docker
gpulayer_services_podman

# Tests for an engine that does not work fail instead of being skipped.
export GPULAYER_TEST_REQUIRE_ENGINES=docker,podman
