import { existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";
import { InstallError, UsageError } from "../errors.ts";
import { redactUrl } from "./hashing.ts";
import { NEUTRAL_VARIABLES } from "./installer-config.ts";
import type { InterpreterInfo } from "./interpreter.ts";
import { installedSet } from "./interpreter.ts";
import type { RequirementSet } from "./requirements.ts";

/**
 * The build, as the ADR decided: a bare venv, a .pth that adds the worker's
 * site directories with site.addsitedir (so its editable installs work too),
 * then pip run by the env's own interpreter, whose resolver sees the worker's
 * packages as installed and installs only what they do not satisfy.
 */

export type BuildStep = "creating" | "linking" | "installing" | "checking";

export interface BuildHooks {
  onStep?(step: BuildStep, detail: string): void;
  onStepDone?(step: BuildStep, seconds: number): void;
  onOutput?(line: string): void;
}

export interface BuildPlan {
  dir: string;
  interpreter: InterpreterInfo;
  requirements: RequirementSet;
  /** Shut pip off from the machine's config and PIP_* variables (an index was given). */
  isolated: boolean;
  env: NodeJS.ProcessEnv;
  toolsDir: string;
  cwd: string;
  venvCreator?: "uv" | "venv" | "auto";
}

export interface BuildOutcome {
  venvCreator: "uv" | "venv";
  installer: string;
  installed: string[];
  check: string[];
  steps: { step: BuildStep; seconds: number }[];
}

export function envSitePackages(dir: string, info: InterpreterInfo): string {
  return join(dir, "lib", `python${info.pyVersion}`, "site-packages");
}

/** Run a process, streaming its lines to the hooks, keeping them for the error message. */
async function runTool(argv: string[], opts: { env: NodeJS.ProcessEnv; cwd: string; hooks: BuildHooks }): Promise<{ code: number; lines: string[] }> {
  let proc: Bun.Subprocess<"ignore", "pipe", "pipe">;
  try {
    proc = Bun.spawn(argv, { env: opts.env as Record<string, string>, cwd: opts.cwd, stdin: "ignore", stdout: "pipe", stderr: "pipe" });
  } catch (error) {
    throw new InstallError(`cannot run ${argv[0]}: ${(error as Error).message}`, "");
  }
  const lines: string[] = [];
  const emit = (raw: string) => {
    // pip masks passwords but shows user names; nothing of a URL's credentials leaves gpulayer.
    const line = redactUrl(raw.replace(/\r$/, ""));
    lines.push(line);
    opts.hooks.onOutput?.(line);
  };
  const pump = async (stream: ReadableStream<Uint8Array>) => {
    const decoder = new TextDecoder();
    let buf = "";
    for await (const chunk of stream) {
      buf += decoder.decode(chunk, { stream: true });
      let i: number;
      while ((i = buf.indexOf("\n")) !== -1) {
        emit(buf.slice(0, i));
        buf = buf.slice(i + 1);
      }
    }
    if (buf) emit(buf);
  };
  await Promise.all([pump(proc.stdout), pump(proc.stderr)]);
  return { code: await proc.exited, lines };
}

/**
 * pip's own words, as a headline and the lines under it: its last telling
 * ERROR line heads the message ("No matching distribution found for x"),
 * what it said from its first error on follows; without any, the tail.
 */
export function installerMessage(lines: string[]): { headline: string; detail: string } {
  const text = lines.map((l) => l.trimEnd()).filter((l) => l.trim());
  const firstError = text.findIndex((l) => /^(ERROR|error):/.test(l.trim()));
  const shown = (firstError === -1 ? text.slice(-8) : text.slice(firstError)).slice(-40);
  const errors = shown.filter((l) => /^ERROR:/.test(l.trim()));
  const headline = [...errors].reverse().find((l) => !/ResolutionImpossible/.test(l)) ?? errors[0] ?? "";
  const detail = shown.filter((l) => l !== headline).map((l) => (l.startsWith(" ") ? l : l.trim()));
  // pip's retries on a dead index are warnings before its errors: say so, or "no matching distribution" misleads.
  const unreachable = text.find((l) => /NewConnectionError|Connection refused|Failed to establish a new connection|Name or service not known|Temporary failure in name resolution/.test(l));
  if (unreachable) detail.push(`(an index did not answer: ${unreachable.trim().slice(0, 200)})`);
  return { headline: headline.trim(), detail: detail.join("\n") };
}

/** An installer's failure: what failed, pip's headline after a colon, the rest of what it said under it. */
function installFailure(what: string, lines: string[]): InstallError {
  const { headline, detail } = installerMessage(lines);
  return new InstallError(headline ? `${what}: ${headline}` : what, detail);
}

/** Environment for the installer: no PYTHONPATH leaking in, and, when isolated, none of pip's own config. */
function installerEnv(plan: BuildPlan): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(plan.env)) {
    if (v === undefined) continue;
    if (k === "PYTHONPATH" || k === "PYTHONHOME" || k === "VIRTUAL_ENV" || k === "PYTHONNOUSERSITE") continue;
    if (plan.isolated && (k.startsWith("PIP_") || k.startsWith("UV_")) && !NEUTRAL_VARIABLES.has(k)) continue;
    env[k] = v;
  }
  env.PIP_DISABLE_PIP_VERSION_CHECK = "1";
  env.PIP_NO_INPUT = "1";
  env.PYTHONDONTWRITEBYTECODE = env.PYTHONDONTWRITEBYTECODE ?? "";
  if (!env.PYTHONDONTWRITEBYTECODE) delete env.PYTHONDONTWRITEBYTECODE;
  const o = plan.requirements.options;
  if (plan.isolated) {
    // /dev/null is the one value that makes pip skip every config file, site-wide ones too.
    env.PIP_CONFIG_FILE = "/dev/null";
    // Index URLs travel as variables, not argv: credentials stay out of `ps`.
    if (o.indexUrl) env.PIP_INDEX_URL = o.indexUrl;
    if (o.extraIndexUrls.length) env.PIP_EXTRA_INDEX_URL = o.extraIndexUrls.join(" ");
    if (o.findLinks.length) env.PIP_FIND_LINKS = o.findLinks.join(" ");
    if (o.noIndex) env.PIP_NO_INDEX = "1";
  }
  return env;
}

/** Fail fast and clearly when an index does not answer, instead of after pip's retries. */
async function checkIndexesReachable(plan: BuildPlan): Promise<void> {
  const o = plan.requirements.options;
  if (o.noIndex) return;
  const urls = [o.indexUrl, ...o.extraIndexUrls, ...o.findLinks].filter((u): u is string => Boolean(u && /^https?:\/\//.test(u)));
  await Promise.all(
    urls.map(async (url) => {
      const bare = url.replace(/^(https?:\/\/)[^/@]+@/, "$1");
      try {
        await fetch(bare, { method: "GET", signal: AbortSignal.timeout(10_000), redirect: "manual" }).then((r) => r.body?.cancel());
      } catch (error) {
        throw new InstallError(`index unreachable: ${redactUrl(url)} (${(error as Error).message})`, "");
      }
    }),
  );
}

/**
 * pip for the env: the worker's, reached through the .pth, or else the one
 * bundled with the interpreter (ensurepip), unpacked once into gpulayer's
 * tools (run from the zip, pip recompiles itself on every start: a second).
 */
async function pipCommand(plan: BuildPlan, envPython: string, env: Record<string, string>, hooks: BuildHooks): Promise<{ argv: string[]; name: string }> {
  // Asked of the worker's site dirs now, not of the cached probe: pip may have come or gone since.
  const workerPip = installedSet(plan.interpreter.siteDirs).find((p) => p.startsWith("pip=="));
  if (workerPip) return { argv: [envPython, "-m", "pip"], name: `pip ${workerPip.slice(5)}` };
  const wheel = plan.interpreter.ensurepipWheel;
  if (!wheel || !existsSync(wheel)) throw new UsageError(`${plan.interpreter.path} has no pip and no bundled pip (ensurepip); install pip for it (e.g. apt-get install python3-pip)`);
  const kept = join(plan.toolsDir, basename(wheel).replace(/\.whl$/, ""));
  if (!existsSync(join(kept, "pip", "__main__.py"))) {
    mkdirSync(plan.toolsDir, { recursive: true });
    const tmp = `${kept}.${process.pid}.tmp`;
    rmSync(tmp, { recursive: true, force: true });
    const { code, lines } = await runTool([plan.interpreter.executable, "-m", "zipfile", "-e", wheel, tmp], { env, cwd: plan.toolsDir, hooks });
    if (code !== 0) throw installFailure(`unpacking the bundled pip ${basename(wheel)} failed`, lines);
    try {
      renameSync(tmp, kept);
    } catch {
      rmSync(tmp, { recursive: true, force: true }); // another build unpacked it first
    }
  }
  // `python DIR/pip` runs pip's __main__, which puts DIR on sys.path.
  return { argv: [envPython, join(kept, "pip")], name: `pip ${basename(wheel).split("-")[1]} (bundled)` };
}

export async function buildEnv(plan: BuildPlan, hooks: BuildHooks = {}): Promise<BuildOutcome> {
  const steps: BuildOutcome["steps"] = [];
  const timed = async <T>(step: BuildStep, detail: string, fn: () => Promise<T>): Promise<T> => {
    hooks.onStep?.(step, detail);
    const t = performance.now();
    const result = await fn();
    const seconds = (performance.now() - t) / 1000;
    steps.push({ step, seconds });
    hooks.onStepDone?.(step, seconds);
    return result;
  };
  const env = installerEnv(plan);
  const info = plan.interpreter;
  const uv = plan.venvCreator === "venv" ? null : Bun.which("uv", { PATH: plan.env.PATH ?? "" });
  if (plan.venvCreator === "uv" && !uv) throw new UsageError("GPULAYER_VENV_CREATOR=uv but uv is not on PATH");
  const venvCreator = uv ? "uv" : "venv";
  if (!uv && !info.hasVenvModule) throw new UsageError(`--python: ${info.path} has no venv module (on Debian: apt-get install python3-venv), and uv is not on PATH`);

  await checkIndexesReachable(plan);

  await timed("creating", `virtual environment with ${venvCreator}`, async () => {
    const argv = uv ? [uv, "venv", "--no-config", "--quiet", "--python", info.executable, plan.dir] : [info.executable, "-m", "venv", "--without-pip", plan.dir];
    const { code, lines } = await runTool(argv, { env, cwd: plan.cwd, hooks });
    if (code !== 0) throw installFailure("creating the virtual environment failed", lines);
  });

  const site = envSitePackages(plan.dir, info);
  const envPython = join(plan.dir, "bin", "python");
  await timed("linking", `${info.siteDirs.length} site dir(s) of ${info.path}`, async () => {
    if (!existsSync(site)) throw new InstallError(`the new environment has no ${site}`, "");
    // addsitedir (not a bare path line) also runs the worker's own .pth files: editable installs keep working.
    const lines = info.siteDirs.map((d) => `import site; site.addsitedir(${JSON.stringify(d)})`);
    writeFileSync(join(site, "_gpulayer_worker.pth"), `${lines.join("\n")}\n`);
  });

  const pip = await pipCommand(plan, envPython, env, hooks);
  const { requirements, constraints, options: o } = plan.requirements;
  if (requirements.length) {
    await timed("installing", `${requirements.length} requirement(s) with ${pip.name}`, async () => {
      const reqFile = join(plan.dir, ".gpulayer", "requirements.in");
      mkdirSync(join(plan.dir, ".gpulayer"), { recursive: true });
      writeFileSync(reqFile, `${requirements.map((r) => r.install).join("\n")}\n`, { mode: 0o600 });
      const argv = [...pip.argv, "install", "--no-warn-script-location", "--progress-bar", "off", "-r", reqFile];
      if (constraints.length) {
        const cFile = join(plan.dir, ".gpulayer", "constraints.in");
        writeFileSync(cFile, `${constraints.map((r) => r.install).join("\n")}\n`, { mode: 0o600 });
        argv.push("-c", cFile);
      }
      if (o.pre) argv.push("--pre");
      if (o.preferBinary) argv.push("--prefer-binary");
      for (const v of o.noBinary) argv.push("--no-binary", v);
      for (const v of o.onlyBinary) argv.push("--only-binary", v);
      if (o.requireHashes) argv.push("--require-hashes");
      for (const v of o.trustedHosts) argv.push("--trusted-host", v);
      const { code, lines } = await runTool(argv, { env, cwd: plan.cwd, hooks });
      // Expanded ${VAR}s may hold secrets: what pip was given does not stay.
      rmSync(reqFile, { force: true });
      rmSync(join(plan.dir, ".gpulayer", "constraints.in"), { force: true });
      // pip names our temporary file ("-r …/requirements.in (line 2)"); name the user's own line instead.
      const ours = new RegExp(`-r ${reqFile.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")} \\(line (\\d+)\\)`, "g");
      const named = lines.map((l) => l.replace(ours, (m, n: string) => requirements[Number(n) - 1]?.origin ?? m));
      if (code !== 0) throw installFailure("installing the requirements failed", named);
    });
  }

  const check = await timed("checking", "pip check", async () => {
    const { code, lines } = await runTool([...pip.argv, "check"], { env, cwd: plan.cwd, hooks });
    return code === 0 ? [] : lines.filter((l) => l.trim() && !/^No broken requirements/.test(l));
  });

  return { venvCreator, installer: pip.name, installed: installedSet([site]), check, steps };
}
