/**
 * Simulated workers for bench/fleet.ts, one process holding many of them:
 * each speaks the real worker protocol through the real client
 * (src/cluster/client.ts), as src/worker/agent.ts and channel.ts do:
 * register with a probe, beat, long-poll for tasks, and for each task report
 * what the task runner reports for a short job (prepare from the cache, run
 * started, a line of output, run finished with exit 0, optionally a small
 * outputs archive, finish), each report numbered as the outbox numbers it.
 * No process is run. Lines on stdout, one JSON document each: `ready` once
 * all have joined, `start`/`end` per task, and on "stop" (stdin) `stats`.
 * Run by bench/fleet.ts: bun bench/fleet-worker.ts '<config JSON>'
 */
import { ClusterClient, Replicas } from "../src/cluster/client.ts";
import type { MachineProbe, PollResponse, RegisterResponse, ReportItemWire, ReportsRequest, TaskAssignment, TaskEventIn } from "../src/cluster/protocol.ts";
import { runsOf } from "../src/core/runs.ts";
import { HttpError } from "../src/errors.ts";

export interface SimConfig {
  /** The server's replicas; worker i talks to replica i mod n first (the list rotated, as a real worker's may be). */
  urls: string[];
  token: string;
  first: number;
  count: number;
  /** Beat this often instead of what the server says (a worker's own coordinator.heartbeat); null: the server's. */
  beatMs: number | null;
  /** How long the simulated job "runs" between its run.started and run.finished reports. */
  jobMs: number;
  /** Upload a small outputs archive per task (PUT /v1/tasks/ID/outputs/HASH). */
  outputs: boolean;
}

const cfg = JSON.parse(process.argv[2]!) as SimConfig;
const now = () => performance.timeOrigin + performance.now();
const emit = (doc: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(doc)}\n`);
const stopping = new AbortController();
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** [when, ms, 1 answered | 0 failed] per beat. */
const beats: [number, number, number][] = [];
/** Failures by request kind and reason: what breaks first as the fleet grows. */
const errors: Record<string, number> = {};
const failed = (kind: string, error: unknown) => {
  const why = error instanceof HttpError ? `HTTP ${error.status}` : ((error as Error).name === "AbortError" ? "aborted" : (error as Error).message.slice(0, 80));
  errors[`${kind}: ${why}`] = (errors[`${kind}: ${why}`] ?? 0) + 1;
};

/** A GPU box as `gpulayer join` probes one: one GPU, torch, a venv's Python. */
function probe(i: number): MachineProbe {
  const hostname = `sim-host-${String(i).padStart(4, "0")}`;
  return {
    hostname,
    os: "linux",
    arch: "x64",
    cpus: 32,
    memoryBytes: 256 * 1024 ** 3,
    gpus: [{ index: 0, uuid: `GPU-${crypto.randomUUID()}`, name: "NVIDIA H100 80GB HBM3", memoryMiB: 81559, driver: "550.54.15" }],
    python: { path: "/opt/venv/bin/python", version: "3.11.9" },
    frameworks: { torch: "2.4.1", numpy: "1.26.4", pip: "24.0", setuptools: "69.5.1", "nvidia-cudnn-cu12": "9.1.0.70" },
    cuda: "12.1",
    engine: null,
    probeMs: 180,
  };
}

/** A one-file tar.gz (ustar, written here): what a task's declared outputs make. */
function outputsArchive(text: string): Uint8Array {
  const data = new TextEncoder().encode(text);
  const header = new Uint8Array(512);
  const put = (s: string, at: number) => header.set(new TextEncoder().encode(s), at);
  const octal = (n: number, width: number) => `${n.toString(8).padStart(width - 1, "0")}\0`;
  put("result.txt", 0);
  put(octal(0o644, 8), 100);
  put(octal(0, 8), 108);
  put(octal(0, 8), 116);
  put(octal(data.length, 12), 124);
  put(octal(Math.floor(Date.now() / 1000), 12), 136);
  put("        ", 148);
  put("0", 156);
  put("ustar\0", 257);
  put("00", 263);
  put(octal(header.reduce((a, b) => a + b, 0), 7), 148);
  const body = new Uint8Array(Math.ceil(data.length / 512) * 512);
  body.set(data);
  return Bun.gzipSync(Buffer.concat([header, body, new Uint8Array(1024)]));
}

class SimWorker {
  private client: ClusterClient | null = null;
  private id = "";
  private beatMs = 2000;
  private readonly running = new Set<string>();

  constructor(private readonly index: number) {}

  async register(): Promise<void> {
    const rotated = cfg.urls.map((_, k) => cfg.urls[(this.index + k) % cfg.urls.length]!);
    const admin = new ClusterClient(new Replicas(rotated), cfg.token);
    const name = `sim-${String(this.index).padStart(4, "0")}`;
    for (let delay = 500; ; delay = Math.min(delay * 2, 5000)) {
      try {
        const r = await admin.json<RegisterResponse>("POST", "/v1/workers/register", { name, labels: { pool: "sim" }, slots: 1, probe: probe(this.index) });
        this.client = admin.withToken(r.credential);
        this.id = r.id;
        this.beatMs = cfg.beatMs ?? r.heartbeat_seconds * 1000;
        return;
      } catch (error) {
        failed("register", error);
        await sleep(delay);
      }
    }
  }

  /** As the agent: a pause, then a beat listing what runs here (the first one a moment into the interval, as workers start apart). */
  async beat(): Promise<void> {
    await sleep(Math.random() * this.beatMs);
    let first = true;
    while (!stopping.signal.aborted) {
      const t = now();
      try {
        const cache = first ? { cache: { bytes: 0, entries: 0, envs: [] } } : {};
        await this.client!.json("POST", `/v1/workers/${this.id}/heartbeat`, { running: [...this.running], free_gpus: this.running.size ? [] : [0], ...cache });
        beats.push([t, now() - t, 1]);
        first = false;
      } catch (error) {
        beats.push([t, now() - t, 0]);
        failed("heartbeat", error);
      }
      await sleep(this.beatMs);
    }
  }

  async poll(): Promise<void> {
    while (!stopping.signal.aborted) {
      try {
        const r = await this.client!.json<PollResponse>("GET", `/v1/workers/${this.id}/tasks?wait=25`, undefined, { signal: stopping.signal });
        for (const t of r.tasks) {
          emit({ e: "start", job: t.job_id, at: now() });
          void this.run(t);
        }
      } catch (error) {
        if (stopping.signal.aborted) return;
        failed("poll", error);
        await sleep(1000);
      }
    }
  }

  /**
   * The reports of a short job as the worker's channel sends them (worker/channel.ts): the first event at once,
   * then what piled up meanwhile in one request of several kinds (`/reports`; by kind to a server without it).
   */
  private async run(t: TaskAssignment): Promise<void> {
    this.running.add(t.id);
    const path = `/v1/tasks/${t.id}`;
    const event = (type: string, data: Record<string, unknown>): ReportItemWire => ({ event: { ts: Date.now(), type, data } });
    const output: ReportItemWire = { output: Buffer.from("ok\n").toString("base64"), stream: "stdout" };
    try {
      await this.report(path, 1, [event("task.prepare.started", { image: null })]);
      const started = [event("task.prepare.finished", { seconds: 0.004, status: "reused", cache: "hit" }), event("task.run.started", { pid: 4242, command: "true" }), output];
      const end: ReportItemWire[] = [event("task.run.finished", { exit_code: 0, seconds: cfg.jobMs / 1000 }), { finish: { state: "succeeded", exit_code: 0, error: null } }];
      if (cfg.jobMs || cfg.outputs) {
        await this.report(path, 2, started);
        if (cfg.jobMs) await sleep(cfg.jobMs);
        if (cfg.outputs) {
          const archive = outputsArchive(`${t.job_id} ${crypto.randomUUID()}\n`);
          const hash = new Bun.CryptoHasher("sha256").update(archive).digest("hex");
          await this.client!.request("PUT", `${path}/outputs/${hash}`, archive);
        }
        await this.report(path, 5, end);
      } else await this.report(path, 2, [...started, ...end]);
      emit({ e: "end", job: t.job_id, at: now() });
    } catch (error) {
      failed("task report", error);
    } finally {
      this.running.delete(t.id);
    }
  }

  /** Items from `seq`, as the channel sends them: one kind by its own endpoint, several by `/reports` (by kind to an older server). */
  private async report(path: string, seq: number, items: ReportItemWire[]): Promise<void> {
    const kind = (i: ReportItemWire) => ("event" in i ? "event" : "output" in i ? "output" : "finish");
    if (items.length > 1 && new Set(items.map(kind)).size > 1 && !byKindOnly) {
      try {
        const report: ReportsRequest = { seq, items };
        await this.client!.request("POST", `${path}/reports`, report);
        return;
      } catch (error) {
        if (!(error instanceof HttpError && error.status === 404 && error.message.startsWith("no route "))) throw error;
        byKindOnly = true;
      }
    }
    let at = seq;
    for (const run of runsOf(items, (a, b) => kind(a) === kind(b))) {
      const first = run[0]!;
      if ("event" in first) await this.client!.request("POST", `${path}/events`, { seq: at, events: run.map((i) => (i as { event: TaskEventIn }).event) });
      else if ("output" in first) {
        const pieces = run.map((i) => Buffer.from((i as { output: string }).output, "base64"));
        await this.client!.request("POST", `${path}/output?stream=stdout&seq=${at}&lengths=${pieces.map((p) => p.length).join(",")}`, Buffer.concat(pieces));
      } else await this.client!.request("POST", `${path}/finish`, { seq: at, ...first.finish });
      at += run.length;
    }
  }
}

/** The server has no `/reports` (a binary from before it): reports go by kind, as the worker's channel falls back. */
let byKindOnly = false;

const workers = Array.from({ length: cfg.count }, (_, k) => new SimWorker(cfg.first + k));
const joinStart = now();
// 25 registrations at a time per process: a fleet starting together, not 250 at one instant.
for (let k = 0; k < workers.length; k += 25) await Promise.all(workers.slice(k, k + 25).map((w) => w.register()));
emit({ e: "ready", count: workers.length, ms: now() - joinStart });
const loops = workers.flatMap((w) => [w.beat(), w.poll()]);

for await (const _ of console) break;
stopping.abort();
emit({ e: "stats", beats, errors });
await Promise.race([Promise.allSettled(loops), sleep(2000)]);
process.exit(0);
