import { existsSync, mkdirSync, renameSync, rmSync } from "node:fs";
import { basename, join } from "node:path";
import { UsageError } from "../../errors.ts";
import type { BuildPlan } from "./build-plan.ts";
import { installedSet } from "../request/interpreter.ts";
import { quote as shlexQuote } from "shlex";
import type { RequestInputs } from "../request/requirements.ts";
import { type BuildHooks, installFailure, runTool } from "./run-tool.ts";
import { writeFileNamed } from "../../core/atomic.ts";

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
    const { code, lines } = await runTool([plan.interpreter.executable, "-m", "zipfile", "-e", wheel, tmp], { env, cwd: plan.toolsDir, hooks, signal: plan.signal, keep: plan.keep });
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
 * What the installer is told to read: the user's own file, unchanged, as
 * `-r FILE`; with -p specs, a small top file (readable by us alone) that
 * holds the specs and `-r` the user's file. For uv (`forUv`), the top file
 * also names as requirements each file that a constraints file includes
 * with `-r` (pip reads those as requirements, uv as constraints). `done`
 * removes it, `named` puts the user's own names in place of ours in what the
 * installer said, `where` names a line of the top file as the user gave it.
 */
export type RequestFiles = ReturnType<typeof requestFiles>;

export function requestFiles(dir: string, inputs: RequestInputs, forUv = false) {
  const extra = forUv ? inputs.requirementsUnderConstraints.map((p) => `-r ${p}`) : [];
  const given = inputs.topFile ? [`-r ${shlexQuote(inputs.topFile)}`] : [];
  if (!inputs.specs.length && !extra.length) return { args: inputs.topFile ? ["-r", inputs.topFile] : [], top: null, done() {}, named: (lines: string[]) => lines, where: (_line: number) => null as string | null };
  const stateDir = join(dir, ".gpulayer");
  mkdirSync(stateDir, { recursive: true });
  const top = join(stateDir, "request.txt");
  const lines = [...inputs.specs, ...given, ...extra];
  writeFileNamed(top, `${lines.join("\n")}\n`, { mode: 0o600 });
  const escaped = top.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  // pip names our file's lines two ways: "-r FILE (line N)" and "from line N of FILE".
  const ours = new RegExp(`-r ${escaped} \\(line (\\d+)\\)|line (\\d+) of ${escaped}`, "g");
  const where = (n: number): string | null => (n >= 1 && n <= inputs.specs.length ? (inputs.specOrigin ? `${inputs.specOrigin}[${n - 1}]` : `-p ${inputs.specs[n - 1]}`) : null);
  return {
    args: ["-r", top],
    top: { path: top, text: `${lines.join("\n")}\n` },
    done: () => rmSync(top, { force: true }),
    named: (out: string[]) => out.map((l) => l.replace(ours, (m, n?: string, of?: string) => where(Number(n ?? of)) ?? m)),
    where,
  };
}

export async function pipInstall(plan: BuildPlan, pip: { argv: string[] }, env: Record<string, string>, hooks: BuildHooks, files: RequestFiles = requestFiles(plan.dir, plan.inputs)): Promise<void> {
  // The files carry their own options (--pre, --hash, ...): pip reads them there, as the user wrote them.
  const argv = [...pip.argv, "install", "--no-warn-script-location", "--progress-bar", "off", ...files.args];
  const { code, lines } = await runTool(argv, { env, cwd: plan.cwd, hooks, signal: plan.signal, keep: plan.keep, as: plan.user });
  files.done();
  if (code !== 0) throw installFailure("installing the requirements failed", files.named(lines));
}

/** pip check: what the env's packages require and do not get, the worker's included (~0.3 s). */
export async function pipCheck(plan: BuildPlan, pip: { argv: string[] }, env: Record<string, string>, hooks: BuildHooks): Promise<string[]> {
  const { code, lines } = await runTool([...pip.argv, "check"], { env, cwd: plan.cwd, hooks, signal: plan.signal, keep: plan.keep, as: plan.user });
  return code === 0 ? [] : lines.filter((l) => l.trim() && !/^No broken requirements/.test(l));
}
