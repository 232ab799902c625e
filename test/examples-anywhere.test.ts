import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { cpSync, mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { importPythonImage, pythonRootfs } from "./fixtures/python-image.ts";
import { engineStatus, removeLocal } from "./fixtures/registry.ts";
import { cli, type CliResult, makeWorkerVenv, ROOT, sandbox, startCli } from "./helpers.ts";
import { keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";
// The documents `job status --json` prints, as the one job model types them (a server answers the same shape).
import type { JobStatus as StatusDoc, Phase } from "../src/jobs/model.ts";

/**
 * One job, the same on one machine and on a fleet: every example in
 * examples/ and a set of job files, each run twice, here and through a
 * server with two workers whose homes differ (real processes on 127.0.0.1).
 * The two `job status --json` documents, and each task's log, must match
 * apart from what names a place or a moment (ids, times, worker names, paths
 * under a home); a divergence prints as a diff of the two.
 */

const TOKEN = "examples-anywhere-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "5", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1", GPULAYER_WORKER_SLOTS: "1" };
const T = 180_000;
const boxes = { local: sandbox(), server: sandbox(), w1: sandbox(), w2: sandbox(), client: sandbox() };
const index = new PackageIndex(join(boxes.client.root, "index"));
const procs: Parameters<typeof stopAll>[0] = [];
let url = "";
let localPython = "";

/** The one engine the image case runs on (docker, else podman), when one answers and the Python image can be made. */
const ENGINE = (await engineStatus("docker")).ok ? "docker" : (await engineStatus("podman")).ok ? "podman" : null;
const rootfs = ENGINE ? await pythonRootfs() : { reason: "no container engine answers" };
const IMAGE = `gpl-test/python-anywhere-${process.pid}:1`;
const imageReady = ENGINE !== null && !("reason" in rootfs);
const REQUIRED = Boolean(process.env.GPULAYER_TEST_REQUIRE_ENGINES?.trim());
if (!imageReady && !REQUIRED) console.warn(`[examples-anywhere.test] skipping the image case: ${"reason" in rootfs ? rootfs.reason : ""}`);

/** Here: two slots, so tasks that meet can run side by side as on the two workers. */
const localEnv = () => ({ ...boxes.local.env, GPULAYER_PYTHON: localPython, GPULAYER_WORKER_SLOTS: "2", ...(ENGINE ? { GPULAYER_CONTAINER_ENGINE: ENGINE } : {}) });
const fleetEnv = () => ({ ...boxes.client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN });
const places = {
  here: { root: boxes.local.root, gpl: (args: string[], cwd = boxes.local.root) => cli(args, { env: localEnv(), cwd }) },
  fleet: { root: boxes.client.root, gpl: (args: string[], cwd = boxes.client.root) => cli(args, { env: fleetEnv(), cwd }) },
};
type Place = keyof typeof places;

/** A stand-in tqdm of a version: `tqdm.tqdm` passes its iterable through. */
const tqdm = (version: string) => ({ name: "tqdm", version, files: { "tqdm/__init__.py": `__version__ = ${JSON.stringify(version)}\ndef tqdm(it, **kw):\n    return it\n` } });

beforeAll(async () => {
  index.start();
  // The pins of examples/pipeline; examples/hello asks tqdm>=4 and gets the newest.
  index.wheel(tqdm("4.66.5"));
  index.wheel(tqdm("4.67.1"));
  index.wheel({ name: "greetb", version: "1.0" });
  // Its build never ends: what a prepare_timeout stops.
  index.sdist({ name: "hangs-anywhere", version: "1.0", sleep: 600 });
  if (imageReady) await importPythonImage(ENGINE!, IMAGE);
  localPython = await makeWorkerVenv(join(boxes.local.root, "venv"), { env: boxes.local.env });
  const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { GPULAYER_TOKEN: TOKEN, ...boxes.server.env, ...FAST } }), procs);
  url = (await waitFor("the server", async () => /"url": "([^"]+)"/.exec(server.out())?.[1])) as string;
  // w1 offers no container engine, w2 the one this machine has: the image case goes to w2.
  for (const name of ["w1", "w2"] as const) {
    const venv = await makeWorkerVenv(join(boxes[name].root, "venv"), { env: boxes[name].env });
    const engine: Record<string, string> = name === "w2" && ENGINE ? { GPULAYER_WORKER_ENGINE: "auto", GPULAYER_CONTAINER_ENGINE: ENGINE } : { GPULAYER_WORKER_ENGINE: "none" };
    keepOutput(startCli(["join", url, "--name", name, "--python", venv], { env: { ...boxes[name].env, ...FAST, ...engine, GPULAYER_TOKEN: TOKEN } }), procs);
  }
  await waitFor("two workers", async () => (JSON.parse((await places.fleet.gpl(["workers", "--json"])).stdout) as unknown[]).length === 2);
}, T);

afterAll(async () => {
  await stopAll(procs);
  index.stop();
  if (imageReady) await removeLocal(ENGINE!, IMAGE);
  for (const b of Object.values(boxes)) b.cleanup();
}, 60_000);

/** Every home and folder of this run's machines, longest first: what a path names a place by. */
const PLACES = Object.values(boxes)
  .map((b) => b.root)
  .sort((a, b) => b.length - a.length);
/** A text with every path under a machine's folders, and every env key, written the same way. */
const scrub = (text: string) => PLACES.reduce((s, root) => s.split(root).join("<root>"), text).replace(/\b[0-9a-f]{64}\b/g, "<key>");

/** What of a phase is the job's own, not its place's or its moment's: no seconds, no env key (the interpreter's path is part of it), no digest. */
const phaseOf = (p: Phase) => ({ name: p.name, state: p.state, cache: p.cache, status: p.status, image: p.image, exit_code: p.exit_code, message: p.message && scrub(p.message) });

/**
 * Hit or miss depends on what ran there before: an env new to both places (its requirements this case's own) is a miss
 * both ways, but the default env, built by an earlier case, may be new to the worker a task lands on. `cache: false` drops it.
 */
const withoutCache = ({ cache: _c, status: _s, ...rest }: ReturnType<typeof phaseOf>) => rest;

/** A `job status --json` document without ids, times, worker names and paths under a home. */
function comparable(doc: StatusDoc, cache: boolean) {
  const phases = (ps: Phase[]) => ps.map(phaseOf).map((p) => (cache ? p : withoutCache(p)));
  return {
    name: doc.name,
    state: doc.state,
    exit_code: doc.exit_code,
    command: scrub(doc.command),
    has_env: doc.env_key !== null,
    error: doc.error && scrub(doc.error),
    phases: phases(doc.phases),
    tasks: doc.tasks?.map((t) => ({
      name: t.name,
      state: t.state,
      needs: t.needs,
      exit_code: t.exit_code,
      has_env: t.env_key !== null,
      error: t.error && scrub(t.error),
      command: scrub(t.command),
      phases: phases(t.phases),
      outputs: t.outputs,
    })),
  };
}

interface Ran {
  run: CliResult;
  status: StatusDoc;
  /** Each task's log (a job without tasks: one, under its own name), scrubbed. */
  logs: Record<string, string>;
}

/** Run a job in its folder at one place; its status and each task's log, as `job status` and `job logs` give them afterwards. */
async function runAt(place: Place, dir: string, args: string[]): Promise<Ran> {
  const { gpl } = places[place];
  const run = await gpl(["job", "run", ...args, "--json"], dir);
  expect(run.stdout, `${place}: ${run.stderr}`).toStartWith("{");
  const id = (JSON.parse(run.stdout) as StatusDoc).id;
  const shown = await gpl(["job", "status", id, "--json"], dir);
  expect(shown.code, shown.stderr).toBe(0);
  const status = JSON.parse(shown.stdout) as StatusDoc;
  const logs: Record<string, string> = {};
  for (const t of status.tasks ?? [{ name: status.name }]) {
    const log = await gpl(["job", "logs", id, ...(status.tasks ? ["--task", t.name] : [])], dir);
    logs[t.name] = scrub(log.stdout);
  }
  return { run, status, logs };
}

/** A job's folder at each place: a copy of an example, or a job file written there. */
function folders(name: string, make: (dir: string, place: Place) => void): Record<Place, string> {
  const at = (place: Place) => {
    const dir = join(places[place].root, name);
    mkdirSync(dir, { recursive: true });
    make(dir, place);
    return dir;
  };
  return { here: at("here"), fleet: at("fleet") };
}
const example = (name: string) => (dir: string) => cpSync(join(ROOT, "examples", name), dir, { recursive: true });
const jobFile = (lines: string[]) => (dir: string) => writeFileSync(join(dir, "job.yaml"), [...lines, ""].join("\n"));

/** Run the same job here and through the server; expect the same documents and logs; give both for what else a case checks. */
async function sameBothWays(name: string, make: (dir: string, place: Place) => void, args: string[], opts: { cache: boolean }): Promise<Record<Place, Ran>> {
  const dirs = folders(name, make);
  const ran = { here: await runAt("here", dirs.here, args), fleet: await runAt("fleet", dirs.fleet, args) };
  recorded.push({ name, here: ran.here.status, fleet: ran.fleet.status });
  expect(ran.fleet.run.code).toBe(ran.here.run.code);
  expect(comparable(ran.fleet.status, opts.cache)).toEqual(comparable(ran.here.status, opts.cache));
  expect(ran.fleet.logs).toEqual(ran.here.logs);
  return ran;
}

/** Every pair of documents the cases compared, for the events' own test at the end. */
const recorded: { name: string; here: StatusDoc; fleet: StatusDoc }[] = [];
/** Events that name a worker: a fleet's own, with nothing to match here. */
const ASSIGNMENT = new Set(["job.assigned", "task.assigned"]);
/** The kinds of event a job recorded (each once, sorted: tasks side by side interleave theirs differently). */
const eventKinds = (doc: StatusDoc) => [...new Set(doc.events.map((e) => e.type).filter((t) => !ASSIGNMENT.has(t)))].sort();

/** What each shipped example shows beyond running the same both ways; an example not named here is checked for that alone. */
const EXAMPLE_CHECKS: Record<string, (ran: Ran) => void> = {
  hello: (ran) => expect(ran.logs.hello).toContain("done: sum=190"),
  pipeline: (ran) => {
    expect(ran.status.tasks!.map((t) => [t.name, t.state, t.outputs.map((o) => o.path)])).toEqual([["prepare", "succeeded", ["rows.json"]], ["report-old", "succeeded", []], ["report-new", "succeeded", []]]);
    expect(ran.logs["report-old"]).toBe("tqdm 4.66.5: sum of 200 rows = 19900\n");
    expect(ran.logs["report-new"]).toBe("tqdm 4.67.1: sum of 100 rows = 4950\n");
  },
};

describe("every example in examples/, here and through a server with two workers", () => {
  test.each(readdirSync(join(ROOT, "examples")).sort())("examples/%s", async (name) => {
    // An env new to both places (requirements of the example's own): a miss both ways.
    const { here } = await sameBothWays(name, example(name), ["-f", "job.yaml", "--index-url", index.url], { cache: true });
    expect(here.status.state).toBe("succeeded");
    EXAMPLE_CHECKS[name]?.(here);
  }, T);
});

describe("job files, here and through a server with two workers", () => {
  test("tasks with outputs: on the fleet, the tasks that pass files run on different workers", async () => {
    // make -> a and b, which meet (one slot per worker): so on the fleet one of them runs where make did not.
    const meets = (at: string, me: string, other: string) =>
      JSON.stringify(`cat data/one.txt; touch ${at}/${me}; t=0; while [ ! -e ${at}/${other} ]; do sleep 0.1; t=$((t+1)); [ $t -lt 300 ] || exit 9; done`);
    const ran = await sameBothWays("outputs", (dir, place) => {
      // Where a and b meet: a folder of the place's own (its path is scrubbed like a home's).
      const at = join(places[place].root, "meet");
      mkdirSync(at);
      jobFile([
        "tasks:",
        `  make: {command: "mkdir -p data && echo one > data/one.txt && echo skip > data/two.log", outputs: ["data/*.txt"]}`,
        `  a: {command: ${meets(at, "a", "b")}, needs: [make]}`,
        `  b: {command: ${meets(at, "b", "a")}, needs: [make]}`,
      ])(dir);
    }, ["-f", "job.yaml"], { cache: false });
    expect(ran.here.status.tasks!.map((t) => [t.name, t.state, t.outputs])).toEqual([
      ["make", "succeeded", [{ path: "data/one.txt", bytes: 4 }]],
      ["a", "succeeded", []],
      ["b", "succeeded", []],
    ]);
    const [make, a, b] = ran.fleet.status.tasks!;
    expect(new Set([a!.worker, b!.worker])).toEqual(new Set(["w1", "w2"]));
    expect([a!.worker, b!.worker]).toContain(make!.worker === "w1" ? "w2" : "w1");
  }, T);

  test("env variables: the job's, a task's own, -e; none of the client's settings", async () => {
    const show = JSON.stringify('echo "$GREETING $SHARED $FROM_FLAG server=${GPULAYER_SERVER-unset} token=${GPULAYER_TOKEN-unset}"');
    const { here } = await sameBothWays(
      "variables",
      jobFile(["name: variables", "env: {GREETING: hello, SHARED: job}", "tasks:", `  one: {command: ${show}, env: {SHARED: task}}`, `  two: {command: ${show}, needs: [one]}`]),
      ["-f", "job.yaml", "-e", "FROM_FLAG=flag"],
      { cache: false },
    );
    expect(here.logs).toEqual({ one: "hello task flag server=unset token=unset\n", two: "hello job flag server=unset token=unset\n" });
  }, T);

  test("a failing task: the job fails with its exit code, what needs it is skipped, what does not still runs", async () => {
    const { here } = await sameBothWays(
      "failing",
      jobFile(["tasks:", "  breaks: {command: 'echo breaking; exit 5'}", "  after: {command: echo never, needs: [breaks]}", "  last: {command: echo never, needs: [after]}", "  aside: {command: echo aside}"]),
      ["-f", "job.yaml"],
      { cache: false },
    );
    expect([here.run.code, here.status.state, here.status.exit_code]).toEqual([5, "failed", 5]);
    expect(here.status.tasks!.map((t) => [t.name, t.state, t.exit_code])).toEqual([["breaks", "failed", 5], ["after", "skipped", null], ["last", "skipped", null], ["aside", "succeeded", 0]]);
  }, T);

  test("a prepare timeout: the job fails in task.prepare with one line, its command never runs", async () => {
    const { here } = await sameBothWays(
      "timeout",
      jobFile(["command: echo ran", "environment:", "  requirements: [hangs-anywhere]", `  index_url: ${index.url}`, "  prepare_timeout: 3s"]),
      ["-f", "job.yaml"],
      { cache: true },
    );
    expect([here.run.code, here.status.state]).toEqual([1, "failed"]);
    expect(here.status.error).toMatch(/^timed out after 3 s while installing 1 requirement/);
    expect(here.logs).toEqual({ job: "" });
  }, T);

  // Skipped where no engine answers or the Python image cannot be made, unless the run requires the engines (CI does): then it fails, saying why.
  (imageReady || REQUIRED ? test : test.skip)(`an image with requirements (${ENGINE ?? "no engine"}): installed on top of the image's Python, imported by the job`, async () => {
    if (!imageReady) throw new Error(`the image case cannot run: ${"reason" in rootfs ? rootfs.reason : "no engine"}`);
    const { here } = await sameBothWays(
      "image",
      jobFile(["name: boxed", `command: python -c "import greetb; print('greetb', greetb.__version__)"`, "environment:", `  image: ${IMAGE}`, "  requirements: [greetb==1.0]", `  index_url: ${index.url}`]),
      ["-f", "job.yaml"],
      { cache: true },
    );
    expect(here.status.state).toBe("succeeded");
    expect(here.logs).toEqual({ boxed: "greetb 1.0\n" });
  }, T);

  test("a GPU asked of machines without one: refused the same way, one line and one exit code, nothing recorded", async () => {
    const dirs = folders("gpu", (dir) => {
      jobFile(["command: echo ran"])(dir);
      writeFileSync(join(dir, "tasks.yaml"), ["tasks:", "  first: {command: echo first}", "  train: {command: echo ran, needs: [first], resources: {gpus: 1}}", ""].join("\n"));
    });
    const refusal = async (place: Place, args: string[]) => {
      const r = await places[place].gpl(["job", "run", ...args], dirs[place]);
      return { code: r.code, line: r.stderr.trimEnd().split("\n").at(-1), stdout: r.stdout };
    };
    const jobCount = async (place: Place) => (JSON.parse((await places[place].gpl(["job", "list", "--json"])).stdout) as unknown[]).length;
    const before = { here: await jobCount("here"), fleet: await jobCount("fleet") };
    for (const args of [["--gpus", "1", "-f", "job.yaml"], ["-f", "tasks.yaml"], ["--gpus", "1", "-f", "job.yaml", "--json"]]) {
      const [here, fleet] = [await refusal("here", args), await refusal("fleet", args)];
      expect(fleet).toEqual(here);
      expect(here.code).toBe(1);
      expect(here.line).toMatch(/^error: (job|task train) refused: it needs 1 GPU; no machine it can run on has more than 0$/);
    }
    // Refused before anything is recorded: no job more in either place.
    expect({ here: await jobCount("here"), fleet: await jobCount("fleet") }).toEqual(before);
  }, T);
});

describe("the events each job recorded, here and through the server", () => {
  // Last in the file: it reads what the cases above recorded.
  test("are of the same kinds, apart from a worker's assignment", () => {
    expect(recorded.length).toBeGreaterThan(0);
    const kinds = (place: Place) => Object.fromEntries(recorded.map((r) => [r.name, eventKinds(r[place])]));
    expect(kinds("fleet")).toEqual(kinds("here"));
  });
});
