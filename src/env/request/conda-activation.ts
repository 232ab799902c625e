import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { killTree } from "../../core/process-tree.ts";
import { UsageError } from "../../errors.ts";

/**
 * What `conda activate` gives a process (conda/activate.py
 * `_build_activate_stack`), without conda: its variables and PATH, the env's
 * own config vars, then whatever the env's activate.d scripts export, run once
 * in a shell and read back as the difference they made.
 */

/** What activation needs of an environment; a CondaEnv is one. */
export interface ActivatedPrefix {
  prefix: string;
  name: string | null;
}

/** The value conda stores for "unset this variable" among an env's config vars (base/constants.py CONDA_ENV_VARS_UNSET_VAR). */
const UNSET_MARKER = "***unset***";

export const ACTIVATE_SCRIPTS_TIMEOUT_MS = 10_000;

/** The shell's own bookkeeping: a script's `cd` or any command changes them; no job should inherit that. */
const SHELL_OWN = new Set(["PWD", "OLDPWD", "SHLVL", "_"]);

/** Startup files a non-interactive shell would source before our script: not part of activation. */
const SHELL_STARTUP = ["BASH_ENV", "ENV"];

/** Records on the shell's stdout that no `env -0` entry can be: they hold no "=". */
const MARK = "@gpulayer-activation:";

function sortedEntries(dir: string, ext = ""): string[] {
  try {
    return readdirSync(dir)
      .filter((f) => f.endsWith(ext))
      .sort()
      .map((f) => join(dir, f));
  } catch {
    return [];
  }
}

function readJson(file: string, label: string): unknown {
  try {
    return JSON.parse(readFileSync(file, "utf8"));
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw new UsageError(`conda environment ${label}: cannot read ${file}: ${(error as Error).message.split("\n")[0]}`);
  }
}

/** Packages' env_vars.d files, then the env's own (`conda env config vars set`, in conda-meta/state), later ones winning, as conda reads them. */
function configVars(prefix: string, label: string): Record<string, string> {
  const vars: Record<string, string> = {};
  const take = (obj: unknown) => {
    if (obj && typeof obj === "object") for (const [k, v] of Object.entries(obj)) vars[k] = String(v);
  };
  for (const file of sortedEntries(join(prefix, "etc", "conda", "env_vars.d"))) take(readJson(file, label));
  take((readJson(join(prefix, "conda-meta", "state"), label) as { env_vars?: unknown } | null)?.env_vars);
  return vars;
}

const quoted = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;

/**
 * One shell: the environment before, each script sourced (its stdout sent to
 * stderr, so only our records are on stdout), the environment after. A
 * script's non-zero status ends it there, naming that script.
 */
function driverScript(scripts: string[], envTool: string): string {
  const lines = [`printf '%s\\0' ${MARK}before`, `${quoted(envTool)} -0`];
  scripts.forEach((script, i) => {
    lines.push(`printf '%s\\0' ${MARK}script:${i}`, `. ${quoted(script)} >&2 || { __gpulayer_status=$?; printf '%s\\0' ${MARK}failed:${i}:$__gpulayer_status; exit $__gpulayer_status; }`);
  });
  lines.push(`printf '%s\\0' ${MARK}after`, `${quoted(envTool)} -0`);
  return lines.join("\n");
}

interface DriverOutput {
  before: Map<string, string>;
  after: Map<string, string> | null;
  /** The index of the last script started. */
  lastScript: number | null;
  failedStatus: number | null;
}

function parseDriver(stdout: string): DriverOutput {
  const out: DriverOutput = { before: new Map(), after: null, lastScript: null, failedStatus: null };
  let section: Map<string, string> | null = null;
  for (const record of stdout.split("\0")) {
    const eq = record.indexOf("=");
    if (eq < 0 && record.startsWith(MARK)) {
      const [what, index, status] = record.slice(MARK.length).split(":");
      if (what === "before") section = out.before;
      else if (what === "after") section = out.after = new Map();
      else if (what === "script") {
        section = null;
        out.lastScript = Number(index);
      } else if (what === "failed") out.failedStatus = Number(status);
    } else if (section && eq > 0) section.set(record.slice(0, eq), record.slice(eq + 1));
  }
  return out;
}

async function runActivateScripts(scripts: string[], vars: Record<string, string>, label: string, prefix: string, timeoutMs: number): Promise<Record<string, string>> {
  // bash where there is one: conda's users source these from bash, and conda-forge's scripts use bash's [[ ]].
  const shell = Bun.which("bash", { PATH: vars.PATH ?? "" }) ?? "/bin/sh";
  const envTool = Bun.which("env", { PATH: vars.PATH ?? "" }) ?? "/usr/bin/env"; // by its path: a script may change PATH
  const shellEnv = { ...vars };
  for (const k of SHELL_STARTUP) delete shellEnv[k];
  let proc: Bun.Subprocess<"ignore", "pipe", "pipe">;
  try {
    proc = Bun.spawn([shell, "-c", driverScript(scripts, envTool)], { env: shellEnv, cwd: prefix, stdin: "ignore", stdout: "pipe", stderr: "pipe", detached: true });
  } catch (error) {
    throw new UsageError(`conda environment ${label}: cannot run ${shell} for its activate scripts: ${(error as Error).message}`);
  }
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = proc.exitCode === null && proc.signalCode === null;
    // The group too: what a script left running in the background holds the pipes open.
    try {
      process.kill(-proc.pid, "SIGKILL");
    } catch {
      // gone already
    }
    killTree(proc.pid);
  }, timeoutMs);
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]).finally(() => clearTimeout(timer));
  const run = parseDriver(stdout);
  const script = run.lastScript === null ? null : scripts[run.lastScript];
  if (timedOut) throw new UsageError(`conda environment ${label}: activate script ${script ?? "shell"} did not finish within ${timeoutMs / 1000} s`);
  if (code !== 0 || !run.after) {
    const last = stderr.trim().split("\n").pop()?.trim();
    const status = run.failedStatus ?? code;
    const what = script ? `activate script ${script}` : `the shell for its activate scripts (${shell})`;
    const how = run.failedStatus === null && code === 0 ? "ended the shell early" : `failed (exit ${status})`;
    throw new UsageError(`conda environment ${label}: ${what} ${how}${last ? `: ${last}` : ""}`);
  }
  const activated = { ...vars };
  for (const [k, v] of run.after) if (!SHELL_OWN.has(k) && run.before.get(k) !== v) activated[k] = v;
  for (const k of run.before.keys()) if (!SHELL_OWN.has(k) && !run.after.has(k)) delete activated[k];
  return activated;
}

/** The environment a process gets from `conda activate`, applied to a copy of `base`. */
export async function condaActivation(env: ActivatedPrefix, base: Record<string, string>, opts: { timeoutMs?: number } = {}): Promise<Record<string, string>> {
  const label = env.name ?? env.prefix;
  const bin = join(env.prefix, "bin");
  // On Windows conda also puts Library\bin and friends first; gpulayer's workers are Linux.
  const vars: Record<string, string> = { ...base, CONDA_PREFIX: env.prefix, CONDA_DEFAULT_ENV: label, CONDA_PROMPT_MODIFIER: `(${label}) `, CONDA_SHLVL: "1", PATH: base.PATH ? `${bin}:${base.PATH}` : bin };
  for (const [k, v] of Object.entries(configVars(env.prefix, label))) {
    if (v === UNSET_MARKER) delete vars[k];
    else vars[k] = v;
  }
  const scripts = sortedEntries(join(env.prefix, "etc", "conda", "activate.d"), ".sh");
  if (!scripts.length) return vars;
  return runActivateScripts(scripts, vars, label, env.prefix, opts.timeoutMs ?? ACTIVATE_SCRIPTS_TIMEOUT_MS);
}
