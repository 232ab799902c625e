import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { Database } from "bun:sqlite";
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, statSync, truncateSync, linkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, makeWorkerVenv, ROOT, sandbox, serversOnPostgres, startCli, tempDir } from "./helpers.ts";
import { keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * Files between tasks (`outputs:`), run here and through a server with two
 * workers whose homes differ (real processes on 127.0.0.1): the shipped
 * pipeline example succeeds both ways, a task finds what the tasks it needs
 * left even on another worker, a declared output that is missing fails its
 * task with one line and skips what needs it, `job outputs` fetches them, and
 * an outputs archive that would leave its folder is refused.
 */

const TOKEN = "job-outputs-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "5", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1", GPULAYER_WORKER_SLOTS: "1" };
const T = 180_000;
const boxes = { local: sandbox(), server: sandbox(), w1: sandbox(), w2: sandbox(), client: sandbox() };
const index = new PackageIndex(join(boxes.client.root, "index"));
const procs: { proc: ReturnType<typeof startCli>; out: () => string }[] = [];
const meeting = tempDir("gpl-out-meet-");
let url = "";
let localPython = "";

const json = <T = any>(text: string): T => JSON.parse(text) as T;
const here = (args: string[], cwd: string) => cli(args, { env: { ...boxes.local.env, GPULAYER_PYTHON: localPython }, cwd });
const fleet = (args: string[], cwd = boxes.client.root) => cli(args, { env: { ...boxes.client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN }, cwd });

/** A stand-in tqdm of each pinned version: `tqdm.tqdm` passes its iterable through. */
const tqdm = (version: string) => ({ name: "tqdm", version, files: { "tqdm/__init__.py": `__version__ = ${JSON.stringify(version)}\ndef tqdm(it, **kw):\n    return it\n` } });

beforeAll(async () => {
  index.start();
  index.wheel(tqdm("4.66.5"));
  index.wheel(tqdm("4.67.1"));
  localPython = await makeWorkerVenv(join(boxes.local.root, "venv"), { env: boxes.local.env });
  const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { GPULAYER_TOKEN: TOKEN, ...boxes.server.env, ...FAST } }), procs);
  url = (await waitFor("the server", async () => /"url": "([^"]+)"/.exec(server.out())?.[1])) as string;
  for (const name of ["w1", "w2"] as const) {
    const venv = await makeWorkerVenv(join(boxes[name].root, "venv"), { env: boxes[name].env });
    keepOutput(startCli(["join", url, "--name", name, "--python", venv], { env: { ...boxes[name].env, ...FAST, GPULAYER_TOKEN: TOKEN } }), procs);
  }
  await waitFor("two workers", async () => json<unknown[]>((await fleet(["workers", "--json"])).stdout).length === 2);
}, T);

afterAll(async () => {
  await stopAll(procs);
  index.stop();
  for (const b of Object.values(boxes)) b.cleanup();
}, 30_000);

/** A copy of examples/pipeline (its runs write rows.json into their folder). */
function pipelineCopy(where: string): string {
  const dir = join(where, "pipeline");
  cpSync(join(ROOT, "examples", "pipeline"), dir, { recursive: true });
  return dir;
}

function jobDir(where: string, name: string, yaml: string[]): string {
  const dir = join(where, name);
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "job.yaml"), [...yaml, ""].join("\n"));
  return dir;
}

interface TaskDoc {
  name: string;
  id: string;
  state: string;
  exit_code: number | null;
  error: string | null;
  worker?: string | null;
  outputs: { path: string; bytes: number }[];
}

const ROWS_JSON_BYTES = JSON.stringify([...Array(200).keys()]).replace(/,/g, ", ").length;

/** The pipeline example run in `dir`: every task succeeded, prepare's output listed with its size, each report's line said. */
async function runPipeline(gpl: typeof here, dir: string): Promise<{ id: string; state: string; tasks: TaskDoc[] }> {
  const r = await gpl(["job", "run", "-f", "job.yaml", "--index-url", index.url, "--json"], dir);
  expect(r.code, r.stderr).toBe(0);
  const status = json<{ id: string; state: string; tasks: TaskDoc[] }>(r.stdout);
  expect(status.tasks.map((t) => [t.name, t.state])).toEqual([["prepare", "succeeded"], ["report-old", "succeeded"], ["report-new", "succeeded"]]);
  expect(status.tasks[0]!.outputs).toEqual([{ path: "rows.json", bytes: ROWS_JSON_BYTES }]);
  expect(r.stderr).toContain("[report-old] tqdm 4.66.5: sum of 200 rows = 19900");
  expect(r.stderr).toContain("[report-new] tqdm 4.67.1: sum of 100 rows = 4950");
  return status;
}

describe("examples/pipeline, which passes rows.json from prepare to both reports", () => {
  test("succeeds here; job status lists the output with its size; job outputs fetches it", async () => {
    const dir = pipelineCopy(boxes.local.root);
    const status = await runPipeline(here, dir);
    const shown = await here(["job", "status", status.id], dir);
    expect(shown.stdout).toContain("outputs rows.json (");

    const out = join(boxes.local.root, "fetched");
    const fetched = await here(["job", "outputs", status.id, "-o", out, "--json"], dir);
    expect(fetched.code, fetched.stderr).toBe(0);
    expect(json(fetched.stdout)).toEqual({ id: status.id, dir: out, tasks: [{ name: "prepare", files: [{ path: "rows.json", bytes: ROWS_JSON_BYTES }] }, { name: "report-old", files: [] }, { name: "report-new", files: [] }] });
    expect(readFileSync(join(out, "prepare", "rows.json"), "utf8")).toBe(readFileSync(join(dir, "rows.json"), "utf8"));
    // What a later run writes in the folder does not change what was kept.
    writeFileSync(join(dir, "rows.json"), "[1]");
    const one = join(boxes.local.root, "one");
    expect((await here(["job", "outputs", status.id, "--task", "prepare", "-o", one], dir)).code).toBe(0);
    expect(JSON.parse(readFileSync(join(one, "rows.json"), "utf8"))).toHaveLength(200);
  }, T);

  test("succeeds through a server with two workers, each task in its own folder; job outputs fetches from the server", async () => {
    const dir = pipelineCopy(boxes.client.root);
    const status = await runPipeline(fleet, dir);
    // Nothing was written in the client's folder: the file went through the server.
    expect(existsSync(join(dir, "rows.json"))).toBe(false);

    const out = join(boxes.client.root, "fetched");
    // Its scratch is under the system's temporary folder, never the home; what a killed client left there goes.
    const tmp = join(boxes.client.root, "tmp");
    const left = join(tmp, "gpulayer-outputs-999999999-0123abcd");
    mkdirSync(join(left, "prepare"), { recursive: true });
    const homeBefore = readdirSync(boxes.client.home).sort();
    const fetched = await cli(["job", "outputs", status.id, "--task", "prepare", "-o", out, "--json"], { env: { ...boxes.client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN, TMPDIR: tmp }, cwd: boxes.client.root });
    expect(fetched.code, fetched.stderr).toBe(0);
    expect(json(fetched.stdout)).toEqual({ id: status.id, dir: out, tasks: [{ name: "prepare", files: [{ path: "rows.json", bytes: ROWS_JSON_BYTES }] }] });
    expect(JSON.parse(readFileSync(join(out, "rows.json"), "utf8"))).toHaveLength(200);
    expect(readdirSync(tmp)).toEqual([]);
    expect(readdirSync(boxes.client.home).sort()).toEqual(homeBefore);
  }, T);
});

describe("the job file's outputs:", () => {
  test("each is a path inside the task's folder: otherwise one line naming its key", async () => {
    for (const [bad, why] of [["../up.json", "must stay inside the task's folder (no `..`)"], ["/etc/passwd", "must be a path relative to the task's folder, not an absolute one"]]) {
      const dir = jobDir(boxes.local.root, "bad-outputs", ["tasks:", `  prepare: {command: "true", outputs: [rows.json, ${JSON.stringify(bad)}]}`]);
      const r = await here(["job", "run", "-f", "job.yaml"], dir);
      expect([r.code, r.stderr]).toEqual([2, `error: job.yaml: tasks.prepare.outputs[1]: ${why}\n`]);
    }
  });
});

describe("outputs kept here", () => {
  test("outputs that cannot be kept in the job store fail their task with one line here, and the job ends", async () => {
    // A file where the store keeps outputs: copying there fails (ENOTDIR), even as root.
    const home = join(boxes.local.root, "home-store-full");
    mkdirSync(join(home, "jobs"), { recursive: true });
    writeFileSync(join(home, "jobs", "outputs"), "");
    const dir = jobDir(boxes.local.root, "unkept", ["tasks:", "  make: {command: 'echo made > made.txt', outputs: [made.txt]}", "  use: {command: cat made.txt, needs: [make]}"]);
    const r = await cli(["job", "run", "-f", "job.yaml", "--json"], { env: { ...boxes.local.env, GPULAYER_HOME: home, GPULAYER_PYTHON: localPython }, cwd: dir });
    expect(r.code, r.stderr).toBe(1);
    const status = json<{ state: string; tasks: TaskDoc[] }>(r.stdout);
    expect(status.state).toBe("failed");
    expect(status.tasks.map((t) => [t.name, t.state, t.exit_code])).toEqual([["make", "failed", 1], ["use", "skipped", null]]);
    expect(status.tasks[0]!.error).toStartWith("task make: its outputs could not be kept: ENOTDIR");
    expect(status.tasks[0]!.error).not.toContain("\n");
  }, T);

  test("job outputs into a folder that holds the same files already: compared without reading them whole, so an output larger than memory is fine", async () => {
    const dir = jobDir(boxes.local.root, "large", ["tasks:", "  make: {command: 'echo x > big.bin && head -c 200000 /dev/urandom > small.bin', outputs: [big.bin, small.bin]}"]);
    const r = await here(["job", "run", "-f", "job.yaml", "--json"], dir);
    expect(r.code, r.stderr).toBe(0);
    const status = json<{ id: string; tasks: TaskDoc[] }>(r.stdout);
    // The kept copy made 4.5 GiB (sparse: no disk used) and linked at the destination (the same file): read whole, it does not fit.
    const kept = join(boxes.local.home, "jobs", "outputs", status.tasks[0]!.id);
    const out = join(boxes.local.root, "large-fetched");
    mkdirSync(out);
    const size = 4.5 * 2 ** 30;
    writeFileSync(join(kept, "big.bin"), "");
    truncateSync(join(kept, "big.bin"), size);
    linkSync(join(kept, "big.bin"), join(out, "big.bin"));
    // Another file with the same bytes (compared chunk by chunk): left as it is.
    cpSync(join(kept, "small.bin"), join(out, "small.bin"));
    const fetched = await here(["job", "outputs", status.id, "--task", "make", "-o", out], dir);
    expect([fetched.code, fetched.stderr]).toEqual([0, ""]);
    expect(statSync(join(out, "big.bin")).size).toBe(size);
    // Its last byte changed: refused, with the line that names it.
    const bytes = readFileSync(join(kept, "small.bin"));
    bytes[bytes.length - 1]! ^= 1;
    writeFileSync(join(out, "small.bin"), bytes);
    const refused = await here(["job", "outputs", status.id, "--task", "make", "-o", out], dir);
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toBe(`error: ${join(out, "small.bin")} exists already and holds something else: give -o an empty folder\n`);
  }, T);
});

describe("outputs through a server", () => {
  test("a task finds what a task it needs (through another) left, on another worker", async () => {
    // make -> shape -> a and b, which meet (one slot each: one per worker); so one of them runs where make did not.
    const meets = (me: string, other: string) =>
      JSON.stringify(`cat data/one.txt shaped.txt; touch ${meeting}/${me}; t=0; while [ ! -e ${meeting}/${other} ]; do sleep 0.1; t=$((t+1)); [ $t -lt 300 ] || exit 9; done`);
    const dir = jobDir(boxes.client.root, "spread", [
      "tasks:",
      `  make: {command: "mkdir -p data && echo one > data/one.txt && echo two > data/two.log", outputs: ["data/*.txt"]}`,
      `  shape: {command: "test ! -e data/two.log && echo shaped > shaped.txt", outputs: [shaped.txt], needs: [make]}`,
      `  a: {command: ${meets("a", "b")}, needs: [shape]}`,
      `  b: {command: ${meets("b", "a")}, needs: [shape]}`,
    ]);
    const r = await fleet(["job", "run", "-f", "job.yaml", "--json"], dir);
    expect(r.code, r.stderr).toBe(0);
    const tasks = json<{ tasks: TaskDoc[] }>(r.stdout).tasks;
    expect(tasks.map((t) => [t.name, t.state, t.outputs])).toEqual([
      ["make", "succeeded", [{ path: "data/one.txt", bytes: 4 }]],
      ["shape", "succeeded", [{ path: "shaped.txt", bytes: 7 }]],
      ["a", "succeeded", []],
      ["b", "succeeded", []],
    ]);
    const [make, , a, b] = tasks;
    expect(new Set([a!.worker, b!.worker])).toEqual(new Set(["w1", "w2"]));
    expect([a!.worker, b!.worker]).toContain(make!.worker === "w1" ? "w2" : "w1");
    expect(r.stderr).toContain("[a] one\n");
    expect(r.stderr).toContain("[b] shaped\n");
  }, T);

  test("a missing declared output fails its task with one line, here and through a server; what needs it is skipped", async () => {
    const yaml = ["tasks:", "  make: {command: 'echo made > made.txt', outputs: [made.txt, rows.json]}", "  use: {command: cat rows.json, needs: [make]}"];
    for (const [where, run] of [[boxes.local.root, here], [boxes.client.root, fleet]] as const) {
      const dir = jobDir(where, "missing", yaml);
      const r = await run(["job", "run", "-f", "job.yaml", "--json"], dir);
      expect(r.code).toBe(1);
      const status = json<{ state: string; tasks: TaskDoc[] }>(r.stdout);
      expect(status.tasks.map((t) => [t.name, t.state, t.exit_code, t.error])).toEqual([
        ["make", "failed", 1, "task make: declared output rows.json is missing"],
        ["use", "skipped", null, "not started: make, which it needs, failed"],
      ]);
      const shown = await run(["job", "status", json<{ id: string }>(r.stdout).id], dir);
      expect(shown.stdout).toContain("task make: declared output rows.json is missing\n");
      expect(shown.stdout).toContain("not started: make, which it needs, failed\n");
      // As it runs, the task's end says why, not only its code (its command succeeded).
      const said = await run(["job", "run", "-f", "job.yaml"], dir);
      expect(said.stderr).toContain("[make] failed (task make: declared output rows.json is missing)\n");
    }
  }, T);

  test("outputs that cannot be put in the folder of a task that needs them fail it in task.prepare with one line, through a server as here", async () => {
    // The job's folder holds a folder where the file `make` leaves goes: a worker's fresh copy of it for `use` cannot take the file.
    const dir = jobDir(boxes.client.root, "unplaceable", ["tasks:", "  make: {command: 'rm -r rows.json && echo x > rows.json', outputs: [rows.json]}", "  use: {command: 'echo never', needs: [make]}"]);
    mkdirSync(join(dir, "rows.json"));
    writeFileSync(join(dir, "rows.json", "keep"), "a folder, not a file");
    const r = await fleet(["job", "run", "-f", "job.yaml", "--json"], dir);
    const tasks = json<{ tasks: TaskDoc[] }>(r.stdout).tasks;
    expect(tasks.map((t) => [t.name, t.state])).toEqual([
      ["make", "succeeded"],
      ["use", "failed"],
    ]);
    expect(tasks[1]!.error).toStartWith("task use: the outputs of the tasks it needs could not be put in its folder: ");
    const events = json<{ events: { type: string; data: { message?: string } }[] }>((await fleet(["job", "status", tasks[1]!.id, "--json"])).stdout).events;
    expect(events.find((e) => e.type === "task.prepare.failed")?.data.message).toBe(tasks[1]!.error!);
    expect(events.some((e) => e.type === "task.bundle.failed")).toBe(false);
  }, T);

  test("a path through a link in the task's folder is never an output, here and through a server: the file it leads to stays where it is", async () => {
    const secret = tempDir("gpl-out-secret-");
    writeFileSync(join(secret, "credential"), "s3cret");
    const yaml = [
      "tasks:",
      `  one: {command: "ln -s ${secret} d", outputs: [d/credential]}`,
      `  all: {command: "ln -s ${secret} e", outputs: ["e/*"]}`,
    ];
    for (const [where, run] of [[boxes.local.root, here], [boxes.client.root, fleet]] as const) {
      const dir = jobDir(where, "linked", yaml);
      const r = await run(["job", "run", "-f", "job.yaml", "--json"], dir);
      expect(r.code).toBe(1);
      const status = json<{ id: string; tasks: TaskDoc[] }>(r.stdout);
      expect(status.tasks.map((t) => [t.name, t.state, t.error, t.outputs])).toEqual([
        ["one", "failed", "task one: declared output d/credential is missing", []],
        ["all", "succeeded", null, []],
      ]);
      const out = join(where, "linked-fetched");
      expect((await run(["job", "outputs", status.id, "-o", out], dir)).code).toBe(0);
      expect(existsSync(join(out, "one", "d"))).toBe(false);
      expect(existsSync(join(out, "all", "e"))).toBe(false);
    }
  }, T);

  test("an outputs archive that would leave its folder is refused by the server, and another worker's task is not its to fill", async () => {
    const gate = join(meeting, "gate");
    const dir = jobDir(boxes.client.root, "hostile", ["tasks:", `  hold: {command: "while [ ! -e ${gate} ]; do sleep 0.1; done; echo ok > ok.txt", outputs: [ok.txt]}`]);
    const d = await fleet(["job", "run", "-d", "-f", "job.yaml"], dir);
    expect(d.code, d.stderr).toBe(0);
    const id = d.stdout.trim();
    const running = await waitFor("the task to run", async () => {
      const t = json<{ tasks: TaskDoc[] }>((await fleet(["job", "status", id, "--json"])).stdout).tasks[0]!;
      return t.state === "running" ? t : null;
    });
    // The task's id is read from the server's SQLite file: on PostgreSQL this part is left to the suite's SQLite run.
    if (!serversOnPostgres) {
      // The worker's task id, as the server knows it.
      const db = new Database(join(boxes.server.home, "server", "server.db"), { readonly: true });
      const taskId = db.query<{ id: string }, [string]>("SELECT id FROM tasks WHERE job_id = ? AND state IN ('assigned', 'running')").get(running.id)!.id;
      db.close();
      const credential = (name: string) => {
        const folder = join(boxes[name as "w1" | "w2"].home, "cluster", "identity");
        return json<{ credential: string }>(readFileSync(join(folder, readdirSync(folder)[0]!), "utf8")).credential;
      };
      const put = async (archive: Uint8Array, who: string) => {
        const hash = new Bun.CryptoHasher("sha256").update(archive).digest("hex");
        const res = await fetch(`${url}/v1/tasks/${taskId}/outputs/${hash}`, { method: "PUT", body: archive, headers: { authorization: `Bearer ${credential(who)}` } });
        return { status: res.status, body: await res.text() };
      };
      const other = running.worker === "w1" ? "w2" : "w1";
      for (const entries of [[{ name: "../escape.txt", type: "file" }], [{ name: "out", type: "symlink", target: "/tmp" }, { name: "out/x.txt", type: "file" }], [{ name: "/abs.txt", type: "file" }]]) {
        const archive = await tarGz(entries);
        const refused = await put(archive, running.worker!);
        expect(refused.status, refused.body).toBe(400);
        expect(json(refused.body).error).toMatch(/^bundle refused/);
        expect((await put(archive, other)).status).toBe(404);
      }
    }
    writeFileSync(gate, "");
    await waitFor("the job to end", async () => json((await fleet(["job", "status", id, "--json"])).stdout).state === "succeeded");
    expect(json<{ tasks: TaskDoc[] }>((await fleet(["job", "status", id, "--json"])).stdout).tasks[0]!.outputs).toEqual([{ path: "ok.txt", bytes: 3 }]);
  }, T);
});

/** A tar.gz written entry by entry as given (python's tarfile: any path, links to anywhere): what a hostile worker could send. */
async function tarGz(entries: { name: string; type: string; target?: string }[]): Promise<Uint8Array> {
  const file = join(tempDir("gpl-hostile-"), "a.tar.gz");
  const writer = `
import io, json, sys, tarfile
with tarfile.open(sys.argv[1], "w:gz", format=tarfile.PAX_FORMAT) as t:
    for e in json.load(sys.stdin):
        i = tarfile.TarInfo(e["name"])
        data = None
        if e["type"] == "symlink": i.type, i.linkname = tarfile.SYMTYPE, e["target"]
        else:
            data = b"x"
            i.size = 1
        t.addfile(i, io.BytesIO(data) if data is not None else None)
`;
  const proc = Bun.spawn(["python3", "-c", writer, file], { stdin: new TextEncoder().encode(JSON.stringify(entries)), stdout: "pipe", stderr: "pipe" });
  if ((await proc.exited) !== 0) throw new Error(await new Response(proc.stderr).text());
  return new Uint8Array(readFileSync(file));
}
