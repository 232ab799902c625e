import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { homeLayout } from "../src/config/paths.ts";
import { listImageRecords } from "../src/docker/index.ts";
import { plainHttpRegistry, pushBusybox, removeRegistryImages, type Registry, startRegistry, engineMatrix, engineTest, ENGINES } from "./fixtures/registry.ts";
import { cli, sandbox, startCli } from "./helpers.ts";

setDefaultTimeout(120_000);

/**
 * An engine that dies mid-pull: a proxy in front of the real registry holds
 * every blob download open, the pull hangs there, and the test SIGKILLs the
 * engine's process. gpulayer must say so in one line, fail the job in
 * task.prepare, and record nothing.
 */
const matrix = await engineMatrix("image-errors.test");
const { status, working } = matrix;

let registry: Registry | undefined;
let proxy: ReturnType<typeof Bun.serve> | undefined;
const held: (() => void)[] = [];

beforeAll(async () => {
  if (!working.length) return;
  registry = await startRegistry();
  const upstream = `http://${registry.host}`;
  proxy = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    idleTimeout: 0,
    async fetch(req) {
      const url = new URL(req.url);
      if (/\/blobs\/sha256:/.test(url.pathname) && req.method === "GET") {
        // Hold the download open until the test lets go: the pull is then "mid-pull".
        await new Promise<void>((resolve) => held.push(resolve));
        return new Response("gone", { status: 503 });
      }
      const r = await fetch(`${upstream}${url.pathname}${url.search}`, { method: req.method, headers: req.headers, redirect: "manual" });
      const headers = new Headers(r.headers);
      const location = headers.get("location");
      if (location?.startsWith(upstream)) headers.set("location", location.replace(upstream, `http://127.0.0.1:${proxy!.port}`));
      return new Response(req.method === "HEAD" ? null : await r.arrayBuffer(), { status: r.status, headers });
    },
  });
}, 30_000);

afterAll(async () => {
  for (const release of held.splice(0)) release();
  proxy?.stop(true);
  if (registry) for (const e of working) await removeRegistryImages(e, registry.host);
  await registry?.stop();
}, 60_000);

/** Processes whose command line names the proxy: the engine CLI doing the pull. */
function pullProcesses(needle: string): number[] {
  const pids: number[] = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const cmd = readFileSync(`/proc/${name}/cmdline`, "utf8").split("\0");
      if (cmd.some((a) => a.includes(needle)) && cmd.includes("pull")) pids.push(Number(name));
    } catch {
      // gone
    }
  }
  return pids;
}

describe.each(ENGINES)("%s dies mid-pull", (name) => {
  const it = engineTest(matrix, name);
  if (!it) return;

  it("one clear line, the job failed in task.prepare, nothing recorded", async () => {
    const repo = `dies-${name}`;
    await pushBusybox(registry!, repo, "1", working[0]!, [...new Set([working[0]!, name])]);
    const host = `127.0.0.1:${proxy!.port}`;
    plainHttpRegistry(host);
    const ref = `${host}/${repo}:1`;
    const box = sandbox();
    box.env.GPULAYER_CONTAINER_ENGINE = name;
    try {
      const job = startCli(["job", "run", "--image", ref, "--", "echo", "ran"], { env: box.env, cwd: box.root });
      let pids: number[] = [];
      for (let i = 0; i < 300 && !(pids = pullProcesses(host)).length; i++) await Bun.sleep(50);
      expect(pids.length).toBeGreaterThan(0);
      // Wait until the pull is inside a blob download, then kill the engine's process.
      for (let i = 0; i < 300 && !held.length; i++) await Bun.sleep(50);
      expect(held.length).toBeGreaterThan(0);
      for (const pid of pids) process.kill(pid, "SIGKILL");
      const [stdout, stderr, code] = await Promise.all([new Response(job.stdout).text(), new Response(job.stderr).text(), job.exited]);
      for (const release of held.splice(0)) release();
      if (process.env.SHOW_STDERR) console.log(stderr);
      expect(code).not.toBe(0);
      expect(stdout).not.toContain("ran");
      const errorLines = stderr.split("\n").filter((l) => /error|failed/i.test(l));
      expect(errorLines.length).toBeGreaterThan(0);
      expect(errorLines[0]).toContain(ref);
      expect(errorLines[0]).toContain("died mid-pull (SIGKILL)");
      expect(listImageRecords(homeLayout(box.home))).toEqual([]);
      const list = JSON.parse((await cli(["job", "list", "--json"], { env: box.env })).stdout);
      expect(list[0].state).toBe("failed");
      expect(list[0].phases.map((p: { name: string }) => p.name)).toEqual(["task.prepare"]);
    } finally {
      for (const release of held.splice(0)) release();
      box.cleanup();
    }
  });
});
