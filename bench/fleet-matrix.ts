/**
 * The fleet simulator (bench/fleet.ts) over its whole matrix, side by side:
 * for each store (SQLite; PostgreSQL with one and three replicas) and each
 * fleet size, one run of another gpulayer build (`--before`, the binary
 * before a change) and one of this checkout's, back to back, so drift in a
 * shared machine hits both alike. Prints one markdown table (or --json).
 *
 * Run: bun run bench/fleet-matrix.ts --before PATH [--workers 10,100,1000] [--rate 20] [--seconds 15] [--beat 5] [--stores sqlite,postgres:1,postgres:3]
 */
import { existsSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { ensureBinary, ROOT } from "./_lib.ts";

const { values } = parseArgs({
  options: {
    before: { type: "string" },
    workers: { type: "string", default: "10,100,1000" },
    rate: { type: "string", default: "20" },
    seconds: { type: "string", default: "15" },
    beat: { type: "string", default: "5" },
    stores: { type: "string", default: "sqlite,postgres:1,postgres:3" },
    json: { type: "boolean", default: false },
  },
});
if (!values.before || !existsSync(values.before)) {
  console.error(`bench/fleet-matrix.ts: --before PATH: ${values.before ? `no such file: ${values.before}` : "the gpulayer binary to compare with"}`);
  process.exit(2);
}
const after = ensureBinary().bin;

interface Run {
  dispatch_ms: { p50: number; p99: number };
  jobs_per_second: number;
  beats_per_second: number;
  beat_ms: { p50: number; p99: number };
  server_cpu_percent: number[];
  pg_backends_cpu_percent: number | null;
  load_average: number;
  ended: number;
  submitted: number;
  errors: Record<string, number>;
}

function run(bin: string, store: string, replicas: string, workers: string): Run {
  const argv = ["bun", join(ROOT, "bench", "fleet.ts"), "--json", "--bin", bin, "--store", store, "--replicas", replicas, "--workers", workers, "--rate", values.rate!, "--seconds", values.seconds!, "--beat", values.beat!];
  const r = Bun.spawnSync(argv, { cwd: ROOT, stdout: "pipe", stderr: "inherit" });
  if (r.exitCode !== 0) throw new Error(`${argv.join(" ")}: exit ${r.exitCode}`);
  return JSON.parse(r.stdout.toString()) as Run;
}

const ms = (n: number) => (!Number.isFinite(n) ? "-" : n >= 1000 ? `${(n / 1000).toFixed(1)} s` : `${n.toFixed(0)} ms`);
const rows: { store: string; workers: string; binary: string; run: Run }[] = [];
for (const cell of values.stores!.split(",")) {
  const [store, replicas = "1"] = cell.split(":");
  for (const workers of values.workers!.split(",")) {
    for (const [binary, bin] of [["before", values.before], ["after", after]] as const) {
      console.error(`${store}${store === "postgres" ? ` × ${replicas}` : ""}, ${workers} workers, ${binary}…`);
      rows.push({ store: store === "postgres" ? `PostgreSQL, ${replicas} replica${replicas === "1" ? "" : "s"}` : "SQLite", workers, binary, run: run(bin, store!, replicas, workers) });
    }
  }
}

if (values.json) console.log(JSON.stringify(rows, null, 2));
else {
  console.log(`${values.rate} jobs/s for ${values.seconds} s, beats every ${values.beat} s\n`);
  console.log("| coordinator | workers | binary | dispatch p50 / p99 | jobs/s held | beats/s, p50 / p99 | server CPU | PostgreSQL backends' CPU | ended | load |");
  console.log("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|");
  for (const { store, workers, binary, run: r } of rows) {
    const cpu = r.server_cpu_percent.map((p) => `${p.toFixed(0)}%`).join(" + ");
    const pg = r.pg_backends_cpu_percent === null ? "" : `${r.pg_backends_cpu_percent.toFixed(0)}%`;
    console.log(`| ${store} | ${workers} | ${binary} | ${ms(r.dispatch_ms.p50)} / ${ms(r.dispatch_ms.p99)} | ${r.jobs_per_second.toFixed(1)} | ${r.beats_per_second.toFixed(0)}; ${ms(r.beat_ms.p50)} / ${ms(r.beat_ms.p99)} | ${cpu} | ${pg} | ${r.ended}/${r.submitted} | ${r.load_average} |`);
  }
}
