import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { mkdirSync, statSync, truncateSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { CLI_ARGV, cli, makeWorkerVenv, sandbox, tempDir } from "./helpers.ts";

/**
 * A warm `env prepare` answers from a lane that skips the command tree (src/commands/env/_warm-lane.ts). Whatever
 * the lane answers, the command would have answered alike; whatever it cannot, the command does, from the start.
 * `--` at the end of argv is a form the lane leaves to the command and changes nothing else: the same request both
 * ways, side by side.
 */

setDefaultTimeout(120_000);

const world = tempDir("gpl-lane-");
const index = new PackageIndex(join(world, "index"));
const box = sandbox();
let request: string[];

beforeAll(async () => {
  index.start();
  index.wheel({ name: "lane-pkg", version: "1.0" });
  const worker = await makeWorkerVenv(join(world, "worker"), { env: box.env });
  request = ["env", "prepare", "-p", "lane-pkg", "--index-url", index.url, "--python", worker];
  const built = await cli([...request, "--json"], { env: box.env });
  expect(built.code, built.stderr).toBe(0);
  expect(JSON.parse(built.stdout).status).toBe("built");
});

afterAll(() => {
  index.stop();
  box.cleanup();
});

/** One document with what differs run by run (the time taken) left out. */
const doc = (stdout: string) => {
  const { seconds, ...rest } = JSON.parse(stdout);
  expect(typeof seconds).toBe("number");
  return rest;
};

describe("the warm lane answers as the command does", () => {
  test("--json: the same document, reused, by the lane and by the command", async () => {
    const [lane, command] = [await cli([...request, "--json"], { env: box.env }), await cli([...request, "--json", "--"], { env: box.env })];
    expect([lane.code, command.code]).toEqual([0, 0]);
    expect(doc(lane.stdout)).toEqual(doc(command.stdout));
    expect(doc(lane.stdout).status).toBe("reused");
    expect([lane.stderr, command.stderr]).toEqual(["", ""]);
  });

  test("plain and --quiet: the path on stdout, the same reuse line on stderr", async () => {
    const runs = await Promise.all([[], ["--"], ["--quiet"], ["--quiet", "--"]].map((extra) => cli([...request, ...extra], { env: box.env })));
    const [lane, command, laneQuiet, commandQuiet] = runs;
    for (const r of runs) expect(r!.code).toBe(0);
    expect(lane!.stdout).toBe(command!.stdout);
    expect(laneQuiet!.stdout).toBe(lane!.stdout);
    expect(commandQuiet!.stdout).toBe(lane!.stdout);
    const line = (stderr: string) => stderr.replace(/\(\d+ ms\)/, "(N ms)");
    expect(line(lane!.stderr)).toBe(line(command!.stderr));
    expect(lane!.stderr).toMatch(/^env [0-9a-f]{12} reused \(\d+ ms\): lane-pkg\n$/);
    expect([laneQuiet!.stderr, commandQuiet!.stderr]).toEqual(["", ""]);
  });

  test("a reuse by the lane counts as a use: gc sees it (the entry's last-used time moves)", async () => {
    const path = JSON.parse((await cli([...request, "--json"], { env: box.env })).stdout).path as string;
    const marker = join(path, ".gpulayer", "last-used");
    const old = new Date(Date.now() - 3 * 86_400_000);
    utimesSync(marker, old, old);
    expect((await cli([...request, "--quiet"], { env: box.env })).code).toBe(0);
    expect(statSync(marker).mtimeMs).toBeGreaterThan(Date.now() - 600_000);
  });

  test("an empty flag value on a warm request is the command's refusal, not an env the empty value happens to key", async () => {
    // An env built with `--find-links .`: an empty --find-links, resolved as the working directory, is its key too.
    const here = join(world, "links-here");
    mkdirSync(here, { recursive: true });
    const built = await cli([...request, "--find-links", "."], { env: box.env, cwd: here });
    expect(built.code, built.stderr).toBe(0);
    for (const empty of [["--find-links", ""], ["--find-links="], ["--index-url", ""], ["--extra-index-url="]]) {
      const r = await cli([...request, ...empty], { env: box.env, cwd: here });
      expect({ empty, code: r.code, stdout: r.stdout }).toEqual({ empty, code: 2, stdout: "" });
      expect(r.stderr).toMatch(/^error: --[a-z-]+ needs a value \(an empty one was given\)\n$/);
    }
  });

  test("--verbose: the key's line once, whether the lane answers or the command builds", async () => {
    index.wheel({ name: "lane-verbose", version: "1.0" });
    const verbose = [...request.slice(0, 3), "lane-verbose", ...request.slice(4), "--verbose"];
    for (const status of ["built", "reused"]) {
      const r = await cli(verbose, { env: box.env });
      expect(r.code, r.stderr).toBe(0);
      expect({ status, keyLines: r.stderr.split("\n").filter((l) => l.startsWith("key ")).length }).toEqual({ status, keyLines: 1 });
      expect(r.stderr).toContain(`env ${r.stderr.match(/^key ([0-9a-f]{12})/m)![1]} ${status}`);
      // The lane answers the reuse (and says so with --verbose); a build is the command's.
      expect({ status, lane: r.stderr.includes("answered by env prepare's warm lane") }).toEqual({ status, lane: status === "reused" });
    }
    const command = await cli([...verbose, "--"], { env: box.env });
    expect(command.stderr).not.toContain("warm lane");
  });

  test("a big find-links file just changed is hashed once, by the command, with one line", async () => {
    const big = join(world, "big-links");
    mkdirSync(big, { recursive: true });
    writeFileSync(join(big, "README"), "not a distribution\n");
    const pad = join(big, "zzpad-1.0.tar.gz");
    writeFileSync(pad, "");
    truncateSync(pad, 65 * 1024 * 1024);
    const r = await cli([...request, "--find-links", big], { env: box.env });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr.split("\n").filter((l) => l.includes(`hashing ${pad}`))).toHaveLength(1);
  });

  test("python from the config file, a variable and a flag at once: the flag wins, then the variable, as for the command", async () => {
    const home = join(world, "home-layers");
    mkdirSync(home, { recursive: true });
    writeFileSync(join(home, "config.yaml"), "python: /nowhere/config-python\n");
    const env = { ...box.env, GPULAYER_HOME: home, GPULAYER_PYTHON: "/nowhere/variable-python" };
    const flagged = request; // --python WORKER is in it
    const built = await cli([...flagged, "--json"], { env });
    expect(built.code, built.stderr).toBe(0);
    const [lane, command] = [await cli([...flagged, "--json", "--verbose"], { env }), await cli([...flagged, "--json", "--"], { env })];
    expect(doc(lane.stdout)).toEqual(doc(command.stdout));
    expect(doc(lane.stdout)).toMatchObject({ status: "reused", key: doc(built.stdout).key });
    expect(lane.stderr).toContain("answered by env prepare's warm lane");
    // Without the flag, the variable names the Python, over the file: both ways the same refusal, naming it.
    const noFlag = request.filter((w, i) => w !== "--python" && request[i - 1] !== "--python");
    const [laneVar, commandVar] = [await cli(noFlag, { env }), await cli([...noFlag, "--"], { env })];
    expect([laneVar.code, commandVar.code]).toEqual([2, 2]);
    expect(laneVar.stderr).toBe(commandVar.stderr);
    expect(laneVar.stderr).toContain("GPULAYER_PYTHON");
    expect(laneVar.stderr).toContain("/nowhere/variable-python");
  });

  test("a bad setting on a warm request is the command's one line and exit 2", async () => {
    const r = await cli([...request, "--prepare-timeout", "soon"], { env: box.env });
    expect(r.code).toBe(2);
    expect(r.stdout).toBe("");
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
    expect(r.stderr).toMatch(/^error: --prepare-timeout soon: /);
  });
});

describe("what the lane leaves to the command", () => {
  test("with a server set (GPULAYER_SERVER), a ready env here is not the answer: the request goes to the server", async () => {
    const r = await cli([...request, "--json"], { env: { ...box.env, GPULAYER_SERVER: "http://127.0.0.1:9", GPULAYER_TOKEN: "t0ken" } });
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain("127.0.0.1:9");
    expect(r.stdout).not.toContain('"status": "reused"');
  });

  test("a token on standard input (GPULAYER_TOKEN_FILE=-) is read by the command, once", async () => {
    const proc = Bun.spawn([...CLI_ARGV, ...request], { env: { ...box.env, GPULAYER_SERVER: "http://127.0.0.1:9", GPULAYER_TOKEN_FILE: "-" }, stdin: new Blob(["t0ken\n"]), stdout: "pipe", stderr: "pipe" });
    const [stderr, code] = await Promise.all([new Response(proc.stderr).text(), proc.exited]);
    expect(code).not.toBe(0);
    // The server is what failed (nothing listens there), not the token: it was there to read.
    expect(stderr).not.toContain("holds no token");
    expect(stderr).toContain("127.0.0.1:9");
  });

  test("a request whose env is not ready is built by the command, with its progress", async () => {
    index.wheel({ name: "lane-other", version: "1.0" });
    const r = await cli([...request.slice(0, 3), "lane-other", ...request.slice(4)], { env: box.env });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/installing 1 requirement/);
    expect(r.stderr).toMatch(/env [0-9a-f]{12} built in /);
  });
});
