/**
 * Time from `gpulayer job run` to the job's first output line, on a warm
 * worker through a server (127.0.0.1), against the same job run locally,
 * side by side in one run (alternating, so drift hits both alike).
 * Then `/v1/health` latency while the server checks the worst bundle it
 * accepts, against the same probe with the server idle.
 * Then (with $BENCH_INDEX) env prepare of a realistic env across 4 workers: shipped against each worker building (bench/cluster-ship.ts).
 * Then (with PostgreSQL installed) the coordinator on SQLite against PostgreSQL with one and three replicas (bench/cluster-replicas.ts).
 * Run: bun run bench/cluster.ts   (BENCH_RUNS=20 by default)
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { zerosBundle } from "../test/fixtures/bombs.ts";
import { binary, machine, printTable, stats } from "./_lib.ts";
import { shipBench } from "./cluster-ship.ts";
import { replicaBench } from "./cluster-replicas.ts";
import { hasPostgres } from "../test/fixtures/postgres.ts";

const bin = binary();
const root = mkdtempSync(join(tmpdir(), "gpl-bench-cluster-"));
const token = `bench-${crypto.randomUUID()}`;
const base: Record<string, string> = { ...(process.env as Record<string, string>), GPULAYER_WORKER_ENGINE: "none", PIP_CONFIG_FILE: "/dev/null" };
for (const k of ["GPULAYER_SERVER", "GPULAYER_TOKEN", "GPULAYER_HOME"]) delete base[k];
const home = (name: string) => ({ ...base, GPULAYER_HOME: join(root, name) });
const python = Bun.which("python3")!;

const children: Bun.Subprocess[] = [];
function start(args: string[], env: Record<string, string>) {
  const proc = Bun.spawn([bin, ...args], { env, stdin: "ignore", stdout: "pipe", stderr: process.env.BENCH_VERBOSE ? "inherit" : "ignore" });
  children.push(proc);
  return proc;
}

/** The first line, as soon as it arrives; the rest is read on (a closed pipe would break the writer). */
function firstLine(stream: ReadableStream<Uint8Array>, what: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = "";
    void (async () => {
      for await (const chunk of stream) {
        text += new TextDecoder().decode(chunk);
        if (text.includes("\n")) resolve(text);
      }
      reject(new Error(`${what} ended before printing a line`));
    })();
  });
}

/** Wall time from starting `gpulayer job run` to the job's first line on stdout; then waits for the exit. */
async function toFirstLine(args: string[], env: Record<string, string>, cwd: string): Promise<number> {
  const t = performance.now();
  const proc = Bun.spawn([bin, ...args], { env, cwd, stdin: "ignore", stdout: "pipe", stderr: "pipe" });
  const line = await firstLine(proc.stdout as ReadableStream<Uint8Array>, args.join(" "));
  const ms = performance.now() - t;
  if (!line.startsWith("first")) throw new Error(`unexpected first line: ${line}`);
  const code = await proc.exited;
  if (code !== 0) throw new Error(`${args.join(" ")} exited ${code}: ${await new Response(proc.stderr).text()}`);
  return ms;
}

function jobsCount(url: string, token: string): number {
  const r = Bun.spawnSync(["curl", "-s", "-H", `authorization: Bearer ${token}`, `${url}/v1/jobs?limit=1000`], { stdout: "pipe" });
  return (JSON.parse(r.stdout.toString() || "[]") as unknown[]).length;
}

try {
  const server = start(["server", "--listen", "127.0.0.1:0", "--json"], { ...home("server"), GPULAYER_TOKEN: token });
  let doc = "";
  for await (const c of server.stdout as ReadableStream<Uint8Array>) {
    doc += new TextDecoder().decode(c);
    if (doc.trimEnd().endsWith("}")) break;
  }
  const url = JSON.parse(doc).url as string;
  start(["join", url, "--name", "bench", "--python", python], { ...home("worker"), GPULAYER_TOKEN: token });
  const client = { ...home("client"), GPULAYER_SERVER: url, GPULAYER_TOKEN: token };
  for (let i = 0; i < 100; i++) {
    const r = Bun.spawnSync([bin, "workers", "--json"], { env: client });
    if (r.exitCode === 0 && JSON.parse(r.stdout.toString()).length) break;
    await Bun.sleep(100);
  }

  const work = join(root, "work");
  mkdirSync(work);
  writeFileSync(join(work, "job.py"), "print('first', flush=True)\nimport time\ntime.sleep(0.05)\nprint('done')\n");
  const job = ["job", "run", "--quiet", "--python", python, "--", "python", "job.py"];
  const remoteJob = ["job", "run", "--quiet", "--workdir", ".", "--", "python", "job.py"];
  const local = home("local");

  // Warm both: the env built (local home, worker home), the bundle uploaded, the interpreter probed.
  for (let i = 0; i < 3; i++) {
    await toFirstLine(job, local, work);
    await toFirstLine(remoteJob, client, work);
  }
  const runs = Number(process.env.BENCH_RUNS ?? 20);
  const samples: Record<string, number[]> = { "local: gpulayer job run (warm env)": [], "remote: job run via server, warm worker": [] };
  for (let i = 0; i < runs; i++) {
    samples["local: gpulayer job run (warm env)"]!.push(await toFirstLine(job, local, work));
    samples["remote: job run via server, warm worker"]!.push(await toFirstLine(remoteJob, client, work));
  }
  const results = Object.entries(samples).map(([k, v]) => [k, stats(v)] as [string, ReturnType<typeof stats>]);
  console.log(`machine: ${machine()}; ${runs} runs each, alternating; server and worker on 127.0.0.1`);
  printTable("time from `job run` to the job's first output line", results, "local: gpulayer job run (warm env)");
  const added = results[1]![1].median - results[0]![1].median;
  console.log(`\nadded by going through the server: ${added.toFixed(1)} ms (median); includes packing the workdir, the submit, dispatch, the worker's long poll, unpacking, and streaming the line back`);

  // /v1/health latency while the server checks the worst bundle it accepts (1.9 GiB of zeros in 2 MB), probed every 10 ms, idle probes alongside.
  const probe = async () => {
    const t = performance.now();
    await (await fetch(`${url}/v1/health`, { headers: { authorization: `Bearer ${token}` } })).arrayBuffer();
    return performance.now() - t;
  };
  const idle: number[] = [];
  for (let i = 0; i < 50; i++) {
    idle.push(await probe());
    await Bun.sleep(10);
  }
  const during: number[] = [];
  let checkMs = 0;
  for (let i = 0; i < Number(process.env.BENCH_BUNDLE_RUNS ?? 3); i++) {
    const file = join(root, `worst-${i}.tar.gz`);
    // One zero member fewer each time: a new hash, so each upload is checked, not found stored.
    const { hash } = zerosBundle(file, 31 - i);
    let done = false;
    const probing = (async () => {
      while (!done) {
        during.push(await probe());
        await Bun.sleep(10);
      }
    })();
    const t = performance.now();
    const res = await fetch(`${url}/v1/bundles/${hash}`, { method: "PUT", headers: { authorization: `Bearer ${token}` }, body: Bun.file(file) });
    if (res.status !== 201) throw new Error(`the worst accepted bundle was refused: ${await res.text()}`);
    checkMs = Math.max(checkMs, performance.now() - t);
    done = true;
    await probing;
  }
  printTable("`/v1/health` while the server checks the worst accepted bundle (1.9 GiB of zeros, 2 MB sent)", [["health, server idle", stats(idle)], ["health, during the check", stats(during)]], "health, server idle");
  console.log(`\n${during.length} probes during checks of up to ${(checkMs / 1000).toFixed(1)} s each; slowest probe ${Math.max(...during).toFixed(1)} ms (aim: under 100 ms)`);

  // The dashboard: the API's latency (a job's status, GET /v1/jobs/ID) with and without a browser's worth of polling
  // of the jobs page (signed in; every 200 ms, harder than the page's own 5 s refresh), alternated in rounds.
  const login = await fetch(`${url}/login`, { method: "POST", redirect: "manual", body: new URLSearchParams({ token }), headers: { "content-type": "application/x-www-form-urlencoded" } });
  const cookie = (login.headers.get("set-cookie") ?? "").split(";")[0]!;
  const someJob = ((await (await fetch(`${url}/v1/jobs?limit=1`, { headers: { authorization: `Bearer ${token}` } })).json()) as { id: string }[])[0]!.id;
  const apiCall = async () => {
    const t = performance.now();
    await (await fetch(`${url}/v1/jobs/${someJob}`, { headers: { authorization: `Bearer ${token}` } })).arrayBuffer();
    return performance.now() - t;
  };
  const quiet: number[] = [];
  const polled: number[] = [];
  let pages = 0;
  for (let round = 0; round < Number(process.env.BENCH_DASH_ROUNDS ?? 5); round++) {
    // 100 calls 10 ms apart: about 1.5 s, long enough for several page loads of the poller.
    for (let i = 0; i < 100; i++) {
      quiet.push(await apiCall());
      await Bun.sleep(10);
    }
    let polling = true;
    const poller = (async () => {
      while (polling) {
        const r = await fetch(`${url}/jobs`, { headers: { cookie } });
        if (r.status !== 200) throw new Error(`the jobs page answered ${r.status}`);
        await r.arrayBuffer();
        pages++;
        await Bun.sleep(200);
      }
    })();
    for (let i = 0; i < 100; i++) {
      polled.push(await apiCall());
      await Bun.sleep(10);
    }
    polling = false;
    await poller;
  }
  printTable("a job's status (GET /v1/jobs/ID) with and without the dashboard's jobs page polled", [["API, no dashboard open", stats(quiet)], ["API, the jobs page polled every 200 ms", stats(polled)]], "API, no dashboard open");
  console.log(`\n${pages} jobs pages served meanwhile (${jobsCount(url, token)} jobs listed)`);
} finally {
  for (const c of children) c.kill("SIGTERM");
  await Promise.all(children.map((c) => c.exited));
  rmSync(root, { recursive: true, force: true });
}

// Env artifacts: a realistic env across 4 workers, shipped against each building (needs $BENCH_INDEX and root).
if (process.env.BENCH_INDEX) {
  const rows = await shipBench();
  const mb = (b: number) => `${(b / 1024 ** 2).toFixed(0)} MB`;
  console.log(`\n## env prepare of ${process.env.BENCH_SHIP_SPECS ?? "transformers datasets"} (env ${mb(rows[0]!.envBytes)}) on 4 workers`);
  console.log("| | seconds | from the index | workers |\n|---|---:|---:|---|");
  for (const r of rows) console.log(`| ${r.mode} | ${r.seconds.toFixed(1)} s | ${mb(r.indexBytes)} | ${r.statuses.join(", ")} |`);
  for (const shipped of rows.filter((r) => r.fetchSeconds.length && r.builtSeconds.length)) {
    const fetch = Math.max(...shipped.fetchSeconds);
    const build = shipped.builtSeconds[0]!;
    console.log(`\n${shipped.mode}: a fetch against the build it spares: slowest of ${shipped.fetchSeconds.length} fetches at once ${fetch.toFixed(2)} s, the build ${build.toFixed(1)} s (**${((100 * fetch) / build).toFixed(0)}%**; aim < 10%)`);
  }
}

// The coordinator's database: SQLite against PostgreSQL, one and three replicas (needs PostgreSQL's binaries).
if (hasPostgres) await replicaBench();
