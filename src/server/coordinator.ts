import type { FinishRequest, PollResponse, PrepareRequestPayload, RegisterResponse, RemoteSpec, TaskAssignment, TaskEventIn, WorkerCache } from "../cluster/protocol.ts";
import { FINAL_JOB_STATES as FINAL } from "../cluster/protocol.ts";
import { ExitCode } from "../errors.ts";
import { CREDENTIALS_LOST, HeldSecrets } from "./held-secrets.ts";
import { HttpFail } from "./http-fail.ts";
import { Notifier } from "./notifier.ts";
import { BeatReconciler, freshOutput, outboxSkip, prepareSteps } from "./task-reports.ts";
import { busyReason, choose, jobNeeds, type Load, neverReason, pickGpus, reasons } from "./match.ts";
import { type RegisterBody, registerWorker } from "./register.ts";
import { type JobRow, newId, ServerStore, type TaskRow, type WorkerRow } from "./store.ts";
import { endUnstarted, settleJob, taskBlocked } from "./job-tasks.ts";

/**
 * The coordinator's rules: workers come, beat and go (or are lost), queued
 * jobs are dispatched to a worker that matches and has room, a lost worker's
 * jobs are re-queued a bounded number of times, and everyone waiting on a
 * change (a worker's long poll, a client watching a job) is woken when it
 * happens. The HTTP routes are only a skin over this.
 */

export interface CoordinatorOptions {
  heartbeatSeconds: number;
  lostSeconds: number;
  /** A lost worker's tasks are released only after this much silence (it fences itself before). */
  leaseSeconds: number;
  maxAttempts: number;
}

export class Coordinator {
  readonly notify = new Notifier();
  /** Requests as sent, credentials included: in memory only, by job id and by prepare id. */
  readonly heldSpecs = new HeldSecrets<RemoteSpec>();
  readonly heldPrepares = new HeldSecrets<PrepareRequestPayload>();
  private unlisted = new BeatReconciler();
  /** The server's own downtime is no worker's silence: silence counts from this start at the earliest. */
  private readonly startedAt = Date.now();
  private sweeper: ReturnType<typeof setInterval>;

  constructor(
    readonly store: ServerStore,
    readonly opts: CoordinatorOptions,
    readonly log: (message: string) => void = () => {},
  ) {
    this.sweeper = setInterval(() => this.sweep(), Math.min(1000, Math.max(100, (opts.lostSeconds * 1000) / 4)));
  }

  close(): void {
    clearInterval(this.sweeper);
  }

  private wakeJob(id: string | null): void {
    if (!id) return;
    this.notify.wake(`job:${id}`);
    // A task of a job: the job's own row follows its tasks' (job-tasks.ts).
    const parent = this.store.job(id)?.parentId;
    if (parent && settleJob(this.store, parent)) this.notify.wake(`job:${parent}`);
  }

  // Workers

  /** A worker joins, or one that has been here before comes back with its saved credential (see register.ts). */
  register(body: RegisterBody, joinedWith: string | null = null): RegisterResponse {
    return registerWorker(this, body, joinedWith);
  }

  /** A request from a worker: it is alive. A lost one back within its lease keeps its tasks; a departed one must register again (409). */
  private seen(w: WorkerRow): void {
    if (w.state === "left") throw new HttpFail(409, `worker ${w.name} is ${w.state}; register again`, { lost: true });
    if (w.state === "lost") {
      this.store.updateWorker(w.id, { state: "idle", lastSeen: Date.now() });
      this.log(`worker ${w.name} is back after ${((Date.now() - w.lastSeen) / 1000).toFixed(1)} s; it keeps what it runs`);
      for (const t of this.store.activeTasks(w.id)) if (t.jobId) this.store.event(t.jobId, "job.worker_back", { worker: w.name });
      this.dispatch();
      return;
    }
    this.store.updateWorker(w.id, { lastSeen: Date.now() });
  }

  /**
   * A beat lists what the worker runs, or ended but has not delivered all of.
   * A task the server gave it that it lists in two beats in a row no more
   * (after it had time to start it) ended there unheard: back to the queue,
   * as for a lost worker, rather than "running" forever.
   */
  heartbeat(w: WorkerRow, body: { running: string[]; free_gpus?: number[]; cache?: WorkerCache }): { cancel: string[] } {
    this.seen(w);
    if (body.free_gpus) this.store.updateWorker(w.id, { freeGpus: body.free_gpus });
    if (body.cache) this.store.updateWorker(w.id, { cache: body.cache });
    const gone = this.unlisted.gone(this.store.activeTasks(w.id), new Set(body.running), Date.now() - 3 * this.opts.heartbeatSeconds * 1000);
    for (const t of gone) this.releaseTask(t, `worker ${w.name} no longer runs it`, true);
    if (gone.length) this.dispatch();
    return { cancel: this.store.activeTasks(w.id).filter((t) => t.cancel).map((t) => t.id) };
  }

  /** Waits for work; `secretHash` is the credential it came with, which a restarted worker replaces and leaving or being lost kills (the poll then ends with 401). */
  async poll(w: WorkerRow, waitMs: number, signal?: AbortSignal, secretHash?: string): Promise<PollResponse> {
    const deadline = Date.now() + waitMs;
    for (;;) {
      // A poll cut off (the worker died) is no sign of life.
      if (signal?.aborted) return { tasks: [], cancel: [] };
      // Replaced (it registered again), or the worker left or was declared lost: that credential is dead.
      if (secretHash && this.store.workerByCredential(secretHash)?.id !== w.id) throw new HttpFail(401, "unauthorized");
      this.seen(this.store.worker(w.id)!);
      const active = this.store.activeTasks(w.id);
      const tasks = active.filter((t) => !t.delivered);
      const cancel = active.filter((t) => t.cancel && !t.cancelSent);
      if (tasks.length || cancel.length || Date.now() >= deadline) {
        const handed: TaskAssignment[] = [];
        for (const t of tasks) {
          const a = this.assignment(t);
          if (a) handed.push(a);
          else this.failUnbuildable(t);
          this.store.updateTask(t.id, { delivered: true });
        }
        for (const t of cancel) this.store.updateTask(t.id, { cancelSent: true });
        if (handed.length || cancel.length || Date.now() >= deadline) return { tasks: handed, cancel: cancel.map((t) => t.id) };
        continue;
      }
      await this.notify.wait(`worker:${w.id}`, deadline - Date.now(), signal);
    }
  }

  /** What the worker is handed: the request with its credentials, from memory; null when a restart lost them. */
  private assignment(t: TaskRow): TaskAssignment | null {
    const job = t.jobId ? this.store.job(t.jobId) : null;
    const spec = job ? this.heldSpecs.resolve(job.id, job.spec) : undefined;
    const prepare = t.prepare ? this.heldPrepares.resolve(t.groupId!, t.prepare) : undefined;
    if (spec === null || prepare === null) return null;
    return { id: t.id, kind: t.kind, attempt: t.attempt, job_id: t.jobId, bundle: job?.bundle ?? t.bundle, gpus: t.gpus, ...(spec ? { spec } : {}), ...(prepare ? { prepare } : {}) };
  }

  /** A task whose request lost its credentials: it ends here, failed, with the reason; the worker never sees it. */
  private failUnbuildable(t: TaskRow): void {
    const message = `${t.kind === "job" ? "job" : "prepare"} cannot be built: ${CREDENTIALS_LOST}`;
    this.store.updateTask(t.id, { state: "done", result: { status: "failed", seconds: 0, message, state: "failed" } });
    if (t.jobId) this.failJob(t.jobId, message);
    if (t.groupId) this.notify.wake(`group:${t.groupId}`);
  }

  private failJob(id: string, message: string): void {
    this.store.event(id, "job.failed", { message });
    this.store.updateJob(id, { state: "failed", error: message, exitCode: ExitCode.failed });
    this.wakeJob(id);
  }

  leave(w: WorkerRow, final: boolean): void {
    this.seen(w);
    if (!final) {
      this.store.updateWorker(w.id, { state: "draining" });
      this.log(`worker ${w.name} is draining: no new work`);
      return;
    }
    for (const t of this.store.activeTasks(w.id)) this.releaseTask(t, `worker ${w.name} left`, false);
    this.store.artifacts.dropClaimsOf(w.id);
    this.store.updateWorker(w.id, { state: "left" });
    this.log(`worker ${w.name} left`);
    this.dispatch();
  }

  /**
   * Workers silent for longer than lostSeconds are lost: no new work. What
   * they run stays theirs until their lease runs out (they stop it
   * themselves by then, when cut off), and is re-queued or failed only then:
   * a job never runs in two places at once.
   */
  sweep(): void {
    const now = Date.now();
    const silence = (w: WorkerRow) => (now - Math.max(w.lastSeen, this.startedAt)) / 1000;
    for (const w of this.store.workers({ present: true })) {
      if (silence(w) > this.opts.lostSeconds) this.markLost(w, `worker ${w.name} lost: no heartbeat for ${silence(w).toFixed(1)} s; what it runs is given out again after ${this.opts.leaseSeconds} s of silence`);
    }
    let released = 0;
    for (const w of this.store.workers().filter((x) => x.state === "lost" && silence(x) > this.opts.leaseSeconds)) {
      for (const t of this.store.activeTasks(w.id)) {
        this.releaseTask(t, `worker ${w.name} lost: no heartbeat for ${silence(w).toFixed(1)} s (its lease, ${this.opts.leaseSeconds} s, is over)`, true);
        released++;
      }
    }
    if (released) this.dispatch();
    // A revoked join token takes the workers that joined with it along (a leaked token's workers among them): at once.
    for (const w of this.store.workers({ present: true })) {
      if (w.joinedWith && !this.store.tokens.has(w.joinedWith)) {
        this.markLost(w, `worker ${w.name} dropped: the join token ${w.joinedWith} it joined with was revoked`, true);
        this.store.updateWorker(w.id, { state: "left" });
      }
    }
    // Credentials live as long as what needs them: a job until it ends, a prepare while any of its tasks runs.
    this.heldSpecs.keepOnly((id) => !FINAL.includes(this.store.job(id)?.state ?? "failed"));
    this.heldPrepares.keepOnly((id) => this.store.groupTasks(id).some((t) => t.state === "assigned" || t.state === "running"));
  }

  /** `release`: its tasks go now (it is known gone: another process took its name, its token was revoked); else at its lease's end. */
  markLost(w: WorkerRow, reason: string, release = false): void {
    this.store.updateWorker(w.id, { state: "lost" });
    // Workers waiting for its env build stop waiting: one of them builds instead.
    this.store.artifacts.dropClaimsOf(w.id);
    this.log(reason);
    for (const t of this.store.activeTasks(w.id)) {
      if (release) this.releaseTask(t, reason, true);
      else if (t.jobId) this.store.event(t.jobId, "job.worker_lost", { worker: w.name, message: reason });
    }
    this.notify.wake(`worker:${w.id}`);
    this.dispatch();
  }

  /** A task its worker no longer runs: a job goes back to the queue (a lost attempt counts), a prepare fails. */
  releaseTask(t: TaskRow, reason: string, lost: boolean): void {
    this.store.updateTask(t.id, { state: lost ? "lost" : "handed_back" });
    if (t.kind === "prepare") {
      this.store.updateTask(t.id, { result: { status: "failed", seconds: (Date.now() - t.created) / 1000, message: reason } });
      this.notify.wake(`group:${t.groupId}`);
      return;
    }
    const job = this.store.job(t.jobId!);
    if (!job || FINAL.includes(job.state)) return;
    if (job.cancelRequested) {
      this.store.event(job.id, "job.cancelled", { reason: `job cancel (${reason})` });
      this.store.updateJob(job.id, { state: "cancelled", exitCode: ExitCode.cancelled });
    } else if (lost && job.attempts >= this.opts.maxAttempts) {
      const error = `${reason}; gave up after ${job.attempts} attempt(s) (GPULAYER_JOB_MAX_ATTEMPTS=${this.opts.maxAttempts})`;
      this.store.event(job.id, "job.lost", { message: error, worker: this.store.worker(t.workerId)?.name ?? null });
      this.store.updateJob(job.id, { state: "failed", error, exitCode: ExitCode.failed });
    } else {
      this.store.event(job.id, "job.requeued", { reason, attempt: job.attempts, worker: this.store.worker(t.workerId)?.name ?? null });
      this.store.updateJob(job.id, { state: "queued", workerId: null });
    }
    this.wakeJob(job.id);
  }

  // Tasks, as their worker reports them

  ownTask(w: WorkerRow, taskId: string): TaskRow {
    const t = this.store.task(taskId);
    if (!t || t.workerId !== w.id) throw new HttpFail(404, "no such task for this worker");
    this.seen(w);
    if (t.state !== "assigned" && t.state !== "running") throw new HttpFail(409, `task ${t.id} is no longer yours (${t.state})`, { revoked: true });
    return t;
  }

  /** How many of these outbox items were applied already (task-reports.ts); the rest count as applied from now. */
  private alreadyApplied(t: TaskRow, seq: number | undefined, count: number): number {
    const { skip, applied } = outboxSkip(t.appliedSeq, seq, count);
    if (applied !== t.appliedSeq) this.store.updateTask(t.id, { appliedSeq: applied });
    return skip;
  }

  /** A finish sent again after the server applied it (its answer was lost): acknowledged, not applied twice. */
  private finishedBefore(w: WorkerRow, taskId: string, seq: number | undefined): boolean {
    const t = this.store.task(taskId);
    return Boolean(t && t.workerId === w.id && seq !== undefined && (t.state === "done" || t.state === "handed_back") && t.appliedSeq >= seq);
  }

  taskEvents(w: WorkerRow, taskId: string, events: TaskEventIn[], seq?: number): void {
    const t = this.ownTask(w, taskId);
    if (t.state === "assigned") this.store.updateTask(t.id, { state: "running" });
    const skip = this.alreadyApplied(t, seq, events.length);
    if (!t.jobId) {
      // A prepare's build steps, kept by task for `env prepare --server` to show.
      for (const e of events.slice(skip)) if (e.type.startsWith("task.prepare.")) this.store.event(prepareSteps(t.id), e.type, e.data);
      if (t.groupId) this.notify.wake(`group:${t.groupId}`);
      return;
    }
    for (const e of events.slice(skip)) {
      // The server's clock, so running phases measure against the same clock that reads them.
      this.store.event(t.jobId, e.type, e.data);
      if (e.type === "task.prepare.started") this.store.updateJob(t.jobId, { state: "preparing" });
      if (e.type === "task.prepare.finished" && typeof e.data.env_key === "string") this.store.updateJob(t.jobId, { envKey: e.data.env_key });
      if (e.type === "task.run.started") this.store.updateJob(t.jobId, { state: "running" });
    }
    this.wakeJob(t.jobId);
  }

  /** `lengths`: the items the body joins (with `seq`); without, the body is one piece. */
  taskOutput(w: WorkerRow, taskId: string, data: Uint8Array, stream: "stdout" | "stderr", seq?: number, lengths?: number[]): void {
    const t = this.ownTask(w, taskId);
    const { fresh, applied } = freshOutput(data, lengths, seq, t.appliedSeq);
    if (applied !== t.appliedSeq) this.store.updateTask(t.id, { appliedSeq: applied });
    if (t.jobId && fresh.length) {
      this.store.appendLog(t.jobId, fresh, stream === "stderr" ? 2 : 1);
      this.wakeJob(t.jobId);
    }
  }

  taskFinish(w: WorkerRow, taskId: string, body: FinishRequest & { seq?: number }): void {
    if (this.finishedBefore(w, taskId, body.seq)) return;
    const t = this.ownTask(w, taskId);
    this.alreadyApplied(t, body.seq, 1);
    this.store.updateTask(t.id, { state: "done", result: body.result ? { ...body.result, state: body.state } : null });
    if (t.jobId) {
      this.store.updateJob(t.jobId, { state: body.state, exitCode: body.exit_code, error: body.error });
      this.wakeJob(t.jobId);
    }
    if (t.groupId) this.notify.wake(`group:${t.groupId}`);
    this.dispatch();
  }

  handback(w: WorkerRow, taskId: string, reason: string, seq?: number): void {
    if (this.finishedBefore(w, taskId, seq)) return;
    const t = this.ownTask(w, taskId);
    this.alreadyApplied(t, seq, 1);
    this.releaseTask(t, reason, false);
    this.dispatch();
  }

  // Dispatch

  private loads(workers: WorkerRow[]): Map<string, Load> {
    const loads = new Map<string, Load>(workers.map((w) => [w.id, { running: 0, usedGpus: new Set<number>() }]));
    for (const t of this.store.activeTasks()) {
      const load = loads.get(t.workerId);
      if (!load || t.kind !== "job") continue;
      load.running++;
      for (const g of t.gpus) load.usedGpus.add(g);
    }
    return loads;
  }

  /** Give each queued job, oldest first, to a matching worker with room; the others say what they wait for. */
  dispatch(): void {
    const workers = this.store.workers({ present: true });
    const loads = this.loads(workers);
    for (const job of this.store.queuedJobs()) {
      const blocked = taskBlocked(this.store, job);
      if (blocked && "skip" in blocked) {
        endUnstarted(this.store, job, blocked.skip);
        this.wakeJob(job.id);
        // What needs this one may come earlier in the queue: look again.
        return this.dispatch();
      }
      if (blocked) {
        this.setWaiting(job, blocked.wait);
        continue;
      }
      if (this.heldSpecs.resolve(job.id, job.spec) === null) {
        this.failJob(job.id, `job cannot be built: ${CREDENTIALS_LOST}`);
        continue;
      }
      const needs = jobNeeds(job.spec, job.labels);
      const w = choose(needs, workers, loads);
      if (!w) {
        this.setWaiting(job, this.waitingFor(job, workers, loads));
        continue;
      }
      const load = loads.get(w.id)!;
      const gpus = pickGpus(needs, w, load);
      load.running++;
      for (const g of gpus) load.usedGpus.add(g);
      const attempt = job.attempts + 1;
      const id = newId(8);
      this.store.addTask({ id, kind: "job", jobId: job.id, groupId: null, workerId: w.id, attempt, gpus, prepare: null, bundle: job.bundle });
      this.store.updateJob(job.id, { attempts: attempt, workerId: w.id, waiting: null });
      this.store.event(job.id, "job.assigned", { worker: w.name, worker_id: w.id, attempt, gpus });
      if (job.parentId) {
        this.store.event(job.parentId, "task.assigned", { task: job.task, worker: w.name, attempt });
        // Whoever follows the job hears of it now, not at its next long poll's end.
        this.notify.wake(`job:${job.parentId}`);
      }
      this.notify.wake(`worker:${w.id}`);
      this.wakeJob(job.id);
    }
  }

  private waitingFor(job: JobRow, workers: WorkerRow[], loads: Map<string, Load>): string {
    const needs = jobNeeds(job.spec, job.labels);
    const able = workers.filter((w) => !neverReason(needs, w));
    if (!able.length) return workers.length ? `a worker that can run it (${reasons(workers, (w) => neverReason(needs, w))})` : "a worker to join";
    return `room on a worker (${reasons(able, (w) => busyReason(needs, w, loads.get(w.id)!))})`;
  }

  private setWaiting(job: JobRow, reason: string): void {
    if (job.waiting === reason) return;
    this.store.updateJob(job.id, { waiting: reason });
    this.store.event(job.id, "job.waiting", { for: reason });
    this.wakeJob(job.id);
  }
}
