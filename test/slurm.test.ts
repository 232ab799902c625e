/**
 * gpulayer under a real Slurm (test/fixtures/slurm.ts: slurmctld and slurmd on
 * this machine, one node of two CPUs and four stand-in GPUs): the sbatch script
 * of docs/guides/slurm.md, jobs of one allocation sharing a cache, and the GPUs
 * a job is given as Slurm itself sets them (the unit-level test is slurm-gpus).
 *
 * A machine without Slurm (or not root) skips this file with its reason; CI
 * installs slurm-wlm and requires it (GPULAYER_TEST_REQUIRE_SLURM=1).
 */
import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { type Slurm, slurmMissing, startSlurm } from "./fixtures/slurm.ts";
import { CLI_ARGV, readyKeys, sandbox } from "./helpers.ts";

setDefaultTimeout(180_000);

const missing = slurmMissing();
const REQUIRED = process.env.GPULAYER_TEST_REQUIRE_SLURM === "1";
if (missing && REQUIRED) {
  test("Slurm is required (GPULAYER_TEST_REQUIRE_SLURM) and can run here", () => {
    throw new Error(missing);
  });
} else if (missing) console.warn(`[slurm.test] skipping: ${missing}`);

const sh = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
const script = (lines: string[]) => `#!/bin/bash\n${lines.join("\n")}\n`;

// Skipped (its reason printed above) only without Slurm or root; CI requires Slurm, and fails instead.
(missing ? describe.skip : describe)("gpulayer in a real Slurm", () => {
  let box: ReturnType<typeof sandbox>;
  let index: PackageIndex;
  let slurm: Slurm;
  /** What an sbatch is submitted with: the user's environment, gpulayer and the node's nvidia-smi on PATH. */
  let env: Record<string, string>;

  const sbatch = async (args: string[], cwd = box.root) => {
    const r = await slurm.command(["sbatch", ...args], env, cwd);
    if (r.code !== 0) throw new Error(`sbatch ${args.join(" ")}: exit ${r.code}: ${r.stderr}`);
    return r;
  };
  const until = async (what: string, cond: () => boolean) => {
    const end = Date.now() + 60_000;
    while (!cond()) {
      if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
      await Bun.sleep(100);
    }
  };

  beforeAll(async () => {
    box = sandbox();
    index = new PackageIndex(join(box.root, "index")).start();
    index.wheel({ name: "slurmtest-one", version: "1.0" });
    const bin = join(box.root, "bin");
    mkdirSync(bin);
    // The node's gpulayer: this checkout's CLI behind one executable, as the install puts it on PATH.
    writeFileSync(join(bin, "gpulayer"), `#!/bin/sh\nexec ${CLI_ARGV.map(sh).join(" ")} "$@"\n`, { mode: 0o755 });
    // The node's nvidia-smi lists all four GPUs whatever the allocation, as the real one does.
    const gpus = [0, 1, 2, 3].map((i) => `echo '${i}, GPU-${i}${i}${i}${i}-aaaa, Fake H100, 81559, 550.54'`);
    writeFileSync(join(bin, "nvidia-smi"), script(gpus));
    chmodSync(join(bin, "nvidia-smi"), 0o755);
    slurm = await startSlurm(join(box.root, "slurm"));
    env = { ...box.env, ...slurm.env, PATH: `${bin}:${slurm.env.PATH}` };
    for (const k of Object.keys(env)) if ((k.startsWith("SLURM_") && k !== "SLURM_CONF") || k === "CUDA_VISIBLE_DEVICES") delete env[k];
  });

  afterAll(async () => {
    await slurm?.stop();
    index?.stop();
  });

  test("the guide's sbatch script: the env is prepared, the job imports from it, on the two GPUs Slurm gave (not the first two), and a third is refused", async () => {
    const dir = join(box.root, "train");
    mkdirSync(dir);
    writeFileSync(join(dir, "requirements.txt"), `--index-url ${index.url}\nslurmtest-one\n`);
    writeFileSync(join(dir, "train.py"), `import os, slurmtest_one\nprint("train", slurmtest_one.__version__, os.environ["CUDA_VISIBLE_DEVICES"])\n`);
    // A job of tasks: gpulayer hands each its GPUs by UUID, from those of the allocation.
    writeFileSync(join(dir, "tasks.yaml"), ["environment: {}", "tasks:", `  both: {command: 'echo "both $CUDA_VISIBLE_DEVICES"', resources: {gpus: 2}}`, ""].join("\n"));
    // GPU 0 taken by another job first: this one is given GPUs 1 and 2.
    await sbatch(["--gres=gpu:1", "-o", "/dev/null", "--wrap", `touch ${sh(join(dir, "holding"))}; while [ ! -e ${sh(join(dir, "done"))} ]; do sleep 0.2; done`]);
    await until("the job holding GPU 0 to start", () => existsSync(join(dir, "holding")));
    const shown = `env | grep -E '^(SLURM_JOB_GPUS|SLURM_STEP_GPUS|CUDA_VISIBLE_DEVICES)=' | sort`;
    writeFileSync(
      join(dir, "train.sbatch"),
      script([
        "#SBATCH --nodes=1 --ntasks-per-node=1 --gres=gpu:2 --time=00:10:00",
        `${shown} | sed 's/^/batch /'`,
        `srun --ntasks-per-node=1 bash -c ${sh(`${shown} | sed 's/^/step /'`)}`,
        "srun --ntasks-per-node=1 gpulayer env prepare requirements.txt --quiet",
        "srun --ntasks-per-node=1 gpulayer job run -r requirements.txt --gpus 1 -- python train.py",
        'srun --ntasks-per-node=1 gpulayer job run -r requirements.txt --gpus 3 -- python train.py || echo "exit $?"',
        "srun --ntasks-per-node=1 gpulayer job run -f tasks.yaml",
      ]),
    );
    try {
      await sbatch(["--wait", "-o", join(dir, "out"), "-e", join(dir, "err"), "train.sbatch"], dir);
    } finally {
      writeFileSync(join(dir, "done"), "");
    }
    const out = readFileSync(join(dir, "out"), "utf8");
    const err = readFileSync(join(dir, "err"), "utf8");
    // What Slurm set, in the batch script and in a step: GPUs 1 and 2 of the node.
    expect(out).toContain("batch CUDA_VISIBLE_DEVICES=1,2\nbatch SLURM_JOB_GPUS=1,2\n");
    expect(out).toContain("step CUDA_VISIBLE_DEVICES=1,2\n");
    expect(out).toMatch(/^step SLURM_STEP_GPUS=1,2$/m);
    // The job imports from the env and sees the one GPU it asked for, the first of Slurm's (not the node's GPU 0);
    // gpulayer counted two: a job asking for three is refused.
    expect(out).toContain("train 1.0 GPU-1111-aaaa\n");
    expect(out).toMatch(/^exit 1$/m);
    expect(err).toContain("error: job refused: it needs 3 GPUs; no machine it can run on has more than 2\n");
    // The tasks' GPUs are those two, not the node's first two (nvidia-smi lists all four).
    expect(out + err).toMatch(/\bboth GPU-1111-aaaa,GPU-2222-aaaa$/m);
    // `env prepare --quiet` printed the env's path; the job ran in it, reused, nothing built again.
    const key = new RegExp(`^${join(box.home, "envs-v1")}/([0-9a-f]{64})$`, "m").exec(out)?.[1];
    expect(readyKeys(box.home)).toContain(key!);
    expect(err).toContain(`task.prepare reused env ${key!.slice(0, 12)} in `);
  });

  test("two jobs at once on one shared cache (GPULAYER_HOME): one builds the env, the other reuses it", async () => {
    const dir = join(box.root, "shared");
    const home = join(dir, "cache");
    mkdirSync(home, { recursive: true });
    const counter = join(dir, "builds");
    index.sdist({ name: "slurmtest-shared", version: "1.0", counter, sleep: 2 });
    // Each waits for the other to have started (both hold a CPU of the node at once), then prepares.
    const job = (me: string, other: string) =>
      sbatch(
        ["--wait", "--ntasks=1", "-o", join(dir, `${me}.out`), "-e", join(dir, `${me}.err`), "--export", `ALL,GPULAYER_HOME=${home}`, "--wrap",
          `touch ${me}.started; for i in $(seq 600); do [ -e ${other}.started ] && break; sleep 0.1; done; gpulayer env prepare -p slurmtest-shared --index-url ${index.url} --json`],
        dir,
      );
    mkdirSync(dir, { recursive: true });
    await Promise.all([job("one", "two"), job("two", "one")]);
    const docs = ["one", "two"].map((me) => JSON.parse(readFileSync(join(dir, `${me}.out`), "utf8")) as { status: string; path: string; key: string });
    expect(docs.map((d) => d.status).sort()).toEqual(["built", "reused"]);
    expect(docs[0]!.path).toBe(docs[1]!.path);
    expect(readFileSync(counter, "utf8").trim().split("\n")).toHaveLength(1);
    expect(readyKeys(home)).toEqual([docs[0]!.key]);
    expect(readdirSync(join(home, "envs-v1"))).toEqual([docs[0]!.key]);
  });
});
