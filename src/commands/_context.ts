import { readdirSync, readFileSync } from "node:fs";
import { homeLayout, type HomeLayout } from "../config/paths.ts";
import { UsageError } from "../errors.ts";
import { launchUmask } from "../core/owner-only.ts";
import { defaultPython } from "../config/python.ts";
import { type FlagValues, type ResolvedSettings, resolveSettings } from "../config/resolve.ts";
import type { SettingName } from "../config/table.ts";
import type { EngineHost } from "../docker/engine.ts";
import { containerSettings } from "../docker/container-settings.ts";
import type { RunnerSettings } from "../jobs/runner.ts";
import type { PrepareSettings } from "../jobs/prepare.ts";
import type { EnvSettings } from "../env/index-light.ts";
import type { JobSpec } from "../jobs/spec.ts";
import type { LocalGpu } from "../jobs/job-tasks.ts";
import { asksForGpus } from "../jobs/resources.ts";
import { allocatedGpus } from "../jobs/allocation.ts";

/**
 * What every command starts from, built once at its top: the settings
 * (flag > GPULAYER_* variable > config file > default, validated), the home
 * layout, the working directory, and the environment child processes get.
 * The one place that reads `process.env` (a test holds it to that).
 */
export interface CommandContext {
  settings: ResolvedSettings;
  values: ResolvedSettings["values"];
  layout: HomeLayout;
  cwd: string;
  /** What installers, engines and jobs inherit: this process's environment minus gpulayer's own secrets. */
  childEnv: Record<string, string>;
  /** The umask gpulayer was started with (it runs under 077 itself): a job's command gets it back. */
  jobUmask: number | undefined;
}

/**
 * Variables that are gpulayer's alone: never handed to a job or a tool. A token file's path is as good as the token
 * to a job that runs as the same user, and a database URL may hold a password.
 */
const OWN_SECRETS = ["GPULAYER_TOKEN", "GPULAYER_TOKEN_FILE", "GPULAYER_METRICS_TOKEN", "GPULAYER_DATABASE"];

/**
 * `configMayBeMissing`: for `config path`, which says where the file goes whether or not it is there.
 * `tokenFileUnread`: token_file left as a path, for a caller that steps aside when one is set (a file of `-` is
 * standard input, which can be read once).
 */
export async function commandContext(flags: FlagValues = {}, opts: { configMayBeMissing?: boolean; tokenFileUnread?: boolean } = {}): Promise<CommandContext> {
  const env = process.env;
  const settings = await resolveSettings(env, flags, opts);
  if (settings.values.token_file !== undefined && !opts.tokenFileUnread) tokenFromFile(settings);
  const childEnv: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) if (v !== undefined && !OWN_SECRETS.includes(k)) childEnv[k] = v;
  return {
    settings,
    values: settings.values,
    layout: homeLayout(settings.values.home, settings.configFile),
    cwd: process.cwd(),
    childEnv,
    jobUmask: launchUmask(),
  };
}

/** What worker.run_as must hold: the user reaches the envs and workdirs, and reads none of the worker's secrets. */
export function runAsChecks(ctx: CommandContext) {
  const tokenFile = ctx.values.token_file;
  return {
    env: ctx.childEnv,
    home: ctx.layout.root,
    reachable: [ctx.layout.envs, ctx.layout.clusterWork],
    closed: [ctx.layout.jobs, ctx.layout.identity, ctx.layout.clusterBundles],
    secret: [ctx.layout.server, ...(tokenFile && tokenFile !== "-" ? [tokenFile] : [])],
  };
}

/** How directly a setting was given: the token and its file are one setting in two forms, and the more direct one wins. */
const RANK = { flag: 3, env: 2, file: 1, default: 0 } as const;

/** token_file read into token, unless the token itself was given more directly; both at one level: the user meant two things. */
function tokenFromFile(settings: ResolvedSettings): void {
  const file = settings.values.token_file!;
  const from = settings.origins.token_file.name;
  const [given, viaFile] = [settings.origins.token, settings.origins.token_file];
  if (RANK[given.source] > RANK[viaFile.source]) return;
  if (RANK[given.source] === RANK[viaFile.source]) throw new UsageError(`${given.name} and ${viaFile.name}: give the token one way`);
  let text: string;
  try {
    // fd 0 itself, not /dev/stdin: a socket (as some launchers give) cannot be opened by path.
    text = readFileSync(file === "-" ? 0 : file, "utf8");
  } catch (error) {
    throw new UsageError(`${from} ${file}: cannot read it (${(error as NodeJS.ErrnoException).code ?? (error as Error).message})`);
  }
  const token = text.split("\n").map((l) => l.trim()).find(Boolean);
  if (!token) throw new UsageError(`${from} ${file === "-" ? "- (standard input)" : file}: holds no token`);
  settings.values.token = token;
  settings.origins.token = settings.origins.token_file;
}

/** Colour only for a terminal, and never against NO_COLOR; FORCE_COLOR forces it (https://no-color.org, https://force-color.org). */
export function colorFor(stream: { isTTY?: boolean }): boolean {
  const env = process.env;
  if (env.FORCE_COLOR !== undefined && env.FORCE_COLOR !== "0" && env.FORCE_COLOR !== "false") return true;
  if (env.NO_COLOR) return false;
  return Boolean(stream.isTTY) && env.TERM !== "dumb";
}

/** Aborted by SIGINT, SIGTERM or SIGHUP: a build in progress stops, its installer's process group killed. */
export function stopOnSignals(): AbortSignal {
  const controller = new AbortController();
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.once(signal, () => controller.abort(new Error(signal)));
  return controller.signal;
}

/** How messages name where a setting came from: `--max-size`, `GPULAYER_CACHE_MAX_SIZE`, `cache.max_size in $GPULAYER_HOME/config.yaml`. */
export function originText(ctx: CommandContext, name: SettingName): string {
  const origin = ctx.settings.origins[name];
  if (origin.source !== "file") return origin.name;
  const root = ctx.layout.root;
  return `${name} in ${origin.name.startsWith(`${root}/`) ? `$GPULAYER_HOME${origin.name.slice(root.length)}` : origin.name}`;
}

/** How to reach the container engine: the children's environment, and container.engine when set. */
export function engineHost(ctx: CommandContext): EngineHost {
  const forced = ctx.values["container.engine"];
  const origin = ctx.settings.origins["container.engine"];
  return { env: ctx.childEnv, forced, forcedBy: forced ? (origin.source === "file" ? `container.engine in ${origin.name}` : origin.name) : undefined };
}

/**
 * How many tasks of a job run here at once: worker.slots, else the number of
 * GPUs (counted by the NVIDIA driver's own folder: no process started), at least 1.
 */
export function localSlots(ctx: CommandContext): number {
  const set = ctx.values["worker.slots"];
  if (set) return set;
  try {
    return Math.max(1, readdirSync("/proc/driver/nvidia/gpus").length);
  } catch {
    return 1;
  }
}

/** This machine's GPUs (a job of tasks shares them out): asked of nvidia-smi only when the job or a task needs a GPU (null: none does). */
export async function localGpus(ctx: CommandContext, spec: JobSpec): Promise<LocalGpu[] | null> {
  if (!asksForGpus(spec)) return null;
  // Loaded only here: the worker's probe is no part of any other command's start.
  const { probeGpus } = await import("../worker/probe.ts");
  // Inside a Slurm allocation, only the GPUs it gave (jobs/allocation.ts).
  return allocatedGpus((await probeGpus(ctx.childEnv)).map((g) => ({ index: g.index, uuid: g.uuid })), ctx.childEnv);
}

/** What the settings say about building an env: every prepare's, `env prepare`'s warm lane's too (nothing here starts a process). */
export function envSettings(ctx: CommandContext): EnvSettings {
  const v = ctx.values;
  const fallback = defaultPython(ctx.layout, ctx.settings);
  return {
    env: ctx.childEnv,
    prepareTimeoutMs: v.prepare_timeout,
    installer: v.installer,
    venvCreator: v.venv_creator,
    uv: v.uv,
    defaultPython: fallback.python,
    defaultPythonOrigin: fallback.origin,
  };
}

/** What `prepare` (jobs/prepare.ts) takes: the env's settings, and the container engine's for an image. */
export function prepareSettings(ctx: CommandContext): PrepareSettings {
  return { ...envSettings(ctx), engine: engineHost(ctx), container: { network: ctx.values["container.network"] } };
}

/** Everything a local job's runner takes from the settings. */
export function runnerSettings(ctx: CommandContext): RunnerSettings {
  const v = ctx.values;
  return {
    ...envSettings(ctx),
    engine: engineHost(ctx),
    container: containerSettings(v["container.network"], v["container.options"]),
    cancelGraceMs: v.cancel_grace,
    setpriv: Bun.which("setpriv", { PATH: ctx.childEnv.PATH ?? "/usr/bin:/bin" }),
    jobUmask: ctx.jobUmask,
  };
}
