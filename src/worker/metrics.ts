import { exposition, Family } from "../core/prometheus.ts";
import { UsageError } from "../errors.ts";

/** What a worker tells a node-level scraper about itself (`join --metrics-listen`): the agent's own view, read at each scrape. */
export interface WorkerMetricsSource {
  name: string;
  running: number;
  slots: number;
  gpus: number;
  freeGpus: number;
  /** Whether the server answered its last heartbeat. */
  connected: boolean;
  cache: { bytes: number; entries: number } | null;
}

export function workerMetrics(s: WorkerMetricsSource): string {
  const labels = { worker: s.name };
  const family = (name: string, help: string, value: number) => {
    const f = new Family(name, "gauge", help);
    f.sample(value, labels);
    return f;
  };
  return exposition([
    family("gpulayer_worker_running_tasks", "Jobs this worker runs now.", s.running),
    family("gpulayer_worker_slots", "Jobs this worker runs at once at most (worker.slots).", s.slots),
    family("gpulayer_worker_gpus", "GPUs this worker has.", s.gpus),
    family("gpulayer_worker_free_gpus", "GPUs no job of this worker holds now.", s.freeGpus),
    family("gpulayer_worker_connected", "1 while the server answers this worker's heartbeats.", s.connected ? 1 : 0),
    family("gpulayer_worker_cache_bytes", "Bytes of envs in this worker's cache.", s.cache?.bytes ?? 0),
    family("gpulayer_worker_cache_entries", "Envs in this worker's cache.", s.cache?.entries ?? 0),
  ]);
}

/** GET /metrics on `listen` (HOST:PORT), without a token: bind it to loopback or a private interface. */
export function serveWorkerMetrics(listen: { hostname: string; port: number }, read: () => WorkerMetricsSource): { url: string; stop(): void } {
  let server: ReturnType<typeof Bun.serve>;
  try {
    server = Bun.serve({
      hostname: listen.hostname,
      port: listen.port,
      fetch: (req) => {
        if (new URL(req.url).pathname !== "/metrics") return new Response("not found\n", { status: 404 });
        if (req.method !== "GET" && req.method !== "HEAD") return new Response("method not allowed\n", { status: 405, headers: { allow: "GET, HEAD" } });
        return new Response(req.method === "HEAD" ? null : workerMetrics(read()), { headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" } });
      },
    });
  } catch (error) {
    throw new UsageError(`--metrics-listen ${listen.hostname}:${listen.port}: cannot listen there: ${(error as Error).message}`);
  }
  return { url: `http://${listen.hostname}:${server.port}/metrics`, stop: () => void server.stop(true) };
}
