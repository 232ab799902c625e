import { mkdirSync } from "node:fs";
import { join } from "node:path";
import type { HomeLayout } from "../config/paths.ts";
import { removeTree } from "../core/tree-owner.ts";
import { hostRequest, warmBuilder } from "../env/index-light.ts";
import type { RunnerSettings } from "../jobs/runner.ts";

/**
 * A new worker's first build as fast as a used home's: on joining, the env a
 * job that asks for nothing gets (the worker's Python, no packages) is built
 * once in scratch space and removed (env/prepare.ts warmBuilder), leaving in
 * the home what every later build takes: the interpreter's probe, the scan of
 * its packages and their stand-ins, uv's check of them, uv's venv. On a GPU
 * box with hundreds of packages, those are most of a first build. It runs
 * beside the poll for work, never before it, and a failure is only told: the
 * first build then does that work itself, as before.
 */

export type WarmOutcome = { state: "done"; seconds: number; python: string } | { state: "skipped" | "failed"; reason: string };

export async function warmWorker(layout: HomeLayout, runner: RunnerSettings, signal: AbortSignal): Promise<WarmOutcome> {
  if (runner.runAs) return { state: "skipped", reason: "worker.run_as: each build writes its own stand-ins" };
  // An empty folder of its own as the request's: the request names no file.
  const workdir = join(layout.clusterWork, "warm-up");
  try {
    removeTree(workdir);
    mkdirSync(workdir, { recursive: true, mode: 0o700 });
    const req = hostRequest(runner, { request: { specs: [], extraIndexUrls: [], findLinks: [] }, workdir });
    return { state: "done", ...(await warmBuilder(layout, { ...req, signal })) };
  } catch (error) {
    return { state: "failed", reason: (error as Error).message.split("\n")[0]!.slice(0, 500) };
  } finally {
    removeTree(workdir);
  }
}
