/**
 * A fleet at scale: the coordinator (the built binary; SQLite, or PostgreSQL
 * with one or three replicas) against N simulated workers speaking the real
 * worker protocol (bench/fleet-worker.ts, up to 250 workers per process: one
 * process per worker would not fit this machine, and Bun's fetch queues past
 * BUN_CONFIG_MAX_HTTP_REQUESTS open requests, 256 by default, each worker
 * holding a long poll), while a client submits short jobs through the API
 * at a fixed rate for a fixed time. Reports dispatch latency (submit to the
 * worker holding the task), jobs ended per second, beats per second and
 * their latency, the servers' CPU and peak memory, and PostgreSQL's
 * connections.
 *
 * Run: bun run bench:fleet --workers 100 --rate 20 --seconds 25 --store postgres --replicas 3
 *   --beat S: the servers' coordinator.heartbeat (default: theirs, 2 s); --job-ms MS: how long a job "runs" (0);
 *   --outputs: each task uploads a small outputs archive; --admin-join: workers register with the server's own
 *   token rather than a named join token (the server then checks no join token per worker); --bin PATH: run that gpulayer
 *   binary as the servers (another build, for a before/after in one session); --json: one JSON document on stdout.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { startPostgres, type Postgres } from "../test/fixtures/postgres.ts";
import { ensureBinary, machine, ROOT } from "./_lib.ts";
import type { SimConfig } from "./fleet-worker.ts";

const PER_PROCESS = 250;

const FLAGS = { workers: { type: "string", default: "10" }, rate: { type: "string", default: "10" }, seconds: { type: "string", default: "20" }, store: { type: "string", default: "sqlite" }, replicas: { type: "string", default: "1" }, beat: { type: "string" }, "job-ms": { type: "string", default: "0" }, outputs: { type: "boolean", default: false }, "admin-join": { type: "boolean", default: false }, bin: { type: "string" }, json: { type: "boolean", default: false } } as const;

function options() {
  let values: ReturnType<typeof parseArgs<{ options: typeof FLAGS }>>["values"];
  try {
    values = parseArgs({ options: FLAGS }).values;
  } catch (error) {
    fail((error as Error).message.split("\n")[0]!);
  }
  const count = (name: string, min: number, max: number) => {
    const n = Number(values[name as keyof typeof values]);
    if (!Number.isFinite(n) || n < min || n > max) fail(`--${name} ${values[name as keyof typeof values]}: a number from ${min} to ${max}`);
    return n;
  };
  const o = { workers: Math.floor(count("workers", 1, 5000)), rate: count("rate", 0.1, 10_000), seconds: count("seconds", 1, 3600), replicas: Math.floor(count("replicas", 1, 10)), jobMs: count("job-ms", 0, 600_000), beat: values.beat === undefined ? null : count("beat", 0.1, 600), store: values.store!, outputs: values.outputs!, adminJoin: values["admin-join"]!, bin: values.bin ?? null, json: values.json! };
  if (o.store !== "sqlite" && o.store !== "postgres") fail(`--store ${o.store}: sqlite or postgres`);
  if (o.bin && !existsSync(o.bin)) fail(`--bin ${o.bin}: no such file`);
  if (o.store === "sqlite" && o.replicas > 1) fail("--replicas: replicas share one PostgreSQL; with --store sqlite there is one server");
  return o;
}

function fail(line: string): never {
  console.error(`bench/fleet.ts: ${line}`);
  process.exit(2);
}

const quantile = (sorted: number[], q: number) => (sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]! : Number.NaN);
const now = () => performance.timeOrigin + performance.now();

/** CPU seconds a process has used (utime + stime, in clock ticks of 1/100 s on Linux). */
function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

/** A line of /proc/PID/status in bytes (VmRSS, VmHWM). */
function memoryBytes(pid: number, field: string): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) * 1024 : 0;
}

const o = options();
// --bin: another build of gpulayer (the binary before a change), run the same way, for a side-by-side figure.
const bin = o.bin ?? ensureBinary().bin;
const root = mkdtempSync(join(tmpdir(), "gpl-bench-fleet-"));
const admin = `bench-${crypto.randomUUID()}`;
const base: Record<string, string> = { ...(process.env as Record<string, string>), GPULAYER_TOKEN: admin, ...(o.beat ? { GPULAYER_HEARTBEAT_SECONDS: String(o.beat) } : {}) };
for (const k of ["GPULAYER_SERVER", "GPULAYER_HOME", "GPULAYER_DATABASE"]) delete base[k];
const children: Bun.Subprocess[] = [];
let pg: Postgres | null = null;
const log = (line: string) => (o.json ? console.error(line) : console.log(line));

try {
  pg = o.store === "postgres" ? await startPostgres() : null;
  const database = pg ? await pg.database() : null;
  const dbArgs = database ? ["--database", database, "--files", join(root, "files")] : [];
  const servers: { url: string; pid: number }[] = [];
  for (let i = 0; i < o.replicas; i++) {
    const proc = Bun.spawn([bin, "server", "--listen", "127.0.0.1:0", "--json", ...dbArgs], { env: { ...base, GPULAYER_HOME: join(root, `server-${i}`) }, stdin: "ignore", stdout: "pipe", stderr: process.env.BENCH_VERBOSE ? "inherit" : "ignore" });
    children.push(proc);
    let doc = "";
    for await (const c of proc.stdout as ReadableStream<Uint8Array>) {
      doc += new TextDecoder().decode(c);
      if (doc.trimEnd().endsWith("}")) break;
    }
    servers.push({ url: JSON.parse(doc).url as string, pid: proc.pid });
  }
  const token = (role: string) => {
    const r = Bun.spawnSync([bin, "server", "token", "create", "--role", role, "--name", `fleet-${role}`, "--json", ...(database ? ["--database", database] : [])], { env: { ...base, GPULAYER_HOME: join(root, "server-0") } });
    if (r.exitCode !== 0) throw new Error(`server token create: ${r.stderr.toString()}`);
    return JSON.parse(r.stdout.toString()).token as string;
  };
  const joinToken = token("join");
  const userToken = token("user");

  // The simulated workers, a process per 250; each process says when all of its workers have joined.
  const starts = new Map<string, number>();
  const ends = new Map<string, number>();
  const stats: { beats: [number, number, number][]; errors: Record<string, number> }[] = [];
  const joinStart = now();
  const ready: Promise<void>[] = [];
  const done: Promise<void>[] = [];
  for (let first = 0; first < o.workers; first += PER_PROCESS) {
    const cfg: SimConfig = { urls: servers.map((s) => s.url), token: o.adminJoin ? admin : joinToken, first, count: Math.min(PER_PROCESS, o.workers - first), beatMs: null, jobMs: o.jobMs, outputs: o.outputs };
    const sim = Bun.spawn([process.execPath, join(ROOT, "bench", "fleet-worker.ts"), JSON.stringify(cfg)], { env: { ...process.env, BUN_CONFIG_MAX_HTTP_REQUESTS: "4096" }, stdin: "pipe", stdout: "pipe", stderr: "inherit" });
    children.push(sim);
    let isReady: () => void = () => {};
    ready.push(new Promise((r) => (isReady = r)));
    done.push(
      (async () => {
        let buffered = "";
        for await (const chunk of sim.stdout as ReadableStream<Uint8Array>) {
          buffered += new TextDecoder().decode(chunk);
          const lines = buffered.split("\n");
          buffered = lines.pop()!;
          for (const line of lines) {
            const doc = JSON.parse(line);
            if (doc.e === "start") starts.set(doc.job, doc.at);
            else if (doc.e === "end") ends.set(doc.job, doc.at);
            else if (doc.e === "ready") isReady();
            else if (doc.e === "stats") stats.push(doc);
          }
        }
      })(),
    );
  }
  await Promise.all(ready);
  const joinedMs = now() - joinStart;
  log(`${o.workers} workers joined in ${(joinedMs / 1000).toFixed(1)} s; settling for a beat interval`);
  // Every worker's first beat and poll in before measuring (beats start within one interval of joining).
  await Bun.sleep((o.beat ?? 2) * 1000 + 1000);

  // The window: jobs submitted at the rate, open loop (a slow answer delays no later submit).
  const cpu0 = servers.map((s) => cpuSeconds(s.pid));
  const sims = children.slice(o.replicas);
  const simCpu0 = sims.reduce((n, p) => n + cpuSeconds(p.pid), 0);
  const submitted = new Map<string, number>();
  const submitMs: number[] = [];
  const submitErrors: Record<string, number> = {};
  let peakRss = servers.map(() => 0);
  let peakConnections = 0;
  const sampleDb = pg ? new Bun.SQL(database!, { max: 1 }) : null;
  // PostgreSQL's backends serving this database (the servers' pools and their LISTEN): their CPU over the window.
  const backendCpu = async () => {
    const rows = sampleDb ? ((await sampleDb.unsafe("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")) as { pid: number }[]) : [];
    return new Map(rows.map((r) => [r.pid, (() => { try { return cpuSeconds(r.pid); } catch { return 0; } })()]));
  };
  const pgCpu0 = await backendCpu();
  const t0 = now();
  const sampler = setInterval(() => {
    peakRss = servers.map((s, i) => Math.max(peakRss[i]!, memoryBytes(s.pid, "VmRSS")));
    void sampleDb?.unsafe("SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()").then((rows) => (peakConnections = Math.max(peakConnections, (rows as { n: number }[])[0]!.n)));
  }, 500);
  const total = Math.round(o.rate * o.seconds);
  const inFlight: Promise<void>[] = [];
  for (let k = 0; k < total; k++) {
    const at = t0 + (k * 1000) / o.rate;
    if (at > now()) await Bun.sleep(at - now());
    const sentAt = now();
    const url = servers[k % servers.length]!.url;
    const spec = { name: `sim-${k}`, argv: ["python", "train.py"], commandText: "python train.py", env: {}, environment: { specs: [], extraIndexUrls: [], findLinks: [] }, resources: { gpus: 1, frameworks: { torch: ">=2.4" } } };
    inFlight.push(
      fetch(`${url}/v1/jobs`, { method: "POST", headers: { authorization: `Bearer ${userToken}`, "content-type": "application/json" }, body: JSON.stringify({ spec, bundle: null, labels: {}, workdir: "/fleet" }) })
        .then(async (r) => {
          if (r.status !== 201) throw new Error(`HTTP ${r.status}`);
          submitted.set(((await r.json()) as { id: string }).id, sentAt);
          submitMs.push(now() - sentAt);
        })
        .catch((e: Error) => void (submitErrors[e.message] = (submitErrors[e.message] ?? 0) + 1)),
    );
  }
  await Bun.sleep(Math.max(0, t0 + o.seconds * 1000 - now()));
  const t1 = now();
  const cpu1 = servers.map((s) => cpuSeconds(s.pid));
  const pgCpu1 = await backendCpu();
  const pgCpu = [...pgCpu1].reduce((n, [pid, c]) => n + c - (pgCpu0.get(pid) ?? 0), 0);
  const simCpu = sims.reduce((n, p) => n + cpuSeconds(p.pid), 0) - simCpu0;
  const load = readFileSync("/proc/loadavg", "utf8").split(" ")[0]!;
  const endedInWindow = [...ends.values()].filter((at) => at >= t0 && at <= t1).length;
  // Every job here is this run's: sent by the window's end, less those ended by then (answered or not yet).
  const backlogAtEnd = total - [...ends.values()].filter((at) => at <= t1).length;
  await Promise.all(inFlight);
  // Whatever was submitted ends, or 20 s pass.
  const drainUntil = now() + 20_000;
  while (now() < drainUntil && [...submitted.keys()].some((id) => !ends.has(id))) await Bun.sleep(100);
  clearInterval(sampler);
  // What the server says of them (its newest 1,000): succeeded, as a real worker's short job would be.
  const states: Record<string, number> = {};
  const failedBecause: string[] = [];
  try {
    const listed = (await (await fetch(`${servers[0]!.url}/v1/jobs?limit=1000`, { headers: { authorization: `Bearer ${userToken}` } })).json()) as { id: string; state: string }[];
    for (const j of listed.filter((j) => submitted.has(j.id))) states[j.state] = (states[j.state] ?? 0) + 1;
    // Why a few of them failed, in the server's words.
    for (const j of listed.filter((j) => submitted.has(j.id) && j.state === "failed").slice(0, 3)) {
      const status = (await (await fetch(`${servers[0]!.url}/v1/jobs/${j.id}`, { headers: { authorization: `Bearer ${userToken}` } })).json()) as { error: string | null };
      failedBecause.push(status.error ?? "(no error recorded)");
    }
  } catch (error) {
    states[`not listed (${(error as Error).message.slice(0, 60)})`] = 1;
  }
  await sampleDb?.close();
  for (const sim of sims) (sim.stdin as import("bun").FileSink).write("stop\n"), (sim.stdin as import("bun").FileSink).end();
  await Promise.all(done);

  const latency = [...submitted].filter(([id]) => starts.has(id)).map(([id, at]) => starts.get(id)! - at).sort((a, b) => a - b);
  const windowBeats = stats.flatMap((s) => s.beats).filter(([at]) => at >= t0 && at <= t1);
  const beatMs = windowBeats.filter(([, , ok]) => ok).map(([, ms]) => ms).sort((a, b) => a - b);
  const errors: Record<string, number> = { ...Object.fromEntries(Object.entries(submitErrors).map(([k, v]) => [`submit: ${k}`, v])) };
  for (const s of stats) for (const [k, v] of Object.entries(s.errors)) errors[k] = (errors[k] ?? 0) + v;
  const sortedSubmit = submitMs.sort((a, b) => a - b);
  const result = {
    machine: machine(),
    store: o.store,
    replicas: o.replicas,
    workers: o.workers,
    rate: o.rate,
    seconds: o.seconds,
    heartbeat_seconds: o.beat ?? 2,
    joined_with: o.adminJoin ? "the server's token" : "a join token",
    joined_seconds: joinedMs / 1000,
    submitted: submitted.size,
    started: latency.length,
    ended: [...submitted.keys()].filter((id) => ends.has(id)).length,
    server_states: states,
    failed_because: failedBecause,
    dispatch_ms: { p50: quantile(latency, 0.5), p99: quantile(latency, 0.99), max: latency.at(-1) ?? Number.NaN },
    submit_ms: { p50: quantile(sortedSubmit, 0.5), p99: quantile(sortedSubmit, 0.99) },
    jobs_per_second: endedInWindow / o.seconds,
    backlog_at_end: backlogAtEnd,
    beats_per_second: beatMs.length / o.seconds,
    beat_ms: { p50: quantile(beatMs, 0.5), p99: quantile(beatMs, 0.99) },
    server_cpu_seconds: cpu1.map((c, i) => c - cpu0[i]!),
    server_cpu_percent: cpu1.map((c, i) => ((c - cpu0[i]!) / o.seconds) * 100),
    server_peak_rss_mb: servers.map((s, i) => Math.max(peakRss[i]!, memoryBytes(s.pid, "VmHWM")) / 1024 ** 2),
    pg_connections_peak: pg ? peakConnections : null,
    pg_backends_cpu_percent: pg ? (pgCpu / o.seconds) * 100 : null,
    /** The simulated workers' own CPU, and the machine's load: on a shared machine, what else competed for the cores. */
    simulator_cpu_percent: (simCpu / o.seconds) * 100,
    load_average: Number(load),
    errors,
    /** A server that ended during the run (its exit code): the run's figures are then of what was left. */
    servers_exited: children.slice(0, o.replicas).map((c) => c.exitCode).filter((c) => c !== null),
  };
  if (o.json) console.log(JSON.stringify(result, null, 2));
  else {
    const f = (n: number) => (Number.isFinite(n) ? n.toFixed(0) : "-");
    console.log(`\n${o.workers} workers, ${o.store}${o.store === "postgres" ? `, ${o.replicas} replica(s)` : ""}; ${o.rate} jobs/s for ${o.seconds} s (${result.machine})`);
    console.log(`dispatch (submit to task start): p50 ${f(result.dispatch_ms.p50)} ms, p99 ${f(result.dispatch_ms.p99)} ms; submit answered p50 ${f(result.submit_ms.p50)} ms, p99 ${f(result.submit_ms.p99)} ms`);
    console.log(`jobs ended: ${result.jobs_per_second.toFixed(1)}/s held (backlog at the end ${backlogAtEnd}); ${result.ended}/${result.submitted} ended after draining; the server lists ${Object.entries(states).map(([k, v]) => `${v} ${k}`).join(", ")} (its newest 1,000)`);
    for (const why of failedBecause) console.log(`a job failed: ${why}`);
    console.log(`beats: ${result.beats_per_second.toFixed(0)}/s answered, p50 ${f(result.beat_ms.p50)} ms, p99 ${f(result.beat_ms.p99)} ms`);
    console.log(`server CPU: ${result.server_cpu_percent.map((p) => `${p.toFixed(0)}%`).join(", ")} of a core; peak RSS ${result.server_peak_rss_mb.map((m) => `${m.toFixed(0)} MB`).join(", ")}${pg ? `; PostgreSQL connections (peak) ${peakConnections}, their backends' CPU ${result.pg_backends_cpu_percent!.toFixed(0)}%` : ""}`);
    console.log(`simulated workers' CPU: ${result.simulator_cpu_percent.toFixed(0)}% of a core; load average ${load}`);
    if (result.servers_exited.length) console.log(`servers that ended during the run: ${result.servers_exited.length} (exit codes ${result.servers_exited.join(", ")})`);
    console.log(`errors: ${Object.keys(errors).length ? Object.entries(errors).map(([k, v]) => `${k} ×${v}`).join("; ") : "none"}`);
  }
} finally {
  const killer = setTimeout(() => children.forEach((c) => c.kill("SIGKILL")), 10_000);
  for (const c of [...children].reverse()) {
    c.kill("SIGTERM");
    await c.exited;
  }
  clearTimeout(killer);
  await pg?.close();
  rmSync(root, { recursive: true, force: true });
}
