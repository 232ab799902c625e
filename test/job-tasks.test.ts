import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, makeWorkerVenv, ROOT, sandbox, tempDir } from "./helpers.ts";

/**
 * Jobs of several tasks, run on this machine with real builds from a local
 * index: each task has its own env (inheriting the job's), two tasks with
 * conflicting pins run at the same time, a failure skips what needs it, a
 * cancel ends them all. What each task sees is what it prints.
 */

setDefaultTimeout(120_000);

const world = tempDir("gpl-tasks-");
const index = new PackageIndex(join(world, "index"));
let worker: string;

beforeAll(async () => {
  index.start();
  index.wheel({ name: "gl-base", version: "1.0" });
  index.wheel({ name: "gl-base", version: "2.0" });
  index.wheel({ name: "gl-extra", version: "1.0" });
  worker = await makeWorkerVenv(join(world, "worker"), { env: sandbox().env });
});
afterAll(() => index.stop());

/** A task command that waits (up to 20 s) until the other task has started too: both running at once, or it fails. */
const meetsOther = (me: string, other: string) =>
  `python -c "import gl_base, pathlib, time; print('${me} gl-base', gl_base.__version__); pathlib.Path('${me}.started').touch(); t = time.time()\nwhile not pathlib.Path('${other}.started').exists():\n    time.sleep(0.05)\n    assert time.time() - t < 20, 'the other task never ran at the same time'\nprint('${me} met ${other}')"`;

function pipeline(dir: string): string {
  const file = join(dir, "job.yaml");
  writeFileSync(
    file,
    [
      "name: pipeline",
      "env: {SHARED: from-job, WHO: job}",
      "environment:",
      `  python: ${worker}`,
      `  index_url: ${index.url}`,
      "  requirements: [gl-base==1.0]",
      "tasks:",
      "  prepare:",
      `    command: echo "prepare WHO=$WHO SHARED=$SHARED" > prepared.txt`,
      "    env: {WHO: prepare}",
      "  train-a:",
      `    command: ${JSON.stringify(meetsOther("a", "b"))}`,
      "    needs: [prepare]",
      "  train-b:",
      `    command: ${JSON.stringify(meetsOther("b", "a"))}`,
      "    environment: {requirements: [gl-base==2.0]}",
      "    needs: [prepare]",
      "",
    ].join("\n"),
  );
  return file;
}

interface TaskDoc {
  name: string;
  id: string;
  state: string;
  needs: string[];
  exit_code: number | null;
  env_key: string | null;
  error: string | null;
  phases: { name: string; cache?: string }[];
}

describe("a job of tasks, here", () => {
  test("prepare, then train-a and train-b side by side, each in its own env with its own pin of gl-base", async () => {
    const s = sandbox();
    try {
      const file = pipeline(s.root);
      const env = { ...s.env, GPULAYER_WORKER_SLOTS: "2" };
      const r = await cli(["job", "run", "-f", file, "--json"], { env, cwd: s.root });
      expect(r.code).toBe(0);
      const status = JSON.parse(r.stdout) as { state: string; tasks: TaskDoc[] };
      expect(status.state).toBe("succeeded");
      expect(status.tasks.map((t) => [t.name, t.state, t.needs])).toEqual([
        ["prepare", "succeeded", []],
        ["train-a", "succeeded", ["prepare"]],
        ["train-b", "succeeded", ["prepare"]],
      ]);
      // Conflicting pins: two envs, neither the other's.
      const [prep, a, b] = status.tasks;
      expect(a!.env_key).toBe(prep!.env_key);
      expect(b!.env_key).not.toBe(a!.env_key);
      // Each line of output says its task (stderr under --json), and each task has its own phases.
      expect(r.stderr).toContain("[train-a] a gl-base 1.0");
      expect(r.stderr).toContain("[train-b] b gl-base 2.0");
      expect(r.stderr).toContain("[train-a] a met b");
      expect(r.stderr).toContain("[train-b] b met a");
      for (const t of status.tasks) expect(t.phases.map((p) => p.name)).toEqual(["task.prepare", "task.run"]);
      // env merged per variable: the task's WHO, the job's SHARED.
      expect(readFileSync(join(s.root, "prepared.txt"), "utf8")).toBe("prepare WHO=prepare SHARED=from-job\n");

      // Each task's own log; all of them, each line with its name.
      const id = (JSON.parse((await cli(["job", "list", "--json"], { env })).stdout) as { id: string }[])[0]!.id;
      const one = await cli(["job", "logs", id, "--task", "train-b"], { env });
      expect(one.stdout).toBe("b gl-base 2.0\nb met a\n");
      const all = await cli(["job", "logs", id], { env });
      expect(all.stdout.split("\n").filter(Boolean).sort()).toEqual(["[train-a] a gl-base 1.0", "[train-a] a met b", "[train-b] b gl-base 2.0", "[train-b] b met a"]);
      const nope = await cli(["job", "logs", id, "--task", "train-c"], { env });
      expect(nope).toMatchObject({ code: 2, stderr: `error: job ${id} has no task train-c (tasks: prepare, train-a, train-b)\n` });
      // The same job again: every env is a cache hit, shown per task.
      const again = await cli(["job", "run", "-f", file, "--json"], { env, cwd: s.root });
      const second = JSON.parse(again.stdout) as { tasks: TaskDoc[] };
      expect(second.tasks.map((t) => t.phases[0]!.cache)).toEqual(["hit", "hit", "hit"]);
      const shown = await cli(["job", "status", id], { env });
      expect(shown.stdout).toMatch(/\n {4}train-b {2}succeeded, exit 0; prepare .+ \(cache miss\), run .+; needs prepare\n/);
    } finally {
      s.cleanup();
    }
  });

  test("what a task inherits, from --dry-run and from what it sees: env merged, environment per field, environment: {} the worker's default", async () => {
    const s = sandbox();
    try {
      const file = join(s.root, "job.yaml");
      writeFileSync(
        file,
        [
          "name: rules",
          "env: {A: job-a, B: job-b}",
          "environment:",
          `  python: ${worker}`,
          `  index_url: ${index.url}`,
          "  requirements: [gl-base==1.0, gl-extra]",
          "tasks:",
          "  same:",
          `    command: python -c "import gl_base, gl_extra, os; print(gl_base.__version__, os.environ['A'], os.environ['B'])"`,
          "  replaced:",
          // requirements replace (gl-extra is gone); index_url and python still the job's.
          `    command: python -c "import gl_base, os, importlib.util as u; print(gl_base.__version__, u.find_spec('gl_extra') is None, os.environ['A'], os.environ['B'], os.environ['C'])"`,
          "    environment: {requirements: [gl-base==2.0]}",
          "    env: {B: task-b, C: task-c}",
          "  bare:",
          `    command: python -c "import importlib.util as u; print(u.find_spec('gl_base') is None)"`,
          "    environment: {}",
          "",
        ].join("\n"),
      );
      const dry = await cli(["job", "run", "-f", file, "--dry-run", "--json"], { env: s.env, cwd: s.root });
      expect(dry.code).toBe(0);
      const plan = JSON.parse(dry.stdout) as { tasks: { name: string; env: string[]; environment: { key: string; summary: string; would: string; python: string } }[] };
      expect(plan.tasks.map((t) => [t.name, t.env, t.environment.summary, t.environment.would])).toEqual([
        ["same", ["A", "B"], "gl-base==1, gl-extra", "build"],
        ["replaced", ["A", "B", "C"], "gl-base==2", "build"],
        ["bare", ["A", "B"], "(no requirements)", "build"],
      ]);
      // Nothing was run or built, and the keys are env prepare's for the same requests.
      expect(existsSync(join(s.home, "jobs", "jobs.db"))).toBe(false);
      const key = async (...args: string[]) => JSON.parse((await cli(["env", "prepare", ...args, "--dry-run", "--json"], { env: s.env, cwd: s.root })).stdout).key as string;
      expect(plan.tasks[1]!.environment.key).toBe(await key("-p", "gl-base==2.0", "--index-url", index.url, "--python", worker));
      // The worker's default (python3 on PATH here), as env prepare resolves it with nothing asked for.
      const bare = JSON.parse((await cli(["env", "prepare", "--dry-run", "--json"], { env: s.env, cwd: s.root })).stdout) as { key: string; inputs: { interpreter: { path: string } } };
      expect(plan.tasks[2]!.environment).toMatchObject({ key: bare.key, python: bare.inputs.interpreter.path });
      const human = await cli(["job", "run", "-f", file, "--dry-run"], { env: s.env, cwd: s.root });
      expect(human.stdout).toContain(`task replaced\n  command  python -c`);
      expect(human.stdout).toContain(`  env      ${plan.tasks[1]!.environment.key} (would build: gl-base==2; python ${worker})\n  vars     A, B, C\n  needs    -\n`);

      const r = await cli(["job", "run", "-f", file], { env: s.env, cwd: s.root });
      expect(r.code).toBe(0);
      expect(r.stdout.split("\n").filter(Boolean).sort()).toEqual(["[bare] True", "[replaced] 2.0 True job-a task-b task-c", "[same] 1.0 job-a job-b"]);
    } finally {
      s.cleanup();
    }
  });

  test("a failed task fails the job with its exit code; what needs it is skipped, never started; a task that does not need it still runs", async () => {
    const s = sandbox();
    try {
      const file = join(s.root, "job.yaml");
      writeFileSync(
        file,
        [
          "environment: {}",
          "tasks:",
          "  breaks:",
          "    command: echo breaking; exit 7",
          "  after:",
          "    command: touch after.ran",
          "    needs: [breaks]",
          "  after-after:",
          "    command: touch after-after.ran",
          "    needs: [after]",
          "  aside:",
          "    command: sleep 0.5; touch aside.ran",
          "",
        ].join("\n"),
      );
      const r = await cli(["job", "run", "-f", file, "--json"], { env: s.env, cwd: s.root });
      expect(r.code).toBe(7);
      const status = JSON.parse(r.stdout) as { state: string; exit_code: number; error: string; tasks: TaskDoc[] };
      expect(status).toMatchObject({ state: "failed", exit_code: 7, error: "task breaks failed (exit 7)" });
      expect(status.tasks.map((t) => [t.name, t.state])).toEqual([
        ["breaks", "failed"],
        ["after", "skipped"],
        ["after-after", "skipped"],
        ["aside", "succeeded"],
      ]);
      expect(status.tasks[1]!.error).toBe("not started: breaks, which it needs, failed");
      expect(status.tasks[2]!.error).toBe("not started: after, which it needs, skipped");
      expect(status.tasks[1]!.phases).toEqual([]);
      expect(existsSync(join(s.root, "after.ran"))).toBe(false);
      expect(existsSync(join(s.root, "after-after.ran"))).toBe(false);
      expect(existsSync(join(s.root, "aside.ran"))).toBe(true);
    } finally {
      s.cleanup();
    }
  });

  test("with the machine's GPUs (nvidia-smi), each task gets its own and sees only those; a job with a task that needs more than there are is refused before anything starts", async () => {
    const s = sandbox();
    try {
      // Two GPUs, as nvidia-smi reports them (a stand-in: this machine has none).
      const bin = join(s.root, "bin");
      mkdirSync(bin);
      writeFileSync(join(bin, "nvidia-smi"), "#!/bin/sh\necho '0, GPU-aaaa-0000, Fake H100, 81559, 550.54'\necho '1, GPU-bbbb-1111, Fake H100, 81559, 550.54'\n");
      chmodSync(join(bin, "nvidia-smi"), 0o755);
      const show = (me: string, other: string) => JSON.stringify(`echo "${me} $CUDA_VISIBLE_DEVICES"; touch ${me}.started; for i in $(seq 200); do [ -e ${other}.started ] && exit 0; sleep 0.05; done; exit 9`);
      writeFileSync(
        join(s.root, "job.yaml"),
        [
          "environment: {}",
          "resources: {gpus: 1}",
          "tasks:",
          `  one: {command: ${show("one", "two")}}`,
          `  two: {command: ${show("two", "one")}}`,
          `  both: {command: 'echo "both $CUDA_VISIBLE_DEVICES"', needs: [one, two], resources: {gpus: 2}}`,
          "",
        ].join("\n"),
      );
      const r = await cli(["job", "run", "-f", "job.yaml", "--json"], { env: { ...s.env, PATH: `${bin}:${s.env.PATH}`, GPULAYER_WORKER_SLOTS: "4" }, cwd: s.root });
      const status = JSON.parse(r.stdout) as { state: string; tasks: TaskDoc[] };
      expect(status.tasks.map((t) => [t.name, t.state])).toEqual([
        ["one", "succeeded"],
        ["two", "succeeded"],
        ["both", "succeeded"],
      ]);
      const lines = r.stderr.split("\n");
      const seen = (who: string) => lines.find((l) => l.startsWith(`[${who}] ${who} `))?.split(" ").pop();
      // One and two ran at once, each on a GPU of its own; both had the two.
      expect(new Set([seen("one"), seen("two")])).toEqual(new Set(["GPU-aaaa-0000", "GPU-bbbb-1111"]));
      expect(seen("both")).toBe("GPU-aaaa-0000,GPU-bbbb-1111");
      expect(r.code).toBe(0);
      // One task that needs more than the machine has: the job is refused whole, nothing of it started or recorded.
      writeFileSync(join(s.root, "three.yaml"), ["environment: {}", "tasks:", "  first: {command: 'touch first.ran'}", "  three: {command: 'echo never', needs: [first], resources: {gpus: 3}}", ""].join("\n"));
      const three = await cli(["job", "run", "-f", "three.yaml"], { env: { ...s.env, PATH: `${bin}:${s.env.PATH}` }, cwd: s.root });
      expect([three.code, three.stderr]).toEqual([1, "error: task three refused: it needs 3 GPUs; no machine it can run on has more than 2\n"]);
      expect(existsSync(join(s.root, "first.ran"))).toBe(false);
    } finally {
      s.cleanup();
    }
  });

  test("with the machine's GPUs, a task in a container gets the GPUs it was given (by id), not the engine's first ones", async () => {
    const s = sandbox();
    try {
      // Two GPUs (nvidia-smi) and docker, both stand-ins: docker answers what gpulayer asks and, for `run`, writes down the GPU options it got.
      const bin = join(s.root, "bin");
      mkdirSync(bin);
      writeFileSync(join(bin, "nvidia-smi"), "#!/bin/sh\necho '0, GPU-aaaa-0000, Fake H100, 81559, 550.54'\necho '1, GPU-bbbb-1111, Fake H100, 81559, 550.54'\n");
      const image = `{"Id": "sha256:${"1".repeat(64)}", "RepoDigests": ["busybox@sha256:${"2".repeat(64)}"], "Size": 1}`;
      writeFileSync(
        join(bin, "docker"),
        [
          "#!/bin/sh",
          `case "$1 $3" in`,
          `  "info {{.ServerVersion}}") echo 27.0.0 ;;`,
          `  "info {{json .Runtimes}}") echo '{"nvidia": {}}' ;;`,
          `  "image "*) echo '[${image}]' ;;`,
          `  "run "*) while [ $# -gt 0 ]; do case "$1" in --gpus) printf '%s %s\\n' "$1" "$2" >> "${s.root}/docker-runs"; shift ;; esac; shift; done ;;`,
          "esac",
          "",
        ].join("\n"),
      );
      for (const f of ["nvidia-smi", "docker"]) chmodSync(join(bin, f), 0o755);
      // one and two start at once (two slots), each with a GPU of its own; both, after them, has the two.
      writeFileSync(
        join(s.root, "job.yaml"),
        ["environment: {image: 'busybox:1'}", "resources: {gpus: 1}", "tasks:", "  one: {command: 'true'}", "  two: {command: 'true'}", "  both: {command: 'true', needs: [one, two], resources: {gpus: 2}}", ""].join("\n"),
      );
      // DOCKER_HOST: the stand-in is asked, never a real daemon's socket.
      const env = { ...s.env, PATH: `${bin}:${s.env.PATH}`, GPULAYER_CONTAINER_ENGINE: "docker", DOCKER_HOST: "tcp://127.0.0.1:9", GPULAYER_WORKER_SLOTS: "4" };
      const r = await cli(["job", "run", "-f", "job.yaml"], { env, cwd: s.root });
      expect(r.code, r.stderr).toBe(0);
      const runs = readFileSync(join(s.root, "docker-runs"), "utf8").split("\n").filter((l) => l.startsWith("--gpus "));
      expect(runs.sort()).toEqual(['--gpus "device=GPU-aaaa-0000"', '--gpus "device=GPU-aaaa-0000,GPU-bbbb-1111"', '--gpus "device=GPU-bbbb-1111"']);
    } finally {
      s.cleanup();
    }
  });

  test("job logs --follow of a job of tasks prints every task's lines with its name as they come, and ends with the job", async () => {
    const s = sandbox();
    try {
      writeFileSync(join(s.root, "job.yaml"), ["environment: {}", "tasks:", "  a: {command: 'echo a1; sleep 0.5; echo a2'}", "  b: {command: 'echo b1', needs: [a]}", ""].join("\n"));
      const started = JSON.parse((await cli(["job", "run", "-f", "job.yaml", "--detach", "--json"], { env: s.env, cwd: s.root })).stdout) as { id: string };
      const followed = await cli(["job", "logs", started.id, "--follow"], { env: s.env });
      expect(followed.code).toBe(0);
      expect(followed.stdout).toBe("[a] a1\n[a] a2\n[b] b1\n");
      const status = JSON.parse((await cli(["job", "status", started.id, "--json"], { env: s.env })).stdout) as { state: string };
      expect(status.state).toBe("succeeded");
      // A task that fails fails the job: following it passes that on.
      writeFileSync(join(s.root, "bad.yaml"), ["environment: {}", "tasks:", "  a: {command: 'echo a1'}", "  b: {command: 'exit 3', needs: [a]}", ""].join("\n"));
      const bad = JSON.parse((await cli(["job", "run", "-f", "bad.yaml", "--detach", "--json"], { env: s.env, cwd: s.root })).stdout) as { id: string };
      const badFollowed = await cli(["job", "logs", bad.id, "--follow"], { env: s.env });
      expect(badFollowed.stdout).toBe("[a] a1\n");
      expect(badFollowed.code).toBe(JSON.parse((await cli(["job", "status", bad.id, "--json"], { env: s.env })).stdout).exit_code);
      expect(badFollowed.code).not.toBe(0);
    } finally {
      s.cleanup();
    }
  });

  test("job cancel of a detached job of tasks ends the running ones and every one not started", async () => {
    const s = sandbox();
    try {
      const file = join(s.root, "job.yaml");
      const marker = `gpl-task-sleep-${process.pid}`;
      writeFileSync(
        file,
        ["environment: {}", "tasks:", "  long:", `    command: [python, -c, "import time; time.sleep(300)", ${marker}]`, "  later:", "    command: touch later.ran", "    needs: [long]", ""].join("\n"),
      );
      const started = await cli(["job", "run", "-f", file, "--detach", "--json"], { env: s.env, cwd: s.root });
      expect(started.code).toBe(0);
      const { id } = JSON.parse(started.stdout) as { id: string };
      const status = async () => JSON.parse((await cli(["job", "status", id, "--json"], { env: s.env })).stdout) as { state: string; tasks: TaskDoc[] };
      for (let i = 0; i < 200 && (await status()).tasks[0]!.state !== "running"; i++) await Bun.sleep(50);
      expect((await status()).tasks[0]!.state).toBe("running");
      const cancel = await cli(["job", "cancel", id, "--json"], { env: s.env });
      expect(cancel.code).toBe(0);
      const after = await status();
      expect(after.state).toBe("cancelled");
      expect(after.tasks.map((t) => [t.name, t.state])).toEqual([
        ["long", "cancelled"],
        ["later", "cancelled"],
      ]);
      expect(existsSync(join(s.root, "later.ran"))).toBe(false);
      expect(Bun.spawnSync(["pgrep", "-f", marker]).stdout.toString().trim()).toBe("");
    } finally {
      s.cleanup();
    }
  });

  test("the example job of tasks resolves: three tasks, two with conflicting pins after the first", async () => {
    const s = sandbox();
    try {
      const r = await cli(["job", "run", "-f", join(ROOT, "examples", "pipeline", "job.yaml"), "--dry-run", "--json"], { env: s.env, cwd: s.root });
      expect(r.code).toBe(0);
      const plan = JSON.parse(r.stdout) as { name: string; tasks: { name: string; needs: string[]; environment: { summary: string; key: string } }[] };
      expect(plan.tasks.map((t) => [t.name, t.needs, t.environment.summary])).toEqual([
        ["prepare", [], "(no requirements)"],
        ["report-old", ["prepare"], "tqdm==4.66.5"],
        ["report-new", ["prepare"], "tqdm==4.67.1"],
      ]);
      expect(new Set(plan.tasks.map((t) => t.environment.key)).size).toBe(3);
    } finally {
      s.cleanup();
    }
  });

  const bad: [string, string, string][] = [
    ["a need that names no task", "tasks:\n  a: {command: 'true', needs: [b]}\n", "job.yaml: tasks.a.needs: no task named b (tasks: a)"],
    ["a cycle of needs", "tasks:\n  a: {command: 'true', needs: [c]}\n  b: {command: 'true', needs: [a]}\n  c: {command: 'true', needs: [b]}\n", "job.yaml: tasks: a cycle of needs: a → c → b → a"],
    ["a task that needs itself", "tasks:\n  a: {command: 'true', needs: [a]}\n", "job.yaml: tasks.a.needs: a task cannot need itself"],
    ["a command of the job's own beside tasks", "command: 'true'\ntasks:\n  a: {command: 'true'}\n", "job.yaml: command: a job with tasks has no command of its own; give each task its command"],
    ["a task without a command", "tasks:\n  a: {env: {X: '1'}}\n", "job.yaml: tasks.a.command: is required"],
    ["a task name with a space", "tasks:\n  'a b': {command: 'true'}\n", "job.yaml: tasks.\"a b\": is not a valid task name (letters, digits, . _ -)"],
    ["an unknown key in a task", "tasks:\n  a: {command: 'true', after: [b]}\n", "job.yaml: tasks.a.after: unknown key"],
  ];
  for (const [what, yaml, message] of bad) {
    test(`refused with one line: ${what}`, async () => {
      const s = sandbox();
      try {
        writeFileSync(join(s.root, "job.yaml"), yaml);
        const r = await cli(["job", "run", "-f", "job.yaml"], { env: s.env, cwd: s.root });
        expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 2, stderr: `error: ${message}\n` });
      } finally {
        s.cleanup();
      }
    });
  }
});
