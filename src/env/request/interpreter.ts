import { existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, statSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { PythonProblem } from "../../errors.ts";
import { writeFileAtomic } from "../../core/atomic.ts";
import { contentHash } from "../../core/hashing.ts";
import { normalizeName } from "./canonical.ts";
import { type ResolvedInterpreter, resolveInterpreter } from "./shims.ts";

/** What gpulayer knows about a worker's Python; probed once, then cached by file identity. */
export interface InterpreterInfo {
  /** The path as the user named it, absolute. */
  path: string;
  executable: string;
  realExecutable: string;
  prefix: string;
  basePrefix: string;
  version: string; // 3.11.7
  pyVersion: string; // 3.11
  implementation: string;
  platform: string; // sysconfig.get_platform()
  soabi: string;
  siteDirs: string[];
  hasVenvModule: boolean;
  ensurepipWheel: string | null;
}

const PROBE = `
import sys, os, json, site, sysconfig
dirs = []
try:
    dirs += site.getsitepackages()
except Exception:
    pass
if site.ENABLE_USER_SITE:
    dirs.append(site.getusersitepackages())
seen = []
for d in dirs:
    d = os.path.abspath(d)
    if os.path.isdir(d) and d not in seen:
        seen.append(d)
# Found by path, not by import: importing ensurepip or importlib.metadata would double the probe's time.
stdlib = sysconfig.get_paths()["stdlib"]
bundled = os.path.join(stdlib, "ensurepip", "_bundled")
wheel = None
try:
    for f in sorted(os.listdir(bundled)):
        if f.startswith("pip-") and f.endswith(".whl"):
            wheel = os.path.join(bundled, f)
except OSError:
    pass
print(json.dumps({
    "executable": sys.executable,
    "prefix": sys.prefix,
    "basePrefix": sys.base_prefix,
    "version": "%d.%d.%d" % sys.version_info[:3],
    "pyVersion": "%d.%d" % sys.version_info[:2],
    "implementation": sys.implementation.name,
    "platform": sysconfig.get_platform(),
    "soabi": sysconfig.get_config_var("SOABI") or "",
    "siteDirs": seen,
    "hasVenvModule": os.path.isdir(os.path.join(stdlib, "venv")) and os.path.isdir(os.path.join(stdlib, "ensurepip")),
    "ensurepipWheel": wheel,
}))
`;

function statSignature(path: string): string {
  try {
    const s = statSync(path);
    return `${path}:${s.ino}:${s.size}:${s.mtimeMs}`;
  } catch {
    return `${path}:missing`;
  }
}

/** Cheap proof that the interpreter is the one probed: the file it names, its real binary, its venv config. */
function signatureOf(path: string, info: Pick<InterpreterInfo, "realExecutable" | "prefix">): string {
  return [statSignature(path), statSignature(info.realExecutable), statSignature(join(info.prefix, "pyvenv.cfg"))].join("|");
}

/** The interpreter named (a path, made absolute; else found on PATH), not yet checked to exist. */
function namedPython(python: string | undefined, env: NodeJS.ProcessEnv): string {
  const name = python || "python3";
  if (name.includes("/")) return resolve(name);
  const found = Bun.which(name, { PATH: env.PATH ?? "" });
  if (!found) throw new PythonProblem(`${name} is not on PATH`);
  return found;
}

export function resolvePythonPath(python: string | undefined, env: NodeJS.ProcessEnv): string {
  const path = namedPython(python, env);
  if (!existsSync(path)) throw new PythonProblem(`not found: ${python}`);
  return path;
}

const cacheFileOf = (pythonPath: string, cacheDir: string) => join(cacheDir, `${contentHash(pythonPath).slice(0, 32)}.json`);

/**
 * A probe's answer as kept. `shimFree`: the path probed was what runs, shims resolved first (every entry written
 * now). An entry without it (an older gpulayer's) may be a shim's answer kept under the shim's own path.
 */
interface CachedProbe {
  signature: string;
  info: InterpreterInfo;
  shimFree?: true;
}

/** What a probe of this very path answered, while the files it rests on are unchanged; else null. */
function cachedProbe(pythonPath: string, cacheDir: string): CachedProbe | null {
  try {
    const cached = JSON.parse(readFileSync(cacheFileOf(pythonPath, cacheDir), "utf8")) as CachedProbe;
    if (cached.signature === signatureOf(pythonPath, cached.info)) return cached;
  } catch {
    // no cache or stale
  }
  return null;
}

/** A probe that cannot be kept (a home this user cannot write) only costs the next run a probe of its own. */
function keepProbe(cacheFile: string, entry: CachedProbe): void {
  try {
    mkdirSync(dirname(cacheFile), { recursive: true });
    writeFileAtomic(cacheFile, JSON.stringify(entry));
  } catch {
    // not kept
  }
}

/** `pythonPath` is what runs, shims already resolved (runningInterpreter's order): its answer is kept as its own. */
export function probeInterpreter(pythonPath: string, cacheDir: string): InterpreterInfo {
  const cacheFile = cacheFileOf(pythonPath, cacheDir);
  const cached = cachedProbe(pythonPath, cacheDir);
  if (cached) {
    // An older gpulayer's entry for what runs (not for a shim): right, and marked so the shortcut may take it.
    if (!cached.shimFree) {
      try {
        keepProbe(cacheFile, { ...cached, shimFree: true });
      } catch {
        // not marked: the next run resolves shims first again, as now
      }
    }
    return cached.info;
  }
  let proc: ReturnType<typeof Bun.spawnSync>;
  try {
    proc = Bun.spawnSync([pythonPath, "-E", "-c", PROBE], { stdout: "pipe", stderr: "pipe" });
  } catch (error) {
    throw new PythonProblem(`cannot run ${pythonPath}: ${(error as Error).message}`);
  }
  if (proc.exitCode !== 0) {
    const msg = (proc.stderr ?? "").toString().trim().split("\n").pop() ?? "";
    throw new PythonProblem(`${pythonPath} is not a working Python 3 (${msg || `exit ${proc.exitCode}`})`);
  }
  let raw: Omit<InterpreterInfo, "path" | "realExecutable">;
  try {
    raw = JSON.parse((proc.stdout ?? "").toString());
  } catch {
    throw new PythonProblem(`${pythonPath} did not answer the probe like a Python 3 interpreter`);
  }
  let realExecutable = raw.executable;
  try {
    realExecutable = realpathSync(raw.executable);
  } catch {
    // keep sys.executable
  }
  const info: InterpreterInfo = { ...raw, path: pythonPath, realExecutable };
  keepProbe(cacheFile, { signature: signatureOf(pythonPath, info), info, shimFree: true });
  return info;
}

/** Distributions in site dirs, from dist-info/egg-info folder names (a readdir, no Python); the first of a name wins, as on sys.path. */
export function distributions(siteDirs: string[]): { name: string; version: string; dir: string }[] {
  const seen = new Set<string>();
  const found: { name: string; version: string; dir: string }[] = [];
  for (const dir of siteDirs) {
    let names: string[];
    try {
      names = readdirSync(dir);
    } catch {
      continue;
    }
    for (const n of names) {
      const m = /^(.+?)-([^-]+?)(-py\d[\d.]*)?\.(dist-info|egg-info)$/.exec(n);
      if (!m) continue;
      const name = normalizeName(m[1]!);
      if (seen.has(name)) continue;
      seen.add(name);
      found.push({ name, version: m[2]!, dir });
    }
  }
  return found;
}

/** The worker's installed `name==version` set. */
export function installedSet(siteDirs: string[]): string[] {
  const set = new Set<string>();
  for (const dir of siteDirs) for (const d of distributions([dir])) set.add(`${d.name}==${d.version}`);
  return [...set].sort();
}

export function baseFingerprint(siteDirs: string[]): string {
  return contentHash(installedSet(siteDirs).join("\n"));
}

/** The interpreter a name runs (PATH looked up, shims resolved), probed: what every request and the worker probe use. */
export function runningInterpreter(python: string | undefined, env: NodeJS.ProcessEnv, cwd: string, cacheDir: string): { info: InterpreterInfo; resolved: ResolvedInterpreter } {
  // Probed before under this very path, and its file unchanged since: a binary then, so a binary now (a shim or a
  // wrapper is never probed under its own path, only what it runs). No shim to look for: the warm path's shortcut.
  const path = namedPython(python, env);
  const known = cachedProbe(path, cacheDir);
  if (known?.shimFree) return { info: known.info, resolved: { path, via: null } };
  const resolved = resolveInterpreter(resolvePythonPath(python, env), env, cwd, cacheDir);
  return { info: probeInterpreter(resolved.path, cacheDir), resolved };
}
