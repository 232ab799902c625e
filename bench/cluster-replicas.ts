/**
 * The coordinator on SQLite (one server) against PostgreSQL with one and
 * with three replicas, 4 workers each, side by side in one run:
 *   - dispatch throughput: 200 short jobs submitted at once (round-robin to
 *     the replicas), from the first submit to the last job's end;
 *   - submit-to-first-output: `gpulayer job run` to the job's first line,
 *     alternating between the three clusters; with three replicas the client
 *     talks to one replica and the worker to another (the wake-up crosses
 *     replicas by NOTIFY).
 * Needs PostgreSQL's binaries (Debian: postgresql). Run: bun run bench/cluster-replicas.ts
 */
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startPostgres } from "../test/fixtures/postgres.ts";
import { binary, machine, printTable, stats } from "./_lib.ts";

const bin = binary();
const token = `bench-${crypto.randomUUID()}`;
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "1", GPULAYER_WORKER_ENGINE: "none", PIP_CONFIG_FILE: "/dev/null" };

interface Cluster {
  name: string;
  servers: string[];
  /** The replica a client submits to, in turn. */
  next(): string;
  /** For the latency runs: a replica no worker starts on, when there are several. */
  clientUrl: string;
}

export async function replicaBench(jobs = Number(process.env.BENCH_REPLICA_JOBS ?? 200), runs = Number(process.env.BENCH_RUNS ?? 20)): Promise<void> {
  const root = mkdtempSync(join(tmpdir(), "gpl-bench-replicas-"));
  const base: Record<string, string> = { ...(process.env as Record<string, string>), ...FAST, GPULAYER_TOKEN: token };
  for (const k of ["GPULAYER_SERVER", "GPULAYER_HOME", "GPULAYER_DATABASE"]) delete base[k];
  const children: Bun.Subprocess[] = [];
  const start = (args: string[], home: string) => {
    const proc = Bun.spawn([bin, ...args], { env: { ...base, GPULAYER_HOME: join(root, home) }, stdin: "ignore", stdout: "pipe", stderr: process.env.BENCH_VERBOSE ? "inherit" : "ignore" });
    children.push(proc);
    return proc;
  };
  const serverUrl = async (proc: Bun.Subprocess) => {
    let doc = "";
    for await (const c of proc.stdout as ReadableStream<Uint8Array>) {
      doc += new TextDecoder().decode(c);
      if (doc.trimEnd().endsWith("}")) break;
    }
    return JSON.parse(doc).url as string;
  };
  const pg = await startPostgres();
  try {
    const make = async (name: string, replicas: number, database: string | null): Promise<Cluster> => {
      const files = join(root, name, "files");
      mkdirSync(files, { recursive: true });
      const servers: string[] = [];
      for (let i = 0; i < replicas; i++) {
        const args = ["server", "--listen", "127.0.0.1:0", "--json", ...(database ? ["--database", database, "--files", files] : [])];
        servers.push(await serverUrl(start(args, `${name}/server-${i}`)));
      }
      // Workers on the replicas after the first (with three: the client's replica has none of them).
      const workerServers = replicas > 1 ? servers.slice(1) : servers;
      for (let w = 0; w < 4; w++) {
        const list = [...workerServers.slice(w % workerServers.length), ...workerServers.slice(0, w % workerServers.length)].join(",");
        start(["join", list, "--name", `${name}-w${w}`, "--python", "python3"], `${name}/w${w}`);
      }
      let turn = 0;
      const cluster = { name, servers, next: () => servers[turn++ % servers.length]!, clientUrl: servers[0]! };
      for (let i = 0; i < 200; i++) {
        const r = Bun.spawnSync([bin, "workers", "--json"], { env: { ...base, GPULAYER_HOME: join(root, "client"), GPULAYER_SERVER: servers[0]! } });
        if (r.exitCode === 0 && JSON.parse(r.stdout.toString()).length === 4) break;
        await Bun.sleep(100);
      }
      return cluster;
    };
    const clusters = [await make("sqlite", 1, null), await make("pg-1", 1, await pg.database()), await make("pg-3", 3, await pg.database())];
    const client = (url: string) => ({ ...base, GPULAYER_HOME: join(root, "client"), GPULAYER_SERVER: url });
    const submit = async (url: string, i: number) => {
      const p = Bun.spawn([bin, "job", "run", "--detach", "--json", "--", "sh", "-c", `echo ${i}`], { env: client(url), stdout: "pipe", stderr: "pipe" });
      const [out, code] = await Promise.all([new Response(p.stdout).text(), p.exited]);
      if (code !== 0) throw new Error(`submit: ${await new Response(p.stderr).text()}`);
      return JSON.parse(out).id as string;
    };
    const ended = async (url: string, ids: Set<string>) => {
      const r = await fetch(`${url}/v1/jobs?limit=1000`, { headers: { authorization: `Bearer ${token}` } });
      const list = (await r.json()) as { id: string; state: string }[];
      return list.filter((j) => ids.has(j.id) && ["succeeded", "failed", "cancelled"].includes(j.state)).length;
    };
    // Warm every worker's env (the first job on each builds it).
    for (const c of clusters) {
      const warm = new Set(await Promise.all(Array.from({ length: 8 }, (_, i) => submit(c.next(), i))));
      while ((await ended(c.servers[0]!, warm)) < warm.size) await Bun.sleep(100);
    }

    const throughput: [string, string][] = [];
    for (const c of clusters) {
      const t = performance.now();
      const ids = new Set<string>();
      // 20 clients at a time, each submitting to the next replica.
      for (let batch = 0; batch < jobs / 20; batch++) for (const id of await Promise.all(Array.from({ length: 20 }, (_, k) => submit(c.next(), batch * 20 + k)))) ids.add(id);
      while ((await ended(c.servers[0]!, ids)) < ids.size) await Bun.sleep(50);
      const s = (performance.now() - t) / 1000;
      throughput.push([c.name, `${(jobs / s).toFixed(1)} jobs/s (${s.toFixed(1)} s for ${jobs})`]);
    }

    const firstLine = async (url: string) => {
      const t = performance.now();
      const p = Bun.spawn([bin, "job", "run", "--quiet", "--", "sh", "-c", "echo first; sleep 0.05; echo done"], { env: client(url), stdout: "pipe", stderr: "pipe" });
      let text = "";
      for await (const chunk of p.stdout as ReadableStream<Uint8Array>) {
        text += new TextDecoder().decode(chunk);
        if (text.includes("\n")) break;
      }
      const ms = performance.now() - t;
      await p.exited;
      if (!text.startsWith("first")) throw new Error(`unexpected first line: ${text}`);
      return ms;
    };
    const samples = new Map(clusters.map((c) => [c.name, [] as number[]]));
    for (let i = 0; i < runs; i++) for (const c of clusters) samples.get(c.name)!.push(await firstLine(c.clientUrl));

    console.log(`\n## the coordinator's database (${machine()}; 4 workers each, ${jobs} jobs, ${runs} latency runs alternating)`);
    console.log("| | dispatch throughput | submit to first output (median) | p90 |\n|---|---:|---:|---:|");
    const labels: Record<string, string> = { sqlite: "SQLite, one server", "pg-1": "PostgreSQL, one replica", "pg-3": "PostgreSQL, three replicas (client and workers on different ones)" };
    for (const [i, c] of clusters.entries()) {
      const st = stats(samples.get(c.name)!);
      console.log(`| ${labels[c.name]} | ${throughput[i]![1]} | ${st.median.toFixed(1)} ms | ${st.p90.toFixed(1)} ms |`);
    }
    printTable("submit to first output", clusters.map((c) => [labels[c.name]!, stats(samples.get(c.name)!)] as [string, ReturnType<typeof stats>]), labels.sqlite!);
  } finally {
    // Workers first (they tell their server they leave), then the servers; whatever lingers is killed.
    const killer = setTimeout(() => children.forEach((c) => c.kill("SIGKILL")), 15_000);
    for (const c of [...children].reverse()) {
      c.kill("SIGTERM");
      await c.exited;
    }
    clearTimeout(killer);
    await pg.close();
    rmSync(root, { recursive: true, force: true });
  }
}

if (import.meta.main) await replicaBench();
