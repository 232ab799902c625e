#!/bin/sh
# Install gpulayer: one self-contained binary; no Bun, Node or Python package needed to run it.
#
#   curl -fsSL https://github.com/gpulayer/gpulayer/releases/latest/download/install.sh | sh
#   wget -qO- https://github.com/gpulayer/gpulayer/releases/latest/download/install.sh | sh
#
# Settings, all optional (environment variables; put them after the pipe: `| GPULAYER_VERSION=0.1.0 sh`):
#   GPULAYER_VERSION      the version to install, e.g. 0.1.0 or v0.1.0 (default: the latest release)
#   GPULAYER_INSTALL_DIR  where to put `gpulayer` (default: ~/.local/bin, or /usr/local/bin as root)
#   GPULAYER_INSTALL_URL  base URL of the releases, for mirrors and tests (default: DEFAULT_URL below)
#
# Layout under the base URL. It is GitHub Releases' own URL scheme, so the default needs nothing
# but the release's assets; `bun run build:release` writes the same tree into release/ (the two
# middle levels are symlinks to release/<version>/), so any static file server on release/ is a mirror:
#   <base>/download/v<version>/gpulayer-<version>-<target>.tar.gz   one file inside: gpulayer
#   <base>/download/v<version>/SHASUMS256.txt                      `sha256sum -c` format
#   <base>/latest/download/SHASUMS256.txt                          the latest release's; the archive
#                                                                  named there for <target> gives the version
# <target> is one of linux-x64, linux-arm64, darwin-arm64, darwin-x64.
#
# The archive's SHA-256 must match SHASUMS256.txt or nothing is installed. This checks that the
# download is intact; both files come from the same server, so it is no signature.
# This script never edits shell profiles: when the folder is not on PATH it says how to add it.
# It needs curl or wget, tar with gzip, and sha256sum, shasum or openssl.

set -eu

DEFAULT_URL="https://github.com/gpulayer/gpulayer/releases"

say() {
	printf '%s\n' "$*"
}

warn() {
	printf 'gpulayer-install: warning: %s\n' "$*" >&2
}

die() {
	printf 'gpulayer-install: error: %s\n' "$*" >&2
	exit 1
}

has() {
	command -v "$1" >/dev/null 2>&1
}

# Sets $target (e.g. linux-x64), or stops with what is unsupported.
detect_target() {
	os_name=$(uname -s 2>/dev/null || echo unknown)
	machine=$(uname -m 2>/dev/null || echo unknown)
	case $os_name in
	Linux) os=linux ;;
	Darwin) os=darwin ;;
	*) die "unsupported operating system: $os_name. gpulayer's release binaries are for Linux and macOS on x64 (x86_64) and arm64 (aarch64); elsewhere, build it from source." ;;
	esac
	case $machine in
	x86_64 | amd64 | x64) arch=x64 ;;
	aarch64 | arm64 | armv8*) arch=arm64 ;;
	*) die "unsupported architecture: $machine ($os_name). gpulayer's release binaries are for x64 (x86_64) and arm64 (aarch64) only." ;;
	esac
	if [ "$os" = darwin ] && [ "$arch" = x64 ] && [ "$(sysctl -n sysctl.proc_translated 2>/dev/null || true)" = 1 ]; then
		arch=arm64 # a shell under Rosetta on Apple silicon: take the native binary
	fi
	if [ "$os" = linux ]; then
		if [ "$arch" = x64 ]; then loader=/lib64/ld-linux-x86-64.so.2; else loader=/lib/ld-linux-aarch64.so.1; fi
		if [ ! -e "$loader" ]; then
			for musl in /lib/ld-musl-*.so.1; do
				[ -e "$musl" ] && die "unsupported C library: musl ($musl). gpulayer's Linux binaries need glibc (Debian, Ubuntu, RHEL, ...); Alpine and other musl systems are not supported."
			done
			warn "$loader is missing: gpulayer's Linux binaries need glibc; it may not run here"
		fi
		if [ "$arch" = x64 ] && [ -r /proc/cpuinfo ] && ! grep -q avx2 /proc/cpuinfo 2>/dev/null; then
			warn "this CPU does not report AVX2, which gpulayer's x64 binary needs; it may not run here"
		fi
	fi
	target="$os-$arch"
}

# Sets $downloader to curl or wget.
pick_downloader() {
	if has curl; then
		downloader=curl
	elif has wget; then
		downloader=wget
	else
		die "need curl or wget to download gpulayer"
	fi
}

# download URL FILE [progress]: returns 1 when the server has no such file (HTTP 404), so that the caller can
# say what is missing (a release, a build); stops on any other failure.
download() {
	if [ "$downloader" = curl ]; then
		# Not -f: the status is read here, and a 404 is no error of curl's.
		if [ "${3:-}" = progress ] && [ -t 2 ]; then shown=--progress-bar; else shown=-sS; fi
		status=$(curl -L --retry 3 "$shown" -w '%{http_code}' -o "$2" "$1") || die "could not download $1"
		case $status in
		2??) return 0 ;;
		404) return 1 ;;
		*) die "could not download $1 (HTTP $status)" ;;
		esac
	else
		# wget says the status only in its messages: GNU `ERROR 404: Not Found.`, BusyBox `HTTP/1.1 404 Not Found`.
		wget -nv -O "$2" "$1" 2>"$tmp/wget.log" && return 0
		grep -Eq ' 404[: ]' "$tmp/wget.log" && return 1
		awk 'NF' "$tmp/wget.log" >&2
		die "could not download $1"
	fi
}

# Sets $hasher; nothing is installed unverified.
pick_hasher() {
	if has sha256sum; then
		hasher=sha256sum
	elif has shasum; then
		hasher=shasum
	elif has openssl; then
		hasher=openssl
	else
		die "need sha256sum, shasum or openssl to verify the download"
	fi
}

sha256_of() {
	case $hasher in
	sha256sum) sha256sum "$1" | cut -d ' ' -f 1 ;;
	shasum) shasum -a 256 "$1" | cut -d ' ' -f 1 ;;
	openssl) openssl dgst -sha256 -r "$1" | cut -d ' ' -f 1 ;;
	esac
}

# The checksum SHASUMS256.txt gives for a file name (either `HASH  NAME` or `HASH *NAME`).
expected_sha256() {
	awk -v f="$2" '$2 == f || $2 == "*" f { print $1; exit }' "$1"
}

# The archive SHASUMS256.txt lists for this target: gpulayer-<version>-<target>.tar.gz.
archive_for_target() {
	awk -v suffix="-$2.tar.gz" '
		{ name = $2; sub(/^\*/, "", name) }
		name ~ /^gpulayer-/ && substr(name, length(name) - length(suffix) + 1) == suffix { print name; exit }
	' "$1"
}

cleanup() {
	[ -n "${staged:-}" ] && rm -f "$staged"
	[ -n "${tmp:-}" ] && rm -rf "$tmp"
	return 0
}

main() {
	base=${GPULAYER_INSTALL_URL:-$DEFAULT_URL}
	while [ "${base%/}" != "$base" ]; do base=${base%/}; done

	version=${GPULAYER_VERSION:-latest}
	version=${version#v}
	case $version in
	latest) ;;
	'' | *[!0-9A-Za-z.-]*) die "GPULAYER_VERSION must look like 0.1.0 or v0.1.0, got: ${GPULAYER_VERSION:-}" ;;
	esac

	if [ -n "${GPULAYER_INSTALL_DIR:-}" ]; then
		dir=$GPULAYER_INSTALL_DIR
		case $dir in "~"/*) dir=${HOME:?HOME is not set}/${dir#"~"/} ;; esac
	elif [ "$(id -u)" = 0 ]; then
		dir=/usr/local/bin
	else
		[ -n "${HOME:-}" ] || die "HOME is not set; set GPULAYER_INSTALL_DIR to choose where gpulayer goes"
		dir=$HOME/.local/bin
	fi
	while [ "${dir%/}" != "$dir" ] && [ "$dir" != / ]; do dir=${dir%/}; done

	detect_target
	pick_downloader
	pick_hasher

	tmp=$(mktemp -d 2>/dev/null || mktemp -d -t gpulayer)
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM

	if [ "$version" = latest ]; then
		sums_url="$base/latest/download/SHASUMS256.txt"
		download "$sums_url" "$tmp/SHASUMS256.txt" || die "there is no release at $base yet ($sums_url is not there)"
		archive=$(archive_for_target "$tmp/SHASUMS256.txt" "$target")
		[ -n "$archive" ] || die "the latest release has no build for $target ($sums_url lists none)"
		version=${archive#gpulayer-}
		version=${version%"-$target.tar.gz"}
	else
		sums_url="$base/download/v$version/SHASUMS256.txt"
		download "$sums_url" "$tmp/SHASUMS256.txt" || die "there is no release $version ($sums_url is not there; the releases: $base)"
		archive="gpulayer-$version-$target.tar.gz"
	fi
	case $version in '' | *[!0-9A-Za-z.-]*) die "unexpected archive name in $sums_url: $archive" ;; esac
	expected=$(expected_sha256 "$tmp/SHASUMS256.txt" "$archive")
	[ -n "$expected" ] || die "$sums_url has no checksum for $archive (is there a $target build of $version?)"

	url="$base/download/v$version/$archive"
	say "downloading gpulayer $version for $target"
	say "  from $url"
	download "$url" "$tmp/$archive" progress || die "$url is not there, though SHASUMS256.txt lists it"

	actual=$(sha256_of "$tmp/$archive")
	if [ "$actual" != "$expected" ]; then
		die "checksum mismatch for $archive: expected $expected, got $actual. The download is corrupt or was tampered with; nothing was installed."
	fi
	say "  sha256 $actual (matches SHASUMS256.txt)"

	mkdir "$tmp/unpacked"
	tar -xzf "$tmp/$archive" -C "$tmp/unpacked" gpulayer 2>/dev/null || die "$archive is not a gpulayer archive (no gpulayer inside)"
	[ -f "$tmp/unpacked/gpulayer" ] || die "$archive is not a gpulayer archive (no gpulayer inside)"
	chmod 755 "$tmp/unpacked/gpulayer"
	# Run it before replacing anything: a binary that cannot start here must not displace one that works.
	if ! about=$("$tmp/unpacked/gpulayer" version 2>&1); then
		die "the downloaded gpulayer does not run on this machine: $about"
	fi

	mkdir -p "$dir" 2>/dev/null || die "cannot create $dir (set GPULAYER_INSTALL_DIR to a folder you can write)"
	[ -w "$dir" ] || die "cannot write to $dir (set GPULAYER_INSTALL_DIR to a folder you can write, or run as root)"
	# Copy beside the destination, then rename over it: atomic, and fine while an old gpulayer runs.
	staged="$dir/.gpulayer.install.$$"
	cp "$tmp/unpacked/gpulayer" "$staged" || die "cannot write to $dir"
	chmod 755 "$staged"
	mv -f "$staged" "$dir/gpulayer" || die "cannot replace $dir/gpulayer"
	staged=
	say "installed $about"
	say "  at $dir/gpulayer"

	case ":${PATH:-}:" in
	*":$dir:"*)
		first=$(command -v gpulayer 2>/dev/null || true)
		if [ -n "$first" ] && [ "$first" != "$dir/gpulayer" ]; then
			warn "$first comes before $dir/gpulayer on PATH; remove it, or put $dir first"
		fi
		;;
	*)
		say ""
		say "$dir is not on your PATH. To run gpulayer by name, add it (this installer never edits your shell profile):"
		case ${SHELL:-} in
		*/fish) say "  fish_add_path $dir" ;;
		*/zsh) say "  echo 'export PATH=\"$dir:\$PATH\"' >> ~/.zshrc" ;;
		*/bash) say "  echo 'export PATH=\"$dir:\$PATH\"' >> ~/.bashrc" ;;
		*) say "  echo 'export PATH=\"$dir:\$PATH\"' >> ~/.profile" ;;
		esac
		say "then open a new shell. Until then: $dir/gpulayer"
		;;
	esac
}

main "$@"
