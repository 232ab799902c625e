import { existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { ownerOnlyFolder } from "../core/owner-only.ts";
import { type BundleLimits, unpackBundle } from "../cluster/bundle.ts";
import { type ClusterClient, untilServed } from "../cluster/client.ts";
import type { GpuInfo, PrepareTaskResult, RemoteSpec, TaskAssignment } from "../cluster/protocol.ts";
import { bundlePaths, type HomeLayout } from "../config/paths.ts";
import { BundleError, ExitCode, InstallError, UserError } from "../errors.ts";
import { prepare, type Prepared } from "../jobs/prepare.ts";
import { type RunnerSettings, type RunningJob, startJob } from "../jobs/runner.ts";
import { environmentRequest } from "../env/index-light.ts";
import type { JobSpec } from "../jobs/spec.ts";
import { giveTree } from "../jobs/run-as.ts";
import { gpuDeviceIds } from "../jobs/allocation.ts";
import { reclaimTree, removeTree } from "../core/tree-owner.ts";
import { JobStore } from "../jobs/store.ts";
import { acquireEntry } from "../env/index-light.ts";
import { type Lease, takeLease } from "../core/lease.ts";
import { touchFile } from "../env/index-light.ts";
import { TaskChannel } from "./channel.ts";
import { type ShippingSettings, workerShipping } from "./env-shipping.ts";
import type { Outbox } from "./outbox.ts";
import { placeInputs, sendOutputs } from "./task-outputs.ts";

/**
 * A task on this worker: a job (fetch its bundle, unpack it, run it with the
 * local runner and its env cache, forward events and output) or a prepare
 * (build or find the env, or pull the image, and say which).
 */

export interface WorkerContext {
  layout: HomeLayout;
  client: ClusterClient;
  gpus: GpuInfo[];
  /** The settings jobs and prepares run under (its defaultPython is the worker's Python). */
  runner: RunnerSettings;
  bundleLimits: BundleLimits;
  /** What the server is owed, on disk until it acknowledges it. */
  outbox: Outbox;
  /** worker.keep_workdirs: leave remote jobs' unpacked workdirs (for debugging). */
  keepWorkdirs: boolean;
  /** Env artifacts with the rest of the fleet (worker/env-shipping.ts). */
  shipping: ShippingSettings;
  log(message: string): void;
  /** How long after the server last heard from this worker its tasks are surely still its own (its lease, less a margin). */
  safeSilenceMs(): number;
}

export interface TaskHandle {
  task: TaskAssignment;
  done: Promise<void>;
  cancel(reason: string): void;
  /** Stop it here and give it back to the server (to be run elsewhere); resolves once the server knows. */
  handBack(reason: string): Promise<void>;
  /** The server says it is no longer this worker's (it gave it out again): stopped here, nothing more reported. */
  takenBack(reason: string): void;
}

/** A remote task's working folder (or a prepare's empty one), under the worker's cluster/work. */
function workDir(ctx: WorkerContext, name: string): string {
  return join(ctx.layout.clusterWork, name);
}

/** The bundle's tar.gz, fetched once per worker and checked against its hash. */
async function fetchBundle(ctx: WorkerContext, hash: string, stopped: () => boolean): Promise<string> {
  const file = bundlePaths(ctx.layout, hash).file;
  if (existsSync(file)) return file;
  // Asked again through an outage of the coordinator, as a task's reports are: it fails no job already given out.
  const data = (await untilServed(() => ctx.client.bytes(`/v1/bundles/${hash}`), stopped)).data;
  if (new Bun.CryptoHasher("sha256").update(data).digest("hex") !== hash) throw new BundleError(`bundle ${hash.slice(0, 12)} arrived damaged (hash mismatch)`);
  ownerOnlyFolder(ctx.layout.clusterBundles);
  const tmp = `${file}.${process.pid}.${crypto.randomUUID()}.tmp`;
  writeFileSync(tmp, data);
  renameSync(tmp, file);
  return file;
}

/**
 * The bundle unpacked once at a path named by its hash: requirements files and
 * local find-links are read from here, so the env key is the same for every
 * job of an unchanged folder.
 */
async function sharedCopy(ctx: WorkerContext, hash: string, file: string): Promise<string> {
  const dir = bundlePaths(ctx.layout, hash).dir;
  if (existsSync(dir)) return dir;
  const tmp = `${dir}.${process.pid}.${crypto.randomUUID()}.tmp`;
  await unpackBundle(file, tmp, ctx.bundleLimits);
  try {
    renameSync(tmp, dir);
  } catch {
    rmSync(tmp, { recursive: true, force: true }); // another task got there first
  }
  return dir;
}

/**
 * The worker's kept copy of a bundle (its tar.gz and the same unpacked),
 * leased for as long as the task uses it, so gc (gc/bundle-source.ts) leaves
 * it be: the lease comes first, then the look and any fetch, holding the
 * copy's lock, which gc holds while it moves a copy out. The caller releases
 * the lease when the task ends.
 */
async function useBundle(ctx: WorkerContext, hash: string, holder: string, stopped: () => boolean): Promise<{ file: string; dir: string; lease: Lease }> {
  const paths = bundlePaths(ctx.layout, hash);
  const lease = takeLease(ctx.layout, "bundle", hash, holder);
  try {
    await acquireEntry({
      lock: paths.lock,
      // Looked at only under the lock: never between gc moving the tar.gz out and the folder.
      reuse: (look) => (look.locked && existsSync(paths.file) && existsSync(paths.dir) ? paths : null),
      build: async () => {
        await sharedCopy(ctx, hash, await fetchBundle(ctx, hash, stopped));
        return paths;
      },
    });
    touchFile(paths.lastUsed);
    return { file: paths.file, dir: paths.dir, lease };
  } catch (error) {
    lease.release();
    throw error;
  }
}

/** A prepare's failure and steps, their paths in the job's folder written from it (`inJobFolder`). */
function namedInJobFolder(data: object, inJobFolder: (text: string) => string): { message?: string; detail?: string } {
  const { message, detail } = data as { message?: unknown; detail?: unknown };
  return { ...(typeof message === "string" ? { message: inJobFolder(message) } : {}), ...(typeof detail === "string" ? { detail: inJobFolder(detail) } : {}) };
}

function localSpec(spec: RemoteSpec, workdir: string, source: string, ctx: WorkerContext, gpus: number[]): JobSpec {
  const env = { ...spec.env };
  // The GPUs the server gave this job, and no others (none when it asked for none).
  if (ctx.gpus.length) env.CUDA_VISIBLE_DEVICES = gpuDeviceIds(ctx.gpus, gpus).join(",");
  return {
    name: spec.name,
    argv: spec.argv,
    commandText: spec.commandText,
    workdir,
    env,
    // Read in the bundle's copy: every worker's key for it is the same (the image and time limit pass through).
    environment: { ...environmentRequest(spec.environment, source, ctx.runner.defaultPython, ctx.runner.defaultPythonOrigin), confineTo: source },
    resources: spec.resources,
    ...(spec.outputs?.length ? { outputs: spec.outputs } : {}),
  };
}

const messageOf = (error: unknown) => (error instanceof InstallError && error.detail ? `${error.message}: ${error.detail}` : error instanceof Error ? error.message : String(error));

/** `asked`: when the poll that brought the task was sent. */
export function startJobTask(ctx: WorkerContext, task: TaskAssignment, asked: number): TaskHandle {
  let running: RunningJob | null = null;
  let stopReason: string | null = null;
  let handedBack: string | null = null;
  const channel = new TaskChannel(ctx.client, task.id, ctx.outbox, (m) => {
    ctx.log(`task ${task.id} (job ${task.job_id}) taken back by the server: ${m}; stopping it`);
    stopReason = "taken back by the server";
    running?.cancel(stopReason);
  }, ctx.log);
  const workdir = workDir(ctx, `${task.job_id}-${task.attempt}`);
  // The final state goes through the outbox like everything else, after it; the task is done once the server has it.
  const finish = (body: Record<string, unknown>) => {
    channel.finish(body);
    return channel.flush();
  };

  let bundleLease: Lease | undefined;
  const done = (async () => {
    try {
      let source = workdir;
      rmSync(workdir, { recursive: true, force: true });
      if (task.bundle) {
        const copy = await useBundle(ctx, task.bundle, `task ${task.id} (job ${task.job_id})`, () => stopReason !== null);
        bundleLease = copy.lease;
        source = copy.dir;
        await unpackBundle(copy.file, workdir, ctx.bundleLimits);
      } else mkdirSync(workdir, { recursive: true });
      // What the tasks it needs left, fetched (the bundles' entry checks) and put at their paths.
      const unplaced = await placeInputs(task, workdir, (hash) => useBundle(ctx, hash, `task ${task.id} (job ${task.job_id}): inputs`, () => stopReason !== null));
      // Failed in task.prepare with the line a task run here fails with (jobs/outputs.ts); a stop meanwhile is the stop's.
      if (unplaced && !stopReason) {
        ctx.log(`task ${task.id} (job ${task.job_id}) failed on this worker: ${unplaced}`);
        if (!handedBack && !channel.muted) {
          channel.event("task.prepare.failed", { seconds: 0, message: unplaced });
          await finish({ state: "failed", exit_code: ExitCode.failed, error: unplaced });
        }
        return;
      }
      if (ctx.runner.runAs) giveTree(workdir, ctx.runner.runAs);
      if (stopReason) {
        if (handedBack) return;
        channel.event("job.cancelled", { reason: stopReason });
        await finish({ state: "cancelled", exit_code: ExitCode.cancelled, error: null });
        return;
      }
      const store = new JobStore(ctx.layout);
      const job = store.create(localSpec(task.spec!, workdir, source, ctx, task.gpus));
      // What goes to the server names the job's own folder as ./, not where this worker keeps it.
      const inJobFolder = (text: string) => [source, workdir].reduce((t, dir) => t.replaceAll(`${dir}/`, "./").replaceAll(dir, "."), text);
      running = startJob(store, ctx.layout, job, ctx.runner, {
        shipping: workerShipping(ctx.shipping, task.id),
        // Every event the runner records, the build's progress (task.prepare.step) among them, goes on to the server.
        onEvent: (type, data) => channel.event(type, { ...data, ...namedInJobFolder(data, inJobFolder), local_job: job.id }),
        onStdout: (c) => channel.output(c, "stdout"),
        onStderr: (c) => channel.output(c, "stderr"),
        // Handed out so long ago that the server may have given the job to another worker meanwhile (this one was frozen, or cut off,
        // past its lease): it starts only once the server has taken what the task reported so far (task.prepare.finished, sent just
        // before), which it refuses (409: taken back, the job is stopped here) for a task no longer this worker's.
        beforeRun: async () => {
          const since = Date.now() - asked;
          if (since < ctx.safeSilenceMs()) return;
          // Counted from the poll that brought it (the server may have handed it out any time since): this worker cannot know later.
          ctx.log(`job ${task.job_id}: asked for ${(since / 1000).toFixed(1)} s ago (a long poll), near this worker's lease: asking the server whether it is still ours before running it`);
          await channel.flush();
        },
        // The GPUs the server gave it, by id, as its CUDA_VISIBLE_DEVICES names them (none: no GPU here).
      }, ctx.gpus.length ? gpuDeviceIds(ctx.gpus, task.gpus) : undefined);
      if (stopReason) running.cancel(stopReason);
      const ran = await running.done;
      let error = store.get(job.id)?.error ?? null;
      if (error) error = inJobFolder(error);
      let outcome = ran;
      if (ran.state === "succeeded" && task.spec?.outputs?.length) {
        // The events so far first: the server records the outputs after the run's end.
        await channel.flush();
        // worker.run_as: the folder taken back (ours, closed to the user) before we read it as root, so nothing the job left running can swap a path for a link meanwhile.
        if (ctx.runner.runAs) reclaimTree(workdir, ctx.runner.runAs.uid, ctx.runner.runAs.gid);
        const sent = await sendOutputs(ctx.client, ctx.bundleLimits, task, workdir, ctx.layout.clusterBundles, () => stopReason !== null);
        if ("failed" in sent) {
          channel.event(sent.missing ? "task.outputs.missing" : "task.outputs.failed", { message: sent.failed });
          outcome = { ...ran, state: "failed", exitCode: ExitCode.failed };
          error = sent.failed;
        }
      }
      ctx.log(`job ${task.job_id}: ended here (${outcome.state}, exit ${outcome.exitCode}); its end goes to the server`);
      store.close();
      if (!handedBack && !channel.muted) await finish({ state: outcome.state === "succeeded" ? "succeeded" : outcome.state === "cancelled" ? "cancelled" : "failed", exit_code: outcome.exitCode, error });
    } catch (error) {
      const message = messageOf(error);
      ctx.log(`task ${task.id} (job ${task.job_id}) failed on this worker: ${message}`);
      if (!handedBack && !channel.muted) {
        channel.event("task.bundle.failed", { message });
        await finish({ state: "failed", exit_code: error instanceof UserError ? error.exitCode : ExitCode.failed, error: message });
      }
    } finally {
      if (handedBack) {
        channel.handback(handedBack);
        await channel.flush();
      }
      try {
        if (!ctx.keepWorkdirs) removeTree(workdir);
      } finally {
        if (bundleLease && task.bundle) touchFile(bundlePaths(ctx.layout, task.bundle).lastUsed);
        bundleLease?.release();
      }
    }
  })();

  return {
    task,
    done,
    cancel(reason) {
      stopReason ??= reason;
      running?.cancel(reason);
    },
    takenBack(reason) {
      channel.revoke(reason);
    },
    async handBack(reason) {
      handedBack = reason;
      channel.seal();
      stopReason ??= reason;
      running?.cancel(reason);
      await done;
    },
  };
}

/** What a prepare task reports: the env (or the image, and its env when the request has one). */
function taskResult(prepared: Prepared, seconds: number): PrepareTaskResult {
  if (prepared.kind === "image") {
    const { image, env } = prepared;
    const result = { status: image.status, seconds: image.seconds, image: image.image, digest: image.digest };
    return env ? { ...result, status: env.status, seconds, key: env.key, path: env.path, ...(env.shadowed ? { shadowed: env.shadowed } : {}) } : result;
  }
  const r = prepared.env;
  return {
    status: r.status,
    seconds: r.seconds,
    key: r.key,
    path: r.path,
    installer_path: r.installerPath,
    check: r.check,
    ...(r.shadowed ? { shadowed: r.shadowed } : {}),
    ...(r.fetched ? { fetched: { bytes: r.fetched.bytes, seconds: r.fetched.seconds, built_by: r.fetched.builtBy } } : {}),
  };
}

export function startPrepareTask(ctx: WorkerContext, task: TaskAssignment): TaskHandle {
  let handedBack: string | null = null;
  const channel = new TaskChannel(ctx.client, task.id, ctx.outbox, () => {}, ctx.log);
  const { pull, ...request } = task.prepare!;
  const done = (async () => {
    const started = performance.now();
    let body: { state: string; exit_code: number; error: string | null; result: PrepareTaskResult };
    let bundleLease: Lease | undefined;
    const empty = workDir(ctx, `prepare-${task.id}`);
    try {
      let cwd = empty;
      const runAs = ctx.runner.runAs;
      rmSync(empty, { recursive: true, force: true });
      if (task.bundle) {
        const copy = await useBundle(ctx, task.bundle, `prepare task ${task.id}`, () => handedBack !== null);
        bundleLease = copy.lease;
        cwd = copy.dir;
        // worker.run_as: the build reads the user's own copy of the bundle (the worker's is closed to the user).
        if (runAs) await unpackBundle(copy.file, empty, ctx.bundleLimits);
      } else {
        // No bundle: an empty folder of the task's own, so a relative path in the request reaches nothing of the worker's.
        mkdirSync(cwd, { recursive: true });
      }
      if (runAs) giveTree(empty, runAs);
      const prepared = await prepare(ctx.layout, ctx.runner, {
        // Relative paths are read in the bundle's copy (the worker's, which the job's user cannot reach): a local
        // prepare's key; with worker.run_as the build reads the user's copy (`empty`), as a job's build does.
        request: { ...request, confineTo: cwd },
        workdir: empty,
        pull,
        shipping: workerShipping(ctx.shipping, task.id),
        // The build's steps, relayed to whoever runs `env prepare --server` (as a job's are).
        hooks: {
          env: {
            onStep: (step, detail) => channel.event("task.prepare.step", { step, detail }),
            onQuiet: (tool, seconds) => channel.event("task.prepare.quiet", { tool, seconds }),
          },
        },
      });
      prepared.release();
      const result = taskResult(prepared, (performance.now() - started) / 1000);
      body = { state: "succeeded", exit_code: ExitCode.ok, error: null, result };
    } catch (error) {
      const message = error instanceof UserError ? messageOf(error) : `internal error: ${messageOf(error)}`;
      body = { state: "failed", exit_code: error instanceof UserError ? error.exitCode : ExitCode.internal, error: message, result: { status: "failed", seconds: (performance.now() - started) / 1000, message } };
    } finally {
      bundleLease?.release();
      removeTree(empty);
    }
    if (!handedBack) {
      channel.finish(body);
      await channel.flush();
    }
  })();
  return {
    task,
    done,
    cancel() {},
    // Its build goes on (see handBack); its result is not reported.
    takenBack(reason) {
      channel.revoke(reason);
    },
    // A build cannot be stopped halfway without leaving work for the next one; the server is told now, the build ends with the process.
    async handBack(reason) {
      if (handedBack) return;
      handedBack = reason;
      channel.handback(reason);
      await channel.flush();
    },
  };
}
