import { existsSync, readdirSync, readFileSync } from "node:fs";
import { availableParallelism, hostname, release, totalmem } from "node:os";
import { join } from "node:path";
import type { GpuInfo, MachineProbe } from "../cluster/protocol.ts";
import type { HomeLayout } from "../config/paths.ts";
import { detectEngine, type EngineHost } from "../docker/engine.ts";
import { distributions, runningInterpreter } from "../env/index-light.ts";
import { listCondaEnvs } from "../env/index-light.ts";
import { userHome } from "../core/home.ts";

/**
 * The machine probe: what a worker tells the coordinator about itself. Read
 * from files and two short commands; torch and friends are never imported
 * (an `import torch` costs seconds), their versions come from site-packages.
 */

/** Run a command with a deadline; null when it is missing, fails or is too slow. */
async function quietRun(argv: string[], timeoutMs: number, env: NodeJS.ProcessEnv): Promise<string | null> {
  const bin = argv[0]!.includes("/") ? argv[0]! : Bun.which(argv[0]!, { PATH: env.PATH ?? "" });
  if (!bin) return null;
  let proc: Bun.Subprocess<"ignore", "pipe", "ignore">;
  try {
    proc = Bun.spawn([bin, ...argv.slice(1)], { env: env as Record<string, string>, stdin: "ignore", stdout: "pipe", stderr: "ignore" });
  } catch {
    return null;
  }
  const timer = setTimeout(() => proc.kill("SIGKILL"), timeoutMs);
  try {
    const [out, code] = await Promise.all([new Response(proc.stdout).text(), proc.exited]);
    return code === 0 ? out : null;
  } finally {
    clearTimeout(timer);
  }
}

const na = (s: string | undefined): string | null => {
  const v = (s ?? "").trim();
  return !v || /^\[?N\/A\]?$/i.test(v) || /^\[Not Supported\]$/i.test(v) ? null : v;
};

/** `nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version --format=csv,noheader,nounits` lines. */
export function parseNvidiaSmi(text: string): GpuInfo[] {
  const gpus: GpuInfo[] = [];
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    const [index, uuid, name, memory, driver] = line.split(",").map((c) => c.trim());
    const i = Number(na(index));
    if (!Number.isInteger(i)) continue;
    const mem = Number(na(memory));
    gpus.push({ index: i, uuid: na(uuid), name: na(name), memoryMiB: na(memory) !== null && Number.isFinite(mem) ? mem : null, driver: na(driver) });
  }
  return gpus;
}

export async function probeGpus(env: Record<string, string | undefined>): Promise<GpuInfo[]> {
  const out = await quietRun(["nvidia-smi", "--query-gpu=index,uuid,name,memory.total,driver_version", "--format=csv,noheader,nounits"], 5000, env);
  return out ? parseNvidiaSmi(out) : [];
}

/** `__version__ = "2.4.1"` and `cuda = "12.1"` (or `cuda: Optional[str] = None`) from torch/version.py. */
export function parseTorchVersionPy(text: string): { version: string | null; cuda: string | null } {
  const value = (name: string) => {
    const m = new RegExp(`^${name}\\s*(?::[^=\\n]*)?=\\s*(?:['"]([^'"]*)['"]|None)`, "m").exec(text);
    return m?.[1] ? m[1] : null;
  };
  return { version: value("__version__"), cuda: value("cuda") };
}

/** Every distribution in the site dirs (dist-info/egg-info names), and torch's own version.py over its dist-info. */
export function readFrameworks(siteDirs: string[]): { frameworks: Record<string, string>; cuda: string | null } {
  const frameworks: Record<string, string> = {};
  let cuda: string | null = null;
  let torchRead = false;
  for (const d of distributions(siteDirs)) frameworks[d.name] = d.version;
  for (const dir of siteDirs) {
    const torchVersion = join(dir, "torch", "version.py");
    if (!torchRead && existsSync(torchVersion)) {
      torchRead = true;
      try {
        const parsed = parseTorchVersionPy(readFileSync(torchVersion, "utf8"));
        if (parsed.version) frameworks.torch = parsed.version;
        cuda = parsed.cuda;
      } catch {
        // unreadable: the dist-info's version stands
      }
    }
  }
  return { frameworks, cuda };
}

async function probeEngineName(layout: HomeLayout, host: EngineHost, timeoutMs: number): Promise<MachineProbe["engine"]> {
  const timeout = new Promise<null>((r) => setTimeout(() => r(null), timeoutMs).unref());
  try {
    const engine = await Promise.race([detectEngine(layout, host).catch(() => null), timeout]);
    return engine?.name ?? null;
  } catch {
    return null;
  }
}

/** `engine` null: the worker offers none (worker.engine: none), so none is looked for. */
export async function probeMachine(layout: HomeLayout, python: string | undefined, machine: { env: Record<string, string>; engine: EngineHost | null }, cwd: string): Promise<MachineProbe> {
  const started = performance.now();
  const { env } = machine;
  const [gpus, engine] = await Promise.all([probeGpus(env), machine.engine ? probeEngineName(layout, machine.engine, 5000) : Promise.resolve(null)]);
  let pythonInfo: MachineProbe["python"] = null;
  let pythonError: string | undefined;
  let frameworks: Record<string, string> = {};
  let cuda: string | null = null;
  try {
    const { info } = runningInterpreter(python, env, cwd, layout.interpreters);
    pythonInfo = { path: info.path, version: info.version };
    ({ frameworks, cuda } = readFrameworks(info.siteDirs));
  } catch (error) {
    pythonError = (error as Error).message;
  }
  const conda = condaEnvironments(env, cwd);
  return {
    hostname: hostname(),
    os: `${process.platform} ${release()}`,
    arch: process.arch,
    cpus: availableParallelism(),
    memoryBytes: totalmem(),
    gpus,
    python: pythonInfo,
    ...(pythonError ? { pythonError } : {}),
    frameworks,
    cuda,
    engine,
    ...(conda.length ? { conda } : {}),
    probeMs: Math.round((performance.now() - started) * 10) / 10,
  };
}

/** Each conda environment with a Python, and what its site-packages hold: read from folders, nothing started but conda itself. */
function condaEnvironments(env: Record<string, string>, cwd: string): NonNullable<MachineProbe["conda"]> {
  try {
    return listCondaEnvs({ env, home: userHome(env), cwd })
      .filter((e) => e.python)
      .map((e) => {
        const lib = join(e.prefix, "lib");
        const sites = (existsSync(lib) ? readdirSync(lib) : []).filter((d) => /^python3\.\d+$/.test(d)).map((d) => join(lib, d, "site-packages"));
        return { name: e.name, prefix: e.prefix, frameworks: readFrameworks(sites).frameworks };
      });
  } catch {
    return []; // a broken conda setup is no reason for a worker not to join
  }
}
