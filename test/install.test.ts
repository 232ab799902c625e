/**
 * Release binaries and install.sh, end to end: build this machine's archive with
 * scripts/build-binaries.ts, serve the release folder on 127.0.0.1, run install.sh
 * under dash with only the tools it needs on PATH, and run what it installed from a
 * bare folder.
 */
import { test, expect, beforeAll, afterAll } from "bun:test";
import { chmodSync, mkdtempSync, existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, realpathSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { join, normalize } from "node:path";
import { ROOT, tempDir, run } from "./helpers.ts";
import { hostTarget, TARGETS } from "../scripts/build-binaries.ts";

// The build and install tests skip only where this machine is no release target (hostTarget() is null): there is no binary of it to build. Linux x64 (CI) is one.
const HOST = hostTarget();
const VERSION = (JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { version: string }).version;
const ARCHIVE = `gpulayer-${VERSION}-${HOST}.tar.gz`;
/** A target other than this machine's: its runtime would have to be downloaded, which the build below makes impossible. */
const CROSS = TARGETS.find((t) => t !== HOST)!;
const SH = Bun.which("dash") ?? "/bin/sh";
// install.sh fetches with curl or wget: each path is tested where that tool is installed (CI installs both, and shellcheck).
const HAS_WGET = Boolean(Bun.which("wget"));
const HAS_CURL = Boolean(Bun.which("curl"));
const HAS_SHELLCHECK = Boolean(Bun.which("shellcheck"));
const BUN = process.execPath;

let work = "";
let releaseDir = "";
let build = { code: -1, stdout: "", stderr: "" };
let server: ReturnType<typeof Bun.serve> | undefined;
let base = "";
const requests: string[] = [];

/** Bun's cross-compiling download cannot succeed: an empty install cache and a proxy that refuses connections. */
function offlineEnv(): Record<string, string> {
  const cache = join(work, "empty-bun-cache");
  mkdirSync(cache, { recursive: true });
  const dead = "http://127.0.0.1:9";
  return { ...(process.env as Record<string, string>), BUN_INSTALL_CACHE_DIR: cache, HTTPS_PROXY: dead, https_proxy: dead, HTTP_PROXY: dead, http_proxy: dead, NO_PROXY: "", no_proxy: "" };
}

/** A fresh folder under this file's own temp root (removed after all; installed binaries are ~100 MB each). */
function scratch(prefix: string): string {
  return mkdtempSync(join(work, prefix));
}

beforeAll(async () => {
  work = tempDir("gpl-install-");
  if (!HOST) return;
  releaseDir = join(work, "release");
  build = await run([BUN, "run", join(ROOT, "scripts/build-binaries.ts"), "--target", `${HOST},${CROSS}`, "--out", releaseDir], { env: offlineEnv(), cwd: work });
  server = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    async fetch(req) {
      const url = new URL(req.url);
      requests.push(url.pathname);
      if (url.pathname.startsWith("/broken/")) return new Response("forbidden", { status: 403 }); // not transient: curl does not retry it
      const m = /^\/(releases|tampered)(\/.*)$/.exec(decodeURIComponent(url.pathname));
      if (!m) return new Response("not found", { status: 404 });
      const path = join(releaseDir, normalize(m[2]!));
      if (!path.startsWith(`${releaseDir}/`)) return new Response("forbidden", { status: 403 });
      const file = Bun.file(path);
      if (!existsSync(path) || !statSync(path).isFile()) return new Response("not found", { status: 404 });
      if (m[1] === "tampered" && path.endsWith(".tar.gz")) {
        const bytes = await file.bytes();
        bytes[bytes.length >> 1]! ^= 0xff; // one flipped byte in the middle: same size, same name
        return new Response(bytes);
      }
      return new Response(file);
    },
  });
  base = `http://127.0.0.1:${server.port}`;
}, 60_000);

afterAll(() => {
  server?.stop(true);
  if (work) rmSync(work, { recursive: true, force: true });
});

/**
 * A PATH holding only what install.sh may use (so a new dependency fails here first),
 * `sh` being dash; `without` leaves some out, `fakes` adds scripts (uname, id).
 */
function toolsDir(opts: { without?: string[]; fakes?: Record<string, string> } = {}): string {
  const dir = scratch("gpl-tools-");
  const tools = ["uname", "id", "mktemp", "rm", "mkdir", "cp", "chmod", "mv", "tar", "gzip", "awk", "cut", "grep", "sha256sum", "curl", "wget"];
  for (const name of tools) {
    if (opts.without?.includes(name) || opts.fakes?.[name]) continue;
    const found = Bun.which(name);
    if (found) symlinkSync(found, join(dir, name));
  }
  symlinkSync(SH, join(dir, "sh"));
  for (const [name, body] of Object.entries(opts.fakes ?? {})) {
    writeFileSync(join(dir, name), `#!${SH}\n${body}\n`);
    chmodSync(join(dir, name), 0o755);
  }
  return dir;
}

/** An ordinary user (uid 1000) even when the tests run as root, so the default folder is ~/.local/bin. */
const NOT_ROOT = { id: `if [ "$1" = -u ]; then echo 1000; else echo 'uid=1000(user) gid=1000(user)'; fi` };

function installerEnv(extra: Record<string, string>): Record<string, string> {
  return { SHELL: "/bin/bash", LANG: "C", ...extra };
}

function installSh(env: Record<string, string>) {
  return run([SH, join(ROOT, "install.sh")], { env, cwd: scratch("gpl-cwd-") });
}

// Skipped only where this machine is no release target (hostTarget() is null); CI is Linux x64, one, so there it runs.
test.skipIf(!HOST)("build-binaries: the host archive, SHASUMS256.txt, no build paths; an unreachable cross target is reported, not fatal", async () => {
  expect(build.code).toBe(0);
  expect(build.stderr).toContain(`built ${HOST}`);
  expect(build.stderr).toContain(`could not build ${CROSS}`);
  expect(build.stderr).toContain(`Cross-compiling needs Bun's ${CROSS} runtime`);

  const versionDir = join(releaseDir, VERSION);
  // The Ray plugin's wheel (integrations/ray) is a release asset too, with its digest, and holds the plugin.
  const wheel = readdirSync(versionDir).find((n) => /^gpulayer_ray-[\w.]+-py3-none-any\.whl$/.test(n));
  expect(readdirSync(versionDir).sort()).toEqual([ARCHIVE, "SHASUMS256.txt", "install.sh", wheel!].sort());
  const listed = await run(["python3", "-c", "import sys, zipfile; print(*zipfile.ZipFile(sys.argv[1]).namelist())", join(versionDir, wheel!)]);
  expect(listed.stdout.split(/\s+/)).toContain("gpulayer_ray/plugin.py");
  const sums = readFileSync(join(versionDir, "SHASUMS256.txt"), "utf8");
  expect(sums).toMatch(new RegExp(`^[0-9a-f]{64}  ${ARCHIVE.replaceAll(".", "\\.")}$`, "m"));
  expect(sums).not.toContain(CROSS);
  if (Bun.which("sha256sum")) {
    const check = await run(["sha256sum", "-c", "SHASUMS256.txt"], { cwd: versionDir });
    expect(check.stdout).toContain(`${ARCHIVE}: OK`);
    expect(check.stdout).toContain(`${wheel}: OK`);
    expect(check.code).toBe(0);
  }

  // The mirror layout install.sh reads (GitHub Releases' URLs) points at the version folder.
  expect(lstatSync(join(releaseDir, "download", `v${VERSION}`)).isSymbolicLink()).toBe(true);
  expect(realpathSync(join(releaseDir, "download", `v${VERSION}`))).toBe(realpathSync(versionDir));
  expect(realpathSync(join(releaseDir, "latest", "download"))).toBe(realpathSync(versionDir));

  // One file, `gpulayer`, executable.
  const list = await run(["tar", "-tvzf", join(versionDir, ARCHIVE)]);
  expect(list.code).toBe(0);
  const entries = list.stdout.trim().split("\n");
  expect(entries).toHaveLength(1);
  expect(entries[0]).toMatch(/^-rwxr-xr-x .* gpulayer$/);

  // Nothing of this machine's paths inside the binary (Bun embeds sources under /$bunfs/).
  const unpacked = scratch("gpl-unpack-");
  expect((await run(["tar", "-xzf", join(versionDir, ARCHIVE), "-C", unpacked])).code).toBe(0);
  const binary = readFileSync(join(unpacked, "gpulayer"));
  for (const path of [ROOT, releaseDir, work]) expect(binary.includes(path)).toBe(false);
  expect(binary.includes("/$bunfs/")).toBe(true);
  rmSync(unpacked, { recursive: true, force: true });
});

// Skipped only where this machine is no release target (hostTarget() is null); CI is Linux x64, one, so there it runs.
test.skipIf(!HOST)("build-binaries: usage errors exit 2; a release with nothing built, or --strict with a target missing, fails", async () => {
  const script = join(ROOT, "scripts/build-binaries.ts");
  const bogus = await run([BUN, "run", script, "--target", "linux-riscv64", "--out", join(work, "bogus")]);
  expect(bogus.code).toBe(2);
  expect(bogus.stderr).toContain('unknown target "linux-riscv64"');

  const onlyCross = await run([BUN, "run", script, "--target", CROSS, "--out", join(work, "cross-only")], { env: offlineEnv() });
  expect(onlyCross.code).toBe(1);
  expect(onlyCross.stderr).toContain(`could not build ${CROSS}`);

  const strict = await run([BUN, "run", script, "--strict", "--target", CROSS, "--out", join(work, "strict")], { env: offlineEnv() });
  expect(strict.code).toBe(1);
});

// Skipped only where this machine is no release target (hostTarget() is null); CI is Linux x64, one, so there it runs.
test.skipIf(!HOST)("build-binaries --local: one self-contained executable for this machine", async () => {
  const out = join(work, "local");
  const r = await run([BUN, "run", join(ROOT, "scripts/build-binaries.ts"), "--local", "--out", out]);
  expect(r.code).toBe(0);
  expect(readdirSync(out)).toEqual(["gpulayer"]);
  const v = await run([join(out, "gpulayer"), "version", "--json"], { env: { HOME: work, PATH: "/nonexistent" }, cwd: scratch("gpl-bare-") });
  expect(v.code).toBe(0);
  expect(JSON.parse(v.stdout)).toMatchObject({ version: VERSION, target: HOST });
});

// Skipped only where this machine is no release target or has no curl; CI (Linux x64) installs curl, so there it runs.
test.skipIf(!HOST || !HAS_CURL)(`curl | sh (dash) installs the latest release into ~/.local/bin, and it runs from a bare folder${HAS_CURL ? "" : " [skipped: curl is not installed]"}`, async () => {
  const home = scratch("gpl-home-");
  const tools = toolsDir({ without: ["wget"], fakes: NOT_ROOT });
  requests.length = 0;
  // The README's one-liner, with the base URL overridden (a trailing slash, too, which the installer drops).
  const r = await run([SH, "-c", `curl -fsSL "${base}/releases/latest/download/install.sh" | sh`], {
    env: installerEnv({ HOME: home, PATH: tools, GPULAYER_INSTALL_URL: `${base}/releases/` }),
    cwd: home,
  });
  expect(r.stderr).toBe("");
  expect(r.code).toBe(0);
  expect(r.stdout).toContain(`downloading gpulayer ${VERSION} for ${HOST}`);
  expect(r.stdout).toContain("matches SHASUMS256.txt");
  expect(r.stdout).toContain(`installed gpulayer ${VERSION} (`);
  // Not on PATH: says how, edits nothing.
  const bin = join(home, ".local", "bin");
  expect(r.stdout).toContain(`${bin} is not on your PATH`);
  expect(r.stdout).toContain(`echo 'export PATH="${bin}:$PATH"' >> ~/.bashrc`);
  expect(readdirSync(home).sort()).toEqual([".local"]);
  expect(readdirSync(bin)).toEqual(["gpulayer"]);
  expect(statSync(join(bin, "gpulayer")).mode & 0o777).toBe(0o755);
  expect(requests).toEqual([
    "/releases/latest/download/install.sh",
    "/releases/latest/download/SHASUMS256.txt",
    `/releases/download/v${VERSION}/${ARCHIVE}`,
  ]);

  // The installed binary alone: no node_modules, no sources, nothing on PATH, an empty HOME.
  const bare = scratch("gpl-bare-");
  const env = { HOME: scratch("gpl-emptyhome-"), PATH: "/nonexistent" };
  const human = await run([join(bin, "gpulayer"), "version"], { env, cwd: bare });
  expect(human.code).toBe(0);
  expect(human.stdout).toMatch(new RegExp(`^gpulayer ${VERSION.replaceAll(".", "\\.")} \\(([0-9a-f]{12}(-dirty)?|unknown), ${HOST}\\)\n$`));
  const json = await run([join(bin, "gpulayer"), "version", "--json"], { env, cwd: bare });
  expect(json.code).toBe(0);
  const info = JSON.parse(json.stdout) as { version: string; commit: string; target: string };
  expect(info.version).toBe(VERSION);
  expect(info.target).toBe(HOST!);
  expect(info.commit).not.toBe("dev");
  // Subcommands are loaded lazily (dynamic import): they must be inside the binary too.
  const help = await run([join(bin, "gpulayer"), "env", "--help"], { env, cwd: bare });
  expect(help.code).toBe(0);
  expect(help.stdout + help.stderr).toContain("prepare");
  expect(readdirSync(bare)).toEqual([]);
});

// Skipped only where this machine is no release target or has no wget; CI (Linux x64) installs wget, so there it runs.
test.skipIf(!HOST || !HAS_WGET)(`wget only, pinned GPULAYER_VERSION, GPULAYER_INSTALL_DIR on PATH: replaces the old binary, no PATH advice${HAS_WGET ? "" : " [skipped: wget is not installed; apt-get install wget]"}`, async () => {
  const home = scratch("gpl-home-");
  const dir = join(home, "tools bin"); // a space in the path, too
  mkdirSync(dir);
  writeFileSync(join(dir, "gpulayer"), "#!/bin/sh\necho old\n", { mode: 0o755 });
  const tools = toolsDir({ without: ["curl"], fakes: NOT_ROOT });
  requests.length = 0;
  const r = await installSh(installerEnv({ HOME: home, PATH: `${tools}:${dir}`, GPULAYER_INSTALL_URL: `${base}/releases`, GPULAYER_VERSION: `v${VERSION}`, GPULAYER_INSTALL_DIR: `${dir}/` }));
  expect(r.stderr).toBe("");
  expect(r.code).toBe(0);
  expect(r.stdout).toContain(`installed gpulayer ${VERSION} (`);
  expect(r.stdout).toContain(`at ${dir}/gpulayer`);
  expect(r.stdout).not.toContain("not on your PATH");
  expect(requests).toEqual([`/releases/download/v${VERSION}/SHASUMS256.txt`, `/releases/download/v${VERSION}/${ARCHIVE}`]);
  expect(readdirSync(dir)).toEqual(["gpulayer"]);
  const v = await run([join(dir, "gpulayer"), "version", "--json"], { env: { HOME: home, PATH: "/nonexistent" }, cwd: scratch("gpl-bare-") });
  expect(JSON.parse(v.stdout)).toMatchObject({ version: VERSION, target: HOST });
});

// Skipped only where this machine is no release target (hostTarget() is null); CI is Linux x64, one, so there it runs.
test.skipIf(!HOST)("a tampered archive is refused and nothing is installed or replaced", async () => {
  const home = scratch("gpl-home-");
  const dir = join(home, "bin");
  mkdirSync(dir);
  writeFileSync(join(dir, "gpulayer"), "#!/bin/sh\necho old\n", { mode: 0o755 });
  const r = await installSh(installerEnv({ HOME: home, PATH: toolsDir({ fakes: NOT_ROOT }), GPULAYER_INSTALL_URL: `${base}/tampered`, GPULAYER_INSTALL_DIR: dir }));
  expect(r.code).toBe(1);
  expect(r.stderr).toContain(`checksum mismatch for ${ARCHIVE}`);
  expect(r.stderr).toContain("nothing was installed");
  expect(r.stdout).not.toContain("installed gpulayer");
  expect(readdirSync(dir)).toEqual(["gpulayer"]);
  expect(readFileSync(join(dir, "gpulayer"), "utf8")).toBe("#!/bin/sh\necho old\n");
});

test("an unknown architecture or operating system gets a clear message before any download", async () => {
  const home = scratch("gpl-home-");
  requests.length = 0;
  const fakeUname = (os: string, machine: string) => ({ uname: `case "$1" in -s) echo ${os} ;; -m) echo ${machine} ;; *) echo ${os} ;; esac`, ...NOT_ROOT });
  const env = (tools: string) => installerEnv({ HOME: home, PATH: tools, GPULAYER_INSTALL_URL: `${base || "http://127.0.0.1:9"}/releases` });

  const arch = await installSh(env(toolsDir({ fakes: fakeUname("Linux", "riscv64") })));
  expect(arch.code).toBe(1);
  expect(arch.stderr).toContain("gpulayer-install: error: unsupported architecture: riscv64 (Linux)");
  expect(arch.stderr).toContain("x64 (x86_64) and arm64 (aarch64)");

  const os = await installSh(env(toolsDir({ fakes: fakeUname("FreeBSD", "amd64") })));
  expect(os.code).toBe(1);
  expect(os.stderr).toContain("gpulayer-install: error: unsupported operating system: FreeBSD");

  expect(requests).toEqual([]);
  expect(existsSync(join(home, ".local"))).toBe(false);
});

// Skipped only where this machine is no release target (hostTarget() is null); CI is Linux x64, one, so there it runs.
test.skipIf(!HOST)("a version that does not exist, and a machine with neither curl nor wget, fail clearly", async () => {
  const home = scratch("gpl-home-");
  // A 404 is a release that is not there, said as such, with curl and with wget; any other failure is a download that failed.
  const fetchers = [...(HAS_CURL ? [["wget"]] : []), ...(HAS_WGET ? [["curl"]] : [])];
  for (const without of fetchers) {
    const tools = toolsDir({ without, fakes: NOT_ROOT });
    const missing = await installSh(installerEnv({ HOME: home, PATH: tools, GPULAYER_INSTALL_URL: `${base}/releases`, GPULAYER_VERSION: "9.9.9" }));
    expect([without, missing.code, missing.stderr]).toEqual([without, 1, `gpulayer-install: error: there is no release 9.9.9 (${base}/releases/download/v9.9.9/SHASUMS256.txt is not there; the releases: ${base}/releases)\n`]);
    const none = await installSh(installerEnv({ HOME: home, PATH: tools, GPULAYER_INSTALL_URL: `${base}/empty` }));
    expect([without, none.code, none.stderr]).toEqual([without, 1, `gpulayer-install: error: there is no release at ${base}/empty yet (${base}/empty/latest/download/SHASUMS256.txt is not there)\n`]);
    const down = await installSh(installerEnv({ HOME: home, PATH: tools, GPULAYER_INSTALL_URL: `${base}/broken`, GPULAYER_VERSION: "9.9.9" }));
    expect([without, down.code]).toEqual([without, 1]);
    expect(down.stderr).toContain(`gpulayer-install: error: could not download ${base}/broken/download/v9.9.9/SHASUMS256.txt`);
    expect(down.stderr).not.toContain("there is no release");
  }

  const bad = await installSh(installerEnv({ HOME: home, PATH: toolsDir({ fakes: NOT_ROOT }), GPULAYER_VERSION: "1.0; rm -rf /" }));
  expect(bad.code).toBe(1);
  expect(bad.stderr).toContain("GPULAYER_VERSION must look like 0.1.0");

  const noFetcher = await installSh(installerEnv({ HOME: home, PATH: toolsDir({ without: ["curl", "wget"], fakes: NOT_ROOT }), GPULAYER_INSTALL_URL: `${base}/releases` }));
  expect(noFetcher.code).toBe(1);
  expect(noFetcher.stderr).toContain("need curl or wget");
  expect(existsSync(join(home, ".local"))).toBe(false);
});

// Skipped only without shellcheck; CI installs it (.ci/run), so there it runs.
test.skipIf(!HAS_SHELLCHECK)(`install.sh is POSIX sh and shellcheck-clean${HAS_SHELLCHECK ? "" : " [skipped: shellcheck is not installed]"}`, async () => {
  const r = await run(["shellcheck", "--shell=sh", "--severity=style", join(ROOT, "install.sh")]);
  expect(r.stdout + r.stderr).toBe("");
  expect(r.code).toBe(0);
});
