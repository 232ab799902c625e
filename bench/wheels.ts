/**
 * A compiled extension needed by 4 different envs on 4 workers of one server (127.0.0.1): the sdist (its build
 * imports the torch stand-in and sleeps BENCH_COMPILE_SECONDS, as a CUDA compile would take) built without
 * isolation. Shared (the default): the first worker compiles, the other three fetch its wheel; against each
 * worker compiling its own (coordinator.share_envs false). The 4 envs are prepared at once (the first worker
 * claims the compile, the others wait for its wheel); BENCH_SEQUENTIAL=1 prepares them one after another. Rounds
 * alternate the two modes, so drift hits both alike. Each worker has its own home and installer caches, as
 * separate machines have.
 * Run: bun run bench:wheels   (BENCH_RUNS=1 round of each, BENCH_COMPILE_SECONDS=15, BENCH_SEQUENTIAL=1)
 */
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PackageIndex } from "../test/fixtures/index.ts";
import { makeWorkerVenv } from "../test/helpers.ts";
import { binary, machine, stats } from "./_lib.ts";

const bin = binary();
const root = mkdtempSync(join(tmpdir(), "gpl-bench-wheels-"));
const token = `bench-${crypto.randomUUID()}`;
const compileSeconds = Number(process.env.BENCH_COMPILE_SECONDS ?? 15);
const rounds = Number(process.env.BENCH_RUNS ?? 1);
const sequential = process.env.BENCH_SEQUENTIAL === "1";
const base: Record<string, string> = { ...(process.env as Record<string, string>), GPULAYER_WORKER_ENGINE: "none", PIP_CONFIG_FILE: "/dev/null", GPULAYER_HEARTBEAT_SECONDS: "0.5" };
for (const k of Object.keys(base)) if (k.startsWith("GPULAYER_SERVER") || k === "GPULAYER_TOKEN" || k === "GPULAYER_HOME" || k.startsWith("PIP_INDEX") || k.startsWith("UV_")) delete base[k];
const others = ["alpha", "beta", "gamma", "delta"];
const counter = join(root, "kernels-builds");
const compiles = () => (existsSync(counter) ? readFileSync(counter, "utf8").trim().split("\n").filter(Boolean).length : 0);

const index = new PackageIndex(join(root, "index"));
const children: Bun.Subprocess[] = [];

async function json(argv: string[], env: Record<string, string>): Promise<unknown> {
  const p = Bun.spawn([bin, ...argv], { env, stdout: "pipe", stderr: process.env.BENCH_VERBOSE ? "inherit" : "ignore" });
  const out = await new Response(p.stdout).text();
  if ((await p.exited) !== 0) throw new Error(`gpulayer ${argv.join(" ")} failed: ${out}`);
  return JSON.parse(out);
}

/** One round: a server and 4 workers with fresh homes; the 4 envs prepared at once (or in turn). Seconds in all, and the compiles. */
async function round(share: boolean, n: number, venvs: string[]): Promise<{ seconds: number; compiled: number; each: number[] }> {
  const dir = join(root, `round-${n}-${share}`);
  const server = Bun.spawn([bin, "server", "--listen", "127.0.0.1:0", "--json"], { env: { ...base, GPULAYER_TOKEN: token, GPULAYER_HOME: join(dir, "server"), GPULAYER_SERVER_SHARE_ENVS: String(share) }, stdout: "pipe", stderr: "ignore" });
  children.push(server);
  let doc = "";
  for await (const c of server.stdout as ReadableStream<Uint8Array>) {
    doc += new TextDecoder().decode(c);
    if (doc.trimEnd().endsWith("}")) break;
  }
  const url = JSON.parse(doc).url as string;
  venvs.forEach((python, i) => {
    const w = join(dir, `w${i + 1}`);
    const env = { ...base, GPULAYER_TOKEN: token, GPULAYER_HOME: join(w, "home"), UV_CACHE_DIR: join(w, "uv"), PIP_CACHE_DIR: join(w, "pip") };
    children.push(Bun.spawn([bin, "join", url, "--name", `w${i + 1}`, "--label", `box=w${i + 1}`, "--python", python], { env, stdout: "ignore", stderr: process.env.BENCH_VERBOSE ? "inherit" : "ignore" }));
  });
  const client = { ...base, GPULAYER_HOME: join(dir, "client"), GPULAYER_SERVER: url, GPULAYER_TOKEN: token };
  for (let i = 0; i < 300 && ((await json(["workers", "--json"], client)) as unknown[]).length < venvs.length; i++) await Bun.sleep(100);
  const before = compiles();
  const each: number[] = [];
  const t = performance.now();
  const prepare = async (i: number, other: string) => {
    const t1 = performance.now();
    await json(["env", "prepare", "-p", "kernels", "-p", other, "--no-build-isolation-package", "kernels", "--index-url", index.url, "--label", `box=w${i + 1}`, "--json"], client);
    each[i] = (performance.now() - t1) / 1000;
  };
  if (sequential) {
    for (const [i, other] of others.entries()) {
      await prepare(i, other);
      // The compiled wheel reaches the server in the background; a fleet's next env comes later than this.
      if (share && i === 0) for (let k = 0; k < 100 && !/^wheels +1 /m.test(Bun.spawnSync([bin, "workers"], { env: client }).stdout.toString()); k++) await Bun.sleep(100);
    }
  } else await Promise.all(others.map((other, i) => prepare(i, other)));
  const seconds = (performance.now() - t) / 1000;
  for (const c of children.splice(0)) c.kill("SIGTERM");
  return { seconds, compiled: compiles() - before, each };
}

try {
  index.start();
  index.wheel({ name: "torch", version: "2.1.0+cu121" });
  for (const n of others) index.wheel({ name: n, version: "1.0" });
  index.sdist({ name: "kernels", version: "1.0", counter, imports: "torch", sleep: compileSeconds });
  mkdirSync(join(root, "venvs"));
  const venvs = await Promise.all([1, 2, 3, 4].map((i) => makeWorkerVenv(join(root, "venvs", `w${i}`), { env: base, packages: ["torch==2.1.0+cu121"], findLinks: index.dir })));
  const modes = { "shared: one compile, 3 fetches": true, "each worker compiles its own": false };
  const seconds: Record<string, number[]> = {};
  const compiled: Record<string, number[]> = {};
  for (let r = 0; r < rounds; r++) {
    for (const [mode, share] of Object.entries(modes)) {
      const got = await round(share, r, venvs);
      (seconds[mode] ??= []).push(got.seconds);
      (compiled[mode] ??= []).push(got.compiled);
      if (process.env.BENCH_VERBOSE) console.log(`${mode}: ${got.each.map((x) => x.toFixed(1)).join(" + ")} s`);
    }
  }
  const shared = stats(seconds["shared: one compile, 3 fetches"]!).median;
  console.log(`machine: ${machine()}; ${rounds} round(s) of each, alternating; a server and 4 workers on 127.0.0.1; the compile sleeps ${compileSeconds} s`);
  console.log(`\n## 4 envs needing one compiled extension, on 4 workers, prepared ${sequential ? "in turn" : "at once"}`);
  console.log("| | seconds (median) | compiles per round | ratio |\n|---|---:|---:|---:|");
  for (const mode of Object.keys(modes)) console.log(`| ${mode} | ${stats(seconds[mode]!).median.toFixed(1)} s | ${compiled[mode]!.join(", ")} | ${(stats(seconds[mode]!).median / shared).toFixed(2)}x |`);
} finally {
  for (const c of children) c.kill("SIGTERM");
  await Promise.all(children.map((c) => c.exited));
  index.stop();
  rmSync(root, { recursive: true, force: true });
}
