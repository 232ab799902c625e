/**
 * `env prepare` of a realistic env across 4 workers on this machine: shipped
 * (one build, the others fetch its artifact) against each worker building
 * (coordinator.share_envs false), side by side in one run, with the seconds
 * and the bytes the package index served for each. The index is
 * $BENCH_INDEX (a PEP 503 folder, file:///…/simple) served over HTTP by this
 * process so its bytes are counted. Workers run in mount namespaces with their
 * homes at one path, as identical machines have it (needs root).
 * Run by bench/cluster.ts; alone: bun run bench/cluster-ship.ts   (BENCH_SHIP_SPECS="transformers datasets";
 * BENCH_BEFORE=PATH adds the shipped run with that binary, in the same run)
 */
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { benchIndex, binary } from "./_lib.ts";

export interface ShipResult {
  mode: string;
  seconds: number;
  indexBytes: number;
  statuses: string[];
  envBytes: number;
  /** The built worker's seconds, and each fetch's (download and unpack): a fetch's share of a build. */
  builtSeconds: number[];
  fetchSeconds: number[];
}

export async function shipBench(): Promise<ShipResult[]> {
  const bin = binary();
  const { index } = benchIndex();
  const folder = index.replace(/^file:\/\//, "").replace(/\/simple\/?$/, "");
  const specs = (process.env.BENCH_SHIP_SPECS ?? "transformers datasets").split(/\s+/).filter(Boolean);
  let served = 0;
  const http = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    async fetch(req) {
      let path = decodeURIComponent(new URL(req.url).pathname);
      if (path.includes("..")) return new Response("no", { status: 400 });
      if (path.endsWith("/")) path += "index.html";
      const file = Bun.file(join(folder, path));
      if (!(await file.exists())) {
        const dir = Bun.file(join(folder, path, "index.html"));
        if (await dir.exists()) return new Response(null, { status: 301, headers: { location: `${new URL(req.url).pathname}/` } });
        return new Response("not found", { status: 404 });
      }
      served += file.size;
      return new Response(file);
    },
  });
  const indexUrl = `http://127.0.0.1:${http.port}/simple`;
  const root = mkdtempSync(join(tmpdir(), "gpl-bench-ship-"));
  const token = `bench-${crypto.randomUUID()}`;
  const base: Record<string, string> = { ...(process.env as Record<string, string>), GPULAYER_WORKER_ENGINE: "none", PIP_CONFIG_FILE: "/dev/null", GPULAYER_HEARTBEAT_SECONDS: "0.5" };
  for (const k of Object.keys(base)) if (k.startsWith("GPULAYER_SERVER") || k === "GPULAYER_TOKEN" || k === "GPULAYER_HOME" || k.startsWith("PIP_INDEX") || k.startsWith("UV_")) delete base[k];
  const python = Bun.which("python3")!;
  const children: Bun.Subprocess[] = [];
  const results: ShipResult[] = [];
  try {
    const beforeBin = process.env.BENCH_BEFORE;
    const modes: [string, string, number, string][] = [
      ["one worker builds (the reference: one build)", "false", 1, bin],
      ["shipped: one build, 3 fetches", "true", 4, bin],
      ...(beforeBin ? [["shipped, the binary before", "true", 4, beforeBin] as [string, string, number, string]] : []),
      ["each of 4 workers builds", "false", 4, bin],
    ];
    for (const [n, [mode, share, count, modeBin]] of modes.entries()) {
      const dir = join(root, `${n}-${share}-${count}`);
      const at = join(dir, "home-path");
      mkdirSync(at, { recursive: true });
      const server = Bun.spawn([modeBin, "server", "--listen", "127.0.0.1:0", "--json"], { env: { GPULAYER_TOKEN: token, ...base, GPULAYER_HOME: join(dir, "server"), GPULAYER_SERVER_SHARE_ENVS: share }, stdout: "pipe", stderr: "ignore" });
      children.push(server);
      let doc = "";
      for await (const c of server.stdout as ReadableStream<Uint8Array>) {
        doc += new TextDecoder().decode(c);
        if (doc.trimEnd().endsWith("}")) break;
      }
      const url = JSON.parse(doc).url as string;
      for (let i = 1; i <= count; i++) {
        const real = join(dir, `w${i}`);
        mkdirSync(join(real, "home"), { recursive: true });
        const env = { ...base, GPULAYER_HOME: at, GPULAYER_TOKEN: token, UV_CACHE_DIR: join(real, "uv"), PIP_CACHE_DIR: join(real, "pip") };
        const w = Bun.spawn(["unshare", "-m", "sh", "-c", `mount --bind "${join(real, "home")}" "${at}" && exec "$@"`, "sh", modeBin, "join", url, "--name", `w${i}`, "--python", python], { env, stdout: "ignore", stderr: process.env.BENCH_VERBOSE ? "inherit" : "ignore" });
        children.push(w);
      }
      const client = { ...base, GPULAYER_HOME: join(dir, "client"), GPULAYER_SERVER: url, GPULAYER_TOKEN: token };
      for (let i = 0; i < 200; i++) {
        const r = Bun.spawn([modeBin, "workers", "--json"], { env: client, stdout: "pipe", stderr: "ignore" });
        const out = await new Response(r.stdout).text();
        if ((await r.exited) === 0 && JSON.parse(out).length === count) break;
        await Bun.sleep(100);
      }
      const before = served;
      const t = performance.now();
      const p = Bun.spawn([modeBin, "env", "prepare", ...specs.flatMap((s) => ["-p", s]), "--index-url", indexUrl, "--json"], { env: client, stdout: "pipe", stderr: process.env.BENCH_VERBOSE ? "inherit" : "ignore" });
      const out = await new Response(p.stdout).text();
      if ((await p.exited) !== 0) throw new Error(`env prepare (${mode}) failed: ${out}`);
      const seconds = (performance.now() - t) / 1000;
      const workers = JSON.parse(out).workers as { status: string; path: string; seconds: number; fetched?: { bytes: number; seconds: number } }[];
      const du = Bun.spawnSync(["du", "-sb", join(dir, "w1", "home", "envs-v1")]).stdout.toString();
      results.push({ mode, seconds, indexBytes: served - before, statuses: workers.map((w) => w.status).sort(), envBytes: Number(du.split(/\s/)[0]), builtSeconds: workers.filter((w) => w.status === "built").map((w) => w.seconds), fetchSeconds: workers.flatMap((w) => (w.fetched ? [w.fetched.seconds] : [])) });
      for (const c of children.splice(0)) c.kill("SIGTERM");
    }
  } finally {
    for (const c of children) c.kill("SIGTERM");
    await Promise.all(children.map((c) => c.exited));
    http.stop(true);
    rmSync(root, { recursive: true, force: true });
  }
  return results;
}

if (import.meta.main) {
  for (const r of await shipBench()) console.log(JSON.stringify(r));
}
