#!/usr/bin/env bun
/**
 * Build gpulayer as standalone executables (`bun build --compile`): no Bun,
 * Node or node_modules needed where it runs.
 *
 *   bun run scripts/build-binaries.ts --local   one executable for this machine: dist/gpulayer
 *   bun run scripts/build-binaries.ts           a release, all targets, into release/:
 *
 *     release/<version>/gpulayer-<version>-<target>.tar.gz   (each holds the single file `gpulayer`)
 *     release/<version>/install.sh                          (the installer, a release asset too)
 *     release/<version>/gpulayer_ray-<v>-py3-none-any.whl   (the Ray plugin, integrations/ray; needs python3 here)
 *     release/<version>/SHASUMS256.txt                      (`sha256sum -c SHASUMS256.txt` checks them all)
 *     release/download/v<version> -> ../<version>           these two symlinks make release/ a mirror
 *     release/latest/download     -> ../<version>           with GitHub Releases' URL scheme (see install.sh)
 *
 * The files in release/<version>/ are the assets of the GitHub release tagged v<version>.
 *
 * Options:
 *   --target T[,T...]   only these targets (repeatable): linux-x64 linux-arm64 darwin-arm64 darwin-x64
 *   --out DIR           write there instead of dist/ (--local) or release/
 *   --strict            fail when any target fails (by default only the host target's failure is fatal:
 *                       cross targets need Bun to download that platform's runtime, which may be offline)
 *
 * The version comes from package.json, the commit from git (GPULAYER_COMMIT overrides, for builds
 * outside a checkout); archive timestamps from SOURCE_DATE_EPOCH, else the commit's time.
 */
import { parseArgs } from "node:util";
import { copyFileSync, createReadStream, createWriteStream, existsSync, lstatSync, unlinkSync, mkdirSync, readFileSync, renameSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { join, relative, resolve } from "node:path";
import { pipeline } from "node:stream/promises";
import { createGzip, constants as zlibConstants } from "node:zlib";

export const TARGETS = ["linux-x64", "linux-arm64", "darwin-arm64", "darwin-x64"] as const;
export type Target = (typeof TARGETS)[number];

const ROOT = resolve(import.meta.dir, "..");
const ENTRY = "./src/cli.ts";

class UsageError extends Error {}

function isTarget(s: string): s is Target {
  return (TARGETS as readonly string[]).includes(s);
}

/** This machine's target name, or undefined where no release binary exists for it (Windows, FreeBSD, ...). */
export function hostTarget(): Target | undefined {
  const os = process.platform === "linux" ? "linux" : process.platform === "darwin" ? "darwin" : undefined;
  const arch = process.arch === "x64" ? "x64" : process.arch === "arm64" ? "arm64" : undefined;
  if (!os || !arch) return undefined;
  const t = `${os}-${arch}`;
  return isTarget(t) ? t : undefined;
}

function git(args: string[]): string | undefined {
  try {
    const r = Bun.spawnSync(["git", "-C", ROOT, ...args], { stdout: "pipe", stderr: "ignore" });
    return r.exitCode === 0 ? r.stdout.toString().trim() : undefined;
  } catch {
    return undefined; // no git on this machine
  }
}

function readVersion(): string {
  const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { version?: unknown };
  const v = pkg.version;
  // install.sh and archive names rely on this alphabet (no spaces, slashes or '+').
  if (typeof v !== "string" || !/^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$/.test(v)) {
    throw new Error(`package.json "version" must look like 1.2.3 or 1.2.3-rc.1, got ${JSON.stringify(v)}`);
  }
  return v;
}

function readCommit(): string {
  if (process.env.GPULAYER_COMMIT) return process.env.GPULAYER_COMMIT;
  const sha = git(["rev-parse", "--short=12", "HEAD"]);
  if (!sha) return "unknown";
  const dirty = git(["status", "--porcelain", "--untracked-files=no"]);
  return dirty ? `${sha}-dirty` : sha;
}

function sourceDateEpoch(): number {
  const env = Number(process.env.SOURCE_DATE_EPOCH);
  if (Number.isInteger(env) && env > 0) return env;
  const t = Number(git(["log", "-1", "--format=%ct"]));
  return Number.isInteger(t) && t > 0 ? t : 0;
}

interface BuildInfo {
  version: string;
  commit: string;
}

/** One `bun build --compile`; resolves to undefined on success, else the reason (Bun's own last lines). */
async function compile(target: Target, outfile: string, info: BuildInfo, cross: boolean): Promise<string | undefined> {
  const argv = [
    process.execPath,
    "build",
    ENTRY,
    "--compile",
    // Without --target Bun embeds its own running binary: the fastest local build, no download.
    ...(cross ? [`--target=bun-${target}`] : []),
    "--minify",
    // Bytecode roughly thirds startup (~30 ms to ~10 ms for `gpulayer version`); it needs ESM
    // output here because cli.ts uses top-level await (Bun's bytecode default is CJS).
    "--bytecode",
    "--format=esm",
    // JIT thresholds 50x: a command's start-up code runs once, and compiling it costs a warm `env prepare` ~0.8 ms of
    // CPU and ~0.2 ms here. The server and workers reset the normal policy (src/core/jit-policy.ts).
    "--compile-jit-policy=50",
    // Lazy subcommands become their own chunks: a warm `env prepare` parses only what it runs.
    "--splitting",
    "--sourcemap=none",
    "--no-compile-autoload-dotenv",
    "--no-compile-autoload-bunfig",
    "--no-compile-autoload-tsconfig",
    "--no-compile-autoload-package-json",
    // The contract of src/version.ts: JSON string literals.
    `--define=GPULAYER_VERSION=${JSON.stringify(info.version)}`,
    `--define=GPULAYER_COMMIT=${JSON.stringify(info.commit)}`,
    `--define=GPULAYER_TARGET=${JSON.stringify(target)}`,
    `--outfile=${outfile}`,
  ];
  const proc = Bun.spawn(argv, { cwd: ROOT, stdout: "pipe", stderr: "pipe", stdin: "ignore" });
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  if (code === 0 && existsSync(outfile)) return undefined;
  const lines = `${err}\n${out}`.split("\n").map((l) => l.trim()).filter(Boolean);
  return lines.slice(-6).join("\n") || `bun build exited with ${code}`;
}

/** Refuse a binary that carries this checkout's paths (sources must be embedded under /$bunfs/ only). */
function leakedPaths(file: string): string[] {
  const data = readFileSync(file);
  const needles = [join(ROOT, "src") + "/", join(ROOT, "node_modules") + "/", join(ROOT, "package.json")];
  return needles.filter((n) => data.includes(n));
}

function octal(n: number, width: number): string {
  return n.toString(8).padStart(width - 1, "0") + "\0";
}

/** A POSIX ustar header for one regular file: no owner names, uid/gid 0, a fixed mtime (reproducible archives). */
function tarHeader(name: string, size: number, mode: number, mtime: number): Uint8Array {
  const h = new Uint8Array(512);
  const put = (offset: number, s: string) => h.set(new TextEncoder().encode(s), offset);
  put(0, name);
  put(100, octal(mode, 8));
  put(108, octal(0, 8));
  put(116, octal(0, 8));
  put(124, octal(size, 12));
  put(136, octal(mtime, 12));
  put(148, "        "); // checksum counts as spaces while summing
  put(156, "0"); // regular file
  put(257, "ustar\0");
  put(263, "00");
  let sum = 0;
  for (const b of h) sum += b;
  put(148, sum.toString(8).padStart(6, "0") + "\0 ");
  return h;
}

/** `gpulayer-<v>-<t>.tar.gz` holding the single file `gpulayer` (mode 755), streamed: a binary is ~100 MB. */
async function writeTarGz(binary: string, dest: string, mtime: number): Promise<void> {
  const size = statSync(binary).size;
  if (size >= 8 ** 11) throw new Error(`${binary} is too large for a ustar archive`);
  async function* tarStream() {
    yield tarHeader("gpulayer", size, 0o755, mtime);
    for await (const chunk of createReadStream(binary, { highWaterMark: 1 << 20 })) yield chunk as Buffer;
    const pad = (512 - (size % 512)) % 512;
    yield new Uint8Array(pad + 1024); // pad the file to a block, then two zero blocks end the archive
  }
  const tmp = `${dest}.partial`;
  await pipeline(tarStream, createGzip({ level: zlibConstants.Z_BEST_COMPRESSION }), createWriteStream(tmp));
  renameSync(tmp, dest);
}

async function sha256File(file: string): Promise<string> {
  const hasher = new Bun.CryptoHasher("sha256");
  for await (const chunk of createReadStream(file, { highWaterMark: 1 << 20 })) hasher.update(chunk as Buffer);
  return hasher.digest("hex");
}

/** A path as the user would type it: relative to the current folder when inside it. */
function display(path: string): string {
  const rel = relative(process.cwd(), path);
  return rel && !rel.startsWith("..") ? rel : path;
}

function mb(bytes: number): string {
  return `${(bytes / 1e6).toFixed(1)} MB`;
}

function seconds(since: number): string {
  return `${((performance.now() - since) / 1000).toFixed(1)}s`;
}

function replaceSymlink(target: string, path: string): void {
  // Unlink an old link itself; never recurse through it into the version folder it points at.
  if (lstatSync(path, { throwIfNoEntry: false })?.isSymbolicLink()) unlinkSync(path);
  else rmSync(path, { recursive: true, force: true });
  mkdirSync(join(path, ".."), { recursive: true });
  symlinkSync(target, path);
}

async function buildLocal(outDir: string, info: BuildInfo): Promise<number> {
  const target = hostTarget();
  if (!target) {
    console.error(`error: no gpulayer build for ${process.platform}-${process.arch} (supported: ${TARGETS.join(", ")})`);
    return 1;
  }
  mkdirSync(outDir, { recursive: true });
  const dest = join(outDir, "gpulayer");
  // Compile beside the destination, then rename: replacing a running binary in place fails (ETXTBSY).
  const tmp = join(outDir, `.gpulayer.${process.pid}.tmp`);
  const started = performance.now();
  const failure = await compile(target, tmp, info, false);
  if (failure) {
    rmSync(tmp, { force: true });
    console.error(`error: building ${target} failed:\n${failure}`);
    return 1;
  }
  const leaks = leakedPaths(tmp);
  if (leaks.length) {
    rmSync(tmp, { force: true });
    console.error(`error: the ${target} binary contains build paths (${leaks.join(", ")})`);
    return 1;
  }
  renameSync(tmp, dest);
  console.error(`built ${display(dest)} (gpulayer ${info.version}, ${info.commit}, ${target}, ${mb(statSync(dest).size)}) in ${seconds(started)}`);
  return 0;
}

/**
 * integrations/ray as a wheel, a release asset beside the binaries: built by its own in-tree
 * backend (offline, byte for byte the same from the same sources) with this machine's python3.
 */
function rayPluginWheel(versionDir: string): string | { why: string } {
  const code = "import sys; sys.path.insert(0, sys.argv[1]); import _build; print(_build.build_wheel(sys.argv[2]))";
  try {
    const r = Bun.spawnSync(["python3", "-c", code, join(ROOT, "integrations", "ray"), versionDir], { stdout: "pipe", stderr: "pipe" });
    if (r.exitCode !== 0) return { why: r.stderr.toString().trim().split("\n").at(-1) ?? `python3 exited ${r.exitCode}` };
    return r.stdout.toString().trim();
  } catch {
    return { why: "no python3 here" };
  }
}

async function buildRelease(outDir: string, targets: Target[], info: BuildInfo, strict: boolean): Promise<number> {
  const host = hostTarget();
  const versionDir = join(outDir, info.version);
  // SHASUMS256.txt must describe exactly what is in the folder: start it afresh.
  rmSync(versionDir, { recursive: true, force: true });
  mkdirSync(versionDir, { recursive: true });
  const staging = join(outDir, `.staging-${process.pid}`);
  mkdirSync(staging, { recursive: true });
  const mtime = sourceDateEpoch();

  const built: { target: Target; archive: string }[] = [];
  const failed: { target: Target; reason: string }[] = [];
  let pluginMissing = false;
  const packing: Promise<void>[] = [];
  try {
    // Compile one at a time (each is short), and compress the previous ones meanwhile (gzip -9 takes seconds).
    for (const target of targets) {
      const started = performance.now();
      const binary = join(staging, target, "gpulayer");
      mkdirSync(join(staging, target), { recursive: true });
      const failure = await compile(target, binary, info, target !== host);
      if (failure) {
        let reason = failure;
        if (target !== host) {
          const runtime = `bun-${target.replace("arm64", "aarch64")}`;
          reason +=
            `\nCross-compiling needs Bun's ${target} runtime (${runtime}-v${Bun.version}), which Bun downloads once` +
            ` (npm package @oven/${runtime}) into its install cache; build where that download works, or on a ${target} machine.`;
        }
        failed.push({ target, reason });
        console.error(`error: could not build ${target}:\n  ${reason.replaceAll("\n", "\n  ")}`);
        continue;
      }
      const leaks = leakedPaths(binary);
      if (leaks.length) {
        failed.push({ target, reason: `the binary contains build paths: ${leaks.join(", ")}` });
        console.error(`error: the ${target} binary contains build paths (${leaks.join(", ")}); not packing it`);
        continue;
      }
      const name = `gpulayer-${info.version}-${target}.tar.gz`;
      const archive = join(versionDir, name);
      const size = statSync(binary).size;
      packing.push(
        writeTarGz(binary, archive, mtime).then(() => {
          built.push({ target, archive: name });
          console.error(`built ${target}: ${mb(size)}, packed ${name} (${mb(statSync(archive).size)}) in ${seconds(started)}`);
        }),
      );
    }
    await Promise.all(packing);
  } finally {
    rmSync(staging, { recursive: true, force: true });
  }

  if (built.length) {
    // The installer is a release asset too: <releases>/latest/download/install.sh is the one-liner's URL.
    copyFileSync(join(ROOT, "install.sh"), join(versionDir, "install.sh"));
    const plugin = rayPluginWheel(versionDir);
    if (typeof plugin !== "string") {
      pluginMissing = true;
      console.error(`not built: the Ray plugin's wheel (${plugin.why})`);
    }
    const names = [...built.map((b) => b.archive), "install.sh", ...(typeof plugin === "string" ? [plugin] : [])].sort();
    const lines: string[] = [];
    for (const name of names) lines.push(`${await sha256File(join(versionDir, name))}  ${name}`);
    writeFileSync(join(versionDir, "SHASUMS256.txt"), `${lines.join("\n")}\n`);
    replaceSymlink(join("..", info.version), join(outDir, "download", `v${info.version}`));
    replaceSymlink(join("..", info.version), join(outDir, "latest", "download"));
    console.error(`release ${info.version} (${info.commit}): ${built.length} archive(s) and SHASUMS256.txt in ${display(versionDir)}`);
  }
  if (failed.length) console.error(`not built: ${failed.map((f) => f.target).join(", ")}`);

  const hostFailed = failed.some((f) => f.target === host);
  if (!built.length || hostFailed || (strict && (failed.length || pluginMissing))) return 1;
  return 0;
}

async function main(argv: string[]): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        local: { type: "boolean", default: false },
        target: { type: "string", multiple: true },
        out: { type: "string" },
        strict: { type: "boolean", default: false },
        help: { type: "boolean", short: "h", default: false },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (error) {
    console.error(`error: ${(error as Error).message}`);
    return 2;
  }
  if (values.help) {
    console.log("usage: bun run scripts/build-binaries.ts [--local] [--target T[,T...]]... [--out DIR] [--strict]");
    console.log(`targets: ${TARGETS.join(", ")}`);
    return 0;
  }
  try {
    const requested = (values.target ?? []).flatMap((t) => t.split(",")).map((t) => t.trim()).filter(Boolean);
    for (const t of requested) if (!isTarget(t)) throw new UsageError(`unknown target ${JSON.stringify(t)} (known: ${TARGETS.join(", ")})`);
    if (values.local && requested.length) throw new UsageError("--local builds for this machine only; leave out --target");
    const info = { version: readVersion(), commit: readCommit() };
    if (values.local) return await buildLocal(resolve(values.out ?? join(ROOT, "dist")), info);
    const targets = requested.length ? [...new Set(requested as Target[])] : [...TARGETS];
    return await buildRelease(resolve(values.out ?? join(ROOT, "release")), targets, info, values.strict);
  } catch (error) {
    console.error(`error: ${(error as Error).message}`);
    return error instanceof UsageError ? 2 : 1;
  }
}

if (import.meta.main) process.exitCode = await main(process.argv.slice(2));
