import type { JobOutputsView, PrepareGroupView, PrepareRequestPayload, RemoteJobStatus, RemoteSpec, SubmitRequest, SubmitResponse, WatchResponse } from "../cluster/protocol.ts";
import { endedPhases, isFinal, outputsOfEvents, phasesOf, statusDocument, taskStatus } from "../jobs/model.ts";
import type { Change, Coordinator } from "./coordinator.ts";
import { ExitCode } from "../errors.ts";
import { HttpFail } from "./http-fail.ts";
import { fleetGpuRefusal, jobNeeds, labelsMatch, neverReason, reasons } from "./match.ts";
import { type JobRow, newId, type ServerStore, type WorkerRow } from "./store.ts";
import { together } from "./db/sql.ts";
import { prepareSteps } from "./task-reports.ts";
import { endUnstarted, JOB_CANCELLED, settleJob } from "./job-tasks.ts";
import { taskGraphProblem } from "../jobs/task-graph.ts";

const JOIN_HINT = "on a GPU box: gpulayer join URL --token-file FILE";

/** Why nothing can take work: none ever joined, or those that did have all left (stopped, or their join token revoked). */
async function noWorkers(store: ServerStore): Promise<string> {
  const known = await store.workers();
  if (!known.length) return `no workers have joined this server (${JOIN_HINT})`;
  const names = known.map((w) => w.name);
  return `no worker is connected now: ${names.length > 5 ? `${names.slice(0, 5).join(", ")} and ${names.length - 5} more` : names.join(", ")} joined before and left (${JOIN_HINT})`;
}

/**
 * How long a submit's "some worker here could run it" stays known for jobs
 * that ask the same (labels, resources, kind of environment): reading every
 * worker for every submit was most of a busy server's work. Only acceptance
 * is kept; a refusal is judged afresh each time. A job accepted on an answer
 * a moment old whose workers all left meanwhile waits for one, as a job does
 * whose workers are lost.
 */
const ACCEPTED_MS = 2_000;

/** Jobs and prepares as clients see them: submit, look, watch, cancel. */
export class JobsApi {
  private readonly accepted = new Map<string, number>();
  private readonly judging = new Map<string, Promise<void>>();

  constructor(readonly c: Coordinator) {}

  private get store() {
    return this.c.store;
  }

  /** Refused (422) when no worker present could ever run it; asks for the bundle (409) when the server lacks it. */
  async submit(body: SubmitRequest): Promise<SubmitResponse> {
    // As a job file's tasks are checked (jobs/task-graph.ts): two of one name, a need of no task, a cycle.
    const graph = body.spec.tasks ? taskGraphProblem(body.spec.tasks) : null;
    if (graph) throw new HttpFail(400, `spec.${graph.at}: ${graph.problem}`);
    await this.refuseUnrunnable(body);
    // Recorded under row locks (new rows only), then given out by a dispatch pass shared with the submits around it.
    const id = await this.c.store.transaction((store) => this.record(store, body));
    await this.c.dispatchSoon();
    const job = (await this.store.job(id))!;
    return { id, state: job.state, waiting: job.waiting };
  }

  /** 422 when no worker here could ever run the job (or one of its tasks). */
  private refuseUnrunnable(body: SubmitRequest): Promise<void> {
    const asks = body.spec.tasks ? body.spec.tasks.map((t) => [`task ${t.name}`, t.spec] as const) : [["job", body.spec] as const];
    // The asks' names too: a refusal names them, and submits sharing a judgement share its words.
    const key = JSON.stringify([body.labels, asks.map(([what, spec]) => [what, spec.resources, jobNeeds(spec, {})])]);
    if ((this.accepted.get(key) ?? 0) > Date.now() - ACCEPTED_MS) return Promise.resolve();
    // Submits of one ask at once share one judgement: at hundreds a second, each reading every worker was most of the server's work.
    const inFlight = this.judging.get(key);
    if (inFlight) return inFlight;
    const judged = this.judgeRunnable(body, key, asks).finally(() => this.judging.delete(key));
    this.judging.set(key, judged);
    return judged;
  }

  private async judgeRunnable(body: SubmitRequest, key: string, asks: (readonly [string, RemoteSpec])[]): Promise<void> {
    const now = Date.now();
    // Judged against the workers here, else (every one lost for a moment: a network blip, a load spike) those that may come
    // back within their lease: the job waits for them rather than being refused as if none had joined.
    const present = await this.store.workers({ present: true });
    const workers = present.length ? present : await this.store.workers({ lost: true });
    if (!workers.length) throw new HttpFail(422, `job refused: ${await noWorkers(this.store)}`);
    const gpus = fleetGpuRefusal(body.spec, body.labels, workers);
    if (gpus) throw new HttpFail(422, gpus);
    // A job of tasks: each task is matched on its own, so each must have a worker that could run it.
    for (const [what, spec] of asks) {
      const needs = jobNeeds(spec, body.labels);
      if (workers.every((w) => neverReason(needs, w))) throw new HttpFail(422, `${what} refused: no worker can run it: ${reasons(workers, (w) => neverReason(needs, w))}`);
    }
    if (present.length) {
      if (this.accepted.size >= 1_000) this.accepted.clear();
      this.accepted.set(key, now);
    }
  }

  /** The job's rows (and its tasks'), queued; its id. */
  private async record(store: ServerStore, body: SubmitRequest): Promise<string> {
    if (body.bundle && !(await store.bundles.has(body.bundle))) throw new HttpFail(409, "bundle_missing", { bundle: body.bundle });
    if (body.bundle) await store.bundles.touch(body.bundle);
    const id = newId(8);
    await this.c.heldSpecs.hold(store.sql, id, body.spec);
    // The row and its first event sent together (in this order) on the transaction's connection.
    await together(
      () => store.addJob({ id, name: body.spec.name, spec: body.spec, bundle: body.bundle, labels: body.labels, workdir: body.workdir }),
      () => store.event(id, "job.submitted", { name: body.spec.name, command: body.spec.commandText, labels: body.labels }),
    );
    for (const t of body.spec.tasks ?? []) {
      const taskId = newId(8);
      await this.c.heldSpecs.hold(store.sql, taskId, t.spec);
      await store.addJob({ id: taskId, name: `${body.spec.name}/${t.name}`, spec: t.spec, bundle: body.bundle, labels: body.labels, workdir: body.workdir, parentId: id, task: t.name, needs: t.needs });
      await store.event(taskId, "job.submitted", { name: t.name, command: t.spec.commandText, job: id });
    }
    return id;
  }

  async find(prefix: string): Promise<JobRow> {
    if (!/^[0-9a-f]{1,16}$/i.test(prefix)) throw new HttpFail(400, `not a job id: ${prefix}`);
    const rows = await this.store.jobsByPrefix(prefix.toLowerCase());
    if (rows.length > 1) throw new HttpFail(400, `job id prefix ${prefix} matches several jobs; give more of it`);
    if (!rows[0]) throw new HttpFail(404, `no job with id ${prefix} on this server (see gpulayer job list)`);
    return rows[0];
  }

  /** A job's (or task's) events, the phases of its latest attempt (a lost attempt stays in the events, not in the phases), and the worker it is on: read once. */
  private async attempt(job: JobRow) {
    const events = (await this.store.events(job.id)).map(({ seq: _s, ...e }) => e);
    const lastAssigned = events.findLastIndex((e) => e.type === "job.assigned" || e.type === "job.requeued" || e.type === "job.lost");
    const worker = job.workerId ? await this.store.worker(job.workerId) : null;
    const attempt = lastAssigned >= 0 ? events.slice(lastAssigned) : events;
    // An ended job's phase that never said it finished (cancelled while its worker was lost) ended with the job.
    return { events, phases: isFinal(job.state) ? endedPhases(attempt, job.updated) : phasesOf(attempt), worker: worker?.name ?? null };
  }

  async status(job: JobRow, withEvents = true): Promise<RemoteJobStatus> {
    const { events, phases, worker } = await this.attempt(job);
    const facts = { ...job, command: job.spec.commandText };
    return {
      ...statusDocument(facts, phases, withEvents ? events : [], job.spec.tasks ? { tasks: await this.taskStatuses(job) } : {}),
      worker,
      attempts: job.attempts,
      waiting: job.waiting,
      labels: job.labels,
    };
  }

  /** Each task of a job: its own row's state and phases (of its latest attempt), its outputs, and the worker it ran on. */
  private async taskStatuses(job: JobRow): Promise<NonNullable<RemoteJobStatus["tasks"]>> {
    const out: NonNullable<RemoteJobStatus["tasks"]> = [];
    for (const t of await this.store.tasksOf(job.id)) {
      const { events, phases, worker } = await this.attempt(t);
      out.push(taskStatus({ ...t, task: t.task!, command: t.spec.commandText }, phases, outputsOfEvents(events), worker));
    }
    return out;
  }

  /** What a job's tasks left: each task's outputs archive (fetched as a bundle) and its files. */
  async outputs(job: JobRow): Promise<JobOutputsView> {
    const tasks: JobOutputsView["tasks"] = [];
    for (const t of job.parentId ? [job] : await this.store.tasksOf(job.id)) tasks.push({ name: t.task ?? t.name, bundle: t.outputsBundle, files: outputsOfEvents(await this.store.events(t.id)) });
    return { id: job.id, tasks };
  }

  async list(limit: number): Promise<Omit<RemoteJobStatus, "events">[]> {
    const out: Omit<RemoteJobStatus, "events">[] = [];
    for (const j of await this.store.jobs(limit)) {
      const { events: _e, ...s } = await this.status(j, false);
      out.push(s);
    }
    return out;
  }

  /** Queued: cancelled at once. Running: its worker is told (on its long poll) and reports the outcome. */
  cancel(jobId: string): Promise<{ id: string; state: string }> {
    return this.c.change((ch) => this.cancelIn(ch, jobId));
  }

  private async cancelIn(ch: Change, jobId: string): Promise<{ id: string; state: string }> {
    const ended = await this.cancelJob(ch, jobId);
    if (ended) throw new HttpFail(409, `job ${jobId} has already ended (${ended})`);
    ch.wake(`job:${jobId}`);
    const now = (await ch.store.job(jobId))!;
    return { id: now.id, state: now.state };
  }

  /**
   * Cancels one job, read under its locks: a task's end reported meanwhile
   * (under row locks, coordinator.ts) is seen, never overwritten with
   * "cancelled". Returns the state it had already ended in, if it had.
   * `task`: a task of a job of tasks, which ends unstarted if not running.
   */
  private async cancelJob(ch: Change, jobId: string, task = false): Promise<string | null> {
    const { store } = ch;
    // Its running task's row before its own: the order a worker's reports lock them in.
    let running = await store.lockedActiveTaskOfJob(jobId);
    await store.lockJob(jobId);
    // A dispatch pass that held the job handed it out meanwhile: that is the run to stop.
    running ??= await store.lockedActiveTaskOfJob(jobId);
    const job = (await store.job(jobId))!;
    if (isFinal(job.state)) return job.state;
    const tasks = task ? [] : await store.tasksOf(job.id);
    if (tasks.length) {
      // A job of tasks: each running task is cancelled on its worker, each not started ends now; the job ends with the last.
      await store.updateJob(job.id, { cancelRequested: true });
      await store.event(job.id, "job.cancel.requested", { tasks: tasks.filter((t) => !isFinal(t.state)).map((t) => t.task) });
      // One ending as this runs waits on the job's lock, held here, or (a deadlock) runs again after.
      for (const t of tasks) if (!isFinal(t.state)) await this.cancelJob(ch, t.id, true);
      if (await settleJob(store, job.id)) ch.wake(`job:${job.id}`);
      return null;
    }
    if (running) {
      await store.updateTask(running.id, { cancel: true });
      await store.updateJob(job.id, { cancelRequested: true });
      await store.event(job.id, "job.cancel.requested", { worker: (await store.worker(running.workerId))?.name ?? null });
      ch.wake(`worker:${running.workerId}`);
    } else if (task) await endUnstarted(store, job, JOB_CANCELLED);
    else {
      await store.event(job.id, "job.cancelled", { reason: "job cancel" });
      await store.updateJob(job.id, { state: "cancelled", exitCode: ExitCode.cancelled, cancelRequested: true });
    }
    ch.wake(`job:${job.id}`);
    return null;
  }

  /** New output and events since the client's marks; waits (long poll) while there are none and the job runs. */
  async watch(jobId: string, logOffset: number, afterSeq: number, waitMs: number, signal?: AbortSignal): Promise<WatchResponse> {
    const deadline = Date.now() + waitMs;
    for (;;) {
      const job = (await this.store.job(jobId))!;
      const chunks = job.logSize > logOffset ? await this.store.readChunks(jobId, logOffset) : [];
      const size = chunks.reduce((n, c) => n + c.data.length, 0);
      const events = (await this.store.followEvents(jobId, [jobId], afterSeq, signal)).map(({ jobId: _j, ...e }) => e);
      const final = isFinal(job.state);
      if (size || events.length || final || Date.now() >= deadline || signal?.aborted) {
        const worker = job.workerId ? await this.store.worker(job.workerId) : null;
        return {
          state: job.state,
          exit_code: job.exitCode,
          error: job.error,
          worker: worker?.name ?? null,
          waiting: job.waiting,
          output: chunks.map((c) => ({ stream: c.stream === 2 ? "stderr" : "stdout", data: Buffer.from(c.data).toString("base64") })),
          log_offset: logOffset + size,
          events,
          done: final && logOffset + size >= job.logSize,
        };
      }
      await this.c.notify.wait(`job:${jobId}`, deadline - Date.now(), signal);
    }
  }

  /** A prepare task on every present worker that matches the labels (and, for an image, has an engine). */
  prepare(body: { request: PrepareRequestPayload; bundle: string | null; labels: Record<string, string> }): Promise<{ id: string; workers: string[] }> {
    return this.c.change((ch) => this.prepareIn(ch, body));
  }

  private async prepareIn(ch: Change, body: { request: PrepareRequestPayload; bundle: string | null; labels: Record<string, string> }): Promise<{ id: string; workers: string[] }> {
    const { store } = ch;
    const workers = await store.workers({ present: true });
    if (!workers.length) throw new HttpFail(422, `prepare refused: ${await noWorkers(store)}`);
    const why = (w: WorkerRow) => (w.state === "draining" ? "draining" : null) ?? labelsMatch(body.labels, w.labels) ?? (body.request.image ? (w.probe.engine ? null : "no working container engine") : null);
    const chosen = workers.filter((w) => !why(w));
    if (!chosen.length) throw new HttpFail(422, `prepare refused: no worker matches: ${reasons(workers, why)}`);
    if (body.bundle && !(await store.bundles.has(body.bundle))) throw new HttpFail(409, "bundle_missing", { bundle: body.bundle });
    if (body.bundle) await store.bundles.touch(body.bundle);
    const id = newId(8);
    await this.c.heldPrepares.hold(store.sql, id, body.request);
    for (const w of chosen) {
      await store.addTask({ id: newId(8), kind: "prepare", jobId: null, groupId: id, workerId: w.id, attempt: 1, gpus: [], prepare: body.request, bundle: body.bundle });
      ch.wake(`worker:${w.id}`);
    }
    return { id, workers: chosen.map((w) => w.name) };
  }

  /** The prepare's tasks and build steps; waits while none finished beyond the `known` the client has seen and no step came after `after`. */
  async group(id: string, known: number, waitMs: number, signal?: AbortSignal, after = 0): Promise<PrepareGroupView> {
    const deadline = Date.now() + waitMs;
    for (;;) {
      const tasks = await this.store.groupTasks(id);
      if (!tasks.length) throw new HttpFail(404, `no prepare ${id}`);
      const finished = tasks.filter((t) => t.state !== "assigned" && t.state !== "running");
      const names = new Map((await this.store.workers()).map((w) => [w.id, w.name]));
      const workerOf = new Map(tasks.map((t) => [prepareSteps(t.id), names.get(t.workerId) ?? t.workerId]));
      const steps: PrepareGroupView["steps"] = (await this.store.followEvents(id, [...workerOf.keys()], after, signal)).map((e) => ({ seq: e.seq, worker: workerOf.get(e.jobId)!, type: e.type, data: e.data }));
      if (steps.length || finished.length > known || finished.length === tasks.length || Date.now() >= deadline || signal?.aborted) {
        return {
          id,
          done: finished.length === tasks.length,
          tasks: tasks.map((t) => ({ id: t.id, worker: names.get(t.workerId) ?? t.workerId, state: t.state, result: t.result })),
          steps,
        };
      }
      await this.c.notify.wait(`group:${id}`, deadline - Date.now(), signal);
    }
  }
}
