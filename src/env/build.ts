import { copyFileSync, existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";
import { InstallError, UsageError } from "../errors.ts";
import { redactUrl } from "./hashing.ts";
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
  const pump = async (stream: ReadableStream<Uint8Array>) => {
    const decoder = new TextDecoder();
    let buf = "";
    for await (const chunk of stream) {
      buf += decoder.decode(chunk, { stream: true });
      let i: number;
      while ((i = buf.indexOf("\n")) !== -1) {
        const line = buf.slice(0, i).replace(/\r$/, "");
        buf = buf.slice(i + 1);
        lines.push(line);
        opts.hooks.onOutput?.(line);
      }
    }
    if (buf) {
      lines.push(buf);
      opts.hooks.onOutput?.(buf);
    }
  };
  await Promise.all([pump(proc.stdout), pump(proc.stderr)]);
  return { code: await proc.exited, lines };
}

/** pip's own words: its ERROR lines, or the tail of what it said. */
export function installerMessage(lines: string[]): string {
  const errors = lines.filter((l) => /^(ERROR|error):/.test(l.trim()));
  const unreachable = lines.find((l) => /NewConnectionError|Connection refused|Failed to establish a new connection|Name or service not known/.test(l));
  const parts = errors.length ? errors.map((l) => l.trim()) : lines.filter((l) => l.trim()).slice(-5);
  if (unreachable && !errors.some((e) => /unreachable/.test(e))) parts.unshift(`index unreachable (${unreachable.trim().slice(0, 200)})`);
  return redactUrl(parts.join("\n"));
}

/** Environment for the installer: no PYTHONPATH leaking in, and, when isolated, none of pip's own config. */
function installerEnv(plan: BuildPlan): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(plan.env)) {
    if (v === undefined) continue;
    if (k === "PYTHONPATH" || k === "PYTHONHOME" || k === "VIRTUAL_ENV" || k === "PYTHONNOUSERSITE") continue;
    if (plan.isolated && (k.startsWith("PIP_") || k.startsWith("UV_"))) continue;
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
    if (o.trustedHosts.length) env.PIP_TRUSTED_HOST = o.trustedHosts.join(" ");
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

/** pip for the env: the worker's, reached through the .pth, or the one bundled with the interpreter (ensurepip), kept in gpulayer's tools. */
function pipCommand(plan: BuildPlan, envPython: string): { argv: string[]; name: string } {
  if (plan.interpreter.pipVersion) return { argv: [envPython, "-m", "pip"], name: `pip ${plan.interpreter.pipVersion}` };
  const wheel = plan.interpreter.ensurepipWheel;
  if (!wheel) throw new UsageError(`${plan.interpreter.path} has no pip and no bundled pip (ensurepip); install pip for it (e.g. apt-get install python3-pip)`);
  mkdirSync(plan.toolsDir, { recursive: true });
  const kept = join(plan.toolsDir, basename(wheel));
  if (!existsSync(kept)) {
    const tmp = `${kept}.${process.pid}.tmp`;
    copyFileSync(wheel, tmp);
    renameSync(tmp, kept);
  }
  // pip runs from its own wheel: `python pip-X.whl/pip ...`.
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
    if (code !== 0) throw new InstallError(`creating the virtual environment failed`, installerMessage(lines));
  });

  const site = envSitePackages(plan.dir, info);
  const envPython = join(plan.dir, "bin", "python");
  await timed("linking", `${info.siteDirs.length} site dir(s) of ${info.path}`, async () => {
    if (!existsSync(site)) throw new InstallError(`the new environment has no ${site}`, "");
    // addsitedir (not a bare path line) also runs the worker's own .pth files: editable installs keep working.
    const lines = info.siteDirs.map((d) => `import site; site.addsitedir(${JSON.stringify(d)})`);
    writeFileSync(join(site, "_gpulayer_worker.pth"), `${lines.join("\n")}\n`);
  });

  const pip = pipCommand(plan, envPython);
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
      const { code, lines } = await runTool(argv, { env, cwd: plan.cwd, hooks });
      rmSync(reqFile, { force: true }); // expanded ${VAR}s may hold secrets
      if (code !== 0) throw new InstallError(`installing the requirements failed`, installerMessage(lines));
    });
  }

  const check = await timed("checking", "pip check", async () => {
    const { code, lines } = await runTool([...pip.argv, "check"], { env, cwd: plan.cwd, hooks });
    return code === 0 ? [] : lines.filter((l) => l.trim() && !/^No broken requirements/.test(l));
  });

  return { venvCreator, installer: pip.name, installed: installedSet([site]), check, steps };
}
