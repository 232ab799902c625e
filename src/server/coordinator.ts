import type { FinishRequest, PollResponse, PrepareRequestPayload, RegisterResponse, RemoteSpec, TaskAssignment, TaskEventIn, WorkerCache } from "../cluster/protocol.ts";
import { eventIs, isFinal } from "../jobs/model.ts";
import { ExitCode } from "../errors.ts";
import { CREDENTIALS_LOST, HeldSecrets, type SecretSeal } from "./held-secrets.ts";
import { HttpFail } from "./http-fail.ts";
import { Notifier } from "./notifier.ts";
import { BeatReconciler, outboxSkip } from "./task-reports.ts";
import { applyItems, outputItems, type ReportItem } from "./report-items.ts";
import { busyReason, chooseAmong, jobNeeds, type Load, type Needs, neverReason, pickGpus, reasons } from "./match.ts";
import { type RegisterBody, registerWorker } from "./register.ts";
import { type JobRow, newId, ServerStore, type TaskRow, type WorkerRow } from "./store.ts";
import { isDeadlock, together } from "./db/sql.ts";
import { blockedTasks, endUnstarted, settleJob } from "./job-tasks.ts";
import { jobEvent, type StreamEvent } from "./event-streams.ts";
import { PollRecheck } from "./poll-recheck.ts";
import { Placer } from "./placer.ts";

/**
 * The coordinator's rules: workers come, beat and go (or are lost), queued
 * jobs are dispatched to a worker that matches and has room, a lost worker's
 * jobs are re-queued a bounded number of times, and everyone waiting on a
 * change (a worker's long poll, a client watching a job) is woken when it
 * happens. The HTTP routes are only a skin over this.
 *
 * A change that decides over many workers (the sweep, a worker joining,
 * leaving or coming back) runs under the database's writer lock
 * (store.exclusive), so it lands whole and alone, also against other
 * replicas on one database: a worker is declared lost once. A task's
 * reports (events, output, finish) and a poll's delivery are about one
 * worker's rows: they lock those rows instead (rowChange), worker first,
 * then its tasks, then their jobs, as every locked change does too, and run
 * beside each other and beside the writer. A dispatch pass claims the jobs
 * and workers it changes (SKIP LOCKED, see dispatch), so replicas dispatch
 * side by side, each job once. Wake-ups are sent once a change has
 * committed, here and (PostgreSQL) to the other replicas.
 * It is one file past the usual size on purpose: every state change of the
 * fleet is here, to be read (and reviewed) together.
 */

export interface CoordinatorOptions {
  heartbeatSeconds: number;
  lostSeconds: number;
  /** A lost worker's tasks are released only after this much silence (it fences itself before). */
  leaseSeconds: number;
  maxAttempts: number;
  /** Replicas on one database: requests' credentials sealed in it (held-secrets.ts) rather than in memory. */
  seal?: SecretSeal | null;
  /** Tell the other replicas (PostgreSQL NOTIFY); none for one server. */
  publish?: (keys: string[]) => Promise<void>;
}

/** With replicas, a long poll looks again this often even without a wake-up (one lost with a NOTIFY connection). */
const REPLICA_RECHECK_MS = 1_000;
/** Jobs whose parent (or none) this process keeps (parentOf); past it, they are read again. */
const PARENTS_KEPT = 100_000;
/** Jobs a dispatch pass hands out or gives a new waiting line at most; a pass follows at once for the rest. */
const JOBS_PER_PASS = 200;

/** A change under row locks gave way: what it found (a worker lost or gone, a request's credentials lost) is for the writer lock's path. */
const LOCKED_PATH = Symbol("the writer lock's path");

/** A dispatch pass that could not claim what it planned looks again this soon (the changes holding it take milliseconds). */
const CONTENDED_RETRY_MS = 20;

function addLoad(load: Load, gpus: number[]): void {
  load.running++;
  for (const g of gpus) load.usedGpus.add(g);
}

/** A change PostgreSQL rolled back for a deadlock runs again, whole, this many times in all. */
const DEADLOCK_TRIES = 3;

/** One change: the transaction's store, and the wake-ups to send once it has committed. */
export interface Change {
  readonly store: ServerStore;
  wake(key: string): void;
  /** A line for the server's log, written once the change has committed: a change rolled back says nothing. */
  log(line: string): void;
  /** A dispatch pass once this change has committed (it left work for one that must see what it wrote). */
  passAfter(): void;
}

/** A beat's answer: the cancels to send, and what the worker listed that is no longer its own (given out again while it stalled: it stops those). */
export interface BeatAnswer {
  cancel: string[];
  gone?: string[];
}

/**
 * `gone`: listed tasks the server took from the worker (lost: its lease ran
 * out, or its beats stopped listing them). Not one the worker ended or gave
 * back itself, which it lists until it hears that the server has its end.
 */
async function beatAnswer(store: ServerStore, active: TaskRow[], listed: string[]): Promise<BeatAnswer> {
  const held = new Set(active.map((t) => t.id));
  const gone: string[] = [];
  for (const id of listed) if (!held.has(id) && (await store.task(id))?.state === "lost") gone.push(id);
  return { cancel: active.filter((t) => t.cancel).map((t) => t.id), ...(gone.length ? { gone } : {}) };
}

/** A credential that is no longer the worker's (replaced as it joined again, or the worker gone). */
const unauthorized = () => new HttpFail(401, "unauthorized");

export class Coordinator {
  readonly notify: Notifier;
  /** Requests as sent, credentials included: in memory only (or sealed, for replicas), by job id and by prepare id. */
  readonly heldSpecs: HeldSecrets<RemoteSpec>;
  readonly heldPrepares: HeldSecrets<PrepareRequestPayload>;
  private unlisted = new BeatReconciler();
  /**
   * The server's own downtime is no worker's silence: silence counts from
   * this start at the earliest, and from the end of the last time the
   * database could not be reached (workers' beats were refused meanwhile).
   */
  private sightedSince = Date.now();
  private blind = false;
  private sweeper: ReturnType<typeof setInterval>;
  private sweeping: Promise<void> | null = null;
  /** Dispatch passes asked for outside a change: the one not yet started (callers join it), and the last one chained. */
  private nextPass: Promise<void> | null = null;
  private lastPass: Promise<void> = Promise.resolve();
  /** A pass failed (the database went away): the sweep runs one. */
  private passOwed = false;
  /** Jobs' parents, as parentOf read them. */
  private readonly parents = new Map<string, string | null>();
  /** With replicas: the workers' waiting polls, looked at again all together (a NOTIFY may be lost). */
  private readonly recheck: PollRecheck | null;

  constructor(
    readonly store: ServerStore,
    readonly opts: CoordinatorOptions,
    readonly log: (message: string) => void = () => {},
    /** A sweep that failed (the database went away): the server decides what that means. */
    private readonly onSweepError: (error: unknown) => void = () => {},
  ) {
    this.notify = new Notifier(opts.publish ? REPLICA_RECHECK_MS : undefined);
    this.recheck = opts.publish ? new PollRecheck(store, (id) => this.notify.wake(`worker:${id}`), REPLICA_RECHECK_MS) : null;
    this.heldSpecs = new HeldSecrets("job", opts.seal ?? null);
    this.heldPrepares = new HeldSecrets("prepare", opts.seal ?? null);
    this.sweeper = setInterval(() => void this.sweep().catch(this.onSweepError), Math.min(1000, Math.max(100, (opts.lostSeconds * 1000) / 4)));
  }

  close(): void {
    clearInterval(this.sweeper);
    this.recheck?.close();
  }

  /** `fn` as one change under the writer lock; its wake-ups and log lines go out after the commit. */
  change<T>(fn: (ch: Change) => Promise<T>): Promise<T> {
    return this.commit(true, fn);
  }

  /** `fn` as one change under the row locks it takes (db/sql.ts `transaction`; on SQLite, the writer lock). */
  private rowChange<T>(fn: (ch: Change) => Promise<T>): Promise<T> {
    return this.commit(false, fn);
  }

  private async commit<T>(writer: boolean, fn: (ch: Change) => Promise<T>): Promise<T> {
    for (let tries = 1; ; tries++) {
      const keys = new Set<string>();
      const lines: string[] = [];
      let passAfter = false;
      const body = (store: ServerStore) => fn({ store, wake: (key) => keys.add(key), log: (line) => lines.push(line), passAfter: () => (passAfter = true) });
      let result: T;
      try {
        result = await (writer ? this.store.exclusive(body) : this.store.transaction(body));
      } catch (error) {
        if (isDeadlock(error) && tries < DEADLOCK_TRIES) continue;
        throw error;
      }
      for (const line of lines) this.log(line);
      for (const key of keys) this.notify.wake(key);
      if (keys.size) void this.opts.publish?.([...keys]).catch(() => {});
      if (passAfter) void this.dispatchSoon();
      return result;
    }
  }

  /**
   * A dispatch pass, for a change that freed room outside the writer lock (a
   * task's finish): passes asked for while one waits to start are that one,
   * so a burst of finishes is one pass, not one each. A pass that fails is
   * owed, and the sweep runs it.
   */
  dispatchSoon(): Promise<void> {
    if (this.nextPass) return this.nextPass;
    const pass = this.lastPass.then(async () => {
      this.nextPass = null;
      try {
        if (this.passOwed || (await this.store.anyQueued())) await this.rowChange((ch) => this.dispatch(ch));
        this.passOwed = false;
      } catch (error) {
        this.passOwed = true;
        this.log(`dispatch waits for the next sweep: ${(error as Error).message}`);
      }
    });
    this.nextPass = pass;
    this.lastPass = pass;
    return pass;
  }

  private async wakeJob(ch: Change, id: string | null): Promise<void> {
    if (!id) return;
    ch.wake(`job:${id}`);
    // A task of a job: the job's own row follows its tasks' (job-tasks.ts).
    const parent = await this.parentOf(ch, id);
    if (!parent) return;
    if (await settleJob(ch.store, parent)) ch.wake(`job:${parent}`);
  }

  /** A job's parent (its job of tasks), or null: set when the job is recorded and never changed, so read once per job here. */
  private async parentOf(ch: Change, id: string): Promise<string | null> {
    if (this.parents.has(id)) return this.parents.get(id)!;
    const job = await ch.store.job(id);
    if (!job) return null;
    if (this.parents.size >= PARENTS_KEPT) this.parents.clear();
    this.parents.set(id, job.parentId);
    return job.parentId;
  }

  // Workers

  /** A worker joins, or one that has been here before comes back with its saved credential (see register.ts). */
  register(body: RegisterBody, joinedWith: string | null = null): Promise<RegisterResponse> {
    return this.change((ch) => registerWorker(this, ch, body, joinedWith));
  }

  /** A request from a worker: it is alive. A lost one back within its lease keeps its tasks; a departed one must register again (409). */
  private async seen(ch: Change, w: WorkerRow): Promise<void> {
    if (w.state === "left") throw new HttpFail(409, `worker ${w.name} is ${w.state}; register again`, { lost: true });
    if (w.state === "lost") {
      await ch.store.updateWorker(w.id, { state: "idle", lastSeen: Date.now() });
      ch.log(`worker ${w.name} is back after ${((Date.now() - w.lastSeen) / 1000).toFixed(1)} s; it keeps what it runs`);
      for (const t of await ch.store.activeTasks(w.id)) if (t.jobId) await ch.store.event(t.jobId, "job.worker_back", { worker: w.name });
      await this.dispatch(ch);
      return;
    }
    await ch.store.updateWorker(w.id, { lastSeen: Date.now() });
  }

  /** The worker's row as it is now (the one the request authenticated may be a moment old). */
  private async current(ch: Change, w: WorkerRow): Promise<WorkerRow> {
    return (await ch.store.worker(w.id)) ?? w;
  }

  /**
   * A beat lists what the worker runs, or ended but has not delivered all of.
   * A task the server gave it that it lists in two beats in a row no more
   * (after it had time to start it) ended there unheard: back to the queue,
   * as for a lost worker, rather than "running" forever.
   */
  async heartbeat(worker: WorkerRow, body: { running: string[]; free_gpus?: number[]; cache?: WorkerCache }): Promise<BeatAnswer> {
    // PostgreSQL only: there the lock is what beats wait on. SQLite has one connection, so a write outside the lock waits for the open transaction anyway, and measured (bench/fleet.ts, 1,000 workers) such beats were overtaken by the chain of transactions and starved.
    if (this.store.sql.dialect === "postgres") {
      const quiet = await this.quietBeat(worker, body);
      if (quiet) return quiet;
    }
    return this.change(async (ch) => {
      const w = await this.currentPresented(ch, worker);
      await this.seen(ch, w);
      if (body.free_gpus) await ch.store.updateWorker(w.id, { freeGpus: body.free_gpus });
      if (body.cache) await ch.store.updateWorker(w.id, { cache: body.cache });
      const gone = this.unlisted.gone(await ch.store.activeTasks(w.id), new Set(body.running), Date.now() - 3 * this.opts.heartbeatSeconds * 1000);
      for (const t of gone) await this.releaseTask(ch, t, `worker ${w.name} no longer runs it`, true);
      if (gone.length) await this.dispatch(ch);
      return beatAnswer(ch.store, await ch.store.activeTasks(w.id), body.running);
    });
  }

  /**
   * The common beat, without the writer lock: an idle worker that lists every
   * task it holds and has none to cancel only says it is alive. Anything else
   * (lost, left, draining, a task unlisted, a cancel) takes the locked path.
   * A task assigned after the read below is too fresh to judge (gone()'s
   * `settledBefore`), as on the locked path; a sweep that reads the worker
   * silent marks it lost only if no beat landed since (moveWorker's lastSeen),
   * and a beat after that finds it lost and takes the locked path back.
   */
  private async quietBeat(w: WorkerRow, body: { running: string[]; free_gpus?: number[]; cache?: WorkerCache }): Promise<BeatAnswer | null> {
    const active = await this.store.activeTasks(w.id);
    const listed = new Set(body.running);
    const settledBefore = Date.now() - 3 * this.opts.heartbeatSeconds * 1000;
    if (active.some((t) => t.cancel) || this.unlisted.anyUnlisted(active, listed, settledBefore)) return null;
    // Another credential (it joined again): the locked path says 401.
    if (!(await this.store.beat(w.id, { lastSeen: Date.now(), freeGpus: body.free_gpus, cache: body.cache }, w.presented))) return null;
    this.unlisted.gone(active, listed, settledBefore);
    return beatAnswer(this.store, active, body.running);
  }

  /** Waits for work; `secretHash` is the credential it came with, which a restarted worker replaces and leaving or being lost kills (the poll then ends with 401). */
  async poll(w: WorkerRow, waitMs: number, signal?: AbortSignal, secretHash?: string): Promise<PollResponse> {
    const deadline = Date.now() + waitMs;
    const wait = () => this.notify.wait(`worker:${w.id}`, deadline - Date.now(), signal, this.recheck !== null);
    const leave = this.recheck?.enter(w.id, secretHash ?? null);
    try {
      for (let look = 0; ; look++) {
        // A poll cut off (the worker died) is no sign of life.
        if (signal?.aborted) return { tasks: [], cancel: [] };
        // Woken, it looks at once: a worker's wake-up is news for it (a task, a cancel, its credential gone), and
        // with replicas only the polls with news are woken (poll-recheck.ts). First under row locks, as always.
        const once = await this.rowChange((ch) => this.deliver(ch, w, look, deadline, secretHash, false));
        const answer = once === LOCKED_PATH ? await this.change((ch) => this.deliver(ch, w, look, deadline, secretHash, true)) : once;
        if (answer && answer !== LOCKED_PATH) return answer;
        await wait();
      }
    } finally {
      leave?.();
    }
  }

  /**
   * A poll's look: the worker's tasks not yet handed out and cancels not yet
   * sent, marked as delivered. Under row locks (`locked` false) a worker lost
   * or gone, or a request whose credentials were lost, is left to the writer
   * lock's path, which brings the worker back or fails the task.
   */
  private async deliver(ch: Change, w: WorkerRow, look: number, deadline: number, secretHash: string | undefined, locked: boolean): Promise<PollResponse | null | typeof LOCKED_PATH> {
    // The request is the sign of life, not this server looking again while it waits (a frozen worker's poll stays open).
    if (look === 0 && !locked) {
      // The touch locks the worker's row and answers with its credential: no registration replaces it meanwhile.
      const secret = await ch.store.touchWorker(w.id, Date.now());
      if (secret === null) return LOCKED_PATH;
      // Replaced (it registered again), or the worker left: that credential is dead.
      if (secretHash && secret !== secretHash) throw unauthorized();
    } else {
      // Looking again (or under the writer lock): the credential read with the worker's row held.
      if (secretHash && !(await ch.store.heldCredential(w.id, secretHash))) throw unauthorized();
      if (look === 0) await this.seen(ch, (await ch.store.worker(w.id))!);
    }
    const active = locked ? await ch.store.activeTasks(w.id) : await ch.store.lockedActiveTasks(w.id);
    const tasks = active.filter((t) => !t.delivered);
    const cancel = active.filter((t) => t.cancel && !t.cancelSent);
    if (!tasks.length && !cancel.length) return Date.now() >= deadline ? { tasks: [], cancel: [] } : null;
    const handed: (TaskAssignment | null)[] = [];
    for (const t of tasks) handed.push(await this.assignment(ch, t));
    if (!locked && handed.includes(null)) return LOCKED_PATH;
    for (const [i, t] of tasks.entries()) {
      if (!handed[i]) await this.failUnbuildable(ch, t);
      await ch.store.updateTask(t.id, { delivered: true });
    }
    for (const t of cancel) await ch.store.updateTask(t.id, { cancelSent: true });
    const given = handed.filter((a): a is TaskAssignment => a !== null);
    return given.length || cancel.length || Date.now() >= deadline ? { tasks: given, cancel: cancel.map((t) => t.id) } : null;
  }

  /** What the worker is handed: the request with its credentials (memory, or sealed); null when a restart lost them. */
  private async assignment(ch: Change, t: TaskRow): Promise<TaskAssignment | null> {
    const job = t.jobId ? await ch.store.job(t.jobId) : null;
    const spec = job ? await this.heldSpecs.resolve(ch.store.sql, job.id, job.spec) : undefined;
    const prepare = t.prepare ? await this.heldPrepares.resolve(ch.store.sql, t.groupId!, t.prepare) : undefined;
    if (spec === null || prepare === null) return null;
    const inputs = job ? await ch.store.inputsOf(job) : [];
    return { id: t.id, kind: t.kind, attempt: t.attempt, job_id: t.jobId, bundle: job?.bundle ?? t.bundle, gpus: t.gpus, ...(spec ? { spec } : {}), ...(prepare ? { prepare } : {}), ...(inputs.length ? { inputs } : {}) };
  }

  /** A task whose request lost its credentials: it ends here, failed, with the reason; the worker never sees it. */
  private async failUnbuildable(ch: Change, t: TaskRow): Promise<void> {
    const message = `${t.kind === "job" ? "job" : "prepare"} cannot be built: ${CREDENTIALS_LOST}`;
    await ch.store.updateTask(t.id, { state: "done", result: { status: "failed", seconds: 0, message, state: "failed" } });
    if (t.jobId) await this.failJob(ch, t.jobId, message);
    if (t.groupId) ch.wake(`group:${t.groupId}`);
  }

  private async failJob(ch: Change, id: string, message: string): Promise<void> {
    await ch.store.event(id, "job.failed", { message });
    await ch.store.updateJob(id, { state: "failed", error: message, exitCode: ExitCode.failed });
    await this.wakeJob(ch, id);
  }

  leave(worker: WorkerRow, final: boolean): Promise<void> {
    return this.change(async (ch) => {
      const w = await this.currentPresented(ch, worker);
      await this.seen(ch, w);
      if (!final) {
        await ch.store.updateWorker(w.id, { state: "draining" });
        ch.log(`worker ${w.name} is draining: no new work`);
        return;
      }
      // After any pass giving it work has committed: that task is released too.
      await ch.store.holdWorkerFromDispatch(w.id);
      for (const t of await ch.store.activeTasks(w.id)) await this.releaseTask(ch, t, `worker ${w.name} left`, false);
      await ch.store.claims.dropAllOf(w.id);
      await ch.store.updateWorker(w.id, { state: "left" });
      ch.log(`worker ${w.name} left`);
      // Its polls end (401), and what any replica keeps of its credential goes.
      ch.wake(`worker:${w.id}`);
      await this.dispatch(ch);
    });
  }

  /**
   * Workers silent for longer than lostSeconds are lost: no new work. What
   * they run stays theirs until their lease runs out (they stop it
   * themselves by then, when cut off), and is re-queued or failed only then:
   * a job never runs in two places at once. One sweep at a time, under the
   * writer lock: with several replicas, each worker is declared lost once.
   */
  sweep(): Promise<void> {
    this.sweeping ??= (async () => {
      // Which workers a revoked join token drops, asked outside the writer lock (one query, an empty answer nearly always); dropped under it.
      const revoked = await this.store.workersOfRevokedTokens();
      const owed = this.passOwed;
      await this.change((ch) => this.sweepIn(ch, revoked, owed));
      if (owed) this.passOwed = false;
    })().finally(() => (this.sweeping = null));
    return this.sweeping;
  }

  /** The database could not be reached: what workers said meanwhile was refused, so their silence counts again from when it answers. */
  lostDatabase(): void {
    this.blind = true;
  }

  /** `owed`: a dispatch pass failed since the last sweep (dispatchSoon), so this one runs it. */
  private async sweepIn(ch: Change, revoked: WorkerRow[], owed: boolean): Promise<void> {
    const { store } = ch;
    const now = Date.now();
    // In a transaction: the database answers again.
    if (this.blind) {
      this.blind = false;
      this.sightedSince = now;
    }
    const silence = (w: WorkerRow) => (now - Math.max(w.lastSeen, this.sightedSince)) / 1000;
    // Silence counts from the later of its last beat and sightedSince, so these hold every worker silent for longer (and a few the check below keeps).
    for (const w of await store.workers({ present: true, silentBefore: now - this.opts.lostSeconds * 1000 })) {
      if (silence(w) > this.opts.lostSeconds) await this.markLost(ch, w, `worker ${w.name} lost: no heartbeat for ${silence(w).toFixed(1)} s; what it runs is given out again after ${this.opts.leaseSeconds} s of silence`, false, true);
    }
    let released = 0;
    for (const w of (await store.workers({ lost: true, silentBefore: now - this.opts.leaseSeconds * 1000 })).filter((x) => silence(x) > this.opts.leaseSeconds)) {
      for (const t of await store.activeTasks(w.id)) {
        await this.releaseTask(ch, t, `worker ${w.name} lost: no heartbeat for ${silence(w).toFixed(1)} s (its lease, ${this.opts.leaseSeconds} s, is over)`, true);
        released++;
      }
    }
    if (released || owed) await this.dispatch(ch);
    // A revoked join token takes the workers that joined with it along (a leaked token's workers among them): at once.
    for (const seen of revoked) {
      // As it is now, under the lock: lost or gone meanwhile, another sweep (or replica) saw to it.
      const w = await store.worker(seen.id);
      if (!w || w.state === "lost" || w.state === "left") continue;
      await this.markLost(ch, w, `worker ${w.name} dropped: the join token ${w.joinedWith} it joined with was revoked`, true);
      await store.updateWorker(w.id, { state: "left" });
    }
    // Credentials live as long as what needs them: a job until it ends, a prepare while any of its tasks runs.
    await this.heldSpecs.keepOnly(store.sql, async (id) => !isFinal((await store.job(id))?.state ?? "failed"));
    await this.heldPrepares.keepOnly(store.sql, async (id) => (await store.groupTasks(id)).some((t) => t.state === "assigned" || t.state === "running"));
  }

  /**
   * `release`: its tasks go now (it is known gone: another process took its name, its token was revoked); else at its lease's end.
   * `silent`: lost for its silence, so not if it beat since `w` was read (beats take no writer lock).
   */
  async markLost(ch: Change, w: WorkerRow, reason: string, release = false, silent = false): Promise<void> {
    const { store } = ch;
    // From the state this change read, or not at all: declared lost once, whichever replica sweeps.
    if (!(await store.moveWorker(w.id, w.state, "lost", silent ? w.lastSeen : undefined))) return;
    // Workers waiting for its env build or wheel compile stop waiting: one of them builds instead.
    await store.claims.dropAllOf(w.id);
    ch.log(reason);
    // Released now: after any pass giving it work has committed, so that task goes too (else the lease's end releases it).
    if (release) await store.holdWorkerFromDispatch(w.id);
    for (const t of await store.activeTasks(w.id)) {
      if (release) await this.releaseTask(ch, t, reason, true);
      else if (t.jobId) await store.event(t.jobId, "job.worker_lost", { worker: w.name, message: reason });
    }
    ch.wake(`worker:${w.id}`);
    await this.dispatch(ch);
  }

  /** A task its worker no longer runs: a job goes back to the queue (a lost attempt counts), a prepare fails. */
  async releaseTask(ch: Change, t: TaskRow, reason: string, lost: boolean): Promise<void> {
    const { store } = ch;
    await store.updateTask(t.id, { state: lost ? "lost" : "handed_back" });
    if (t.kind === "prepare") {
      await store.updateTask(t.id, { result: { status: "failed", seconds: (Date.now() - t.created) / 1000, message: reason } });
      ch.wake(`group:${t.groupId}`);
      return;
    }
    const job = await store.job(t.jobId!);
    if (!job || isFinal(job.state)) return;
    if (job.cancelRequested) {
      await store.event(job.id, "job.cancelled", { reason: `job cancel (${reason})` });
      await store.updateJob(job.id, { state: "cancelled", exitCode: ExitCode.cancelled });
    } else if (lost && job.attempts >= this.opts.maxAttempts) {
      const error = `${reason}; gave up after ${job.attempts} attempt(s) (GPULAYER_JOB_MAX_ATTEMPTS=${this.opts.maxAttempts})`;
      await store.event(job.id, "job.lost", { message: error, worker: (await store.worker(t.workerId))?.name ?? null });
      await store.updateJob(job.id, { state: "failed", error, exitCode: ExitCode.failed });
    } else {
      await store.event(job.id, "job.requeued", { reason, attempt: job.attempts, worker: (await store.worker(t.workerId))?.name ?? null });
      await store.updateJob(job.id, { state: "queued", workerId: null });
    }
    await this.wakeJob(ch, job.id);
  }

  // Tasks, as their worker reports them

  private async ownTask(ch: Change, worker: WorkerRow, taskId: string): Promise<TaskRow> {
    const w = await this.currentPresented(ch, worker);
    const t = await ch.store.task(taskId);
    if (!t || t.workerId !== worker.id) throw new HttpFail(404, "no such task for this worker");
    await this.seen(ch, w);
    if (t.state !== "assigned" && t.state !== "running") throw new HttpFail(409, `task ${t.id} is no longer yours (${t.state})`, { revoked: true });
    return t;
  }

  /**
   * ownTask under row locks: the worker's row, then the task's. A worker lost
   * or gone is the writer lock's (seen(): back, or 409).
   */
  private async ownLockedTask(ch: Change, worker: WorkerRow, taskId: string): Promise<TaskRow | typeof LOCKED_PATH> {
    const [here, t] = await this.workerThenTask(ch, worker, taskId);
    return here ? this.heldBy(t, worker) : LOCKED_PATH;
  }

  /**
   * The worker's sign of life (false: lost or gone) and its task's row, both locked in that order, in one round
   * trip (sent together on the transaction's connection, which runs them in turn).
   */
  private async workerThenTask(ch: Change, worker: WorkerRow, taskId: string): Promise<[boolean, TaskRow | null]> {
    const [secret, t] = await together(
      () => ch.store.touchWorker(worker.id, Date.now()),
      () => ch.store.lockedTask(taskId),
    );
    if (secret !== null && worker.presented && secret !== worker.presented) throw unauthorized();
    return [secret !== null, t];
  }

  /** The worker's row as it is now, while the credential its request came with is still its own (not replaced as it joined again, nor gone): else 401. */
  private async currentPresented(ch: Change, w: WorkerRow): Promise<WorkerRow> {
    if (!w.presented) return this.current(ch, w);
    const now = await ch.store.workerByCredential(w.presented);
    if (now?.id !== w.id) throw unauthorized();
    return now;
  }

  /** The task, when this worker holds it now: else 404 (not its own) or 409 (no longer its own). */
  private heldBy(t: TaskRow | null, worker: WorkerRow): TaskRow {
    if (!t || t.workerId !== worker.id) throw new HttpFail(404, "no such task for this worker");
    if (t.state !== "assigned" && t.state !== "running") throw new HttpFail(409, `task ${t.id} is no longer yours (${t.state})`, { revoked: true });
    return t;
  }

  /** A task's report: under row locks, or (its worker lost or gone) under the writer lock as before. */
  private async report(w: WorkerRow, taskId: string, apply: (ch: Change, t: TaskRow) => Promise<void>): Promise<void> {
    const done = await this.rowChange(async (ch) => {
      const t = await this.ownLockedTask(ch, w, taskId);
      if (t === LOCKED_PATH) return false;
      await apply(ch, t);
      return true;
    });
    if (!done) await this.change(async (ch) => apply(ch, await this.ownTask(ch, w, taskId)));
  }

  /** A task this worker holds now, of a job: what it may upload outputs for. */
  taskOfWorker(w: WorkerRow, taskId: string): Promise<TaskRow> {
    return this.change(async (ch) => {
      const t = await this.ownTask(ch, w, taskId);
      if (!t.jobId) throw new HttpFail(400, "a prepare task has no outputs");
      return t;
    });
  }

  /** A task's outputs, as the server received and checked them: recorded on its job's row, listed in its `task.outputs` event. */
  taskOutputs(w: WorkerRow, taskId: string, hash: string, files: { path: string; bytes: number }[]): Promise<void> {
    return this.change(async (ch) => {
      const t = await this.ownTask(ch, w, taskId);
      if (!t.jobId) throw new HttpFail(400, "a prepare task has no outputs");
      await ch.store.updateJob(t.jobId, { outputsBundle: hash });
      await ch.store.event(t.jobId, "task.outputs", { files });
      await this.wakeJob(ch, t.jobId);
    });
  }

  /**
   * How many of these outbox items were applied already (task-reports.ts); the rest count as applied from now,
   * written with `fields`, the report's own change to the task's row (one statement for both).
   */
  private async alreadyApplied(ch: Change, t: TaskRow, seq: number | undefined, count: number, fields: Parameters<ServerStore["updateTask"]>[1] = {}): Promise<number> {
    const { skip, applied } = outboxSkip(t.appliedSeq, seq, count);
    const change = applied !== t.appliedSeq ? { ...fields, appliedSeq: applied } : fields;
    if (Object.keys(change).length) await ch.store.updateTask(t.id, change);
    return skip;
  }

  /** A finish sent again after the server applied it (its answer was lost): acknowledged, not applied twice. */
  private async finishedBefore(ch: Change, w: WorkerRow, taskId: string, seq: number | undefined): Promise<boolean> {
    const t = await ch.store.task(taskId);
    return Boolean(t && this.appliedFinish(t, w, seq));
  }

  private appliedFinish(t: TaskRow, w: WorkerRow, seq: number | undefined): boolean {
    return t.workerId === w.id && seq !== undefined && (t.state === "done" || t.state === "handed_back") && t.appliedSeq >= seq;
  }

  taskEvents(w: WorkerRow, taskId: string, events: TaskEventIn[], seq?: number): Promise<void> {
    return this.taskReports(w, taskId, events.map((event) => ({ event })), seq);
  }

  /** `lengths`: the items the body joins (with `seq`); without, the body is one piece. */
  taskOutput(w: WorkerRow, taskId: string, data: Uint8Array, stream: "stdout" | "stderr", seq?: number, lengths?: number[]): Promise<void> {
    return this.taskReports(w, taskId, outputItems(data, lengths, stream), seq);
  }

  /** A task ended: its room goes to the queue in a dispatch pass after the commit, shared with the finishes around it (dispatchSoon). */
  taskFinish(w: WorkerRow, taskId: string, body: FinishRequest & { seq?: number }): Promise<void> {
    const { seq, ...finish } = body;
    return this.taskReports(w, taskId, [{ finish }], seq);
  }

  /**
   * Outbox items `seq`.. of one task, in order, in one transaction: events, output, and its end last (a short job's
   * whole report in one request); each applied once (a batch sent again after a lost answer is acknowledged).
   */
  async taskReports(w: WorkerRow, taskId: string, items: ReportItem[], seq?: number): Promise<void> {
    const apply = async (ch: Change, t: TaskRow) => {
      const applied = await applyItems(ch.store, t, items, outboxSkip(t.appliedSeq, seq, items.length).skip);
      // The task's row and the job's, sent together (the job's after the task's, as every change takes them).
      await together(
        () => this.alreadyApplied(ch, t, seq, items.length, applied.task),
        async () => (t.jobId && Object.keys(applied.job).length ? ch.store.updateJob(t.jobId, applied.job) : null),
      );
      for (const key of applied.wakes) ch.wake(key);
      if (applied.wakeJob) await this.wakeJob(ch, t.jobId);
    };
    const last = items.at(-1);
    if (!last || !("finish" in last)) return this.report(w, taskId, apply);
    // An end: its seq is the last item's.
    const endSeq = seq === undefined ? undefined : seq + items.length - 1;
    const done = await this.rowChange(async (ch) => {
      const [here, t] = await this.workerThenTask(ch, w, taskId);
      if (!here) return LOCKED_PATH;
      // Applied before, its answer lost: acknowledged again.
      if (t && this.appliedFinish(t, w, endSeq)) return true;
      await apply(ch, this.heldBy(t, w));
      return true;
    });
    if (done === LOCKED_PATH) {
      await this.change(async (ch) => {
        await this.currentPresented(ch, w);
        if (await this.finishedBefore(ch, w, taskId, endSeq)) return;
        await apply(ch, await this.ownTask(ch, w, taskId));
        await this.dispatch(ch);
      });
      return;
    }
    await this.dispatchSoon();
  }

  handback(w: WorkerRow, taskId: string, reason: string, seq?: number): Promise<void> {
    return this.change(async (ch) => {
      await this.currentPresented(ch, w);
      if (await this.finishedBefore(ch, w, taskId, seq)) return;
      const t = await this.ownTask(ch, w, taskId);
      await this.alreadyApplied(ch, t, seq, 1);
      await this.releaseTask(ch, t, reason, false);
      await this.dispatch(ch);
    });
  }

  // Dispatch

  private async loads(ch: Change, workers: WorkerRow[]): Promise<Map<string, Load>> {
    const loads = new Map<string, Load>(workers.map((w) => [w.id, { running: 0, usedGpus: new Set<number>() }]));
    for (const t of await ch.store.activeTasks()) {
      const load = loads.get(t.workerId);
      if (load && t.kind === "job") addLoad(load, t.gpus);
    }
    return loads;
  }

  /**
   * Give each queued job, oldest first, to a matching worker with room; the
   * others say what they wait for. Under row locks, so replicas dispatch side
   * by side: a pass plans on unlocked reads (the queue, the workers, their
   * loads), then claims the planned jobs (FOR UPDATE SKIP LOCKED) and their
   * workers (store.claimWorkers) in one statement each, and counts those
   * workers' loads afresh under the claim. A job another pass holds is that
   * pass's; a job is claimed only while no worker holds it, so it is handed
   * out once; no worker goes over its slots. A planned job left unplaced
   * (its worker held elsewhere, or filled since the reads) owes a pass
   * soon, planned afresh.
   */
  async dispatch(ch: Change): Promise<void> {
    const { store } = ch;
    // Nothing queued (most finishes, at any fleet's size): no worker to read.
    const queued = await store.queuedJobs();
    if (!queued.length) return;
    const workers = await store.workers({ present: true });
    const loads = await this.loads(ch, workers);
    // Tasks of jobs whose needs failed end here, all at once, each job settled once after (job-tasks.ts): linear, however long the chain.
    const blocked = await blockedTasks(store, queued);
    const claimedSkips = new Set((await store.claimQueuedJobs(blocked.skips.map((s) => s.task.id))).map((j) => j.id));
    for (const { task, because } of blocked.skips) {
      if (!claimedSkips.has(task.id)) continue;
      await endUnstarted(store, task, because);
      ch.wake(`job:${task.id}`);
    }
    for (const parent of new Set(blocked.skips.filter((s) => claimedSkips.has(s.task.id)).map((s) => s.task.parentId!))) if (await settleJob(store, parent)) ch.wake(`job:${parent}`);
    const skipped = new Set(blocked.skips.map((s) => s.task.id));
    // Which workers could ever run a job depends on what it asks alone: judged once per ask in a pass, not once per job.
    const ableFor = new Map<string, WorkerRow[]>();
    const able = (needs: Needs, key: string) => {
      let found = ableFor.get(key);
      if (!found) ableFor.set(key, (found = workers.filter((w) => !neverReason(needs, w))));
      return found;
    };
    // An ask no worker had room for stays without room for the rest of the plan (it only adds load): the jobs queued
    // behind it with the same ask wait for the same reason, judged once, not once per job over every worker.
    const noRoom = new Map<string, string>();
    // Each job's worker, from a heap per ask rather than a look at every worker (placer.ts).
    const placer = new Placer(loads);
    // The plan, on the unlocked reads: a worker for each job that one looks free for; the others, what they wait for.
    const plan: { needs: Needs; worker: WorkerRow; job: JobRow }[] = [];
    const waits: { job: JobRow; reason: string }[] = [];
    for (const job of queued) {
      if (skipped.has(job.id)) continue;
      const waiting = blocked.waits.get(job.id);
      if (waiting) {
        waits.push({ job, reason: waiting });
        continue;
      }
      if ((await this.heldSpecs.resolve(store.sql, job.id, job.spec)) === null) {
        if (await store.claimQueuedJob(job.id)) await this.failJob(ch, job.id, `job cannot be built: ${CREDENTIALS_LOST}`);
        continue;
      }
      const needs = jobNeeds(job.spec, job.labels);
      const key = JSON.stringify(needs);
      const known = noRoom.get(key);
      const worker = known === undefined ? placer.choose(needs, key, able(needs, key)) : null;
      if (!worker) {
        const reason = known ?? waitingFor(needs, workers, able(needs, key), loads);
        noRoom.set(key, reason);
        waits.push({ job, reason });
        continue;
      }
      plan.push({ needs, worker, job });
      addLoad(loads.get(worker.id)!, pickGpus(needs, worker, loads.get(worker.id)!));
    }
    // A line already said is not said again. A pass changes JOBS_PER_PASS jobs at most (each holds a lock to its
    // commit, and PostgreSQL's lock table is finite): the rest in a pass after this one commits, planned afresh.
    const allNewWaits = waits.filter((w) => w.job.waiting !== w.reason);
    if (plan.length + allNewWaits.length > JOBS_PER_PASS) ch.passAfter();
    plan.splice(JOBS_PER_PASS);
    const newWaits = allNewWaits.slice(0, JOBS_PER_PASS - plan.length);
    if (!plan.length && !newWaits.length) return;
    // Claimed: the jobs no other pass holds (it says so itself, or has handed them out since the reads), each one's
    // event stream first, then its row, as every writer of both takes them (store.lockJob); a few statements however
    // many jobs the pass places. A waiting line is its job's own event; a job handed out is its parent's too.
    await store.holdStreams([...plan.flatMap(({ job: j }) => (j.parentId ? [j.id, j.parentId] : [j.id])), ...newWaits.map((w) => w.job.id)]);
    const claimed = new Map((await store.claimQueuedJobs([...plan, ...newWaits].map((p) => p.job.id))).map((j) => [j.id, j]));
    await this.markWaiting(ch, newWaits.filter((w) => claimed.has(w.job.id)));
    if (!plan.length) return;
    // The planned workers no other change holds, and their loads as they are now.
    const pool = await store.claimWorkers([...new Set(plan.map((p) => p.worker.id))]);
    const fresh = new Map<string, Load>(pool.map((w) => [w.id, { running: 0, usedGpus: new Set() }]));
    for (const { workerId, gpus } of await store.jobGpusOf(pool.map((w) => w.id))) addLoad(fresh.get(workerId)!, gpus);
    const handed: Handout[] = [];
    for (const { needs, job: seen } of plan) {
      const job = claimed.get(seen.id);
      if (!job) continue;
      // As they are now, under their locks: a worker may have joined again with other slots or GPUs since the reads.
      const w = chooseAmong(needs, pool.filter((x) => !neverReason(needs, x)), fresh);
      if (!w) continue;
      const gpus = pickGpus(needs, w, fresh.get(w.id)!);
      addLoad(fresh.get(w.id)!, gpus);
      handed.push({ job, worker: w, gpus });
    }
    await this.handOut(ch, handed);
    // A planned job left unplaced, or held by another change (a pass of older reads that only marks it waiting): a pass again soon, planned afresh.
    if (handed.length < plan.length) this.owePass();
  }

  /** The jobs' tasks on their workers, and the events that say so: a few statements for the whole pass. */
  private async handOut(ch: Change, handed: Handout[]): Promise<void> {
    if (!handed.length) return;
    const { store } = ch;
    const tasks = handed.map(({ job, worker, gpus }) => ({ id: newId(8), kind: "job" as const, jobId: job.id, groupId: null, workerId: worker.id, attempt: job.attempts + 1, gpus, prepare: null, bundle: job.bundle }));
    const events: StreamEvent[] = [];
    for (const [i, { job, worker: w, gpus }] of handed.entries()) {
      const attempt = tasks[i]!.attempt;
      events.push(jobEvent(job.id, "job.assigned", { worker: w.name, worker_id: w.id, attempt, gpus }));
      if (job.parentId) {
        events.push(jobEvent(job.parentId, "task.assigned", { task: job.task, worker: w.name, attempt }));
        // As the local runner records it (one model of events): the task's first start, not its retries.
        if (attempt === 1) events.push(jobEvent(job.parentId, "task.started", { task: job.task!, id: job.id, ...(gpus.length ? { gpus } : {}) }));
        // Whoever follows the job hears of it now, not at its next long poll's end.
        ch.wake(`job:${job.parentId}`);
      }
      ch.wake(`worker:${w.id}`);
      // Assigned, its row still queued: nothing of its job's row changes (settleJob), which would cost a read of all its tasks per task.
      ch.wake(`job:${job.id}`);
    }
    // The writes of the whole pass sent together, in this order, on the transaction's connection.
    await together(
      () => store.addTasks(tasks),
      () => store.jobsHandedOut(tasks.map((t) => ({ id: t.jobId, attempts: t.attempt, workerId: t.workerId }))),
      () => store.eventsOfStreams(events),
    );
  }

  /** Jobs claimed to wait, each for its reason: one statement per reason and one for their events. */
  private async markWaiting(ch: Change, waits: { job: JobRow; reason: string }[]): Promise<void> {
    if (!waits.length) return;
    const byReason = new Map<string, string[]>();
    for (const { job, reason } of waits) (byReason.get(reason) ?? byReason.set(reason, []).get(reason)!).push(job.id);
    for (const [reason, ids] of byReason) await ch.store.jobsWaiting(ids, reason);
    await ch.store.eventsOfStreams(waits.map(({ job, reason }) => jobEvent(job.id, "job.waiting", { for: reason })));
    // Waiting changes nothing of its job's row (settleJob): woken, not settled, or a job of 1,000 tasks reads them all 1,000 times.
    for (const { job } of waits) ch.wake(`job:${job.id}`);
  }

  /** A pass again soon: after the change that holds what this one could not claim has committed. */
  private owePass(): void {
    this.passOwed = true;
    setTimeout(() => void this.dispatchSoon(), CONTENDED_RETRY_MS).unref?.();
  }

}

interface Handout {
  job: JobRow;
  worker: WorkerRow;
  gpus: number[];
}

/** What a queued job waits for, given the workers able to run it and their loads. */
function waitingFor(needs: Needs, workers: WorkerRow[], able: WorkerRow[], loads: Map<string, Load>): string {
  if (!able.length) return workers.length ? `a worker that can run it (${reasons(workers, (w) => neverReason(needs, w))})` : "a worker to join";
  return `room on a worker (${reasons(able, (w) => busyReason(needs, w, loads.get(w.id)!))})`;
}
