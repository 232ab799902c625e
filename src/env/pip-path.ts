import { existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";
import { UsageError } from "../errors.ts";
import type { BuildPlan } from "./build.ts";
import { installedSet } from "./interpreter.ts";
import type { Requirement, RequirementSet } from "./requirements.ts";
import { type BuildHooks, installFailure, runTool } from "./run-tool.ts";

/**
 * The ADR's installer: pip run by the env's own interpreter, whose resolver
 * sees the worker's packages through the .pth as installed and installs only
 * what they do not satisfy (shadowing the worker's copy where it needs
 * another version: "Not uninstalling ... outside environment").
 */

/**
 * pip for the env: the worker's, reached through the .pth, or else the one
 * bundled with the interpreter (ensurepip), unpacked once into gpulayer's
 * tools (run from the zip, pip recompiles itself on every start: a second).
 */
export async function pipCommand(plan: BuildPlan, envPython: string, env: Record<string, string>, hooks: BuildHooks): Promise<{ argv: string[]; name: string }> {
  // Asked of the worker's site dirs now, not of the cached probe: pip may have come or gone since.
  const workerPip = installedSet(plan.interpreter.siteDirs).find((p) => p.startsWith("pip=="));
  if (workerPip) return { argv: [envPython, "-m", "pip"], name: `pip ${workerPip.slice(5)}` };
  const wheel = plan.interpreter.ensurepipWheel;
  if (!wheel || !existsSync(wheel)) throw new UsageError(`${plan.interpreter.path} has no pip and no bundled pip (ensurepip); install pip for it (e.g. apt-get install python3-pip)`);
  const kept = join(plan.toolsDir, basename(wheel).replace(/\.whl$/, ""));
  if (!existsSync(join(kept, "pip", "__main__.py"))) {
    mkdirSync(plan.toolsDir, { recursive: true });
    const tmp = `${kept}.${process.pid}.${crypto.randomUUID()}.tmp`;
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

/**
 * The request as files an installer reads with -r/-c, readable by us alone;
 * `done` removes them (expanded ${VAR}s may hold secrets), `named` puts the
 * user's own line in place of ours in what the installer said.
 */
export function requestFiles(dir: string, set: RequirementSet) {
  const stateDir = join(dir, ".gpulayer");
  mkdirSync(stateDir, { recursive: true });
  const reqFile = join(stateDir, "requirements.in");
  const cFile = join(stateDir, "constraints.in");
  const write = (file: string, reqs: Requirement[]) => writeFileSync(file, `${reqs.map((r) => r.install).join("\n")}\n`, { mode: 0o600 });
  write(reqFile, set.requirements);
  if (set.constraints.length) write(cFile, set.constraints);
  const ours = new RegExp(`-r ${reqFile.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")} \\(line (\\d+)\\)`, "g");
  return {
    args: ["-r", reqFile, ...(set.constraints.length ? ["-c", cFile] : [])],
    done() {
      rmSync(reqFile, { force: true });
      rmSync(cFile, { force: true });
    },
    named: (lines: string[]) => lines.map((l) => l.replace(ours, (m, n: string) => set.requirements[Number(n) - 1]?.origin ?? m)),
  };
}

export async function pipInstall(plan: BuildPlan, pip: { argv: string[] }, env: Record<string, string>, hooks: BuildHooks): Promise<void> {
  const o = plan.requirements.options;
  const files = requestFiles(plan.dir, plan.requirements);
  const argv = [...pip.argv, "install", "--no-warn-script-location", "--progress-bar", "off", ...files.args];
  if (o.pre) argv.push("--pre");
  if (o.preferBinary) argv.push("--prefer-binary");
  for (const v of o.noBinary) argv.push("--no-binary", v);
  for (const v of o.onlyBinary) argv.push("--only-binary", v);
  if (o.requireHashes) argv.push("--require-hashes");
  for (const v of o.trustedHosts) argv.push("--trusted-host", v);
  const { code, lines } = await runTool(argv, { env, cwd: plan.cwd, hooks });
  files.done();
  // pip names our temporary file ("-r …/requirements.in (line 2)"); name the user's own line instead.
  if (code !== 0) throw installFailure("installing the requirements failed", files.named(lines));
}

/** pip check: what the env's packages require and do not get, the worker's included (~0.3 s). */
export async function pipCheck(plan: BuildPlan, pip: { argv: string[] }, env: Record<string, string>, hooks: BuildHooks): Promise<string[]> {
  const { code, lines } = await runTool([...pip.argv, "check"], { env, cwd: plan.cwd, hooks });
  return code === 0 ? [] : lines.filter((l) => l.trim() && !/^No broken requirements/.test(l));
}
