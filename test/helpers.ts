import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { pgProgram } from "./fixtures/postgres.ts";

export const ROOT = resolve(import.meta.dir, "..");
/** How the tests start gpulayer: the built binary (GPULAYER_TEST_BIN) or bun on src/cli.ts. */
export const CLI_ARGV: string[] = process.env.GPULAYER_TEST_BIN ? [resolve(process.env.GPULAYER_TEST_BIN)] : [process.execPath, join(ROOT, "src", "cli.ts")];

/** Whether the servers the tests start keep their state in PostgreSQL (the cluster tests' second run in CI). */
export const serversOnPostgres = Boolean(process.env.GPULAYER_TEST_SERVER_DATABASE);

/**
 * Everything a server's database holds, as text, for tests that look for
 * what must never be kept: the SQLite file and its log, or a dump of the
 * PostgreSQL database (pg_dump, data and schema).
 */
export function serverDatabaseText(env: Record<string, string>, serverHome: string): string {
  if (!env.GPULAYER_DATABASE) return readFileSync(join(serverHome, "server", "server.db"), "latin1") + readFileSync(join(serverHome, "server", "server.db-wal"), "latin1");
  const dump = Bun.spawnSync([pgProgram("pg_dump"), env.GPULAYER_DATABASE], { stdout: "pipe", stderr: "pipe" });
  if (dump.exitCode !== 0) throw new Error(`pg_dump: ${dump.stderr.toString()}`);
  return dump.stdout.toString("latin1");
}

/** Every folder tempDir made in this run: test/preload.ts removes them when the whole run ends. */
const madeDirs: string[] = [];

/**
 * A new folder under the system's temporary folder, removed when the whole
 * test run ends (not when its file does: fixtures shared across files keep
 * theirs). GPULAYER_TEST_KEEP=1 keeps them, to look into after a failure.
 */
export function tempDir(prefix = "gpl-"): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  madeDirs.push(dir);
  return dir;
}

export function removeTempDirs(): void {
  if (process.env.GPULAYER_TEST_KEEP) return;
  for (const dir of madeDirs.splice(0)) {
    try {
      rmSync(dir, { recursive: true, force: true });
    } catch (error) {
      console.warn(`could not remove ${dir}: ${(error as Error).message}`); // a mount left by a test: told, not a failure of the run
    }
  }
}

/** An isolated world for one test: its own gpulayer home and pip/uv caches, and none of the machine's pip config. */
export function sandbox(): { root: string; home: string; env: Record<string, string>; cleanup(): void } {
  const root = tempDir();
  const home = join(root, "home");
  mkdirSync(home);
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (v !== undefined && !k.startsWith("PIP_") && !k.startsWith("UV_") && !k.startsWith("GPULAYER_")) env[k] = v;
  // The cluster tests again on PostgreSQL (.ci/run): every server a test starts keeps its state in a database of its own there.
  const pg = process.env.GPULAYER_TEST_SERVER_DATABASE;
  if (pg) {
    const name = `sandbox_${root.replace(/[^A-Za-z0-9]/g, "_").toLowerCase()}`;
    const made = Bun.spawnSync([pgProgram("psql"), pg, "-qc", `CREATE DATABASE ${name}`], { stdout: "pipe", stderr: "pipe" });
    if (made.exitCode !== 0) throw new Error(`GPULAYER_TEST_SERVER_DATABASE: ${made.stderr.toString()}`);
    const url = new URL(pg);
    url.pathname = `/${name}`;
    env.GPULAYER_DATABASE = url.toString();
  }
  Object.assign(env, {
    GPULAYER_HOME: home,
    PIP_CACHE_DIR: join(root, "pip-cache"),
    UV_CACHE_DIR: join(root, "uv-cache"),
    PIP_CONFIG_FILE: "/dev/null",
    NO_COLOR: "1",
  });
  return { root, home, env, cleanup: () => rmSync(root, { recursive: true, force: true }) };
}

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Run gpulayer as a whole process (never spawnSync: the test's own index server must keep answering). */
export async function cli(args: string[], opts: { env: Record<string, string>; cwd?: string }): Promise<CliResult> {
  const proc = Bun.spawn([...CLI_ARGV, ...args], { env: opts.env, cwd: opts.cwd, stdout: "pipe", stderr: "pipe", stdin: "ignore" });
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  return { code, stdout, stderr };
}

/** Start gpulayer and return the process; `detached` makes it lead its own process group (to SIGKILL it with its children). */
export function startCli(args: string[], opts: { env: Record<string, string>; cwd?: string; detached?: boolean }) {
  return Bun.spawn([...CLI_ARGV, ...args], { env: opts.env, cwd: opts.cwd, stdout: "pipe", stderr: "pipe", stdin: "ignore", detached: opts.detached });
}

export async function run(argv: string[], opts: { env?: Record<string, string>; cwd?: string } = {}): Promise<CliResult> {
  const proc = Bun.spawn(argv, { env: opts.env ?? (process.env as Record<string, string>), cwd: opts.cwd, stdout: "pipe", stderr: "pipe" });
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  return { code, stdout, stderr };
}

export const HAS_UV = Boolean(Bun.which("uv"));

let pipWheelPath: string | undefined;
/** The pip wheel bundled with python3 (ensurepip): pip for venvs that have none, offline. */
export async function bundledPipWheel(): Promise<string> {
  pipWheelPath ??= (await run(["python3", "-c", "import ensurepip,os,glob;print(glob.glob(os.path.join(os.path.dirname(ensurepip.__file__),'_bundled','pip-*.whl'))[0])"])).stdout.trim();
  return pipWheelPath;
}

/** `pip install` into a venv with the bundled pip, offline: the worker's set changes under gpulayer. */
export async function pipInstall(python: string, args: string[], env: Record<string, string>): Promise<void> {
  const r = await run([python, join(await bundledPipWheel(), "pip"), "install", "--no-index", "--disable-pip-version-check", ...args], { env });
  if (r.code !== 0) throw new Error(r.stderr + r.stdout);
}

/** Keys of the entries that carry a ready marker. */
export function readyKeys(home: string): string[] {
  const envs = join(home, "envs-v1");
  if (!existsSync(envs)) return [];
  return readdirSync(envs).filter((k) => existsSync(join(envs, k, ".gpulayer", "ready")));
}

/**
 * A worker virtualenv (like /opt/venv on a GPU box). Made with uv when present
 * (fast); `withPip` seeds pip into it so the ADR path (worker's pip through the
 * .pth) is the one exercised.
 */
export async function makeWorkerVenv(dir: string, opts: { withPip?: boolean; packages?: string[]; findLinks?: string; editable?: string; env: Record<string, string> }): Promise<string> {
  const env = { ...opts.env };
  if (HAS_UV) {
    const r = await run(["uv", "venv", "--no-config", "--quiet", "--python", "python3", dir], { env });
    if (r.code !== 0) throw new Error(r.stderr);
  } else {
    const r = await run(["python3", "-m", "venv", "--without-pip", dir], { env });
    if (r.code !== 0) throw new Error(r.stderr);
  }
  const py = join(dir, "bin", "python");
  const pipWheel = await bundledPipWheel();
  const pip = [py, join(pipWheel, "pip")];
  if (opts.withPip) {
    const r = await run([...pip, "install", "--no-index", pipWheel], { env });
    if (r.code !== 0) throw new Error(r.stderr + r.stdout);
  }
  if (opts.packages?.length) {
    const r = await run([...pip, "install", "--no-index", "--find-links", opts.findLinks!, ...opts.packages], { env });
    if (r.code !== 0) throw new Error(r.stderr + r.stdout);
  }
  if (opts.editable) {
    const r = await run([...pip, "install", "--no-index", "--no-build-isolation", "-e", opts.editable], { env });
    if (r.code !== 0) throw new Error(r.stderr + r.stdout);
  }
  return py;
}

/** The uv binary itself, not a pyenv shim (a shim needs pyenv and its own PYENV_VERSION to run). */
export function realUv(): string | null {
  const found = Bun.which("uv");
  if (!found) return null;
  if (readFileSync(found).subarray(0, 2).toString() !== "#!") return realpathSync(found);
  const real = Bun.spawnSync(["pyenv", "which", "uv"], { stdout: "pipe", stderr: "ignore" }).stdout.toString().trim();
  return real || null;
}
