import { existsSync, statSync } from "node:fs";
import { basename, dirname, isAbsolute, join, relative, resolve } from "node:path";
import type { EnvironmentFile, JobFile, TaskFile } from "../config/jobfile.ts";
import { type EnvironmentRequest, environmentRequest, projectFolderProblem, refuseOnImage } from "../env/index-light.ts";
import { validateRef } from "../docker/image-ref.ts";
import { positiveDuration } from "../config/kinds.ts";
import { join as shlexJoin } from "shlex";
import { UsageError } from "../errors.ts";
import { taskGraphProblem } from "./task-graph.ts";

/** A job with every path resolved and flags merged over its file: what a runner needs, nothing else. */
export interface JobSpec {
  name: string;
  /** argv to exec; a string command becomes ["/bin/sh", "-c", text]. */
  argv: string[];
  commandText: string;
  workdir: string;
  env: Record<string, string>;
  /** What it asks of its environment (env/request/request-schema.ts): the one shape from here to the wire and a worker's prepare. */
  environment: EnvironmentRequest;
  resources: { gpus: number; frameworks: Record<string, string> };
  /** A task's declared outputs (paths or globs relative to its workdir): found there when it succeeds, given to what needs it. */
  outputs?: string[];
  /** A job of several tasks (the job file's `tasks:`): each runs on its own, with the job's fields as its defaults. */
  tasks?: TaskSpec[];
}

/** One task of a job: its own spec (the job's fields inherited), and the tasks that must succeed before it starts. */
export interface TaskSpec {
  name: string;
  needs: string[];
  spec: JobSpec;
}

/** What `job run` flags can say; each one overrides the job file's field. Its environment fields are the request's own. */
export interface JobFlags extends Omit<EnvironmentRequest, "pythonOrigin" | "confineTo"> {
  file?: string;
  workdir?: string;
  env: string[]; // K=V
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

/** Refused before a job is recorded: a requirements file that is not there, or is a folder. */
function requirementsFileOrRefusal(path: string, where: string, given: string): void {
  const st = statSync(path, { throwIfNoEntry: false });
  if (!st) throw new UsageError(`${where}: file not found: ${given}`);
  if (st.isDirectory()) throw new UsageError(`${where}: ${given} is a directory, not a requirements file`);
  if (basename(path) === "uv.lock") throw new UsageError(`${where}: ${given} is a uv.lock, read with its project: ${where === "-r" ? "give --project" : "give environment.project"} with the project's folder`);
}

/** The environment fields a job file's section sets, resolved against `workdir`; fields it does not set are absent. */
function environmentFromFile(fe: EnvironmentFile, workdir: string, where: string): Partial<JobSpec["environment"]> {
  const byFile = environmentRequest({ specs: [], python: fe.python, indexUrl: fe.index_url, extraIndexUrls: fe.extra_index_urls ?? [], findLinks: fe.find_links ?? [] }, workdir);
  const out: Partial<JobSpec["environment"]> = {};
  if (fe.python !== undefined) Object.assign(out, { python: byFile.python, pythonOrigin: `${where}.python` });
  if (fe.conda !== undefined) out.conda = fe.conda;
  if (fe.index_url !== undefined) out.indexUrl = fe.index_url;
  if (fe.extra_index_urls !== undefined) out.extraIndexUrls = byFile.extraIndexUrls;
  if (fe.find_links !== undefined) out.findLinks = byFile.findLinks;
  if (fe.image !== undefined) out.image = fe.image;
  if (fe.project !== undefined) {
    const path = resolve(workdir, fe.project);
    const rel = relative(workdir, path);
    if (rel.startsWith("..") || isAbsolute(rel)) throw new UsageError(`${where}.project: must be a path inside workdir: ${fe.project}`);
    // Refused before a job is recorded, named by the file (the prepare would name --project).
    if (!statSync(path, { throwIfNoEntry: false })?.isDirectory()) throw new UsageError(`${where}.project: no such folder: ${fe.project}`);
    for (const f of ["pyproject.toml", "uv.lock"]) if (!existsSync(join(path, f))) throw new UsageError(`${where}.project: no ${f} in ${fe.project}${f === "uv.lock" ? " (run uv lock)" : ""}`);
    if (fe.requirements !== undefined) throw new UsageError(`${where}: project and requirements both say what to install; the lock is the whole environment: give one`);
    Object.assign(out, { project: path, groups: fe.groups ?? [], extras: fe.extras ?? [] });
  } else if (fe.groups !== undefined || fe.extras !== undefined) throw new UsageError(`${where}: ${fe.groups !== undefined ? "groups" : "extras"} select from a uv project's lock: give project with it`);
  if (fe.no_build_isolation !== undefined) out.noBuildIsolation = fe.no_build_isolation;
  if (fe.prepare_timeout !== undefined) out.prepareTimeoutMs = positiveDuration.parse(fe.prepare_timeout) as number;
  if (typeof fe.requirements === "string") {
    const path = resolve(workdir, fe.requirements);
    const rel = relative(workdir, path);
    if (rel.startsWith("..") || isAbsolute(rel)) throw new UsageError(`${where}.requirements: must be a path inside workdir: ${fe.requirements}`);
    requirementsFileOrRefusal(path, `${where}.requirements`, fe.requirements);
    Object.assign(out, { requirementsFile: path, specs: [] });
  } else if (Array.isArray(fe.requirements)) Object.assign(out, { requirementsFile: undefined, specs: fe.requirements, specsOrigin: `${where}.requirements` });
  return out;
}

/** A list command as a shell line would say it (quoted where a word needs it): what status, logs and --dry-run show. */
function commandLine(argv: string[]): string {
  return shlexJoin(argv);
}

function commandOf(command: string | string[]): { argv: string[]; commandText: string } {
  return typeof command === "string" ? { argv: ["/bin/sh", "-c", command], commandText: command } : { argv: command, commandText: commandLine(command) };
}

function directory(path: string, notOne: string): string {
  if (!existsSync(path) || !statSync(path).isDirectory()) throw new UsageError(notOne);
  return path;
}

export function buildJobSpec(flags: JobFlags, cwd: string): JobSpec {
  // The job file's schema (and the parsers it needs) is loaded only for a job file: about 1 ms of start-up otherwise.
  const file: JobFile = flags.file ? (require("../config/jobfile.ts") as typeof import("../config/jobfile.ts")).loadJobFile(resolve(cwd, flags.file)) : {};
  const fileDir = flags.file ? dirname(resolve(cwd, flags.file)) : cwd;
  const source = flags.file ? basename(flags.file) : "job";

  const workdir = flags.workdir ? resolve(cwd, flags.workdir) : resolve(fileDir, file.workdir ?? ".");
  directory(workdir, flags.workdir ? `--workdir: not a directory: ${flags.workdir}` : `${source}: workdir: not a directory: ${file.workdir}`);

  let argv: string[] = [];
  let commandText = "";
  if (file.tasks) {
    if (file.command !== undefined) throw new UsageError(`${source}: command: a job with tasks has no command of its own; give each task its command`);
    if (flags.command.length) throw new UsageError(`${source} has tasks, each with its own command: give none after --`);
  } else if (flags.command.length) ({ argv, commandText } = { argv: flags.command, commandText: commandLine(flags.command) });
  else if (file.command !== undefined) ({ argv, commandText } = commandOf(file.command));
  else throw new UsageError(flags.file ? `${source}: command: is required (or give one after --)` : "no command: give one after -- (gpulayer job run -p tqdm -- python train.py) or use -f JOB_FILE");

  const env: Record<string, string> = {};
  for (const [k, val] of Object.entries(file.env ?? {})) env[k] = String(val);
  Object.assign(env, parseEnvPairs(flags.env));

  // Each field from the flags (paths against the current directory), else from the file (paths against the workdir): one rule, environmentRequest.
  const byFlags = environmentRequest({ requirementsFile: flags.requirementsFile, specs: flags.specs, python: flags.python, indexUrl: flags.indexUrl, extraIndexUrls: flags.extraIndexUrls, findLinks: flags.findLinks }, cwd);
  const byFile = environmentFromFile(file.environment ?? {}, workdir, `${source}: environment`);
  // python and conda both name the base interpreter: one field. A flag for either replaces the file's.
  const base = flags.python !== undefined || flags.conda !== undefined ? { python: byFlags.python, pythonOrigin: byFlags.pythonOrigin, conda: flags.conda } : { python: byFile.python, pythonOrigin: byFile.pythonOrigin, conda: byFile.conda };
  if (base.python !== undefined && base.conda !== undefined) throw new UsageError(flags.python !== undefined || flags.conda !== undefined ? `--python and --conda both name the base interpreter: give one` : `${source}: environment: python and conda both name the base interpreter: give one`);
  const environment: JobSpec["environment"] = {
    specs: [],
    python: base.python,
    ...(base.pythonOrigin ? { pythonOrigin: base.pythonOrigin } : {}),
    conda: base.conda,
    indexUrl: byFlags.indexUrl ?? byFile.indexUrl,
    extraIndexUrls: byFlags.extraIndexUrls.length ? byFlags.extraIndexUrls : (byFile.extraIndexUrls ?? []),
    findLinks: byFlags.findLinks.length ? byFlags.findLinks : (byFile.findLinks ?? []),
    image: flags.image ?? byFile.image,
    prepareTimeoutMs: flags.prepareTimeoutMs ?? byFile.prepareTimeoutMs,
  };
  const noBuildIsolation = flags.noBuildIsolation?.length ? flags.noBuildIsolation : byFile.noBuildIsolation;
  if (noBuildIsolation?.length) environment.noBuildIsolation = noBuildIsolation;
  // What to install is one choice: a project, a requirements file, specs. Made by a flag, it replaces the file's whole (a file's
  // requirements never join a flag's project, nor a file's project a flag's requirements); a project given with requirements on
  // one side is refused when the env is prepared.
  const byFlagsChoice = flags.project !== undefined || Boolean(byFlags.requirementsFile) || flags.specs.length > 0;
  // --group and --extra without --project select from the job file's project, each replacing the file's own.
  const selecting = flags.project === undefined && Boolean(flags.groups?.length || flags.extras?.length);
  if (selecting && (byFlagsChoice || byFile.project === undefined)) {
    const flag = flags.groups?.length ? "--group" : "--extra";
    throw new UsageError(byFlagsChoice ? `${flag} selects from a uv project's lock, and ${byFlags.requirementsFile ? "-r" : "-p"} replaces ${source}'s project: give --project DIR with it` : `${flag} selects from a uv project's lock: give --project DIR, or environment.project in ${source}`);
  }
  if (byFlagsChoice) {
    if (flags.project !== undefined) {
      const path = resolve(cwd, flags.project);
      // Refused before a job is recorded, as a job file's project is.
      const problem = projectFolderProblem(path);
      if (problem) throw new UsageError(problem);
      Object.assign(environment, { project: path, groups: flags.groups ?? [], extras: flags.extras ?? [] });
    }
    if (byFlags.requirementsFile) {
      requirementsFileOrRefusal(byFlags.requirementsFile, "-r", flags.requirementsFile!);
      environment.requirementsFile = byFlags.requirementsFile;
    }
    environment.specs = flags.specs;
  } else {
    if (byFile.project !== undefined) Object.assign(environment, { project: byFile.project, groups: flags.groups?.length ? flags.groups : (byFile.groups ?? []), extras: flags.extras?.length ? flags.extras : (byFile.extras ?? []) });
    environment.requirementsFile = byFile.requirementsFile;
    environment.specs = byFile.specs ?? [];
    if (byFile.specsOrigin) environment.specsOrigin = byFile.specsOrigin;
  }

  const name = flags.name ?? file.name ?? (flags.file ? basename(flags.file).replace(/\.(ya?ml|json)$/, "") : basename(argv[argv[0] === "/bin/sh" ? 2 : 0]?.split(" ")[0] ?? "job"));
  const resources = { gpus: flags.gpus ?? file.resources?.gpus ?? 0, frameworks: file.resources?.frameworks ?? {} };
  const job: JobSpec = { name, argv, commandText, workdir, env, environment, resources };
  if (!file.tasks) {
    refusedOnImage(environment);
    return job;
  }
  const tasks = Object.entries(file.tasks).map(([taskName, task]) => ({ name: taskName, needs: task.needs ?? [], spec: taskSpec(job, taskName, task, fileDir, source) }));
  checkNeeds(tasks, source);
  // What runs is each task's request (the job's is only their default): each is refused here as prepare() would.
  for (const t of tasks) refusedOnImage(t.spec.environment);
  return { ...job, commandText: `tasks: ${tasks.map((t) => t.name).join(", ")}`, tasks };
}

/** What prepare() would refuse of a request with an image, refused before a job is recorded: a malformed reference first. */
function refusedOnImage(environment: JobSpec["environment"]): void {
  if (environment.image !== undefined) validateRef(environment.image);
  refuseOnImage(environment);
}

/**
 * A task's spec: the job's fields are its defaults. `env` is merged (the
 * task's value wins per variable); in `environment` and `resources`, each
 * field the task sets replaces the job's (requirements replace, they do not
 * add), and `environment: {}` is the worker's default, none of the job's.
 */
function taskSpec(job: JobSpec, name: string, task: TaskFile, fileDir: string, source: string): JobSpec {
  const at = `${source}: tasks.${name}`;
  const workdir = task.workdir ? directory(resolve(fileDir, task.workdir), `${at}.workdir: not a directory: ${task.workdir}`) : job.workdir;
  const env = { ...job.env };
  for (const [k, val] of Object.entries(task.env ?? {})) env[k] = String(val);
  let environment: JobSpec["environment"];
  if (task.environment === undefined) environment = job.environment;
  else if (Object.keys(task.environment).length === 0) environment = { specs: [], extraIndexUrls: [], findLinks: [] };
  else {
    const own = environmentFromFile(task.environment, workdir, `${at}.environment`);
    if (own.python !== undefined && own.conda !== undefined) throw new UsageError(`${at}.environment: python and conda both name the base interpreter: give one`);
    // One field, the base interpreter: a task's python replaces the job's conda, and its conda the job's python.
    const base = own.python !== undefined || own.conda !== undefined ? { python: own.python, conda: own.conda } : {};
    environment = { ...job.environment, ...own, ...base };
  }
  const resources = { gpus: task.resources?.gpus ?? job.resources.gpus, frameworks: task.resources?.frameworks ?? job.resources.frameworks };
  return { name, ...commandOf(task.command), workdir, env, environment, resources, ...(task.outputs?.length ? { outputs: task.outputs } : {}) };
}

/** The tasks' names and needs, as a server checks them too (task-graph.ts). */
function checkNeeds(tasks: TaskSpec[], source: string): void {
  const found = taskGraphProblem(tasks);
  if (found) throw new UsageError(`${source}: ${found.at}: ${found.problem}`);
}
