import { existsSync, statSync } from "node:fs";
import { basename, dirname, isAbsolute, relative, resolve } from "node:path";
import { type JobFile, loadJobFile } from "../config/jobfile.ts";
import { type EnvironmentSource, environmentRequest } from "../env/request.ts";
import { positiveDuration } from "../config/kinds.ts";
import { UsageError } from "../errors.ts";

/** A job with every path resolved and flags merged over its file: what a runner needs, nothing else. */
export interface JobSpec {
  name: string;
  /** argv to exec; a string command becomes ["/bin/sh", "-c", text]. */
  argv: string[];
  commandText: string;
  workdir: string;
  env: Record<string, string>;
  environment: EnvironmentSource & { image?: string; /** environment.prepare_timeout or --prepare-timeout; else the runner's default. */ prepareTimeoutMs?: number; /** A remote job's bundle on its worker: the request may reach nothing outside it. */ confineTo?: string };
  resources: { gpus: number; frameworks: Record<string, string> };
}

/** What `job run` flags can say; each one overrides the job file's field. */
export interface JobFlags {
  file?: string;
  requirementsFile?: string;
  specs: string[];
  python?: string;
  workdir?: string;
  env: string[]; // K=V
  image?: string;
  prepareTimeoutMs?: number;
  indexUrl?: string;
  extraIndexUrls: string[];
  findLinks: string[];
  command: string[]; // after --
  name?: string;
  gpus?: number;
}

function parseEnvPairs(pairs: string[]): Record<string, string> {
  const env: Record<string, string> = {};
  for (const pair of pairs) {
    const i = pair.indexOf("=");
    if (i <= 0) throw new UsageError(`-e ${pair}: expected KEY=VALUE`);
    const key = pair.slice(0, i);
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(key)) throw new UsageError(`-e ${pair}: ${key} is not a valid variable name`);
    env[key] = pair.slice(i + 1);
  }
  return env;
}

export function buildJobSpec(flags: JobFlags, cwd: string): JobSpec {
  const file: JobFile = flags.file ? loadJobFile(resolve(cwd, flags.file)) : {};
  const fileDir = flags.file ? dirname(resolve(cwd, flags.file)) : cwd;
  const source = flags.file ? basename(flags.file) : "job";

  const workdir = flags.workdir ? resolve(cwd, flags.workdir) : resolve(fileDir, file.workdir ?? ".");
  if (!existsSync(workdir) || !statSync(workdir).isDirectory()) {
    throw new UsageError(flags.workdir ? `--workdir: not a directory: ${flags.workdir}` : `${source}: workdir: not a directory: ${file.workdir}`);
  }

  let argv: string[];
  let commandText: string;
  if (flags.command.length) {
    argv = flags.command;
    commandText = flags.command.join(" ");
  } else if (typeof file.command === "string") {
    argv = ["/bin/sh", "-c", file.command];
    commandText = file.command;
  } else if (Array.isArray(file.command)) {
    argv = file.command;
    commandText = file.command.join(" ");
  } else {
    throw new UsageError(flags.file ? `${source}: command: is required (or give one after --)` : "no command: give one after -- (gpulayer job run -p tqdm -- python train.py) or use -f JOB_FILE");
  }

  const env: Record<string, string> = {};
  for (const [k, val] of Object.entries(file.env ?? {})) env[k] = String(val);
  Object.assign(env, parseEnvPairs(flags.env));

  // Each field from the flags (paths against the current directory), else from the file (paths against the workdir): one rule, environmentRequest.
  const fe = file.environment ?? {};
  const byFlags = environmentRequest({ requirementsFile: flags.requirementsFile, specs: flags.specs, python: flags.python, indexUrl: flags.indexUrl, extraIndexUrls: flags.extraIndexUrls, findLinks: flags.findLinks }, cwd);
  const byFile = environmentRequest({ specs: [], python: fe.python, indexUrl: fe.index_url, extraIndexUrls: fe.extra_index_urls ?? [], findLinks: fe.find_links ?? [] }, workdir);
  const environment: JobSpec["environment"] = {
    specs: [],
    python: byFlags.python ?? byFile.python,
    indexUrl: byFlags.indexUrl ?? byFile.indexUrl,
    extraIndexUrls: byFlags.extraIndexUrls.length ? byFlags.extraIndexUrls : byFile.extraIndexUrls,
    findLinks: byFlags.findLinks.length ? byFlags.findLinks : byFile.findLinks,
    image: flags.image ?? fe.image,
    prepareTimeoutMs: flags.prepareTimeoutMs ?? (fe.prepare_timeout === undefined ? undefined : (positiveDuration.parse(fe.prepare_timeout) as number)),
  };
  if (byFlags.requirementsFile || flags.specs.length) {
    if (byFlags.requirementsFile) {
      if (!existsSync(byFlags.requirementsFile)) throw new UsageError(`-r: file not found: ${flags.requirementsFile}`);
      environment.requirementsFile = byFlags.requirementsFile;
    }
    environment.specs = flags.specs;
  } else if (typeof fe.requirements === "string") {
    const path = resolve(workdir, fe.requirements);
    const rel = relative(workdir, path);
    if (rel.startsWith("..") || isAbsolute(rel)) throw new UsageError(`${source}: environment.requirements: must be a path inside workdir: ${fe.requirements}`);
    if (!existsSync(path)) throw new UsageError(`${source}: environment.requirements: file not found: ${fe.requirements}`);
    environment.requirementsFile = path;
  } else if (Array.isArray(fe.requirements)) {
    environment.specs = fe.requirements;
  }

  return {
    name: flags.name ?? file.name ?? (flags.file ? basename(flags.file).replace(/\.(ya?ml|json)$/, "") : basename(argv[argv[0] === "/bin/sh" ? 2 : 0]?.split(" ")[0] ?? "job")),
    argv,
    commandText,
    workdir,
    env,
    environment,
    resources: { gpus: flags.gpus ?? file.resources?.gpus ?? 0, frameworks: file.resources?.frameworks ?? {} },
  };
}
