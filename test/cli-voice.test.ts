import { afterAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import type { ArgsDef, CommandDef } from "citty";
import { runCommand } from "citty";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { shellSplit } from "../src/docker/shellwords.ts";
import { rejectUnknownFlags } from "../src/commands/_args.ts";
import { EXAMPLES } from "../src/commands/_examples.ts";
import { helpText } from "../src/commands/_help.ts";
import { formatAgo, Output } from "../src/ui/output.ts";
import { cli, makeWorkerVenv, readyKeys, sandbox } from "./helpers.ts";
import { PackageIndex } from "./fixtures/index.ts";
import { capture } from "../src/ui/terminal.ts";

// Real processes and real builds take seconds; a file that sets none gets 5 s, whatever another file set.
setDefaultTimeout(120_000);

/** One CLI voice: usage lines, help, colour, error and warning lines. In-process where no real process is needed. */

const box = sandbox();
afterAll(() => box.cleanup());

// biome-ignore lint: each command has its own args type
type Loader = () => Promise<CommandDef<any>>;
const COMMANDS: Record<string, Loader> = {
  "env prepare": () => import("../src/commands/env/prepare.ts").then((m) => m.default),
  "env list": () => import("../src/commands/env/list.ts").then((m) => m.default),
  "env show": () => import("../src/commands/env/show.ts").then((m) => m.default),
  "env rm": () => import("../src/commands/env/rm.ts").then((m) => m.default),
  "job run": () => import("../src/commands/job/run.ts").then((m) => m.default),
  "job status": () => import("../src/commands/job/status.ts").then((m) => m.default),
  "job logs": () => import("../src/commands/job/logs.ts").then((m) => m.default),
  "job list": () => import("../src/commands/job/list.ts").then((m) => m.default),
  "job cancel": () => import("../src/commands/job/cancel.ts").then((m) => m.default),
  gc: () => import("../src/commands/gc.ts").then((m) => m.default),
  config: () => import("../src/commands/config.ts").then((m) => m.default),
  join: () => import("../src/commands/join.ts").then((m) => m.default),
  server: () => import("../src/commands/server.ts").then((m) => m.default),
  workers: () => import("../src/commands/workers.ts").then((m) => m.default),
  version: () => import("../src/commands/version.ts").then((m) => m.default),
};

describe("--help", () => {
  for (const [path, load] of Object.entries(COMMANDS)) {
    test(`${path}: the usage line names the program and the command; no colour off a terminal`, async () => {
      const text = await helpText(await load(), path.split(" "), { color: false });
      expect(text).toContain(`USAGE  gpulayer ${path}`);
      expect(text).not.toMatch(/\u001b\[/);
      expect(text.split("\n").every((l) => l === l.trimEnd())).toBe(true);
    });
  }

  test("job run's usage shows the command after --", async () => {
    expect(await helpText(await COMMANDS["job run"]!(), ["job", "run"], { color: false })).toContain("USAGE  gpulayer job run [OPTIONS] [-- COMMAND ...]");
  });

  test("only the commands that install say --verbose shows the installer", async () => {
    for (const [path, load] of Object.entries(COMMANDS)) {
      const text = await helpText(await load(), path.split(" "), { color: false });
      const verbose = text.split("\n").find((l) => l.trimStart().startsWith("--verbose")) ?? "";
      expect(verbose.includes("installer")).toBe(path === "env prepare" || path === "job run");
    }
  });

  test("every example under --help uses flags its command has", async () => {
    for (const [path, examples] of Object.entries(EXAMPLES)) {
      if (!path || !COMMANDS[path]) continue;
      const cmd = await COMMANDS[path]!();
      const args = (cmd.args ?? {}) as ArgsDef;
      const subs = Object.keys((cmd.subCommands ?? {}) as object);
      for (const example of examples) {
        const words = shellSplit(example.replace(/\s+#.*$/, ""), "example");
        const at = words.indexOf("gpulayer");
        const rest = words.slice(at + 1 + path.split(" ").length);
        if (subs.includes(rest[0]!)) continue; // a subcommand's example (`config path`): checked under its own path
        expect(() => rejectUnknownFlags(rest, args)).not.toThrow();
      }
    }
  });

  test("gpulayer help [COMMAND...] prints what --help prints; a command that is not there is named", async () => {
    for (const words of [[], ["job"], ["job", "run"], ["server", "token"]]) {
      const help = await cli(["help", ...words], { env: box.env });
      const flag = await cli([...words, "--help"], { env: box.env });
      expect([words.join(" "), help.code, help.stdout]).toEqual([words.join(" "), 0, flag.stdout]);
    }
    expect((await cli(["--help"], { env: box.env })).stdout).toContain("  help ");
    const unknown = await cli(["help", "env", "prepar"], { env: box.env });
    expect([unknown.code, unknown.stdout, unknown.stderr]).toEqual([2, "", "error: unknown command prepar (see gpulayer env --help)\n"]);
  });

  test("as a process: plain when piped, NO_COLOR plain, FORCE_COLOR in colour", async () => {
    const piped = await cli(["job", "run", "--help"], { env: box.env });
    expect(piped.stdout).toStartWith("Prepare the job's environment");
    expect(piped.stdout).not.toMatch(/\u001b\[/);
    const forced = await cli(["job", "run", "--help"], { env: { ...box.env, FORCE_COLOR: "1" } });
    expect(forced.stdout).toMatch(/\u001b\[1mUSAGE/);
    const both = await cli(["job", "run", "--help"], { env: { ...box.env, FORCE_COLOR: "0", NO_COLOR: "1" } });
    expect(both.stdout).not.toMatch(/\u001b\[/);
  });
});

describe("one error style", () => {
  test("warnings and errors from a command are one prefixed line each, no colour, no padding", () => {
    const written: string[] = [];
    capture.sink = (fd, text) => written.push(`${fd}:${text}`);
    try {
      const out = new Output({});
      out.log.warn("pip check: x 1.0 requires y");
      out.log.error("task.prepare failed: nope");
      out.log.info("plain");
    } finally {
      capture.sink = null;
    }
    expect(written).toEqual(["2:warning: pip check: x 1.0 requires y\n", "2:error: task.prepare failed: nope\n", "2:plain\n"]);
  });

  test("a command given without -- gets the hint; a negative size is named", async () => {
    const r = await cli(["job", "run", "-p", "tqdm", "python", "-c", "1"], { env: box.env });
    expect(r.code).toBe(2);
    expect(r.stderr).toBe("error: unexpected argument python: put the command after -- (gpulayer job run -p tqdm -- python -c 1)\n");
    // A misspelled flag before the stray value is what is wrong, not where the command goes.
    const typo = await cli(["job", "run", "-p", "tqdm", "--pyhton", "python3", "--", "python", "-c", "1"], { env: box.env });
    expect([typo.code, typo.stderr]).toEqual([2, "error: unknown option --pyhton (did you mean --python?)\n"]);
    // Nothing near: where to look instead.
    const far = await cli(["job", "run", "--frobnicate", "--", "true"], { env: box.env });
    expect([far.code, far.stderr]).toEqual([2, "error: unknown option --frobnicate (see --help)\n"]);
    // job run's -r, brought to env prepare, where the file is the argument.
    for (const flag of ["-r", "--requirement"]) {
      const r2 = await cli(["env", "prepare", flag, "requirements.txt"], { env: box.env });
      expect([r2.code, r2.stderr]).toEqual([2, `error: unknown option ${flag}: the requirements file is the argument here (gpulayer env prepare requirements.txt)\n`]);
    }
    const neg = await cli(["gc", "--max-size", "-5G"], { env: box.env });
    expect(neg.code).toBe(2);
    expect(neg.stderr).toBe("error: --max-size -5G: a size cannot be negative\n");
    // The parser would take the next flag as the value: the flag that lacks one is named instead.
    const missing = await cli(["gc", "--max-size", "--dry-run"], { env: box.env });
    expect([missing.code, missing.stderr]).toEqual([2, "error: --max-size needs a value (--dry-run is an option)\n"]);
  });

  test("what citty would drop or take as nothing is refused, naming it: extra arguments, a value missing at the end or empty, -r twice", async () => {
    writeFileSync(join(box.root, "a.txt"), "tqdm\n");
    writeFileSync(join(box.root, "b.txt"), "idna\n");
    const cases: [string[], string][] = [
      [["env", "prepare", "a.txt", "b.txt"], "unexpected argument b.txt: one REQ_FILE is taken; for several, write one that names each with -r (see --help)"],
      [["env", "prepare", "a.txt", "--index-url"], "--index-url needs a value"],
      [["env", "prepare", "a.txt", "--index-url", ""], "--index-url needs a value (an empty one was given)"],
      [["env", "prepare", "a.txt", "--index-url="], "--index-url needs a value (an empty one was given)"],
      [["env", "prepare", "a.txt", "--find-links", ""], "--find-links needs a value (an empty one was given)"],
      [["env", "list", "extra"], "unexpected argument extra (see --help)"],
      [["env", "show", "a", "b"], "unexpected argument b: one KEY is taken (see --help)"],
      [["job", "run", "-r"], "-r needs a value"],
      [["job", "run", "-r", "a.txt", "--requirements=b.txt", "--", "true"], "-r is taken once (the last would win, the others dropped); for several files, write one that names each with -r"],
    ];
    for (const [args, line] of cases) {
      const r = await cli(args, { env: box.env, cwd: box.root });
      expect([args.join(" "), r.code, r.stderr]).toEqual([args.join(" "), 2, `error: ${line}\n`]);
    }
    // A flag that is a setting says what empty means in the setting's own words.
    const python = await cli(["env", "prepare", "a.txt", "--python", ""], { env: box.env, cwd: box.root });
    expect([python.code, python.stderr]).toEqual([2, "error: --python : must not be empty\n"]);
  });

  test("a local project that is not there: where it was looked for, when the path was relative (pip reads it from the working folder)", async () => {
    writeFileSync(join(box.root, "edit.txt"), "-e ./missing-proj\n");
    const editable = await cli(["env", "prepare", "edit.txt", "--python", "python3"], { env: box.env, cwd: box.root });
    expect([editable.code, editable.stderr]).toEqual([2, `error: edit.txt:1: editable project not found: ./missing-proj (looked for ${join(box.root, "missing-proj")})\n`]);
    const plain = await cli(["env", "prepare", "-p", "./missing-pkg", "--python", "python3"], { env: box.env, cwd: box.root });
    expect([plain.code, plain.stderr]).toEqual([2, `error: -p[0]: local package not found: ./missing-pkg (looked for ${join(box.root, "missing-pkg")})\n`]);
    const absolute = await cli(["env", "prepare", "-p", join(box.root, "missing-pkg"), "--python", "python3"], { env: box.env, cwd: box.root });
    expect(absolute.stderr).toBe(`error: -p[0]: local package not found: ${join(box.root, "missing-pkg")}\n`);
  });

  test("ages are rounded before their unit is chosen: never '60s ago' or '60 min ago'", () => {
    const now = 10_000_000_000;
    const ago = (seconds: number) => formatAgo(now - seconds * 1000, now);
    expect([ago(0), ago(59.4), ago(59.6), ago(89), ago(3569), ago(3590), ago(86_000), ago(3 * 86_400)]).toEqual(["0s ago", "59s ago", "1 min ago", "1 min ago", "59 min ago", "1 h ago", "1 day ago", "3 days ago"]);
  });

  test("citty's own refusals read as ours: lower case, no full stop", async () => {
    const unknown = await cli(["env", "prepar"], { env: box.env });
    expect([unknown.code, unknown.stderr]).toEqual([2, "error: unknown command prepar (see --help)\n"]);
    const flagsOnly = await cli(["-x"], { env: box.env });
    expect([flagsOnly.code, flagsOnly.stderr]).toEqual([2, "error: no command given, only -x (see gpulayer --help)\n"]);
  });

  test("a timer longer than timers hold is refused, a build or not (a longer one would fire at once)", async () => {
    const r = await cli(["env", "prepare", "-p", "six", "--prepare-timeout", "99999999999999999h"], { env: box.env });
    expect([r.code, r.stderr]).toEqual([2, "error: --prepare-timeout 99999999999999999h: too long: at most 24d\n"]);
    const grace = await cli(["config"], { env: { ...box.env, GPULAYER_CANCEL_GRACE: "30d" } });
    expect([grace.code, grace.stderr]).toEqual([2, "error: GPULAYER_CANCEL_GRACE=30d (environment): too long: at most 24d\n"]);
    // An age is no timer: a bundle kept for 90 days is fine.
    expect((await cli(["config"], { env: { ...box.env, GPULAYER_BUNDLE_RETENTION: "90d" } })).code).toBe(0);
  });

  test("in-process: a command run through citty's runCommand, as its tests would", async () => {
    const before = { ...process.env };
    const printed: string[] = [];
    process.env.GPULAYER_HOME = box.home;
    process.env.GPULAYER_CACHE_MAX_SIZE = "3G";
    capture.sink = (fd, text) => fd === 1 && printed.push(text);
    try {
      await runCommand(await COMMANDS.config!(), { rawArgs: ["--json"] });
    } finally {
      capture.sink = null;
      for (const k of Object.keys(process.env)) if (!(k in before)) delete process.env[k];
      Object.assign(process.env, before);
    }
    const doc = JSON.parse(printed.join("")) as { settings: { name: string; value: unknown; source: string }[] };
    expect(doc.settings.find((s) => s.name === "cache.max_size")).toMatchObject({ value: 3 * 1024 ** 3, source: "env" });
  });
});

describe("an invalid marker", () => {
  const index = new PackageIndex(join(box.root, "index")).start();
  afterAll(() => index.stop());
  test("is one line naming it, not pip's traceback; nothing is left in the cache", async () => {
    index.wheel({ name: "tiny", version: "1.0" });
    const py = await makeWorkerVenv(join(box.root, "worker"), { withPip: true, env: box.env });
    // pip reads the marker (uv's fast path would refuse it in its own words); both must be one line.
    const r = await cli(["env", "prepare", "-p", 'tiny ; python_version >> "3"', "--index-url", index.url, "--python", py], { env: { ...box.env, GPULAYER_INSTALLER: "pip" } });
    expect(r.code).toBe(1);
    const errors = r.stderr.split("\n").filter((l) => l.startsWith("error:"));
    expect(errors).toHaveLength(1);
    expect(errors[0]).toContain("Invalid marker");
    expect(r.stderr).not.toContain("Traceback");
    expect(readyKeys(box.home)).toEqual([]);
    const fast = await cli(["env", "prepare", "-p", 'tiny ; python_version >> "3"', "--index-url", index.url, "--python", py], { env: box.env });
    expect(fast.code).not.toBe(0);
    expect(fast.stderr.split("\n").filter((l) => l.startsWith("error:"))).toHaveLength(1);
    expect(fast.stderr).not.toContain("Traceback");
  });
});
