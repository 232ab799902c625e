import type { ArgsDef } from "citty";
import { isProblem } from "../config/kinds.ts";
import { SETTING_NAMES, SETTINGS, type SettingDef } from "../config/table.ts";
import { UsageError } from "../errors.ts";
import { didYouMean } from "../core/suggest.ts";
import type { EnvironmentRequest } from "../env/index-light.ts";

/**
 * `join --token T`, `server --token T`: refused. Any process on the machine, jobs included, reads
 * /proc/PID/cmdline, and these two run for days.
 */
export function refuseTokenOnCommandLine(command: "join" | "server", token: string | undefined): void {
  if (token !== undefined) throw new UsageError(`${command} --token: a token on the command line can be read by every process on this machine (/proc/PID/cmdline), jobs included; use --token-file FILE, --token-file - (standard input) or GPULAYER_TOKEN`);
}

/** Flags every reporting command takes. */
export const outputArgs = {
  json: { type: "boolean", description: "Print one JSON document on stdout and nothing else there" },
  quiet: { type: "boolean", alias: "q", description: "Print only what is essential (errors, the result path)" },
  verbose: { type: "boolean", description: "Show debug lines, and the stack of an internal error" },
} as const satisfies ArgsDef;

/** The output flags of the commands that build environments: --verbose shows the installer too. */
export const buildOutputArgs = {
  ...outputArgs,
  verbose: { type: "boolean", description: "Show the installer's own output (pip, uv), debug lines, and the stack of an internal error" },
} as const satisfies ArgsDef;

/** Where the environment's packages come from; shared by `env prepare` and `job run`. */
export const installerArgs = {
  python: { type: "string", valueHint: "PATH", description: "The worker's Python the env links to (default: the configured one, else python3 on PATH)" },
  conda: { type: "string", valueHint: "NAME|PATH", description: "A conda environment on the worker as the base: its Python, its packages under the env's, its activation for the job" },
  "index-url": { type: "string", valueHint: "URL", description: "Base URL of the package index (pip's --index-url); shuts out pip's own config" },
  "extra-index-url": { type: "string", valueHint: "URL", description: "Another index to search (repeatable)" },
  "find-links": { type: "string", valueHint: "DIR|URL", description: "A folder or page of distributions to use (repeatable)" },
  "no-build-isolation-package": { type: "string", valueHint: "NAME", description: "Build this requirement after the rest of the env, with its packages and the worker's importable (torch extensions; repeatable)" },
  project: { type: "string", valueHint: "DIR", description: "A uv project (pyproject.toml + uv.lock): the env is what uv sync --frozen installs" },
  group: { type: "string", valueHint: "NAME", description: "With --project: a dependency group to install as well (repeatable)" },
  extra: { type: "string", valueHint: "NAME", description: "With --project: an extra of the project to install (repeatable)" },
  "prepare-timeout": { type: "string", valueHint: "DURATION", description: "Give up building the environment after this long (30s, 10m, 1h; default 30m, or GPULAYER_PREPARE_TIMEOUT)" },
} as const satisfies ArgsDef;

/** Run against a coordinator instead of this machine; shared by `env prepare`, `job …` and `workers`. */
export const serverArgs = {
  server: { type: "string", valueHint: "URL", description: "A gpulayer server to run against (else GPULAYER_SERVER; neither: this machine); several replicas may be given, comma-separated: the next is asked when one stops answering" },
  token: { type: "string", valueHint: "TOKEN", description: "A user token of the server (else GPULAYER_TOKEN)" },
  "token-file": { type: "string", valueHint: "FILE", description: "Read the token from FILE (- : standard input; else GPULAYER_TOKEN_FILE)" },
} as const satisfies ArgsDef;

/**
 * Where a command with a local and a fleet meaning acts: with a server configured (--server, GPULAYER_SERVER or the
 * config file) the fleet, else this machine; --local says this machine whatever is configured.
 */
export const placeArgs = {
  ...serverArgs,
  local: { type: "boolean", description: "This machine, even with a server configured (--server, GPULAYER_SERVER or the config file)" },
} as const satisfies ArgsDef;

/** Narrow which workers may take the work (with a server). */
export const labelArgs = {
  label: { type: "string", valueHint: "K=V", description: "With a server: only workers with this label (repeatable)" },
} as const satisfies ArgsDef;

/**
 * citty keeps only the last value of a repeated flag; collect all of them
 * from the raw arguments (before `--`).
 */
export function repeated(rawArgs: string[], names: string[]): string[] {
  const values: string[] = [];
  for (let i = 0; i < rawArgs.length; i++) {
    const arg = rawArgs[i]!;
    if (arg === "--") break;
    for (const name of names) {
      if (arg === name) {
        const value = rawArgs[i + 1];
        if (value === undefined) throw new UsageError(`${name} needs a value`);
        values.push(value);
        i++;
      } else if (name.startsWith("--") && arg.startsWith(`${name}=`)) {
        values.push(arg.slice(name.length + 1));
      }
    }
  }
  return values;
}

/** The arguments after `--`, verbatim. */
export function afterDoubleDash(rawArgs: string[]): string[] {
  const i = rawArgs.indexOf("--");
  return i === -1 ? [] : rawArgs.slice(i + 1);
}

/**
 * citty accepts any flag, drops extra arguments and takes a missing value as
 * none; a serious CLI names each of these. Values of flags that are settings
 * are judged by the setting's own kind (an empty one may mean "none" there).
 * `hints`: what to write instead of a flag users bring from a neighbouring command.
 */
export function rejectUnknownFlags(rawArgs: string[], args: ArgsDef, hints: Record<string, string> = {}): void {
  const known = new Set<string>(["--help", "-h"]);
  for (const [name, def] of Object.entries(args)) {
    known.add(`--${name}`);
    if (def.type === "boolean") known.add(`--no-${name}`);
    for (const a of aliasesOf(def)) known.add(a.length === 1 ? `-${a}` : `--${a}`);
  }
  // Built at the first flag without `=`: once per command line.
  let valued: Set<string> | undefined;
  const takesValue = (flag: string) => (valued ??= new Set(Object.entries(args).flatMap(([name, def]) => (def.type === "string" ? [`--${name}`, ...aliasesOf(def).map((a) => (a.length === 1 ? `-${a}` : `--${a}`))] : [])))).has(flag);
  const positionals = Object.values(args).filter((d) => d.type === "positional") as { valueHint?: string }[];
  let given = 0;
  let awaiting = ""; // a flag whose value is the next argument
  for (const arg of rawArgs) {
    if (arg === "--") break;
    const isFlag = arg.startsWith("-") && arg !== "-";
    if (awaiting) {
      if (isFlag) {
        // `--max-size -5G`: the value reads as flags to the parser; name the real problem, in the setting's own words.
        if (/^-\d/.test(arg)) {
          const setting = settingOfFlag(awaiting);
          const parsed = setting ? setting.kind.parse(arg) : null;
          throw new UsageError(`${awaiting} ${arg}: ${parsed && isProblem(parsed) ? parsed.problem : "a negative value is not taken"}`);
        }
        // `--max-size --dry-run`: the parser would take the next flag as the value.
        if (known.has(arg.includes("=") ? arg.slice(0, arg.indexOf("=")) : arg)) throw new UsageError(`${awaiting} needs a value (${arg} is an option)`);
      }
      if (arg === "") refuseEmpty(awaiting);
      awaiting = "";
      continue;
    }
    if (!isFlag) {
      if (++given > positionals.length) {
        const hint = positionals.at(-1)?.valueHint;
        // pip's own way to several files is one that includes them: say so rather than take only the first.
        const several = hint === "REQ_FILE" ? "; for several, write one that names each with -r" : "";
        throw new UsageError(`unexpected argument ${arg}${hint ? `: one ${hint} is taken${several}` : ""} (see --help)`);
      }
      continue;
    }
    const eq = arg.indexOf("=");
    const flag = eq === -1 ? arg : arg.slice(0, eq);
    if (!known.has(flag)) throw new UsageError(`unknown option ${flag}${hints[flag] ? `: ${hints[flag]}` : didYouMean(flag, [...known].filter((k) => k.startsWith("--"))) || " (see --help)"}`);
    if (eq === -1) awaiting = takesValue(flag) ? flag : "";
    else if (eq === arg.length - 1 && takesValue(flag)) refuseEmpty(flag);
  }
  if (awaiting) throw new UsageError(`${awaiting} needs a value`);
}

/** An empty value is no value, unless the flag is a setting whose kind says what empty means there. */
function refuseEmpty(flag: string): void {
  if (!settingOfFlag(flag)) throw new UsageError(`${flag} needs a value (an empty one was given)`);
}

function settingOfFlag(flag: string): SettingDef<unknown> | undefined {
  const name = SETTING_NAMES.find((n) => (SETTINGS[n] as SettingDef<unknown>).flag === flag);
  return name ? (SETTINGS[name] as SettingDef<unknown>) : undefined;
}

function aliasesOf(def: ArgsDef[string]): string[] {
  return "alias" in def && def.alias ? (Array.isArray(def.alias) ? def.alias : [def.alias]) : [];
}

/** --project with its --group and --extra flags (which say nothing without it). */
export function projectFlags(project: string | undefined, rawArgs: string[], opts: { jobFile?: boolean } = {}): Partial<Pick<EnvironmentRequest, "project" | "groups" | "extras">> {
  const groups = repeated(rawArgs, ["--group"]);
  const extras = repeated(rawArgs, ["--extra"]);
  if (project === undefined && (groups.length || extras.length)) {
    // With a job file, they select from its environment.project (jobs/spec.ts says so when it has none).
    if (opts.jobFile) return { groups, extras };
    throw new UsageError(`${groups.length ? "--group" : "--extra"} selects from a uv project's lock: give --project DIR with it`);
  }
  return project === undefined ? {} : { project, groups, extras };
}

/** A flag's whole number of at least 1 (--limit, --wait, ...), or one line naming the flag. */
export function count(flag: string, value: string): number {
  const n = Number(value);
  if (!/^\d+$/.test(value.trim()) || n < 1) throw new UsageError(`${flag} takes a whole number of at least 1, not ${JSON.stringify(value)}`);
  return n;
}
