import { exposition, Family, type Groups, observe } from "../core/prometheus.ts";
import type { ServerStore, WorkerRow } from "./store.ts";
import { WORKER_STATES } from "../cluster/protocol.ts";
import { FINAL_STATES, JOB_STATES } from "../jobs/model.ts";

/**
 * The server's Prometheus metrics, in the text exposition format, computed
 * at each scrape from the store (one way for the data to flow: the same
 * records `job status` and the dashboard read; nothing is counted twice or
 * lost at a restart). A scrape reads the jobs table and the phase events.
 */

/** What each worker's cache answered: hits and misses of the prepares it ran, for a job or for `env prepare --server`. */
export async function cacheHits(store: ServerStore): Promise<Map<string, { hit: number; miss: number }>> {
  const byWorker = new Map<string, { hit: number; miss: number }>();
  const count = (workerId: string, hit: boolean) => {
    const c = byWorker.get(workerId) ?? { hit: 0, miss: 0 };
    if (hit) c.hit++;
    else c.miss++;
    byWorker.set(workerId, c);
  };
  for (const e of await store.phaseEvents(["task.prepare.finished"])) if (e.workerId) count(e.workerId, e.data.cache === "hit");
  // Only a prepare that ended answers for the cache (a job's failed prepare has no task.prepare.finished either).
  for (const r of await store.prepareTaskResults()) if (["reused", "built", "fetched", "pulled"].includes(r.status)) count(r.workerId, r.status === "reused");
  return byWorker;
}

export async function serverMetrics(store: ServerStore, workers: (WorkerRow & { running: number })[]): Promise<string> {
  const families: Family[] = [];
  const family = (name: string, type: "gauge" | "counter" | "histogram", help: string) => {
    const f = new Family(name, type, help);
    families.push(f);
    return f;
  };

  const states = await store.jobStateCounts();
  const jobs = family("gpulayer_jobs", "gauge", "Jobs (and tasks of jobs) on the server, by state.");
  for (const s of JOB_STATES) jobs.sample(states.get(s) ?? 0, { state: s });
  const finished = family("gpulayer_jobs_finished_total", "counter", "Jobs that have ended, by how.");
  for (const s of FINAL_STATES) finished.sample(states.get(s) ?? 0, { state: s });

  const events = await store.phaseEvents(["job.submitted", "job.assigned", "task.prepare.started", "task.prepare.finished", "task.run.finished"]);
  const prepare: Groups = new Map();
  const run: Groups = new Map();
  const wait: Groups = new Map();
  const dispatch: Groups = new Map();
  const submitted = new Map<string, number>();
  const assigned = new Set<string>();
  const started = new Set<string>();
  for (const e of events) {
    if (e.type === "job.submitted") submitted.set(e.jobId, e.ts);
    else if (e.type === "job.assigned" && !assigned.has(e.jobId) && submitted.has(e.jobId)) {
      assigned.add(e.jobId);
      observe(dispatch, {}, (e.ts - submitted.get(e.jobId)!) / 1000);
    } else if (e.type === "task.prepare.started" && !started.has(e.jobId) && submitted.has(e.jobId)) {
      started.add(e.jobId);
      observe(wait, {}, (e.ts - submitted.get(e.jobId)!) / 1000);
    } else if (e.type === "task.prepare.finished") {
      const kind = e.data.status === "fetched" ? "fetched" : e.data.image ? "image" : "env";
      observe(prepare, { cache: e.data.cache === "hit" ? "hit" : "miss", kind }, Number(e.data.seconds) || 0);
    } else if (e.type === "task.run.finished") observe(run, {}, Number(e.data.seconds) || 0);
  }
  family("gpulayer_task_prepare_seconds", "histogram", "Time in task.prepare (finding or building the environment), by cache hit or miss and by kind (env, image, fetched).").histogram(prepare);
  family("gpulayer_task_run_seconds", "histogram", "Time in task.run (the job's own command).").histogram(run);
  family("gpulayer_queue_wait_seconds", "histogram", "From a job's submission to the start of its task.prepare on a worker.").histogram(wait);
  family("gpulayer_dispatch_latency_seconds", "histogram", "From a job's submission to its assignment to a worker.").histogram(dispatch);

  const byState = family("gpulayer_workers", "gauge", "Workers, by state.");
  for (const s of WORKER_STATES) byState.sample(workers.filter((w) => (w.state === "idle" && w.running ? "busy" : w.state) === s).length, { state: s });
  const bytes = family("gpulayer_worker_cache_bytes", "gauge", "Bytes of envs in each worker's cache, as it last reported.");
  const entries = family("gpulayer_worker_cache_entries", "gauge", "Envs in each worker's cache, as it last reported.");
  const ratio = family("gpulayer_worker_cache_hit_ratio", "gauge", "Share of each worker's env prepares that reused a cached env (0 when it prepared none).");
  const running = family("gpulayer_worker_running_tasks", "gauge", "Jobs each worker runs now.");
  const hits = await cacheHits(store);
  for (const w of workers) {
    const labels = { worker: w.name };
    bytes.sample(w.cache?.bytes ?? 0, labels);
    entries.sample(w.cache?.entries ?? 0, labels);
    const h = hits.get(w.id);
    ratio.sample(h && h.hit + h.miss ? h.hit / (h.hit + h.miss) : 0, labels);
    running.sample(w.running, labels);
  }
  family("gpulayer_bundle_storage_bytes", "gauge", "Bytes of job bundles the server keeps.").sample((await store.bundles.list()).reduce((n, b) => n + b.bytes, 0));
  family("gpulayer_artifact_storage_bytes", "gauge", "Bytes of env artifacts the server keeps for workers to fetch.").sample((await store.artifacts.totals()).bytes);
  return exposition(families);
}
