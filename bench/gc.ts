/**
 * gc's cost over many entries: `bun run bench/gc.ts [counts...]` (default 1000 10000).
 *
 * Builds synthetic environments (the layout of a real one: meta.json with a
 * recorded size, ready marker, last-used stamp, bin/, lib/python3.11/
 * site-packages/) in a temp GPULAYER_HOME, then times:
 *   - gc with nothing to delete (the cron case: a limit above the total), in
 *     process and as a whole `gpulayer gc` process;
 *   - gc removing the 1% least recently used;
 *   - gc --refresh-sizes (walks every entry: what recorded sizes save).
 * Aim: 10,000 entries in under a second when nothing needs deleting.
 */
import { mkdirSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { homeLayout } from "../src/config/paths.ts";
import { runGc } from "../src/gc/run.ts";

const ROOT = join(import.meta.dir, "..");
const counts = process.argv.slice(2).map(Number).filter((n) => n > 0);
const DAY = 86_400_000;

function makeEntries(home: string, n: number): number {
  const envs = join(home, "envs-v1");
  mkdirSync(envs, { recursive: true });
  let total = 0;
  const now = Date.now();
  for (let i = 0; i < n; i++) {
    const key = new Bun.CryptoHasher("sha256").update(`bench-${i}`).digest("hex");
    const dir = join(envs, key);
    const site = join(dir, "lib", "python3.11", "site-packages");
    mkdirSync(join(site, `pkg${i}`), { recursive: true });
    mkdirSync(join(dir, "bin"), { recursive: true });
    mkdirSync(join(dir, ".gpulayer"), { recursive: true });
    writeFileSync(join(site, `pkg${i}`, "__init__.py"), "x = 1\n".repeat(100));
    writeFileSync(join(dir, "bin", "python"), "#!/bin/sh\n");
    const sizeBytes = 100_000 + (i % 97) * 1000;
    total += sizeBytes;
    const meta = {
      key,
      path: dir,
      python: join(dir, "bin", "python"),
      created: new Date(now - 30 * DAY).toISOString(),
      buildSeconds: 2.1,
      sizeBytes,
      venvCreator: "uv",
      installer: "pip 23.2.1",
      summary: `pkg${i}==1.0, numpy<3`,
      request: { schema: 1, requirements: [`pkg${i}==1.0`, "numpy<3"], constraints: [], options: { index_url: null, extra_index_urls: [], find_links: [] }, interpreter: { path: "/opt/venv/bin/python", version: "3.11.7", platform: "linux-x86_64" }, base: "0".repeat(64) },
      installed: [`pkg${i}==1.0`],
      check: [],
    };
    writeFileSync(join(dir, ".gpulayer", "meta.json"), JSON.stringify(meta, null, 2));
    const lastUsed = join(dir, ".gpulayer", "last-used");
    writeFileSync(lastUsed, "");
    const used = new Date(now - ((i * 7919) % (20 * DAY)) - DAY);
    utimesSync(lastUsed, used, used);
    writeFileSync(join(dir, ".gpulayer", "ready"), `${key}\n`);
  }
  return total;
}

async function timeCli(home: string, args: string[]): Promise<number> {
  const started = performance.now();
  const proc = Bun.spawn([process.execPath, join(ROOT, "src", "cli.ts"), "gc", ...args], { env: { ...process.env, GPULAYER_HOME: home }, stdout: "ignore", stderr: "pipe" });
  const code = await proc.exited;
  if (code !== 0) throw new Error(`gpulayer gc failed: ${await new Response(proc.stderr).text()}`);
  return (performance.now() - started) / 1000;
}

const ms = (s: number) => `${(s * 1000).toFixed(0)} ms`;
const us = (s: number, n: number) => `${((s / n) * 1e6).toFixed(1)} µs/entry`;

for (const n of counts.length ? counts : [1000, 10000]) {
  const home = join(tmpdir(), `gpl-bench-gc-${process.pid}-${n}`);
  rmSync(home, { recursive: true, force: true });
  const t0 = performance.now();
  const total = makeEntries(home, n);
  console.log(`\n${n} entries (${(total / 2 ** 20).toFixed(0)} MiB recorded), made in ${ms((performance.now() - t0) / 1000)}`);
  const layout = homeLayout(home);
  const base = { minAgeMs: 10 * 60_000, keep: [], dryRun: false, refreshSizes: false, engineEnv: process.env };

  const runs: number[] = [];
  for (let i = 0; i < 3; i++) {
    const r = await runGc(layout, { ...base, maxSize: { bytes: total + 1, origin: "bench" } });
    if (r.removed.length || r.entries !== n) throw new Error("nothing should have been removed");
    runs.push(r.seconds);
  }
  const best = Math.min(...runs);
  console.log(`  nothing to delete, in process:  ${ms(best)} best of 3 (${runs.map(ms).join(", ")}), ${us(best, n)}`);
  const cli = await timeCli(home, ["--max-size", String(total + 1), "--quiet"]);
  console.log(`  nothing to delete, gpulayer gc: ${ms(cli)} wall (process start included), ${us(cli, n)}`);

  const dry = await runGc(layout, { ...base, dryRun: true, maxSize: { bytes: Math.floor(total * 0.99), origin: "bench" } });
  console.log(`  --dry-run, 1% over the limit:   ${ms(dry.seconds)} (${dry.removed.length} would go)`);
  const trim = await runGc(layout, { ...base, maxSize: { bytes: Math.floor(total * 0.99), origin: "bench" } });
  console.log(`  removing the 1% least used:     ${ms(trim.seconds)} (${trim.removed.length} removed), ${us(trim.seconds, n)}`);

  const refresh = await runGc(layout, { ...base, refreshSizes: true, maxSize: { bytes: total * 2, origin: "bench" } });
  console.log(`  --refresh-sizes (walks all):    ${ms(refresh.seconds)} (${refresh.sizesRefreshed} measured), ${us(refresh.seconds, refresh.entries)}`);
  const after = await runGc(layout, { ...base, maxSize: { bytes: total * 2, origin: "bench" } });
  console.log(`  next run, sizes recorded:       ${ms(after.seconds)} (${after.sizesRefreshed} measured again), ${us(after.seconds, after.entries)}`);
  rmSync(home, { recursive: true, force: true });
}
