import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { sleep } from "../core/sleep.ts";
import { isUrl, refuseStaleLocks } from "../env/index-light.ts";
import type { JobSpec } from "../jobs/spec.ts";
import type { PackProgress, PackResult } from "./bundle.ts";
import { connect, type RemoteTarget } from "./client.ts";
import { ExitCode, HttpError, jobEndCode, UsageError, UserError } from "../errors.ts";
import { isFinal } from "../jobs/model.ts";
import { type RemoteJobStatus, type RemoteSpec, type SubmitRequest, type SubmitResponse, type WatchResponse } from "./protocol.ts";
import { carriedFiles, type CarryContext } from "./bundle-carry.ts";
import { inBundle, packTemp, postWithBundle, type UploadHooks, wireEnvironment } from "./upload.ts";

/**
 * Jobs on a coordinator, from the client's side: submit one (its folder
 * packed and sent only when the server lacks it), follow its output and
 * events, read, list and cancel. Nothing here prints: results are returned,
 * updates yielded, and what happens along the way goes to hooks.
 */

/** The job as it travels: paths inside its folder made relative to it (and checked to be in the bundle). */
export function remoteSpec(spec: JobSpec, pack?: PackResult): RemoteSpec {
  return {
    name: spec.name,
    argv: spec.argv,
    commandText: spec.commandText,
    env: spec.env,
    environment: wireEnvironment(spec.environment, spec.workdir, spec.workdir, pack),
    resources: spec.resources,
    ...(spec.outputs?.length ? { outputs: spec.outputs } : {}),
    ...(spec.tasks ? { tasks: spec.tasks.map((t) => ({ name: t.name, needs: t.needs, spec: remoteSpec(taskInBundle(spec, t), pack) })) } : {}),
  };
}

/** A task runs in the job's folder on its worker: one of its own elsewhere cannot travel with it. */
function taskInBundle(job: JobSpec, task: NonNullable<JobSpec["tasks"]>[number]): JobSpec {
  if (task.spec.workdir !== job.workdir && task.spec.workdir !== job.workdir.replace(/\/$/, "")) throw new UsageError(`task ${task.name}: a workdir of its own (${task.spec.workdir}) does not go with --server: its tasks run in the job's folder on their workers`);
  return { ...task.spec, workdir: job.workdir };
}

export interface SubmitHooks extends UploadHooks {
  /** A path of the folder that is not sent (too big, not a plain file, ...). */
  onSkipped?(skipped: PackResult["skipped"][number]): void;
  /** Files only their owner may read, left out (a .gpulayerignore `!pattern` sends one). */
  onOwnerOnly?(paths: string[]): void;
  /** Packing a big folder: every few thousand entries. */
  onPacking?(progress: PackProgress): void;
  /** The signal that asked to stop while the folder was packed (packing holds the event loop): nothing is sent then. */
  stopped?(): string | null;
}

export interface SubmitOptions {
  /**
   * Whether spec.workdir travels: only when it was asked for (--workdir, or a
   * job file). Otherwise the job runs in an empty folder on the worker, and
   * what would need a folder (-r, a local --find-links) is refused.
   */
  sendWorkdir: boolean;
  /** How the client reads the request to find the local projects whose installed files travel whatever .gitignore says. */
  reading: Omit<CarryContext, "cwd">;
}

/** The requests of a job and of each of its tasks. */
function requestsOf(spec: JobSpec): JobSpec["environment"][] {
  return [spec.environment, ...(spec.tasks ?? []).flatMap((t) => requestsOf(t.spec))];
}

/** Why a job cannot run without its folder, or null. */
export function needsFolder(spec: JobSpec): string | null {
  for (const t of spec.tasks ?? []) {
    const why = needsFolder(t.spec);
    if (why) return `task ${t.name}: ${why}`;
  }
  const e = spec.environment;
  if (e.project) return "--project needs its folder sent: give --workdir (the folder that holds the project, e.g. --workdir .)";
  if (e.requirementsFile) return "-r needs its folder sent: give --workdir (the folder that holds the requirements file, e.g. --workdir .)";
  const local = e.findLinks.find((f) => !isUrl(f));
  if (local) return `--find-links ${local} needs its folder sent: give --workdir (the folder that holds it, e.g. --workdir .)`;
  return null;
}

/** Pack the job's folder (or an empty one) and submit the job; the bundle is uploaded only when the server lacks it. */
export async function submitJob(target: RemoteTarget, spec: JobSpec, labels: Record<string, string>, hooks: SubmitHooks, opts: SubmitOptions): Promise<SubmitResponse> {
  let empty: string | null = null;
  if (!opts.sendWorkdir) {
    const why = needsFolder(spec);
    if (why) throw new UsageError(why);
    empty = mkdtempSync(join(tmpdir(), "gpulayer-empty-"));
  } else refuseStaleLocks(requestsOf(spec), opts.reading.env, spec.workdir);
  try {
    const root = empty ?? spec.workdir;
    const carried = !empty ? carriedFiles(root, requestsOf(spec), { ...opts.reading, cwd: root }) : undefined;
    const pack = packTemp(root, target.bundleLimits, hooks.onPacking, carried);
    try {
      // A signal that came during packing is heard only once the loop turns: before anything is sent.
      await new Promise((turned) => setTimeout(turned, 0));
      const stoppedBy = hooks.stopped?.();
      if (stoppedBy) throw new UserError(`${stoppedBy}: stopped before the job was submitted; nothing was sent`, ExitCode.cancelled);
      for (const s of pack.skipped) hooks.onSkipped?.(s);
      if (pack.ownerOnly.length) hooks.onOwnerOnly?.(pack.ownerOnly);
      const body = { spec: remoteSpec({ ...spec, workdir: root }, pack), bundle: pack.hash, labels, workdir: empty ? "(empty folder)" : spec.workdir } satisfies SubmitRequest;
      return await postWithBundle<SubmitResponse>(connect(target), "/v1/jobs", body, pack, hooks);
    } finally {
      pack.dispose();
    }
  } finally {
    if (empty) rmSync(empty, { recursive: true, force: true });
  }
}

/** What following a job brings: its output as it comes, and its events (with the worker it runs on). */
export type JobUpdate =
  | { kind: "output"; stream: "stdout" | "stderr"; data: Uint8Array }
  | { kind: "event"; type: string; data: Record<string, unknown>; worker: string | null };

/** How often a server that does not answer is tried again while following. */
const TROUBLE_RETRY_MS = 1000;

/**
 * Follow a job (long polls) until it has ended and its output is all here.
 * A server that does not answer (or answers 5xx: a proxy in front of one
 * restarting) is waited for as long as it takes, and following resumes
 * where it was, by output offset and event number, so nothing is shown
 * twice or missed; `onTrouble` hears when that starts (a message) and ends
 * (null). A refusal (4xx) ends it at once. Returns the last watch answer.
 */
export async function* followJob(target: RemoteTarget, id: string, opts: { fromLog?: number; onTrouble?: (message: string | null) => void } = {}): AsyncGenerator<JobUpdate, WatchResponse> {
  const client = connect(target);
  let log = opts.fromLog ?? 0;
  let after = 0;
  let troubled = false;
  for (;;) {
    let w: WatchResponse;
    try {
      w = await client.json<WatchResponse>("GET", `/v1/jobs/${id}/watch?log=${log}&after=${after}&wait=20`);
      if (troubled) opts.onTrouble?.(null);
      troubled = false;
    } catch (error) {
      if (error instanceof HttpError && error.status < 500) throw error;
      if (!troubled) opts.onTrouble?.(`the server does not answer (${(error as Error).message}); still following job ${id}, resuming where it was once it is back`);
      troubled = true;
      await sleep(TROUBLE_RETRY_MS);
      continue;
    }
    for (const c of w.output) yield { kind: "output", stream: c.stream, data: Buffer.from(c.data, "base64") };
    log = w.log_offset;
    for (const e of w.events) {
      after = e.seq;
      yield { kind: "event", type: e.type, data: e.data, worker: w.worker };
    }
    if (w.done) return w;
  }
}

export function jobStatus(target: RemoteTarget, id: string): Promise<RemoteJobStatus> {
  return connect(target).json<RemoteJobStatus>("GET", `/v1/jobs/${encodeURIComponent(id)}`);
}

/** jobStatus, with a server that does not answer (or answers 5xx) waited for, as followJob waits: for a follower that starts during an outage. */
export async function jobStatusOnceBack(target: RemoteTarget, id: string, onTrouble?: (message: string | null) => void): Promise<RemoteJobStatus> {
  let troubled = false;
  for (;;) {
    try {
      const status = await jobStatus(target, id);
      if (troubled) onTrouble?.(null);
      return status;
    } catch (error) {
      if (error instanceof HttpError && error.status < 500) throw error;
      if (!troubled) onTrouble?.(`the server does not answer (${(error as Error).message}); waiting for it to follow job ${id}`);
      troubled = true;
      await sleep(TROUBLE_RETRY_MS);
    }
  }
}

/** Follow a job to its end, each update handed to `onUpdate`; returns its last watch answer (its state and exit code). */
export async function followToEnd(target: RemoteTarget, id: string, onUpdate: (u: JobUpdate) => void, onTrouble?: (message: string | null) => void): Promise<WatchResponse> {
  const updates = followJob(target, id, { onTrouble });
  for (;;) {
    const next = await updates.next();
    if (next.done) return next.value;
    onUpdate(next.value);
  }
}

/** Newest first, without their events. */
export function listJobs(target: RemoteTarget, limit: number): Promise<Omit<RemoteJobStatus, "events">[]> {
  return connect(target).json<Omit<RemoteJobStatus, "events">[]>("GET", `/v1/jobs?limit=${limit}`);
}

/** The job's whole output so far, as it came. */
export async function jobLog(target: RemoteTarget, id: string): Promise<Uint8Array> {
  return (await connect(target).bytes(`/v1/jobs/${encodeURIComponent(id)}/log`)).data;
}

/** Ask for a job to be cancelled, and return at once (its worker stops it and reports back). */
export function requestCancel(target: RemoteTarget, id: string): Promise<{ id: string; state: string }> {
  return connect(target).json<{ id: string; state: string }>("POST", `/v1/jobs/${id}/cancel`);
}

/** Cancel a job and wait for it to end: its grace (cancel_grace) and 15 s more for the worker to report. */
export async function cancelJob(target: RemoteTarget, id: string, opts: { graceMs?: number; /** Once, when the worker has not stopped it within a few seconds; with how long this waits at most. */ onWaiting?(worker: string | null, waitsMs: number): void } = {}): Promise<{ id: string; state: string }> {
  const first = await requestCancel(target, id);
  const started = Date.now();
  const deadline = started + (opts.graceMs ?? target.cancelGraceMs) + 15_000;
  let told = false;
  for (;;) {
    const s = await jobStatus(target, first.id);
    if (isFinal(s.state)) return { id: s.id, state: s.state };
    if (!told && Date.now() - started > 3_000) {
      told = true;
      opts.onWaiting?.(s.worker, deadline - started);
    }
    if (Date.now() > deadline) throw new UserError(`job ${s.id} did not stop in time${s.worker ? ` on worker ${s.worker}` : ""}: its cancel stands, and it ends cancelled once its worker stops it, or its lease runs out (gpulayer job status ${s.id})`);
    await sleep(200);
  }
}

/** The exit code `job run` passes on: the job's own, else 0 for a success and 1 for anything else. */
export function exitCodeOf(status: { exit_code: number | null; state: string }): number {
  return jobEndCode(status.exit_code, status.state);
}
