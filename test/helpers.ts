import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

export const ROOT = resolve(import.meta.dir, "..");
/** How the tests start gpulayer: the built binary (GPULAYER_TEST_BIN) or bun on src/cli.ts. */
export const CLI_ARGV: string[] = process.env.GPULAYER_TEST_BIN ? [resolve(process.env.GPULAYER_TEST_BIN)] : [process.execPath, join(ROOT, "src", "cli.ts")];

export function tempDir(prefix = "gpl-"): string {
  return mkdtempSync(join(tmpdir(), prefix));
}

/** An isolated world for one test: its own gpulayer home and pip/uv caches, and none of the machine's pip config. */
export function sandbox(): { root: string; home: string; env: Record<string, string>; cleanup(): void } {
  const root = tempDir();
  const home = join(root, "home");
  mkdirSync(home);
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (v !== undefined && !k.startsWith("PIP_") && !k.startsWith("UV_") && !k.startsWith("GPULAYER_")) env[k] = v;
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
