import { closeSync, openSync, writeSync } from "node:fs";
import { endJobProcesses } from "../core/job-processes.ts";
import { withUmask } from "../core/owner-only.ts";
import { type Lease, takeLease } from "../core/lease.ts";
import { jobArgv, type RunAs, runAsEnv } from "./run-as.ts";
import { type Watchdog, watchJob } from "./watchdog.ts";
import type { HomeLayout } from "../config/paths.ts";
import { ExitCode, InstallError, UserError } from "../errors.ts";
import type { PrepareHooks } from "../env/lookup.ts";
import { prepare, type Prepared, type PrepareSettings } from "./prepare.ts";
import type { Shipping } from "../env/shipping.ts";
import { type ContainerSettings, type EnsureHooks, type RunningContainer, runContainer } from "../docker/index.ts";
import type { JobRecord, JobState, JobStore } from "./store.ts";
import type { JobSpec } from "./spec.ts";
import { bootId, processStartTime } from "../core/process-identity.ts";

/**
 * The local runner: prepare (the env cache; timed as task.prepare), then run
 * the command in the env (task.run), in its own process group so cancel
 * reaches every child. Never mixes the two phases' time.
 */

export interface RunnerIO {
  onStdout?(chunk: Uint8Array): void;
  onStderr?(chunk: Uint8Array): void;
  prepareHooks?: PrepareHooks;
  imageHooks?: EnsureHooks;
  onPrepared?(info: { status: string; seconds: number; key: string; kind: "env" | "image" }): void;
  onPrepareFailed?(message: string): void;
  /** Every event as it is recorded (a cluster worker forwards them to the server). */
  onEvent?(type: string, data: Record<string, unknown>): void;
  /** A joined worker's env artifacts: fetched before a build, shared after one (env/shipping.ts). */
  shipping?: Shipping;
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

const SIGNALS: Record<string, number> = { SIGHUP: 1, SIGINT: 2, SIGQUIT: 3, SIGKILL: 9, SIGTERM: 15 };

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

function killGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal);
  } catch {
    // the group is gone already
  }
}

export function startJob(store: JobStore, layout: HomeLayout, job: JobRecord, settings: RunnerSettings, io: RunnerIO = {}): RunningJob {
  let cancelReason: string | null = null;
  let child: Bun.Subprocess | null = null;
  let container: RunningContainer | null = null;
  let killTimer: ReturnType<typeof setTimeout> | undefined;
  let jobLease: Lease | undefined;
  let watchdog: Watchdog | null = null;
  const emit = (type: string, data: Record<string, unknown> = {}) => {
    store.event(job.id, type, data);
    io.onEvent?.(type, data);
  };

  // A cancel during task.prepare kills the installer's process group (nothing half-built is kept).
  const preparing = new AbortController();
  const cancel = (reason: string) => {
    if (cancelReason) return;
    cancelReason = reason;
    preparing.abort(new Error(reason));
    if (container) void container.stop(settings.cancelGraceMs / 1000);
    else if (child) {
      const pid = child.pid;
      killGroup(pid, "SIGTERM");
      killTimer = setTimeout(() => killGroup(pid, "SIGKILL"), settings.cancelGraceMs);
      // And whatever left the group (setsid, a daemon): every process with the job's mark.
      void endJobProcesses(job.id, settings.cancelGraceMs);
    }
  };

  const finish = (state: JobState, exitCode: number, extra: Partial<JobOutcome> = {}): JobOutcome => {
    if (state === "cancelled") emit("job.cancelled", { reason: cancelReason });
    store.update(job.id, { state, exitCode, childPid: null, childStart: null });
    return { state, exitCode, prepareSeconds: null, runSeconds: null, ...extra };
  };

  /** task.run in a container (the image is here, and the env on top of it when the job has requirements: prepare() was task.prepare). */
  const runImage = async (prepared: Extract<Prepared, { kind: "image" }>, prepareSeconds: number): Promise<JobOutcome> => {
    const spec = job.spec;
    const { image, env } = prepared;
    const hit = image.status === "reused" && (!env || env.status === "reused");
    emit("task.prepare.finished", {
      seconds: prepareSeconds,
      status: env?.status ?? image.status,
      cache: hit ? "hit" : "miss",
      image: image.image,
      digest: image.digest,
      engine: image.engine.name,
      // The two steps, each timed and reused or not: the image, then the env on top of it.
      ...(env ? { image_status: image.status, image_seconds: image.seconds, env_key: env.key, env_status: env.status, env_seconds: env.seconds } : {}),
    });
    if (env) io.onPrepared?.({ status: env.status, seconds: env.seconds, key: env.key, kind: "env" });
    else io.onPrepared?.({ status: image.status, seconds: prepareSeconds, key: image.digest, kind: "image" });
    try {
      if (cancelReason) return finish("cancelled", ExitCode.cancelled, { prepareSeconds });
      const log = openSync(store.logPath(job.id), "a");
      const sink = (to?: (c: Uint8Array) => void) => (c: Uint8Array) => {
        writeSync(log, c);
        to?.(c);
      };
      const runStart = performance.now();
      container = await runContainer({
        engine: image.engine,
        image: image.imageId,
        workdir: spec.workdir,
        // The env first on the image's own PATH, as a venv's activation would put it.
        env: { ...spec.env, GPULAYER_JOB_ID: job.id, ...prepared.vars },
        mounts: prepared.mounts,
        command: spec.argv,
        name: `gpulayer-${job.id}`.replace(/[^a-zA-Z0-9_.-]/g, "-"),
        gpus: spec.resources.gpus || undefined,
        network: settings.container.network,
        extraOptions: settings.container.extraOptions,
        engineEnv: settings.engine.env,
        onStdout: sink(io.onStdout),
        onStderr: sink(io.onStderr),
      });
      store.update(job.id, { state: "running", childPid: container.pid, childStart: processStartTime(container.pid) });
      emit("task.run.started", { pid: container.pid, container: container.name, engine: image.engine.name, command: spec.commandText });
      if (cancelReason) void container.stop(settings.cancelGraceMs / 1000);
      const exitCode = await container.exited;
      closeSync(log);
      const runSeconds = (performance.now() - runStart) / 1000;
      emit("task.run.finished", { exit_code: exitCode, seconds: runSeconds });
      if (cancelReason) return finish("cancelled", exitCode, { prepareSeconds, runSeconds });
      return finish(exitCode === 0 ? "succeeded" : "failed", exitCode, { prepareSeconds, runSeconds });
    } finally {
      prepared.release();
    }
  };

  const done = (async (): Promise<JobOutcome> => {
    const spec = job.spec;
    // Each pid with its start time: whoever signals it later checks that it is still this process.
    store.update(job.id, { state: "preparing", runnerPid: process.pid, runnerStart: processStartTime(process.pid), pidBoot: bootId() });
    emit("task.prepare.started", { image: spec.environment.image ?? null });
    const prepStart = performance.now();
    let host: Extract<Prepared, { kind: "host" }>;
    try {
      const prepared = await prepare(layout, settings, {
        request: spec.environment,
        workdir: spec.workdir,
        gpus: spec.resources.gpus,
        holder: `job ${job.id}`,
        signal: preparing.signal,
        shipping: io.shipping,
        forRun: true,
        hooks: { env: io.prepareHooks, image: io.imageHooks, onImage: (image, withEnv) => withEnv && io.onPrepared?.({ status: image.status, seconds: image.seconds, key: image.digest, kind: "image" }) },
      });
      if (prepared.kind === "image") return await runImage(prepared, (performance.now() - prepStart) / 1000);
      host = prepared;
    } catch (error) {
      const seconds = (performance.now() - prepStart) / 1000;
      if (!(error instanceof UserError)) throw error;
      const message = error instanceof InstallError && error.detail ? `${error.message}: ${error.detail}` : error.message;
      emit("task.prepare.failed", { seconds, message });
      store.update(job.id, { error: message });
      io.onPrepareFailed?.(message);
      return finish(cancelReason ? "cancelled" : "failed", cancelReason ? ExitCode.cancelled : error.exitCode, { prepareSeconds: seconds });
    }
    const prepared = host.env;
    const prepareSeconds = (performance.now() - prepStart) / 1000;
    store.update(job.id, { envKey: prepared.key });
    emit("task.prepare.finished", { seconds: prepareSeconds, status: prepared.status, cache: prepared.status === "reused" ? "hit" : "miss", env_key: prepared.key, path: prepared.path, installer_path: prepared.installerPath, ...(prepared.fetched ? { fetched: { bytes: prepared.fetched.bytes, seconds: prepared.fetched.seconds, built_by: prepared.fetched.builtBy } } : {}) });
    io.onPrepared?.({ status: prepared.status, seconds: prepareSeconds, key: prepared.key, kind: "env" });

    try {
      if (cancelReason) return finish("cancelled", ExitCode.cancelled, { prepareSeconds });
      const log = openSync(store.logPath(job.id), "a");
      const env: Record<string, string> = { ...host.inherited, ...spec.env, ...host.vars, GPULAYER_JOB_ID: job.id };
      if (settings.runAs) Object.assign(env, runAsEnv(settings.runAs));
      const runStart = performance.now();
      try {
        // Looked up as exec would, here: through setpriv the failure would read as setpriv's own.
        if (!Bun.which(spec.argv[0]!, { PATH: env.PATH, cwd: spec.workdir })) throw new Error(spec.argv[0]!.includes("/") ? "no such file, or not executable" : "not found on the job's PATH (the env's bin first), or not executable");
        child = Bun.spawn(jobArgv(withUmask(spec.argv, settings.jobUmask), settings.setpriv, settings.runAs), { cwd: spec.workdir, env, stdin: "ignore", stdout: "pipe", stderr: "pipe", detached: true });
      } catch (error) {
        closeSync(log);
        const message = `cannot start ${spec.argv[0]}: ${(error as Error).message}`;
        emit("task.run.started", { command: spec.commandText });
        emit("task.run.finished", { exit_code: ExitCode.cannotStart, seconds: 0, error: message });
        writeSync(openSync(store.logPath(job.id), "a"), `gpulayer: ${message}\n`);
        io.onStderr?.(new TextEncoder().encode(`gpulayer: ${message}\n`));
        return finish("failed", ExitCode.cannotStart, { prepareSeconds, runSeconds: 0 });
      }
      store.update(job.id, { state: "running", childPid: child.pid, childStart: processStartTime(child.pid) });
      // Held by the job itself too: if this runner dies, the env stays in use while any process of the job lives.
      jobLease = takeLease(layout, "env", prepared.key, `job ${job.id}`, child.pid, job.id);
      // And if this runner dies, what the job started is ended within a second.
      watchdog = watchJob(job.id, process.pid, settings.env.PATH ?? "/usr/bin:/bin");
      emit("task.run.started", { pid: child.pid, command: spec.commandText });
      if (cancelReason) cancel(cancelReason);
      const pump = async (stream: ReadableStream<Uint8Array>, sink?: (c: Uint8Array) => void) => {
        for await (const chunk of stream) {
          writeSync(log, chunk);
          sink?.(chunk);
        }
      };
      const pumped = Promise.all([pump(child.stdout as ReadableStream<Uint8Array>, io.onStdout), pump(child.stderr as ReadableStream<Uint8Array>, io.onStderr)]);
      await child.exited;
      // The job ends with its main process: what it left behind (in its group, or setsid and holding its output) is ended too.
      killGroup(child.pid, cancelReason ? "SIGKILL" : "SIGTERM");
      await endJobProcesses(job.id, cancelReason ? 0 : settings.cancelGraceMs);
      await pumped;
      clearTimeout(killTimer);
      closeSync(log);
      const runSeconds = (performance.now() - runStart) / 1000;
      const signal = child.signalCode;
      const exitCode = child.exitCode ?? ExitCode.signalBase + (signal ? (SIGNALS[signal] ?? 0) : 0);
      emit("task.run.finished", { exit_code: exitCode, seconds: runSeconds, ...(signal ? { signal } : {}) });
      if (cancelReason) return finish("cancelled", exitCode, { prepareSeconds, runSeconds });
      return finish(exitCode === 0 ? "succeeded" : "failed", exitCode, { prepareSeconds, runSeconds });
    } finally {
      watchdog?.stop();
      jobLease?.release();
      host.release();
    }
  })();

  return { done, cancel };
}
