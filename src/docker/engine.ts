import { mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { HomeLayout } from "../config/paths.ts";
import { UsageError, UserError } from "../errors.ts";
import { writeFileAtomic } from "../core/atomic.ts";

/**
 * The container engine: Docker or Podman, whichever answers. A binary on
 * PATH is not enough (a stopped dockerd, a podman without its config); an
 * engine counts once `info` (or any command that reaches it) succeeds.
 */
export type EngineName = "docker" | "podman";
export const ENGINE_NAMES: readonly EngineName[] = ["docker", "podman"];

export interface Engine {
  name: EngineName;
  /** Absolute path of the CLI. */
  bin: string;
}

export interface ExecResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Run the engine's CLI to completion (never spawnSync: callers may serve a registry in this process). */
export async function engineExec(engine: Engine, args: string[], opts: { env: EngineEnv; timeoutMs?: number }): Promise<ExecResult> {
  const proc = Bun.spawn([engine.bin, ...args], { env: opts.env, stdin: "ignore", stdout: "pipe", stderr: "pipe" });
  const timer = opts.timeoutMs ? setTimeout(() => proc.kill("SIGKILL"), opts.timeoutMs) : undefined;
  try {
    const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
    return { code, stdout, stderr };
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The engine's own error in one line: its last line that says "Error", with
 * the "Error: " / "Error response from daemon: " prefixes dropped.
 */
export function engineMessage(output: string): string {
  const lines = output
    .replace(/\u001b\[[0-9;?]*[A-Za-z]/g, "")
    .split(/\r?\n|\r/)
    .map((l) => l.trim())
    .filter(Boolean);
  const errorLine = [...lines].reverse().find((l) => /^(error|docker: error|Error response)/i.test(l) || /level=(error|fatal)/.test(l)) ?? lines.at(-1) ?? "";
  return errorLine
    .replace(/^time="[^"]*" level=\w+ msg=/, "")
    .replace(/^docker: /i, "")
    .replace(/^Error response from daemon: /i, "")
    .replace(/^Error: /i, "")
    .replace(/^"|"$/g, "")
    .trim();
}

function engineFor(name: EngineName, env: EngineEnv): Engine | null {
  const bin = Bun.which(name, { PATH: env.PATH ?? "" });
  return bin ? { name, bin } : null;
}

/** The environment of the engine's CLI (PATH, DOCKER_HOST, CONTAINER_HOST, ...). */
export type EngineEnv = Record<string, string | undefined>;

/** How to reach an engine: its CLI's environment, and the `container.engine` setting when one is chosen. */
export interface EngineHost {
  env: EngineEnv;
  forced?: EngineName;
  /** Where the choice came from, for messages (GPULAYER_CONTAINER_ENGINE, the config file). */
  forcedBy?: string;
}

/** `info` succeeded: the engine works. Otherwise its own message, for the error that lists what was tried. */
export async function probeEngine(engine: Engine, env: EngineEnv): Promise<string | null> {
  // A format that needs the server: `docker info --format '{{json .}}'` exits 0 with client data alone.
  const format = engine.name === "docker" ? "{{.ServerVersion}}" : "{{.Host.OCIRuntime.Name}}";
  const r = await engineExec(engine, ["info", "--format", format], { env, timeoutMs: 20_000 });
  if (r.code === 0) return null;
  return engineMessage(`${r.stderr}\n${r.stdout}`) || `${engine.name} info exited ${r.code}`;
}

/** Where the last working engine is remembered, so the warm path of a job costs no `info` call. */
function cacheFile(layout: HomeLayout): string {
  return join(layout.images, "engine.json");
}

/** The engine that worked last time (unverified: the caller's first real command verifies it). */
export function rememberedEngine(layout: HomeLayout, env: EngineEnv): Engine | null {
  try {
    const data = JSON.parse(readFileSync(cacheFile(layout), "utf8")) as { name?: string; bin?: string };
    if (data.name !== "docker" && data.name !== "podman") return null;
    return engineFor(data.name, env);
  } catch {
    return null;
  }
}

export function rememberEngine(layout: HomeLayout, engine: Engine): void {
  try {
    mkdirSync(layout.images, { recursive: true });
    writeFileAtomic(cacheFile(layout), JSON.stringify({ name: engine.name, bin: engine.bin, checked: new Date().toISOString() }));
  } catch {
    // only a hint for next time
  }
}

const perProcess = new Map<string, Engine>();

/** The first candidate an engine command should try: the forced one, else the one that worked last. */
export function candidateEngine(layout: HomeLayout, host: EngineHost): Engine | null {
  const { forced, env } = host;
  if (forced) {
    const engine = engineFor(forced, env);
    if (!engine) throw new UserError(`${host.forcedBy ?? "container.engine"} chose ${forced}, but ${forced} is not installed (not found on PATH)`);
    return engine;
  }
  return perProcess.get(layout.root) ?? rememberedEngine(layout, env);
}

/**
 * A working engine: GPULAYER_CONTAINER_ENGINE when set (it must work), else
 * docker, else podman (the one that worked last time is tried first). The
 * answer is kept for this process and remembered on disk.
 */
export async function detectEngine(layout: HomeLayout, host: EngineHost, opts: { fresh?: boolean } = {}): Promise<Engine> {
  const { forced, env } = host;
  const cached = perProcess.get(layout.root);
  if (!opts.fresh && cached && !forced) return cached;
  const order: EngineName[] = forced ? [forced] : [...ENGINE_NAMES];
  const remembered = forced ? null : rememberedEngine(layout, env);
  if (remembered) order.sort((a, b) => (a === remembered.name ? -1 : b === remembered.name ? 1 : 0));
  const tried: string[] = [];
  for (const name of order) {
    const engine = engineFor(name, env);
    if (!engine) {
      tried.push(`${name}: not installed (not found on PATH)`);
      continue;
    }
    const problem = await probeEngine(engine, env);
    if (problem === null) {
      // Only what detection found is kept; a forced engine is the variable's business.
      if (!forced) {
        perProcess.set(layout.root, engine);
        if (remembered?.name !== engine.name || remembered.bin !== engine.bin) rememberEngine(layout, engine);
      }
      return engine;
    }
    tried.push(`${name}: ${problem}`);
  }
  const hint = forced ? ` (${host.forcedBy ?? "container.engine"} chose it)` : " (GPULAYER_CONTAINER_ENGINE=docker|podman or container.engine in the config file picks one)";
  throw new UserError(`no working container engine; tried ${tried.join("; ")}${hint}`);
}

/** Forget the per-process answer (an engine stopped answering). */
export function forgetEngine(layout: HomeLayout): void {
  perProcess.delete(layout.root);
}

/** Record that an engine just answered a command (so later calls in this process skip detection). */
export function engineAnswered(layout: HomeLayout, engine: Engine, env: EngineEnv): void {
  if (perProcess.get(layout.root)?.bin === engine.bin) return;
  perProcess.set(layout.root, engine);
  const remembered = rememberedEngine(layout, env);
  if (remembered?.name !== engine.name || remembered.bin !== engine.bin) rememberEngine(layout, engine);
}
