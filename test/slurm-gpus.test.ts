/**
 * `gpulayer job run` inside a Slurm allocation takes the GPUs Slurm gave it, never more.
 * The node's GPUs come from a stand-in nvidia-smi (this machine has none), which lists
 * all four whatever the allocation, as the real one does; the allocation is what Slurm
 * puts in the job's environment (SLURM_JOB_ID, SLURM_JOB_GPUS / SLURM_STEP_GPUS,
 * CUDA_VISIBLE_DEVICES).
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { cli, sandbox } from "./helpers.ts";

describe("GPUs of a Slurm allocation", () => {
  let s: ReturnType<typeof sandbox>;
  let env: Record<string, string>;

  beforeAll(() => {
    s = sandbox();
    const bin = join(s.root, "bin");
    mkdirSync(bin);
    const lines = [0, 1, 2, 3].map((i) => `echo '${i}, GPU-${i}${i}${i}${i}-aaaa, Fake H100, 81559, 550.54'`);
    writeFileSync(join(bin, "nvidia-smi"), `#!/bin/sh\n${lines.join("\n")}\n`);
    chmodSync(join(bin, "nvidia-smi"), 0o755);
    env = { ...s.env, PATH: `${bin}:${s.env.PATH}`, GPULAYER_WORKER_SLOTS: "4" };
    for (const k of Object.keys(env)) if (k.startsWith("SLURM_") || k === "CUDA_VISIBLE_DEVICES") delete env[k];
    // Two tasks of one GPU each, then one that needs both: each sees only its own (CUDA_VISIBLE_DEVICES).
    // One and two wait for each other: both run at once, so each holds a GPU of its own.
    const show = (me: string, other?: string) =>
      JSON.stringify(`echo "${me} $CUDA_VISIBLE_DEVICES"` + (other ? `; touch ${me}.started; for i in $(seq 200); do [ -e ${other}.started ] && exit 0; sleep 0.05; done; exit 9` : ""));
    writeFileSync(
      join(s.root, "two.yaml"),
      ["environment: {}", "resources: {gpus: 1}", "tasks:", `  one: {command: ${show("one", "two")}}`, `  two: {command: ${show("two", "one")}}`, `  both: {command: ${show("both")}, needs: [one, two], resources: {gpus: 2}}`, ""].join("\n"),
    );
  });
  afterAll(() => s.cleanup());

  const seen = (stderr: string, who: string) => stderr.split("\n").find((l) => l.startsWith(`[${who}] ${who} `))?.split(" ").pop();

  test("sbatch --gres=gpu:2 on a four-GPU node (SLURM_JOB_GPUS=1,3): the tasks share out GPUs 1 and 3, and none other", async () => {
    rmSync(join(s.root, "one.started"), { force: true });
    rmSync(join(s.root, "two.started"), { force: true });
    const r = await cli(["job", "run", "-f", "two.yaml", "--json"], { env: { ...env, SLURM_JOB_ID: "42", SLURM_JOB_GPUS: "1,3" }, cwd: s.root });
    expect(r.code).toBe(0);
    expect(new Set([seen(r.stderr, "one"), seen(r.stderr, "two")])).toEqual(new Set(["GPU-1111-aaaa", "GPU-3333-aaaa"]));
    expect(seen(r.stderr, "both")).toBe("GPU-1111-aaaa,GPU-3333-aaaa");
  });

  test("a job that needs more GPUs than the allocation gives is refused, though the node has them", async () => {
    const r = await cli(["job", "run", "--gpus", "3", "--", "true"], { env: { ...env, SLURM_JOB_ID: "42", SLURM_STEP_GPUS: "0,2", SLURM_JOB_GPUS: "0,1,2,3" }, cwd: s.root });
    expect([r.code, r.stderr]).toEqual([1, "error: job refused: it needs 3 GPUs; no machine it can run on has more than 2\n"]);
  });

  test("CUDA_VISIBLE_DEVICES (as Slurm sets it for a step) bounds the GPUs too, by index or UUID", async () => {
    const one = await cli(["job", "run", "--gpus", "2", "--", "true"], { env: { ...env, SLURM_JOB_ID: "42", CUDA_VISIBLE_DEVICES: "2" }, cwd: s.root });
    expect([one.code, one.stderr]).toEqual([1, "error: job refused: it needs 2 GPUs; no machine it can run on has more than 1\n"]);
    rmSync(join(s.root, "one.started"), { force: true });
    rmSync(join(s.root, "two.started"), { force: true });
    const byUuid = await cli(["job", "run", "-f", "two.yaml", "--json"], { env: { ...env, CUDA_VISIBLE_DEVICES: "GPU-0000-aaaa,GPU-2222" }, cwd: s.root });
    expect(byUuid.code).toBe(0);
    expect(seen(byUuid.stderr, "both")).toBe("GPU-0000-aaaa,GPU-2222-aaaa");
  });

  test("a Slurm job given no GPU gets none", async () => {
    const r = await cli(["job", "run", "--gpus", "1", "--", "true"], { env: { ...env, SLURM_JOB_ID: "42" }, cwd: s.root });
    expect([r.code, r.stderr]).toEqual([1, "error: job refused: it needs 1 GPU; no machine it can run on has more than 0\n"]);
  });

  test("outside Slurm, every GPU of the machine", async () => {
    const r = await cli(["job", "run", "--gpus", "4", "--", "true"], { env, cwd: s.root });
    expect(r.code).toBe(0);
  });
});
