import { age, anyText, boolean, choice, count, databaseUrl, duration, type Kind, positiveDuration, secret, serverUrl, size, word } from "./kinds.ts";

/**
 * Every setting gpulayer has, in one table: its config.yaml key (the name used
 * everywhere), its GPULAYER_* variable, the flag that sets it where a command
 * has one, its kind (one parser per kind) and its default. Resolved once, at
 * the top, flag > variable > file > default (src/config/resolve.ts); the
 * settings reference (docs/reference/settings.md) is generated from this one.
 */
export interface SettingDef<T> {
  env: string;
  flag?: string;
  kind: Kind<T>;
  default?: T;
  /** What the default is, when it is not a plain value (computed, or "none"). */
  defaultText?: string;
  /** False for the settings that say where the config file is. */
  inFile?: boolean;
  help: string;
}

export const SETTINGS = {
  home: { env: "GPULAYER_HOME", kind: word, defaultText: "$XDG_CACHE_HOME/gpulayer, else ~/.cache/gpulayer", inFile: false, help: "where envs, locks, jobs and the config file live" },
  config: { env: "GPULAYER_CONFIG", kind: word, defaultText: "$GPULAYER_HOME/config.yaml", inFile: false, help: "the config file" },
  python: { env: "GPULAYER_PYTHON", flag: "--python", kind: word, defaultText: "the one `join --python` saved, else python3 on PATH", help: "the Python envs are built for" },
  installer: { env: "GPULAYER_INSTALLER", kind: choice("auto", "uv", "pip"), default: "auto", help: "auto takes uv's fast path where it builds the same env, else pip" },
  uv: { env: "GPULAYER_UV", kind: word, default: "auto", help: "auto: uv on PATH, else a pinned uv gpulayer installs from the package index into its tools folder; a path: that uv; off: never uv (the pip path)" },
  venv_creator: { env: "GPULAYER_VENV_CREATOR", kind: choice("auto", "uv", "venv"), default: "auto", help: "what creates the virtual environment" },
  prepare_timeout: { env: "GPULAYER_PREPARE_TIMEOUT", flag: "--prepare-timeout", kind: positiveDuration, default: 30 * 60_000, help: "the longest an environment may take to build (a job's environment.prepare_timeout wins)" },
  cancel_grace: { env: "GPULAYER_CANCEL_GRACE", kind: duration, default: 10_000, help: "time between SIGTERM and SIGKILL when a job is cancelled" },
  "cache.max_size": { env: "GPULAYER_CACHE_MAX_SIZE", flag: "--max-size", kind: size, defaultText: "none", help: "the size gpulayer gc keeps the cache under" },
  "container.engine": { env: "GPULAYER_CONTAINER_ENGINE", kind: choice("docker", "podman"), defaultText: "the first that works", help: "the container engine for images" },
  "container.network": { env: "GPULAYER_CONTAINER_NETWORK", kind: word, default: "host", help: "the network mode of job containers" },
  "container.options": { env: "GPULAYER_CONTAINER_OPTIONS", kind: anyText, default: "", help: "extra engine options for job containers, shell-split (--shm-size 8g)" },
  server: { env: "GPULAYER_SERVER", flag: "--server", kind: serverUrl, defaultText: "none: commands run on this machine", help: "the coordinator to send jobs to; several replicas of it may be given, comma-separated (http://a:7070,http://b:7070): the client moves to the next when one stops answering" },
  token: { env: "GPULAYER_TOKEN", flag: "--token", kind: secret, defaultText: "none; the server makes one on its first start", help: "the server's token; never passed on to jobs" },
  token_file: { env: "GPULAYER_TOKEN_FILE", flag: "--token-file", kind: word, defaultText: "none", help: "a file holding the token, `-` for standard input (how `join` should get it: a token on a command line can be read by every process on the machine)" },
  "bundle.max_size": { env: "GPULAYER_BUNDLE_MAX", kind: size, default: 200 * 1024 ** 2, help: "the largest packed workdir bundle a remote job may send or a worker accept" },
  "bundle.max_unpacked": { env: "GPULAYER_BUNDLE_MAX_UNPACKED", kind: size, default: 2 * 1024 ** 3, help: "the most a bundle may hold unpacked" },
  "coordinator.listen": { env: "GPULAYER_LISTEN", flag: "--listen", kind: word, default: "127.0.0.1:7070", help: "where `gpulayer server` listens (HOST:PORT)" },
  "coordinator.database": { env: "GPULAYER_DATABASE", flag: "--database", kind: databaseUrl, defaultText: "SQLite in the server's home", help: "where `gpulayer server` keeps its state: a postgres:// URL lets several server replicas share it (one machine: leave it unset)" },
  "coordinator.files": { env: "GPULAYER_SERVER_FILES", flag: "--files", kind: word, defaultText: "$GPULAYER_HOME/server", help: "where the server keeps uploaded bundles and env artifacts; replicas on one database need one folder they all reach (NFS, a shared volume)" },
  "coordinator.heartbeat": { env: "GPULAYER_HEARTBEAT_SECONDS", kind: positiveDuration, default: 2_000, help: "how often workers report (the server tells them; a worker's own setting wins)" },
  "coordinator.worker_lost": { env: "GPULAYER_WORKER_LOST_SECONDS", kind: positiveDuration, default: 30_000, help: "silence after which a worker counts as gone and its jobs are retried" },
  "coordinator.worker_lease": { env: "GPULAYER_WORKER_LEASE", kind: positiveDuration, default: 300_000, help: "how long a lost worker's jobs stay its own: re-queued only after this much silence (a worker out of touch that long stops them itself), so no job runs twice at once" },
  "coordinator.job_max_attempts": { env: "GPULAYER_JOB_MAX_ATTEMPTS", kind: count(1), default: 3, help: "times a job is started before it fails for good" },
  "coordinator.max_body": { env: "GPULAYER_MAX_BODY_BYTES", kind: size, default: 8 * 1024 ** 2, help: "the largest JSON request the server reads" },
  "coordinator.max_job": { env: "GPULAYER_MAX_JOB_BYTES", kind: size, default: 2 * 1024 ** 2, help: "the largest job (or prepare) request the server takes: commands, env values and tasks together" },
  "coordinator.bundles_max_size": { env: "GPULAYER_BUNDLE_MAX_SIZE", kind: size, default: 10 * 1024 ** 3, help: "the most the server keeps of uploaded bundles, together" },
  "coordinator.bundle_retention": { env: "GPULAYER_BUNDLE_RETENTION", kind: age, default: 86_400_000, help: "how long an unused bundle is kept" },
  "coordinator.artifacts_max_size": { env: "GPULAYER_ARTIFACTS_MAX_SIZE", kind: size, default: 50 * 1024 ** 3, help: "the most the server keeps of env artifacts workers uploaded, together (least recently used go first)" },
  "coordinator.metrics_token": { env: "GPULAYER_METRICS_TOKEN", kind: secret, defaultText: "none: /metrics takes the server's token or a user token", help: "a token good for GET /metrics only, for a Prometheus scraper (at least 16 characters)" },
  "coordinator.share_envs": { env: "GPULAYER_SERVER_SHARE_ENVS", kind: boolean, default: true, help: "false: workers neither upload env artifacts nor fetch them; each builds its own" },
  "worker.slots": { env: "GPULAYER_WORKER_SLOTS", kind: count(1), defaultText: "the number of GPUs, at least 1", help: "jobs a worker runs at once" },
  "worker.drain": { env: "GPULAYER_WORKER_DRAIN_SECONDS", kind: duration, default: 30_000, help: "how long a stopping worker lets its jobs finish" },
  "worker.engine": { env: "GPULAYER_WORKER_ENGINE", kind: choice("auto", "none"), default: "auto", help: "none: the worker offers no container engine" },
  "worker.run_as": { env: "GPULAYER_WORKER_RUN_AS", flag: "--run-as", kind: word, defaultText: "none: jobs run as the worker's own user", help: "a worker running as root runs every job's command, and the build of its env, as this OS user, so neither can read the worker's token, credential or home" },
  "worker.share_envs": { env: "GPULAYER_SHARE_ENVS", kind: boolean, default: true, help: "false: this worker neither uploads the envs it builds nor fetches other workers' (it trusts no other worker's build)" },
  "worker.prefetch_envs": { env: "GPULAYER_PREFETCH_ENVS", flag: "--prefetch-envs", kind: count(0), default: 0, help: "on joining, fetch this many of the fleet's most used envs (jobs of the last 7 days) whose artifacts fit this worker's default Python, in the background, before its first job needs them (0: none; nothing where sharing envs is off)" },
  "worker.offline": { env: "GPULAYER_OFFLINE", flag: "--offline", kind: boolean, default: false, help: "a worker without a package index: it fetches the env artifacts other workers built, and builds only an env that needs compiled wheels, from theirs" },
  "worker.metrics_listen": { env: "GPULAYER_WORKER_METRICS_LISTEN", flag: "--metrics-listen", kind: word, defaultText: "none: no metrics served", help: "where a joined worker serves its own Prometheus metrics (HOST:PORT; no token: bind it to loopback or a private interface)" },
  "worker.keep_workdirs": { env: "GPULAYER_KEEP_WORKDIRS", kind: boolean, default: false, help: "keep remote jobs' unpacked workdirs (for debugging)" },
} satisfies Record<string, SettingDef<any>>;

export type SettingName = keyof typeof SETTINGS;
type ValueOf<D> = D extends { kind: Kind<infer T> } ? T : never;
/** The typed value of each setting; undefined where it has no default and nothing set it. */
export type SettingValues = { [K in SettingName]: (typeof SETTINGS)[K] extends { default: unknown } ? ValueOf<(typeof SETTINGS)[K]> : ValueOf<(typeof SETTINGS)[K]> | undefined };

export const SETTING_NAMES = Object.keys(SETTINGS) as SettingName[];
