import { accessSync, chmodSync, constants, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { writeFileAtomic } from "../../core/atomic.ts";
import { contentHash } from "../../core/hashing.ts";
import type { BuildPlan } from "./build-plan.ts";
import { installedSet } from "../request/interpreter.ts";
import { installerMessage, runTool } from "./run-tool.ts";
import { resolveToolShim } from "../request/shims.ts";
import { definedOnly } from "../../core/defined-env.ts";

/**
 * The uv a build uses, by the `uv` setting: off, none; a path, that one;
 * auto, uv on PATH, else a pinned uv that gpulayer installs once into its
 * tools folder: pip (the build's interpreter's) downloads the official wheel
 * from the request's index when it names one, and from the index the
 * machine's pip configuration names (its mirror, certificates, credentials)
 * when it names none or that one has no uv; its sha256 is checked against
 * the table below before anything is unpacked, and only the `uv` binary is kept.
 */

/** The uv gpulayer installs when none is on PATH. */
export const UV_VERSION = "0.13.9";

/**
 * sha256 of uv 0.13.9's official Linux and macOS wheels, as PyPI lists them
 * (https://pypi.org/pypi/uv/json, releases["0.13.9"]). Written here, never
 * fetched: a wheel whose hash is not its entry's is refused.
 */
export const UV_WHEEL_SHA256: Readonly<Record<string, string>> = {
  "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl": "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",
  "uv-0.13.9-py3-none-musllinux_1_1_x86_64.whl": "2c45530751517d6c3bbc69a19473f6effe47cce047bede01ffd8af7ea7b36b25",
  "uv-0.13.9-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl": "5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe",
  "uv-0.13.9-py3-none-manylinux_2_28_aarch64.whl": "ecb6028d79dc96fbeafffe5c8af62a7099487ebc05a701e76714eebcffd06375",
  "uv-0.13.9-py3-none-macosx_10_12_x86_64.whl": "c16ed11e013557536b3e60065f1b912f6407bd6518e041b961e23ef9e6b4fbf5",
  "uv-0.13.9-py3-none-macosx_11_0_arm64.whl": "66c512266d633bef48384a1f53003f41f2a8e7b36fe6e7fbfd3e0fd52d96fa63",
};

/** The uv to use, or why there is none (what the build says when pip builds instead). */
export type UvFound = { path: string; reason: null } | { path: null; reason: string };

type UvPlan = Pick<BuildPlan, "uv" | "env" | "toolsDir" | "interpreter" | "inputs" | "isolated" | "installer" | "venvCreator" | "cwd" | "signal">;

const NOT_ON_PATH = "uv is not on PATH";
const OWN_UV = "set GPULAYER_UV=/path/to/uv to use a uv of your own, or GPULAYER_UV=off to build without uv";

/** Where the pinned uv lives once installed. */
export function pinnedUvPath(toolsDir: string): string {
  return join(toolsDir, `uv-${UV_VERSION}`, "uv");
}

// One answer per build (build.ts asks twice), and one install at a time per tools folder in this process.
const perPlan = new WeakMap<object, Promise<UvFound>>();
const installing = new Map<string, Promise<UvFound>>();

/**
 * `env`: the environment pip gets on the pip path (build.ts installerEnv):
 * the machine's pip config, or, for an isolated request, its index as
 * PIP_INDEX_URL. Without it, plan.env as it is.
 */
export function findUv(plan: UvPlan, env?: Record<string, string>): Promise<UvFound> {
  let found = perPlan.get(plan);
  if (!found) {
    found = lookUp(plan, env ?? definedOnly(plan.env));
    perPlan.set(plan, found);
  }
  return found;
}

async function lookUp(plan: UvPlan, env: Record<string, string>): Promise<UvFound> {
  const setting = plan.uv ?? "auto";
  if (setting === "off") return { path: null, reason: "the uv setting is off (GPULAYER_UV=off)" };
  if (setting !== "auto") return ownUv(plan, setting);
  const onPath = Bun.which("uv", { PATH: plan.env.PATH ?? "" });
  const resolved = onPath ? resolveToolShim(onPath, plan.env, plan.cwd) : null;
  if (typeof resolved === "string") return { path: resolved, reason: null };
  // A pyenv shim for a uv that the Python version pyenv picks here lacks: as good as none on PATH.
  const pinned = pinnedUvPath(plan.toolsDir);
  if (isExecutable(pinned)) return { path: pinned, reason: null };
  // Nothing of this build would run uv: no download for it.
  if (plan.installer === "pip" && plan.venvCreator === "venv") return { path: null, reason: NOT_ON_PATH };
  // Builds that would ask pip the same thing share one download; another index or pip config asks on its own.
  const pipVariables = (e: Record<string, string | undefined>) => Object.entries(e).filter(([k]) => k.startsWith("PIP_")).sort();
  const asked = JSON.stringify([plan.toolsDir, plan.interpreter.path, pipVariables(env), plan.isolated ? pipVariables(plan.env) : []]);
  // A failed install is remembered for an hour (per index and pip configuration): a box without network
  // does not pay a pip download at every cold build.
  const failedFile = join(plan.toolsDir, `uv-${UV_VERSION}.failed.json`);
  const before = recentFailure(failedFile, asked);
  if (before) return { path: null, reason: before };
  let running = installing.get(asked);
  if (!running) {
    running = installPinned(plan, env)
      .then((found) => {
        if (found.path === null && !plan.signal?.aborted) rememberFailure(failedFile, asked, found.reason);
        return found;
      })
      .finally(() => installing.delete(asked));
    installing.set(asked, running);
  }
  return running;
}

const RETRY_AFTER_MS = 3_600_000;

function recentFailure(file: string, asked: string): string | null {
  try {
    const f = JSON.parse(readFileSync(file, "utf8")) as { at: number; asked: string; reason: string };
    const ago = Date.now() - f.at;
    if (f.asked !== asked || ago > RETRY_AFTER_MS || ago < 0) return null;
    return `${f.reason} (${Math.round(ago / 60_000)} min ago; tried again an hour after, or remove ${file})`;
  } catch {
    return null;
  }
}

function rememberFailure(file: string, asked: string, reason: string): void {
  try {
    mkdirSync(dirname(file), { recursive: true });
    writeFileAtomic(file, JSON.stringify({ at: Date.now(), asked, reason }));
  } catch {
    // only saves the next build a download
  }
}

/** A uv the setting names: a path (relative to the working directory), or a name looked up on PATH. */
function ownUv(plan: UvPlan, setting: string): UvFound {
  const path = setting.includes("/") ? resolve(plan.cwd, setting) : Bun.which(setting, { PATH: plan.env.PATH ?? "" });
  if (path && isExecutable(path)) {
    const resolved = resolveToolShim(path, plan.env, plan.cwd);
    if (typeof resolved === "string") return { path: resolved, reason: null };
    return { path: null, reason: `the uv setting names ${setting}, a pyenv shim, and the Python version pyenv picks here (${resolved.absent}) has no uv` };
  }
  return { path: null, reason: `the uv setting names ${setting}, which is not an executable file` };
}

function isExecutable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return statSync(path).isFile();
  } catch {
    return false;
  }
}

/** The table's entry for a wheel file: the same name, else the one that shares a platform tag with it. */
export function pinnedWheelFor(file: string): { name: string; sha256: string } | null {
  if (UV_WHEEL_SHA256[file]) return { name: file, sha256: UV_WHEEL_SHA256[file] };
  const tags = (name: string) => name.replace(/\.whl$/, "").split("-").at(-1)!.split(".");
  const want = new Set(tags(file));
  const entry = Object.entries(UV_WHEEL_SHA256).find(([name]) => tags(name).some((t) => want.has(t)));
  return entry ? { name: entry[0], sha256: entry[1] } : null;
}

/**
 * pip's environment for the download: the pip path's, and, for a request
 * whose files name an index (-i, --extra-index-url, --find-links,
 * --no-index), those too, as variables (credentials stay out of `ps`).
 * Any index will do: the wheel's hash is checked, not where it came from.
 */
function downloadEnv(plan: UvPlan, env: Record<string, string>): Record<string, string> {
  if (!plan.isolated) return env;
  const out = { ...env };
  const { inputs } = plan;
  if (inputs.noIndex) out.PIP_NO_INDEX = "1";
  const indexes = [...new Set([...(env.PIP_INDEX_URL ? [env.PIP_INDEX_URL] : []), ...(env.PIP_EXTRA_INDEX_URL?.split(/\s+/) ?? []), ...inputs.indexUrls].filter(Boolean))];
  if (indexes.length) out.PIP_INDEX_URL = indexes[0]!;
  if (indexes.length > 1) out.PIP_EXTRA_INDEX_URL = indexes.slice(1).join(" ");
  // A file's find-links URL with credentials is known here only with them hidden: left out.
  const links = [...(env.PIP_FIND_LINKS?.split(/\s+/) ?? []), ...inputs.findLinks.map((f) => f.path ?? (f.url && !/^[a-z][a-z0-9+.-]*:\/\/[^/]*@/i.test(f.url) ? f.url : ""))].filter((l) => l && !/\s/.test(l));
  if (links.length) out.PIP_FIND_LINKS = [...new Set(links)].join(" ");
  return out;
}

/**
 * Where pip looks for the wheel, in turn: for an isolated request, its own
 * indexes, then the machine's pip configuration (its variables and files,
 * which the build shuts out); otherwise the machine's alone. Each named in
 * the failure when none has it.
 */
function downloadAttempts(plan: UvPlan, pipEnv: Record<string, string>): [string, Record<string, string>][] {
  if (!plan.isolated) return [["", pipEnv]];
  const machine: Record<string, string> = {};
  for (const [k, v] of Object.entries(pipEnv)) if (!k.startsWith("PIP_")) machine[k] = v;
  for (const [k, v] of Object.entries(plan.env)) if (v !== undefined && k.startsWith("PIP_")) machine[k] = v;
  Object.assign(machine, { PIP_DISABLE_PIP_VERSION_CHECK: "1", PIP_NO_INPUT: "1" });
  return [
    ["from the request's index: ", pipEnv],
    ["from the machine's pip configuration: ", machine],
  ];
}

/** Only the binary, out of the wheel (zipfile: the interpreter's own stdlib), into a file not there yet. */
const UNPACK = `
import re, shutil, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if re.fullmatch(r"uv-[^/]+\\.data/scripts/uv", n)]
    if len(names) != 1:
        sys.exit("the wheel holds no uv-*.data/scripts/uv")
    with z.open(names[0]) as src, open(dest, "xb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
`;

async function installPinned(plan: UvPlan, env: Record<string, string>): Promise<UvFound> {
  const failed = (why: string): UvFound => ({ path: null, reason: `${NOT_ON_PATH} and installing the pinned uv failed: ${why}` });
  const info = plan.interpreter;
  const hasPip = installedSet(info.siteDirs).some((p) => p.startsWith("pip=="));
  const bundled = info.ensurepipWheel && existsSync(info.ensurepipWheel) ? info.ensurepipWheel : null;
  if (!hasPip && !bundled) return failed(`${info.path} has no pip to download it with`);
  const pipEnv = { ...downloadEnv(plan, env), ...(hasPip ? {} : { PYTHONPATH: bundled! }) };
  const target = join(plan.toolsDir, `uv-${UV_VERSION}`);
  // All of it in a folder of this build's own, renamed into place whole: two builds at once each make their own.
  const tmp = `${target}.${process.pid}.${crypto.randomUUID()}.tmp`;
  const run = (argv: string[], e: Record<string, string>) => runTool(argv, { env: e, cwd: tmp, hooks: {}, signal: plan.signal });
  try {
    mkdirSync(join(tmp, "download"), { recursive: true });
    // pip reaches the index (its config, mirror, certificates, credentials): gpulayer never does that itself. The
    // request's index first (the build reaches it anyway), then the machine's: a private index seldom carries uv.
    const attempts = downloadAttempts(plan, pipEnv);
    const refusals: string[] = [];
    for (const [where, e] of attempts) {
      const dl = await run([info.path, "-m", "pip", "download", `uv==${UV_VERSION}`, "--only-binary", ":all:", "--no-deps", "--retries", "1", "--progress-bar", "off", "--dest", join(tmp, "download")], e);
      if (dl.code === 0) break;
      refusals.push(`${where}${installerMessage(dl.lines).headline || `exit ${dl.code}`}`);
    }
    if (refusals.length === attempts.length) return failed(`pip download uv==${UV_VERSION}: ${refusals.join("; ")}`);
    const wheels = readdirSync(join(tmp, "download")).filter((f) => f.endsWith(".whl"));
    if (wheels.length !== 1) return failed(`pip download left ${wheels.length} wheels (${wheels.join(", ") || "none"})`);
    const file = wheels[0]!;
    const wheel = join(tmp, "download", file);
    const got = contentHash(new Uint8Array(await Bun.file(wheel).arrayBuffer()));
    const pinned = pinnedWheelFor(file);
    if (!pinned) return failed(`pip chose ${file}, which is not one of the uv ${UV_VERSION} wheels whose sha256 gpulayer pins (${Object.keys(UV_WHEEL_SHA256).join(", ")}); nothing was installed; ${OWN_UV}`);
    if (got !== pinned.sha256) return failed(`hash mismatch: ${file} from the package index has sha256 ${got}, not ${pinned.sha256} (the official ${pinned.name}); nothing was installed; ${OWN_UV}`);
    mkdirSync(join(tmp, basename(target)));
    const binary = join(tmp, basename(target), "uv");
    const unpack = await run([info.path, "-I", "-c", UNPACK, wheel, binary], env);
    if (unpack.code !== 0) return failed(`unpacking ${file}: ${unpack.lines.filter((l) => l.trim()).at(-1) ?? `exit ${unpack.code}`}`);
    chmodSync(binary, 0o755);
    const version = await run([binary, "--version"], env);
    const said = version.lines.join(" ").trim();
    if (version.code !== 0 || !said.startsWith(`uv ${UV_VERSION}`)) return failed(`${file}'s uv does not run here (\`uv --version\`: ${said || `exit ${version.code}`})`);
    mkdirSync(plan.toolsDir, { recursive: true });
    try {
      renameSync(join(tmp, basename(target)), target);
    } catch (error) {
      // Another build put it there first: theirs is the same file.
      if (!isExecutable(pinnedUvPath(plan.toolsDir))) throw error;
    }
    return { path: pinnedUvPath(plan.toolsDir), reason: null };
  } catch (error) {
    if (plan.signal?.aborted) throw error;
    return failed((error as Error).message);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}
