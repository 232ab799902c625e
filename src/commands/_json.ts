import * as v from "valibot";
import { JOB_STATES, PHASE_NAMES, PHASE_STATES } from "../jobs/model.ts";

/**
 * Every `--json` document a command prints, written down once. Keys are
 * snake_case throughout, nested objects included; what a user wrote (variable
 * names, labels, package names) is data and kept as it is. Strict objects: a
 * key not listed here fails, so a document cannot grow a field unnoticed.
 *
 * Commands build their documents with one explicit mapping each, typed by the
 * types below (`import type`: valibot is not loaded on a command's way); the
 * schemas themselves are for the tests (test/json-documents.test.ts) and the
 * JSON reference (docs/reference/json.md), whose tables a test holds to the keys listed here.
 */

const str = v.string();
const num = v.number();
const bool = v.boolean();
const nullableStr = v.nullable(v.string());
const strList = v.array(v.string());
/** Data, not names of ours: variables, labels, package names. */
const strRecord = v.record(v.string(), v.string());

// ---- gpulayer version, config ----

export const VersionDocument = v.strictObject({ version: str, commit: str, target: str });

export const ConfigPathDocument = v.strictObject({ config_file: str, exists: bool });

export const SettingRow = v.strictObject({
  name: str,
  value: v.unknown(),
  shown: str,
  source: v.picklist(["flag", "env", "file", "worker", "default"]),
  origin: str,
  variable: str,
  flag: nullableStr,
  help: str,
});

export const ConfigDocument = v.strictObject({ config_file: str, config_file_exists: bool, settings: v.array(SettingRow) });

// ---- env prepare, env list, env show, env rm ----

/** A requirement built without isolation (env/build/wheelhouse.ts): compiled by this build, or its wheel taken from the wheelhouse. */
export const WheelBuilt = v.strictObject({ name: str, wheel: str, from: v.picklist(["compiled", "wheelhouse", "fleet"]), seconds: num, built_against: strList, built_by: v.optional(str) });

export const EnvPrepareDocument = v.strictObject({
  key: str,
  path: str,
  python: str,
  status: v.picklist(["built", "reused", "fetched"]),
  seconds: num,
  check: strList,
  installer_path: nullableStr,
  /** A uv project's env: the worker packages it shadows with the locked version. */
  shadowed: v.optional(v.array(v.strictObject({ name: str, worker: str, locked: str }))),
  /** Built: the requirements built without isolation, compiled or from the wheelhouse. */
  wheels: v.optional(v.array(WheelBuilt)),
});

/** The inputs a key covers, for people (env prepare --dry-run, env show). */
export const InputsReport = v.strictObject({
  files: v.array(v.strictObject({ path: str, kind: v.picklist(["requirements", "constraints"]), via: str, digest: str })),
  specs: strList,
  variables: v.array(v.strictObject({ name: str, set: bool })),
  locals: v.array(v.strictObject({ kind: v.picklist(["project", "editable", "archive"]), path: str, digest: str, files: v.optional(num), origin: str })),
  find_links: v.array(v.strictObject({ origin: str, url: v.optional(str), path: v.optional(str), digest: v.optional(str) })),
  index: v.strictObject({ index_url: nullableStr, extra_index_urls: strList, in_files: v.optional(strList), machine_pip_config: bool, machine_pip_config_sources: v.optional(strList) }),
  interpreter: v.strictObject({ path: str, via: nullableStr, executable: str, version: str, platform: str }),
  base: str,
  /** With a lock (a uv project, a pylock.toml), the whole input; its local projects are in locals. */
  lock: v.optional(
    v.strictObject({ kind: v.picklist(["uv.lock", "pylock.toml"]), path: str, digest: str, pyproject_digest: v.optional(str), groups: v.optional(strList), extras: v.optional(strList) }),
  ),
  /** The conda environment the interpreter is from, when the request named one. */
  conda: v.optional(v.strictObject({ prefix: str, name: nullableStr, packages: num, meta_digest: str })),
});

/** The env built here nearest a request that would build, and what differs (env/request/nearest.ts). */
export const NearestEnv = v.strictObject({ key: str, path: str, summary: str, created: nullableStr, differs: v.array(str) });

export const EnvDryRunDocument = v.strictObject({ key: str, would: v.picklist(["reuse", "build"]), path: str, summary: str, inputs: InputsReport, nearest: v.nullable(NearestEnv) });

export const EnvImageDocument = v.strictObject({
  image: str,
  digest: str,
  status: v.picklist(["pulled", "reused"]),
  seconds: num,
  engine: v.picklist(["docker", "podman"]),
  image_id: str,
  size_bytes: num,
  pulled_by_gpulayer: bool,
  /** With requirements: the env built on top of the image (for its Python, linked to its packages). */
  env: v.optional(v.strictObject({ key: str, path: str, status: v.picklist(["built", "reused"]), seconds: num, shadowed: v.optional(v.array(v.strictObject({ name: str, worker: str, locked: str }))) })),
});

export const EnvListEnvEntry = v.strictObject({
  kind: v.literal("env"),
  key: str,
  path: str,
  state: v.picklist(["ready", "building", "incomplete"]),
  size_bytes: num,
  created: nullableStr,
  last_used: nullableStr,
  summary: str,
  python: v.nullable(v.strictObject({ version: str, path: str })),
  requirements_file: nullableStr,
});

export const EnvListImageEntry = v.strictObject({
  kind: v.literal("image"),
  id: str,
  dir: str,
  engine: v.picklist(["docker", "podman"]),
  ref: str,
  digest: str,
  image_id: str,
  repo_digests: strList,
  size_bytes: num,
  first_seen: str,
  last_pulled: nullableStr,
  last_used: nullableStr,
  pulled_by_gpulayer: bool,
});

export const EnvListDocument = v.array(v.variant("kind", [EnvListEnvEntry, EnvListImageEntry]));

const UrlOrDigest = v.strictObject({ url: v.optional(str), digest: v.optional(str) });

/** The key document (src/env/request/key.ts): every input the installer reads, by content. */
export const KeyDocument = v.strictObject({
  schema: num,
  reading: v.strictObject({ requirements: strList, constraints: strList, lines: strList }),
  variables: v.record(v.string(), nullableStr),
  locals: v.array(v.strictObject({ kind: v.picklist(["project", "editable", "archive"]), digest: str, path: v.optional(str) })),
  find_links: v.array(UrlOrDigest),
  flags: v.strictObject({ index_url: nullableStr, extra_index_urls: strList, find_links: v.array(UrlOrDigest) }),
  installer_config: nullableStr,
  interpreter: v.strictObject({ executable: str, prefix: str, version: str, implementation: str, platform: str, soabi: str }),
  base: str,
  no_build_isolation: v.optional(strList),
  build_variables: v.optional(v.record(v.string(), nullableStr)),
});

export const EnvShowDocument = v.strictObject({
  key: str,
  path: str,
  python: str,
  created: str,
  build_seconds: num,
  size_bytes: num,
  venv_creator: v.picklist(["uv", "venv"]),
  installer: str,
  installer_path: nullableStr,
  installer_fallback: nullableStr,
  summary: str,
  request: KeyDocument,
  inputs: v.nullable(InputsReport),
  installed: strList,
  check: strList,
  shadowed: v.optional(v.array(v.strictObject({ name: str, worker: str, locked: str }))),
  wheels: v.optional(v.array(WheelBuilt)),
  last_used: str,
});

export const EnvRmDocument = v.strictObject({ key: str, removed: v.literal(true) });

// ---- gc ----

const gcItemEntries = {
  kind: v.picklist(["env", "image", "bundle", "wheel", "bytecode"]),
  id: str,
  state: v.picklist(["ready", "incomplete", "building"]),
  size_bytes: num,
  last_used: nullableStr,
  created: nullableStr,
  summary: str,
  image: v.optional(v.strictObject({ engine: str, refs: strList, digest: str })),
};

export const GcRemovedItem = v.strictObject({ ...gcItemEntries, reason: v.picklist(["lru", "incomplete", "image"]) });

export const GcSkippedItem = v.strictObject({
  ...gcItemEntries,
  reasons: v.array(v.strictObject({ code: v.picklist(["leased", "locked", "min-age", "keep", "changed", "container", "engine", "not-pulled", "failed"]), message: str })),
});

export const GcLimit = v.strictObject({
  max_size_bytes: v.nullable(num),
  origin: nullableStr,
  watermark: v.nullable(v.strictObject({ high: num, low: num, path: str, used_percent: num, excess_bytes: num })),
  min_age_seconds: num,
  keep: strList,
});

export const GcDocument = v.strictObject({
  ran: bool,
  dry_run: bool,
  limit: GcLimit,
  target_bytes: v.nullable(num),
  entries: num,
  total_before_bytes: num,
  total_after_bytes: num,
  freed_bytes: num,
  removed: v.array(GcRemovedItem),
  skipped: v.array(GcSkippedItem),
  trash: v.strictObject({ finished: num, freed_bytes: num }),
  limit_reached: bool,
  sizes_refreshed: num,
  seconds: num,
});

// ---- job run, status, list, cancel ----

const JobState = v.picklist(JOB_STATES);

export const JobPhase = v.strictObject({
  name: v.picklist(PHASE_NAMES),
  seconds: v.nullable(num),
  state: v.picklist(PHASE_STATES),
  cache: v.optional(v.picklist(["hit", "miss"])),
  status: v.optional(str),
  env_key: v.optional(str),
  image: v.optional(str),
  digest: v.optional(str),
  exit_code: v.optional(num),
  message: v.optional(str),
});

/** `data` is the event's own record (its keys snake_case too, its values what the job carried). */
export const JobEventEntry = v.strictObject({ ts: num, type: str, data: v.record(v.string(), v.unknown()), time: str });

export const JobStatusDocument = v.strictObject({
  id: str,
  name: str,
  state: JobState,
  exit_code: v.nullable(num),
  command: str,
  workdir: str,
  created: str,
  env_key: nullableStr,
  error: nullableStr,
  lost: v.optional(v.literal(true)),
  phases: v.array(JobPhase),
  /** A job of several tasks: each task, in the job file's order (its own events: `job status JOB --task NAME`). */
  tasks: v.optional(v.array(v.lazy(() => JobTaskEntry))),
  events: v.array(JobEventEntry),
});

/** One task of a job: its record's id, where it stands, what it waits for, and its own phases. */
export const JobTaskEntry = v.strictObject({
  name: str,
  id: str,
  state: JobState,
  needs: v.array(str),
  exit_code: v.nullable(num),
  env_key: nullableStr,
  error: nullableStr,
  command: str,
  phases: v.array(JobPhase),
  /** Through a server: the worker it ran on. */
  worker: v.optional(nullableStr),
  /** The files it left for the tasks that need it (its declared `outputs:`), with their sizes. */
  outputs: v.array(v.lazy(() => JobTaskOutput)),
});

/** One file a task left: its path in the task's folder, and its size. */
export const JobTaskOutput = v.strictObject({ path: str, bytes: num });

export const JobListEntry = v.omit(JobStatusDocument, ["events"]);

export const JobListDocument = v.array(JobListEntry);

/** `job run --dry-run --json`: each task as it would run (a job without tasks: one, named after it). */
export const JobDryRunTask = v.strictObject({
  name: str,
  command: str,
  workdir: str,
  needs: v.array(str),
  environment: v.strictObject({ key: nullableStr, would: v.nullable(v.picklist(["reuse", "build"])), summary: str, python: nullableStr, image: nullableStr, conda: nullableStr }),
  env: v.array(str),
  resources: v.strictObject({ gpus: num, frameworks: v.record(v.string(), v.string()) }),
});

export const JobDryRunDocument = v.strictObject({ name: str, tasks: v.array(JobDryRunTask) });

/** `job outputs --json`: what was fetched, task by task, into which folder. */
export const JobOutputsTask = v.strictObject({ name: str, files: v.array(JobTaskOutput) });
export const JobOutputsDocument = v.strictObject({ id: str, dir: str, tasks: v.array(JobOutputsTask) });

/** `job run --detach --json` and `job cancel --json`. */
export const JobStateDocument = v.strictObject({ id: str, state: JobState });

// ---- join, server, workers ----

export const GpuEntry = v.strictObject({ index: num, uuid: nullableStr, name: nullableStr, memory_mib: v.nullable(num), driver: nullableStr });

export const ProbeDocument = v.strictObject({
  hostname: str,
  os: str,
  arch: str,
  cpus: num,
  memory_bytes: num,
  gpus: v.array(GpuEntry),
  python: v.nullable(v.strictObject({ path: str, version: str })),
  python_error: nullableStr,
  frameworks: strRecord,
  cuda: nullableStr,
  engine: v.nullable(v.picklist(["docker", "podman"])),
  conda: v.array(v.strictObject({ name: nullableStr, prefix: str, frameworks: strRecord })),
  probe_ms: num,
});

export const JoinDocument = v.strictObject({ settings_file: str, name: str, python: nullableStr, labels: strRecord, probe: ProbeDocument });

/** `join SERVER_URL --json`, when the worker has stopped. */
export const JoinLeftDocument = v.strictObject({ name: str, url: str, left: v.literal(true) });

export const ServerDocument = v.strictObject({ url: str, port: num, state: str, token_file: nullableStr, replica: str, database: str, files: str, token: v.optional(str) });

/** `server token create --json`: the token itself, this once. */
export const ServerTokenCreateDocument = v.strictObject({ name: str, role: v.picklist(["user", "join"]), token: str });
export const ServerTokenEntry = v.strictObject({ name: str, role: v.picklist(["user", "join"]), created: str, last_used: nullableStr });
export const ServerTokenListDocument = v.array(ServerTokenEntry);
export const ServerTokenRevokeDocument = v.strictObject({ name: str, revoked: v.literal(true) });

export const WorkerEntry = v.strictObject({
  id: str,
  name: str,
  labels: strRecord,
  /** The named join token it joined with; null for the server's own token. */
  joined_with: nullableStr,
  state: v.picklist(["idle", "busy", "draining", "lost", "left"]),
  registered: str,
  last_seen: str,
  slots: num,
  running: num,
  free_gpus: v.array(num),
  probe: ProbeDocument,
  /** What it fetched on joining (worker.prefetch_envs); null when it prefetches nothing or has not reported yet. */
  prefetch: v.nullable(
    v.strictObject({
      state: v.picklist(["prefetching", "done", "off", "failed"]),
      wanted: num,
      planned: num,
      fetched: num,
      present: num,
      bytes: num,
      keys: v.array(str),
      reason: v.optional(str),
    }),
  ),
});

export const WorkersDocument = v.array(WorkerEntry);

// ---- errors ----

/** `gc --server URL --json`: the server's env artifacts trimmed (or, with --dry-run, that would be). */
export const GcServerDocument = v.strictObject({
  server: str,
  dry_run: v.boolean(),
  max_bytes: num,
  removed: v.array(v.strictObject({ sha256: str, key: str, bytes: num, built_by: str })),
  skipped: v.array(v.strictObject({ sha256: str, reason: str })),
  kept: num,
  kept_bytes: num,
  /** Each present worker's cache as it last reported it: shown, never trimmed from here (each worker runs its own gc). */
  workers: v.array(v.strictObject({ worker: str, entries: v.nullable(num), bytes: v.nullable(num) })),
});

/** A worker's env as it last reported it (its heartbeats carry its cache): in `env list` and `env show` of the fleet. */
const FleetWorkerEnv = v.strictObject({ key: str, state: str, size_bytes: num, last_used: nullableStr, summary: str, python: v.nullable(v.strictObject({ version: str, path: str })), requirements_file: nullableStr });
/** An env artifact the server keeps. */
const FleetArtifact = v.strictObject({ sha256: str, key: str, bytes: num, built_by: str, created: str, last_used: str });

/** `env list --json` with a server: each present worker's envs as it last reported them, and the server's artifacts. */
/** `env prepare --json` with a server: each worker's prepare task, as it ended. */
export const EnvPrepareFleetWorker = v.strictObject({
  worker: str,
  status: v.picklist(["built", "reused", "fetched", "pulled", "failed"]),
  /** The task's end as the worker sent it (absent when it ended without a result). */
  state: v.optional(v.picklist(["succeeded", "failed", "cancelled"])),
  seconds: num,
  key: v.optional(str),
  path: v.optional(str),
  installer_path: v.optional(nullableStr),
  check: v.optional(strList),
  shadowed: v.optional(v.array(v.strictObject({ name: str, worker: str, locked: str }))),
  fetched: v.optional(v.strictObject({ bytes: num, seconds: num, built_by: str })),
  image: v.optional(str),
  digest: v.optional(str),
  message: v.optional(str),
});

export const EnvPrepareFleetDocument = v.strictObject({ server: str, workers: v.array(EnvPrepareFleetWorker) });

export const EnvListFleetDocument = v.strictObject({
  server: str,
  workers: v.array(v.strictObject({ worker: str, state: str, reported: v.boolean(), envs: v.array(FleetWorkerEnv) })),
  artifacts: v.array(FleetArtifact),
});

/** `env show KEY --json` with a server: where on the fleet one env is (its details: `env show KEY --local` on a worker). */
export const EnvShowFleetDocument = v.strictObject({
  server: str,
  key: str,
  summary: str,
  workers: v.array(v.strictObject({ worker: str, state: str, size_bytes: num, last_used: nullableStr })),
  artifacts: v.array(FleetArtifact),
});

/** Any failure under --json (a job that ran and failed prints its status instead). */
export const ErrorDocument = v.strictObject({ error: v.strictObject({ message: str, exit_code: num }) });

/** Each command's document, by the command line that prints it. */
export const DOCUMENTS = {
  version: VersionDocument,
  config: ConfigDocument,
  "config path": ConfigPathDocument,
  "env prepare": EnvPrepareDocument,
  "env prepare --dry-run": EnvDryRunDocument,
  "env prepare --image": EnvImageDocument,
  "env list": EnvListDocument,
  "env show": EnvShowDocument,
  "env show: wheels[]": WheelBuilt,
  "env rm": EnvRmDocument,
  gc: GcDocument,
  "gc --server": GcServerDocument,
  "env prepare --server": EnvPrepareFleetDocument,
  "env list --server": EnvListFleetDocument,
  "env show --server": EnvShowFleetDocument,
  "job run": JobStatusDocument,
  "job run --detach": JobStateDocument,
  "job run --dry-run": JobDryRunDocument,
  "job status": JobStatusDocument,
  "job list": JobListDocument,
  "job cancel": JobStateDocument,
  "job outputs": JobOutputsDocument,
  join: JoinDocument,
  "join SERVER_URL": JoinLeftDocument,
  server: ServerDocument,
  "server token create": ServerTokenCreateDocument,
  "server token list": ServerTokenListDocument,
  "server token revoke": ServerTokenRevokeDocument,
  workers: WorkersDocument,
  error: ErrorDocument,
} as const;

/**
 * The field tables of docs/reference/json.md, by their headings: a
 * document's own keys, or, for a list, one entry's; and the objects nested in
 * them that have a table of their own.
 */
export const README_TABLES = {
  version: VersionDocument,
  config: ConfigDocument,
  "config: settings[]": SettingRow,
  "config path": ConfigPathDocument,
  "env prepare": EnvPrepareDocument,
  "env prepare --dry-run": EnvDryRunDocument,
  "env prepare --dry-run: inputs": InputsReport,
  "env prepare --dry-run: nearest": NearestEnv,
  "env prepare --image": EnvImageDocument,
  "env list: an env": EnvListEnvEntry,
  "env list: an image": EnvListImageEntry,
  "env show": EnvShowDocument,
  "env show: wheels[]": WheelBuilt,
  "env rm": EnvRmDocument,
  gc: GcDocument,
  "gc: limit": GcLimit,
  "gc: removed[]": GcRemovedItem,
  "gc: skipped[]": GcSkippedItem,
  "gc --server": GcServerDocument,
  "env prepare --server": EnvPrepareFleetDocument,
  "env prepare --server: workers[]": EnvPrepareFleetWorker,
  "env list --server": EnvListFleetDocument,
  "env show --server": EnvShowFleetDocument,
  "job status": JobStatusDocument,
  "job status: phases[]": JobPhase,
  "job status: tasks[]": JobTaskEntry,
  "job status: tasks[].outputs[]": JobTaskOutput,
  "job run --dry-run": JobDryRunDocument,
  "job run --dry-run: tasks[]": JobDryRunTask,
  "job status: events[]": JobEventEntry,
  "job list": JobListEntry,
  "job cancel": JobStateDocument,
  "job outputs": JobOutputsDocument,
  "job outputs: tasks[]": JobOutputsTask,
  join: JoinDocument,
  "join: probe": ProbeDocument,
  "join: probe.gpus[]": GpuEntry,
  "join SERVER_URL": JoinLeftDocument,
  server: ServerDocument,
  "server token create": ServerTokenCreateDocument,
  "server token list": ServerTokenEntry,
  "server token revoke": ServerTokenRevokeDocument,
  workers: WorkerEntry,
  error: ErrorDocument,
} as const;

export type VersionDoc = v.InferOutput<typeof VersionDocument>;
export type ConfigDoc = v.InferOutput<typeof ConfigDocument>;
export type ConfigPathDoc = v.InferOutput<typeof ConfigPathDocument>;
export type EnvPrepareDoc = v.InferOutput<typeof EnvPrepareDocument>;
export type EnvDryRunDoc = v.InferOutput<typeof EnvDryRunDocument>;
export type EnvImageDoc = v.InferOutput<typeof EnvImageDocument>;
export type EnvListEnvDoc = v.InferOutput<typeof EnvListEnvEntry>;
export type EnvListImageDoc = v.InferOutput<typeof EnvListImageEntry>;
export type EnvListDoc = v.InferOutput<typeof EnvListDocument>;
export type EnvShowDoc = v.InferOutput<typeof EnvShowDocument>;
export type EnvRmDoc = v.InferOutput<typeof EnvRmDocument>;
export type GcDoc = v.InferOutput<typeof GcDocument>;
export type GcServerDoc = v.InferOutput<typeof GcServerDocument>;
export type EnvListFleetDoc = v.InferOutput<typeof EnvListFleetDocument>;
export type EnvShowFleetDoc = v.InferOutput<typeof EnvShowFleetDocument>;
export type JobStatusDoc = v.InferOutput<typeof JobStatusDocument>;
export type JobDryRunDoc = v.InferOutput<typeof JobDryRunDocument>;
export type JobListDoc = v.InferOutput<typeof JobListDocument>;
export type JobStateDoc = v.InferOutput<typeof JobStateDocument>;
export type JobOutputsDoc = v.InferOutput<typeof JobOutputsDocument>;
export type ProbeDoc = v.InferOutput<typeof ProbeDocument>;
export type JoinDoc = v.InferOutput<typeof JoinDocument>;
export type JoinLeftDoc = v.InferOutput<typeof JoinLeftDocument>;
export type ServerDoc = v.InferOutput<typeof ServerDocument>;
export type ServerTokenCreateDoc = v.InferOutput<typeof ServerTokenCreateDocument>;
export type ServerTokenListDoc = v.InferOutput<typeof ServerTokenListDocument>;
export type ServerTokenRevokeDoc = v.InferOutput<typeof ServerTokenRevokeDocument>;
export type WorkersDoc = v.InferOutput<typeof WorkersDocument>;
export type ErrorDoc = v.InferOutput<typeof ErrorDocument>;
