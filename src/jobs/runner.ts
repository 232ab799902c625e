import { closeSync, openSync, writeSync } from "node:fs";
import { type Lease, takeLease } from "../core/lease.ts";
import type { RunAs } from "./run-as.ts";
import { CannotStart, type StartedTask, type TaskDriver } from "./drivers/driver.ts";
import { processDriver } from "./drivers/process.ts";
import { containerDriver } from "./drivers/container.ts";
import type { HomeLayout } from "../config/paths.ts";
import { ExitCode, InstallError, UserError } from "../errors.ts";
import { type PrepareHooks, wheelDocs } from "../env/index-light.ts";
import { prepare, type Prepared, type PrepareSettings } from "./prepare.ts";
import type { Shipping } from "../env/index-light.ts";
import type { ContainerSettings, EnsureHooks } from "../docker/index.ts";
import type { JobRecord, JobStore } from "./store.ts";
import type { EventSink, JobEventData, JobEventName, JobState } from "./model.ts";
import { bootId, processStartTime } from "../core/process-identity.ts";

/**
 * The runner of one task (a job without tasks is one), here or on a worker:
 * prepare (the env cache, or the image; timed as task.prepare), then run the
 * command (task.run) through a driver (jobs/drivers/: a process in its own
 * group, so cancel reaches every child, or a container), with its log, events,
 * record and cancel written once for both. Never mixes the two phases' time.
 */

export interface RunnerIO {
  onStdout?(chunk: Uint8Array): void;
  onStderr?(chunk: Uint8Array): void;
  prepareHooks?: PrepareHooks;
  imageHooks?: EnsureHooks;
  /** `key`: the env's key, or the image as the job names it. */
  onPrepared?(info: { status: string; seconds: number; key: string; kind: "env" | "image" }): void;
  onPrepareFailed?(message: string): void;
  /** Every event as it is recorded (a cluster worker forwards them to the server). */
  onEvent?: EventSink;
  /** A joined worker's env artifacts: fetched before a build, shared after one (env/store/shipping.ts). */
  shipping?: Shipping;
  /** Awaited once the env is ready, right before the command starts: a worker makes sure the job is still its own (a cancel meanwhile stops the start). */
  beforeRun?(): Promise<void>;
}

export interface JobOutcome {
  state: JobState;
  exitCode: number;
  prepareSeconds: number | null;
  runSeconds: number | null;
}

export interface RunningJob {
  done: Promise<JobOutcome>;
  /** SIGTERM to the job's process group, SIGKILL after the grace period. */
  cancel(reason: string): void;
}

/** What the runner takes from the settings, resolved once at the top: the prepare's (jobs/prepare.ts), and the run's. */
export interface RunnerSettings extends PrepareSettings {
  container: ContainerSettings;
  /** cancel_grace: SIGTERM, then SIGKILL this much later. */
  cancelGraceMs: number;
  /** worker.run_as: the job's command, and the build of its env, run as this user. */
  runAs?: RunAs;
  /** setpriv (util-linux) when on PATH: the job's main process gets a parent-death signal (and run_as its user). */
  setpriv: string | null;
  /** The umask the job's command runs with: the one gpulayer was started with (it runs under 077 itself). */
  jobUmask?: number;
}

/** What task.prepare leaves for task.run: the driver that runs the command, and what it holds until the command ends. */
interface Launch {
  driver: TaskDriver;
  prepareSeconds: number;
  /** The command started (its main process's pid). */
  onStarted?(pid: number): void;
  /** Lets go of what task.prepare holds (the env's and image's leases). */
  release(): void;
}

/**
 * `gpus`: the GPUs this task was given (ids or UUIDs, as its CUDA_VISIBLE_DEVICES names them); a
 * container gets exactly these. Without them, a container that asks for N gets the engine's first N.
 */
export function startJob(store: JobStore, layout: HomeLayout, job: JobRecord, settings: RunnerSettings, io: RunnerIO = {}, gpus?: string[]): RunningJob {
  let cancelReason: string | null = null;
  let running: StartedTask | null = null;
  const emit = <N extends JobEventName>(type: N, data: JobEventData[N]) => {
    store.event(job.id, type, data);
    io.onEvent?.(type, data);
  };

  // A cancel during task.prepare kills the installer's process group (nothing half-built is kept).
  const preparing = new AbortController();
  const cancel = (reason: string) => {
    if (cancelReason) return;
    cancelReason = reason;
    preparing.abort(new Error(reason));
    running?.stop();
  };

  const finish = (state: JobState, exitCode: number, extra: Partial<JobOutcome> = {}): JobOutcome => {
    if (state === "cancelled") emit("job.cancelled", { reason: cancelReason });
    store.update(job.id, { state, exitCode, childPid: null, childStart: null });
    return { state, exitCode, prepareSeconds: null, runSeconds: null, ...extra };
  };

  // The build's progress is the job's own events too (recorded here, relayed by a worker): the same record wherever it runs.
  const prepareHooks: PrepareHooks = {
    ...io.prepareHooks,
    onStep: (step, detail) => {
      emit("task.prepare.step", { step, detail });
      io.prepareHooks?.onStep?.(step, detail);
    },
    onQuiet: (tool, seconds) => {
      emit("task.prepare.quiet", { tool, seconds });
      io.prepareHooks?.onQuiet?.(tool, seconds);
    },
  };

  /** task.prepare, by the one prepare (jobs/prepare.ts): an image (and the env on top of it) or this machine's env; what runs it next. */
  const prepareLaunch = async (prepStart: number): Promise<Launch> => {
    const spec = job.spec;
    const prepared = await prepare(layout, settings, {
      request: spec.environment,
      workdir: spec.workdir,
      gpus: spec.resources.gpus,
      holder: `job ${job.id}`,
      signal: preparing.signal,
      shipping: io.shipping,
      forRun: true,
      hooks: { env: prepareHooks, image: io.imageHooks, onImage: (image, withEnv) => withEnv && io.onPrepared?.({ status: image.status, seconds: image.seconds, key: image.image, kind: "image" }) },
    });
    return prepared.kind === "image" ? imageLaunch(prepared, (performance.now() - prepStart) / 1000) : hostLaunch(prepared, (performance.now() - prepStart) / 1000);
  };

  /** An image job: prepared; run in a container. */
  const imageLaunch = (prepared: Extract<Prepared, { kind: "image" }>, prepareSeconds: number): Launch => {
    const spec = job.spec;
    const { image, env } = prepared;
    const hit = image.status === "reused" && (!env || env.status === "reused");
    // The job's env is the one on top of the image, as a server records it from this event.
    if (env) store.update(job.id, { envKey: env.key });
    emit("task.prepare.finished", {
      seconds: prepareSeconds,
      status: env?.status ?? image.status,
      cache: hit ? "hit" : "miss",
      image: image.image,
      digest: image.digest,
      engine: image.engine.name,
      // The two steps, each timed and reused or not: the image, then the env on top of it.
      ...(env ? { image_status: image.status, image_seconds: image.seconds, env_key: env.key, env_status: env.status, env_seconds: env.seconds } : {}),
      ...(env?.shadowed ? { shadowed: env.shadowed } : {}),
    });
    if (env) io.onPrepared?.({ status: env.status, seconds: env.seconds, key: env.key, kind: "env" });
    else io.onPrepared?.({ status: image.status, seconds: prepareSeconds, key: image.image, kind: "image" });
    const driver = containerDriver(
      {
        engine: image.engine,
        image: image.imageId,
        workdir: spec.workdir,
        // The env first on the image's own PATH, as a venv's activation would put it.
        env: { ...containerEnv(spec.env, gpus), GPULAYER_JOB_ID: job.id, ...prepared.vars },
        mounts: prepared.mounts,
        command: spec.argv,
        name: `gpulayer-${job.id}`.replace(/[^a-zA-Z0-9_.-]/g, "-"),
        // The GPUs it was given, by id: a count would be the node's first N, whichever this task holds.
        gpus: gpus ?? (spec.resources.gpus || undefined),
        network: settings.container.network,
        extraOptions: settings.container.extraOptions,
        engineEnv: settings.engine.env,
      },
      settings.cancelGraceMs,
    );
    return { driver, prepareSeconds, release: prepared.release };
  };

  /** A job on this machine's Python: its env found, fetched or built; run as a process. */
  const hostLaunch = (host: Extract<Prepared, { kind: "host" }>, prepareSeconds: number): Launch => {
    const spec = job.spec;
    const prepared = host.env;
    store.update(job.id, { envKey: prepared.key });
    emit("task.prepare.finished", { seconds: prepareSeconds, status: prepared.status, cache: prepared.status === "reused" ? "hit" : "miss", env_key: prepared.key, path: prepared.path, installer_path: prepared.installerPath, ...(prepared.shadowed ? { shadowed: prepared.shadowed } : {}), ...wheelDocs(prepared.wheels), ...(prepared.fetched ? { fetched: { bytes: prepared.fetched.bytes, seconds: prepared.fetched.seconds, built_by: prepared.fetched.builtBy } } : {}) });
    io.onPrepared?.({ status: prepared.status, seconds: prepareSeconds, key: prepared.key, kind: "env" });
    const env: Record<string, string> = { ...host.inherited, ...spec.env, ...host.vars, GPULAYER_JOB_ID: job.id };
    // The GPUs it was given and no others, as a worker's task gets them: a count alone would leave every GPU here (or the whole allocation) visible.
    if (gpus) env.CUDA_VISIBLE_DEVICES = gpus.join(",");
    let jobLease: Lease | undefined;
    return {
      driver: processDriver({ jobId: job.id, argv: spec.argv, workdir: spec.workdir, env, graceMs: settings.cancelGraceMs, setpriv: settings.setpriv, runAs: settings.runAs, umask: settings.jobUmask, watchdogPath: settings.env.PATH ?? "/usr/bin:/bin" }),
      prepareSeconds,
      // Held by the job itself too: if this runner dies, the env stays in use while any process of the job lives.
      onStarted: (pid) => (jobLease = takeLease(layout, "env", prepared.key, `job ${job.id}`, pid, job.id)),
      release: () => (jobLease?.release(), host.release()),
    };
  };

  /** task.run, whatever the driver: the log, the record, the events, cancel, and the outcome. */
  const runLaunch = async (launch: Launch): Promise<JobOutcome> => {
    const spec = job.spec;
    const { prepareSeconds } = launch;
    try {
      await io.beforeRun?.();
      if (cancelReason) return finish("cancelled", ExitCode.cancelled, { prepareSeconds });
      const log = openSync(store.logPath(job.id), "a");
      const sink = (to?: (c: Uint8Array) => void) => (c: Uint8Array) => {
        writeSync(log, c);
        to?.(c);
      };
      const runStart = performance.now();
      let started: StartedTask;
      try {
        started = await launch.driver.start({ stdout: sink(io.onStdout), stderr: sink(io.onStderr) });
      } catch (error) {
        if (!(error instanceof CannotStart)) {
          closeSync(log);
          throw error;
        }
        emit("task.run.started", { command: spec.commandText });
        emit("task.run.finished", { exit_code: ExitCode.cannotStart, seconds: 0, error: error.message });
        const line = new TextEncoder().encode(`gpulayer: ${error.message}\n`);
        writeSync(log, line);
        closeSync(log);
        io.onStderr?.(line);
        return finish("failed", ExitCode.cannotStart, { prepareSeconds, runSeconds: 0 });
      }
      running = started;
      store.update(job.id, { state: "running", childPid: started.pid, childStart: processStartTime(started.pid) });
      launch.onStarted?.(started.pid);
      emit("task.run.started", { pid: started.pid, ...started.details, command: spec.commandText });
      if (cancelReason) started.stop();
      const exit = await started.exited;
      running = null;
      closeSync(log);
      const runSeconds = (performance.now() - runStart) / 1000;
      emit("task.run.finished", { exit_code: exit.exitCode, seconds: runSeconds, ...(exit.signal ? { signal: exit.signal } : {}) });
      if (cancelReason) return finish("cancelled", exit.exitCode, { prepareSeconds, runSeconds });
      return finish(exit.exitCode === 0 ? "succeeded" : "failed", exit.exitCode, { prepareSeconds, runSeconds });
    } finally {
      launch.release();
    }
  };

  const done = (async (): Promise<JobOutcome> => {
    // Each pid with its start time: whoever signals it later checks that it is still this process.
    store.update(job.id, { state: "preparing", runnerPid: process.pid, runnerStart: processStartTime(process.pid), pidBoot: bootId() });
    emit("task.prepare.started", { image: job.spec.environment.image ?? null });
    const prepStart = performance.now();
    let launch: Launch;
    try {
      launch = await prepareLaunch(prepStart);
    } catch (error) {
      const seconds = (performance.now() - prepStart) / 1000;
      if (!(error instanceof UserError)) throw error;
      const message = error instanceof InstallError && error.detail ? `${error.message}: ${error.detail}` : error.message;
      emit("task.prepare.failed", { seconds, message });
      store.update(job.id, { error: message });
      io.onPrepareFailed?.(message);
      return finish(cancelReason ? "cancelled" : "failed", cancelReason ? ExitCode.cancelled : error.exitCode, { prepareSeconds: seconds });
    }
    return runLaunch(launch);
  })();

  return { done, cancel };
}

/** The engine shows a container only its given GPUs, renumbered from 0: an index naming them on the host would hide them. */
function containerEnv(env: Record<string, string>, gpus: string[] | undefined): Record<string, string> {
  if (!gpus) return env;
  const { CUDA_VISIBLE_DEVICES: _hostNames, ...rest } = env;
  return rest;
}
