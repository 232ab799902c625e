import { ClusterClient, isUnavailable, Replicas } from "../cluster/client.ts";
import type { MachineProbe, PollResponse, RegisterResponse, TaskAssignment, WorkerCache, WorkerPrefetch } from "../cluster/protocol.ts";
import { listEnvs } from "../env/index-light.ts";
import type { WorkerMetricsSource } from "./metrics.ts";
import type { HomeLayout } from "../config/paths.ts";
import { HttpError, UserError } from "../errors.ts";
import { sleep } from "../core/sleep.ts";
import type { RunnerSettings } from "../jobs/runner.ts";
import type { BundleLimits } from "../cluster/bundle.ts";
import { loadIdentity, saveIdentity } from "./identity.ts";
import { endLeftovers } from "./leftovers.ts";
import { TaskChannel } from "./channel.ts";
import { Outbox } from "./outbox.ts";
import { startJobTask, startPrepareTask, type TaskHandle, type WorkerContext } from "./tasks.ts";
import { printable } from "../ui/escape.ts";
import { prefetchEnvs, type PrefetchSettings } from "./prefetch.ts";
import { warmWorker } from "./warm.ts";

/**
 * The worker's loop (`gpulayer join URL`): register with the probe (as the
 * worker it was, when its home keeps an identity from this server), beat,
 * long-poll for tasks and run them; on the first SIGINT/SIGTERM take no more
 * work and let what runs finish (up to the drain time), then hand back what
 * is left and leave; a second signal hands back at once.
 */

/** How often a worker reads its env cache for its report (a readdir and a meta.json per env). */
const CACHE_REPORT_MS = 5_000;

export interface AgentOptions {
  /** The server: one URL, or its replicas joined with "," (the client moves to the next when one stops answering). */
  url: string;
  token: string;
  name: string;
  labels: Record<string, string>;
  slots: number;
  probe: MachineProbe;
  layout: HomeLayout;
  /** The settings tasks run under; its defaultPython is the worker's Python. */
  runner: RunnerSettings;
  bundleLimits: BundleLimits;
  keepWorkdirs: boolean;
  /** worker.share_envs and worker.offline (worker/env-shipping.ts). */
  shareEnvs: boolean;
  offline: boolean;
  /** worker.prefetch_envs (worker/prefetch.ts): count 0, none. */
  prefetch: PrefetchSettings;
  /** coordinator.heartbeat when set on this machine: it wins over what the server asks. */
  heartbeatMs?: number;
  drainSeconds: number;
  onLog(message: string): void;
}

/** A sleep that does not keep the process alive on its own. */
const nap = (ms: number) => new Promise<void>((r) => setTimeout(r, Math.max(0, ms)).unref());

export class Agent {
  private readonly tasks = new Map<string, TaskHandle>();
  private stopping = false;
  private urgent = false;
  private pollAbort = new AbortController();
  private wake: (() => void) | null = null;
  private client: ClusterClient | null = null;
  private workerId = "";
  private credential = "";
  private heartbeatMs = 2000;
  private cacheReadAt = 0;
  private cacheSent = "";
  private connected = false;
  private left = false;
  private beatWake: (() => void) | null = null;
  private rejoining: Promise<void> | null = null;
  private readonly outbox: Outbox;
  /** Env artifacts being uploaded (worker/env-shipping.ts): a stopping worker lets them end. */
  private readonly uploads = new Set<Promise<void>>();
  /** The server's lease (lease_seconds): out of touch this long, this worker's jobs are given out again. */
  private leaseMs = Number.POSITIVE_INFINITY;
  private lastContact = Date.now();
  private fenced = false;
  /** What the prefetch on joining did so far (worker/prefetch.ts), reported with the cache. */
  private prefetched: WorkerPrefetch | null = null;
  /** Stops what runs beside the poll for work (the prefetch, the warm-up) when the worker stops. */
  private readonly besideAbort = new AbortController();

  /** The server's replicas, shared by every client of this worker: after a failover all of them talk to the one that answers. */
  private readonly replicas: Replicas;

  constructor(private readonly opts: AgentOptions) {
    this.outbox = new Outbox(opts.layout);
    this.replicas = new Replicas(opts.url, (from, to) => this.log(`the server at ${from} does not answer; now talking to ${to}`));
  }

  /** One line each, whatever a job's or a worker's name, a label or a server's message holds: no line break, no escape code reaches the log. */
  private log(message: string): void {
    this.opts.onLog(printable(message));
  }

  /** First call: drain. Second: hand back now. */
  stop(signal: string): void {
    if (this.stopping) {
      this.urgent = true;
      this.log(`${signal} again: handing back ${this.tasks.size} task(s) now`);
    } else this.log(`${signal}: taking no more work${this.tasks.size ? `; letting ${this.tasks.size} task(s) finish (up to ${this.opts.drainSeconds} s, ${signal} again to hand them back now)` : ""}`);
    this.stopping = true;
    this.pollAbort.abort();
    this.besideAbort.abort();
    this.wake?.();
  }

  private async register(): Promise<void> {
    const admin = new ClusterClient(this.replicas, this.opts.token);
    const { url, name, layout } = this.opts;
    let delay = 1000;
    let waitedForOld = false;
    for (;;) {
      const saved = loadIdentity(layout, url, name);
      try {
        const body = { name, labels: this.opts.labels, slots: this.opts.slots, probe: this.opts.probe, ...(saved ? { resume: { id: saved.id, credential: saved.credential } } : {}) };
        const r = await admin.json<RegisterResponse>("POST", "/v1/workers/register", body);
        saveIdentity(layout, { server: url, name: r.name, id: r.id, credential: r.credential });
        this.workerId = r.id;
        this.credential = r.credential;
        this.client = admin.withToken(r.credential);
        this.heartbeatMs = this.opts.heartbeatMs ?? r.heartbeat_seconds * 1000;
        this.leaseMs = r.lease_seconds ? r.lease_seconds * 1000 : Number.POSITIVE_INFINITY;
        this.contact();
        this.log(`joined ${admin.url}${this.replicas.urls.length > 1 ? ` (one of ${this.replicas.urls.length} replicas)` : ""} as ${r.name}${r.resumed ? ` again (the same worker, ${r.id})` : ""}; waiting for work`);
        return;
      } catch (error) {
        // Heard from moments ago: a process that has just died (restarted after a crash) or one still running. Ask once more when it would count as gone.
        const retryAfter = error instanceof HttpError && error.status === 409 ? Number(error.body.retry_after) : Number.NaN;
        if (!waitedForOld && !this.stopping && Number.isFinite(retryAfter)) {
          waitedForOld = true;
          this.log(`the server heard from a worker ${name} moments ago; asking again in ${retryAfter.toFixed(1)} s, in case that process has just stopped`);
          await sleep(retryAfter * 1000 + 300);
          continue;
        }
        // A wrong token or a taken name will not fix itself; a server that is not up yet (or unavailable: 502/503/504) may.
        if ((error instanceof HttpError && !isUnavailable(error.status)) || this.stopping) throw error;
        this.log(`${(error as Error).message}; retrying in ${delay / 1000} s`);
        await sleep(delay);
        delay = Math.min(delay * 2, 30_000);
      }
    }
  }

  private shipping() {
    return { layout: this.opts.layout, client: this.client!, offline: this.opts.offline, share: this.opts.shareEnvs, log: (m: string) => this.log(m), uploads: this.uploads };
  }

  /** In the background, beside the poll for work: each change goes with the next heartbeat. */
  private async prefetch(): Promise<void> {
    // After the first poll for work is on its way: probing the Python for the conditions is synchronous.
    await new Promise((r) => setImmediate(r));
    const done = await prefetchEnvs(this.shipping(), this.opts.prefetch, (state) => {
      this.prefetched = state;
      this.cacheReadAt = 0;
    }, this.besideAbort.signal);
    if (done.state !== "done" && !this.stopping) this.log(`prefetching envs: ${done.state}${done.reason ? ` (${done.reason})` : ""}`);
    else if (done.state === "done") this.log(`prefetching envs: done, ${done.fetched} fetched, ${done.present} here already, of ${done.wanted} wanted`);
  }

  /** In the background, beside the poll for work (worker/warm.ts); stopped when the worker stops. */
  private async warmUp(): Promise<void> {
    await new Promise((r) => setImmediate(r));
    const done = await warmWorker(this.opts.layout, this.opts.runner, this.besideAbort.signal);
    if (done.state === "done") this.log(`warmed up for a first build on ${done.python} in ${done.seconds.toFixed(2)} s (its probe, stand-ins of its packages, uv's venv)`);
    else if (!this.stopping) this.log(`warm-up ${done.state}: ${done.reason}${done.state === "failed" ? " (the first build does that work itself)" : ""}`);
  }

  private context(): WorkerContext {
    const shipping = this.shipping();
    return { safeSilenceMs: () => this.safeSilenceMs(), layout: this.opts.layout, client: this.client!, gpus: this.opts.probe.gpus, runner: this.opts.runner, bundleLimits: this.opts.bundleLimits, outbox: this.outbox, keepWorkdirs: this.opts.keepWorkdirs, shipping, log: (m) => this.log(m) };
  }

  /** `asked`: when the poll that brought it was sent (the server heard from this worker no earlier). */
  private start(task: TaskAssignment, asked: number): void {
    if (this.tasks.has(task.id)) return;
    if (this.stopping) {
      void this.client!.request("POST", `/v1/tasks/${task.id}/handback`, { reason: `worker ${this.opts.name} is leaving` }).catch(() => {});
      return;
    }
    const handle = task.kind === "job" ? startJobTask(this.context(), task, asked) : startPrepareTask(this.context(), task);
    this.log(task.kind === "job" ? `job ${task.job_id} (${task.spec?.name}): started (attempt ${task.attempt}${task.gpus.length ? `, GPUs ${task.gpus.join(",")}` : ""})` : `prepare task ${task.id}: started`);
    this.tasks.set(task.id, handle);
    void handle.done.finally(() => {
      this.tasks.delete(task.id);
      this.log(task.kind === "job" ? `job ${task.job_id}: done` : `prepare task ${task.id}: done`);
      this.wake?.();
    });
  }

  private cancel(ids: string[]): void {
    for (const id of ids) this.tasks.get(id)?.cancel("job cancel");
  }

  /** The env cache for the server, when it changed since the last report (read at most every CACHE_REPORT_MS). */
  private async cacheReport(): Promise<WorkerCache | undefined> {
    if (Date.now() - this.cacheReadAt < CACHE_REPORT_MS) return undefined;
    this.cacheReadAt = Date.now();
    const envs = await listEnvs(this.opts.layout).catch(() => null);
    if (!envs) return undefined;
    const report: WorkerCache = {
      bytes: envs.reduce((n, e) => n + e.sizeBytes, 0),
      entries: envs.length,
      ...(this.prefetched ? { prefetch: this.prefetched } : {}),
      envs: envs.slice(0, 1000).map((e) => ({ key: e.key, summary: e.summary.slice(0, 200), bytes: e.sizeBytes, last_used: e.lastUsed, state: e.state, python: e.python, requirements_file: e.requirementsFile })),
    };
    const text = JSON.stringify(report);
    if (text === this.cacheSent) return undefined;
    this.cacheSent = text;
    return report;
  }

  /** What `join --metrics-listen` shows: read from the agent as it is now. */
  metricsSource(): WorkerMetricsSource {
    const cache = this.cacheSent ? (JSON.parse(this.cacheSent) as WorkerCache) : null;
    return { name: this.opts.name, running: this.tasks.size, slots: this.opts.slots, gpus: this.opts.probe.gpus.length, freeGpus: this.freeGpus().length, connected: this.connected, cache: cache && { bytes: cache.bytes, entries: cache.entries } };
  }

  private freeGpus(): number[] {
    const used = new Set([...this.tasks.values()].flatMap((t) => t.task.gpus));
    return this.opts.probe.gpus.map((g) => g.index).filter((i) => !used.has(i));
  }

  /** Lost (the server stopped hearing us), or forgotten: what runs here now runs elsewhere; stop it and join again. */
  private rejoin(why = "the server declared this worker lost"): Promise<void> {
    this.rejoining ??= (async () => {
      this.log(`${why}; stopping its tasks and joining again`);
      for (const t of this.tasks.values()) void t.handBack("worker declared lost");
      await this.register();
    })().finally(() => {
      this.rejoining = null;
    });
    return this.rejoining;
  }

  private pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      this.beatWake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }

  private async heartbeats(): Promise<void> {
    let failing = false;
    for (;;) {
      await this.pause(this.heartbeatMs);
      if (this.left) return;
      try {
        // What runs here, and what ended here but the server has not all of yet: the server reconciles its view with this.
        const running = [...new Set([...this.tasks.keys(), ...this.outbox.pendingTasks()])];
        const cache = await this.cacheReport();
        const r = await this.client!.json<{ cancel: string[]; gone?: string[] }>("POST", `/v1/workers/${this.workerId}/heartbeat`, { running, free_gpus: this.freeGpus(), ...(cache ? { cache } : {}) }).catch((error: unknown) => {
          this.cacheSent = ""; // not heard: sent again with the next beat
          throw error;
        });
        this.contact();
        this.connected = true;
        this.cancel(r.cancel);
        // Listed, but no longer ours: given out again while this worker went unheard past its lease (it stalled, or was frozen).
        for (const id of r.gone ?? []) this.tasks.get(id)?.takenBack("given out again while this worker went unheard");
        if (failing) this.log("the server answers again");
        failing = false;
      } catch (error) {
        if (this.left) return;
        this.connected = false;
        this.fenceIfCutOff();
        if (error instanceof HttpError && error.status === 409 && !this.stopping) await this.rejoin().catch((e) => this.log(`joining again failed: ${(e as Error).message}`));
        // A refused credential is the poll loop's to deal with.
        else if (!failing && !(error instanceof HttpError && error.status === 401)) this.log(`heartbeat failed: ${(error as Error).message}`);
        failing = true;
      }
    }
  }

  /**
   * The server no longer takes our credential. Another `gpulayer join` on
   * this home took the worker over (the saved credential is no longer ours):
   * stop. Else the server forgot us (its state was wiped): join again.
   */
  private async credentialRefused(): Promise<void> {
    const saved = loadIdentity(this.opts.layout, this.opts.url, this.opts.name);
    if (saved && saved.credential !== this.credential) {
      const stopping = Promise.all([...this.tasks.values()].map((t) => t.handBack("worker taken over by another process")));
      await Promise.race([stopping, nap(this.opts.runner.cancelGraceMs + 5000)]);
      throw new UserError(`worker ${this.opts.name} was taken over by another gpulayer join with the same name and GPULAYER_HOME (${this.opts.layout.root}); this one stops`);
    }
    await this.rejoin("the server refused this worker's credential (it was marked lost, or the server's state was wiped)");
  }

  async run(): Promise<void> {
    const left = await endLeftovers(this.opts.layout, 1000, this.opts.keepWorkdirs);
    if (left.jobs) this.log(`ended what ${left.jobs} job(s) of a previous run of this worker left behind (${left.processes} process(es))`);
    await this.deliverLeftOver();
    await this.register();
    const beats = this.heartbeats();
    const prefetching = this.opts.prefetch.count > 0 ? this.prefetch() : null;
    const warming = this.warmUp();
    // One line per outage, not one a second: the heartbeat says when the server answers again.
    let failedWith: string | null = null;
    try {
      while (!this.stopping) {
        const credential = this.credential;
        try {
          const asked = Date.now();
          const r = await this.client!.json<PollResponse>("GET", `/v1/workers/${this.workerId}/tasks?wait=25`, undefined, { signal: this.pollAbort.signal });
          failedWith = null;
          this.contact();
          this.cancel(r.cancel);
          for (const t of r.tasks) this.start(t, asked);
        } catch (error) {
          if (this.stopping) break;
          // Joining again (lost) gives a new credential: whatever a poll sent with the old one got is stale; poll again.
          if (this.rejoining) await this.rejoining.catch(() => {});
          if (credential !== this.credential) continue;
          if (error instanceof HttpError && error.status === 409) await this.rejoin();
          else if (error instanceof HttpError && error.status === 401) await this.credentialRefused();
          else {
            if (failedWith === null) this.log(`waiting for work failed: ${(error as Error).message}; retrying every second`);
            failedWith = (error as Error).message;
            await sleep(1000);
          }
        }
      }
      await this.leave();
    } finally {
      // Also when giving up: no heartbeat keeps the process alive.
      this.left = true;
      this.beatWake?.();
    }
    await beats.catch(() => {});
    await prefetching;
    await warming;
  }

  private contact(): void {
    this.lastContact = Date.now();
    this.fenced = false;
  }

  /**
   * Out of touch with the server for nearly its lease (a network cut, or a
   * server down that long): the server will give this worker's jobs out
   * again at the lease's end, so they are stopped here first and given back
   * (durably: the handback waits in the outbox), and a job never runs in two
   * places at once. Short cuts cost nothing: the server keeps a lost
   * worker's jobs until its lease is over.
   */
  /** How long this worker may go unheard and still take what it runs for its own: its lease, less a margin for beats in flight. */
  private safeSilenceMs(): number {
    return this.leaseMs - Math.max(3 * this.heartbeatMs, 0.2 * this.leaseMs);
  }

  private fenceIfCutOff(): void {
    const silent = Date.now() - this.lastContact;
    if (this.fenced || !this.tasks.size || silent < this.safeSilenceMs()) return;
    this.fenced = true;
    const reason = `worker ${this.opts.name} was out of touch with the server for ${(silent / 1000).toFixed(0)} s, near its lease (${this.leaseMs / 1000} s): stopped there, to run elsewhere`;
    this.log(`${reason}; stopping ${this.tasks.size} task(s)`);
    for (const t of this.tasks.values()) void t.handBack(reason);
  }

  /**
   * What a previous run of this worker ended but could not deliver (its
   * outbox on disk), sent first, with the credential it had, before joining
   * again: registering hands back whatever the server still believes runs
   * here, so a job that finished before the crash is not run again.
   */
  private async deliverLeftOver(): Promise<void> {
    const tasks = this.outbox.pendingTasks();
    const saved = loadIdentity(this.opts.layout, this.opts.url, this.opts.name);
    if (!tasks.length) return;
    if (!saved) {
      for (const t of tasks) this.outbox.drop(t);
      return;
    }
    this.log(`delivering what ${tasks.length} task(s) of a previous run left undelivered`);
    const client = new ClusterClient(this.replicas, saved.credential);
    await Promise.all(
      tasks.map((t) => {
        const channel = new TaskChannel(client, t, this.outbox, () => {}, (m) => this.log(m));
        channel.kick();
        return channel.flush();
      }),
    );
  }

  private async leave(): Promise<void> {
    const post = (final: boolean) => this.client!.request("POST", `/v1/workers/${this.workerId}/leave`, { final }).catch((e) => this.log(`telling the server failed: ${(e as Error).message}`));
    await post(false);
    const deadline = Date.now() + this.opts.drainSeconds * 1000;
    while (this.tasks.size && !this.urgent && Date.now() < deadline) {
      await Promise.race([nap(deadline - Date.now()), new Promise<void>((r) => (this.wake = r))]);
    }
    // Env artifacts still uploading (worker/env-shipping.ts) end within the same drain time: the fleet waits for them.
    if (this.uploads.size && !this.urgent) await Promise.race([Promise.allSettled([...this.uploads]), nap(deadline - Date.now())]);
    if (this.tasks.size) {
      this.log(`handing back ${this.tasks.size} task(s)`);
      const all = Promise.all([...this.tasks.values()].map((t) => t.handBack(`worker ${this.opts.name} left`)));
      await Promise.race([all, nap(this.opts.runner.cancelGraceMs + 5000)]);
    }
    await post(true);
    this.left = true;
    this.beatWake?.();
    this.log("left the server");
  }
}
