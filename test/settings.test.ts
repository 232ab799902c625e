import { afterAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { resolveSettings } from "../src/config/resolve.ts";
import { settingsMarkdown } from "../src/config/report.ts";
import { SETTING_NAMES, SETTINGS, type SettingDef, type SettingName } from "../src/config/table.ts";
import { ExitCode, UsageError } from "../src/errors.ts";
import { CLI_ARGV, cli, sandbox } from "./helpers.ts";

// Real processes and real builds take seconds; a file that sets none gets 5 s, whatever another file set.
setDefaultTimeout(120_000);

/**
 * Every setting of the table, from every source: flag > GPULAYER_* variable >
 * config file > default in each combination, and a bad value from each
 * source is one line naming that source (exit 2).
 */

const box = sandbox();
afterAll(() => box.cleanup());

/** Two good values and a bad one for each kind, as text (what a variable or a flag holds). */
function samples(name: SettingName): { a: string; b: string; c: string; bad?: string } {
  const def = SETTINGS[name] as SettingDef<unknown>;
  switch (def.kind.name) {
    case "size":
      return { a: "1G", b: "2G", c: "3M", bad: "1x" };
    case "duration":
      return { a: "5s", b: "7m", c: "2h", bad: "soon" };
    case "count":
      return { a: "2", b: "3", c: "4", bad: "two" };
    case "boolean":
      return { a: "true", b: "false", c: "1", bad: "maybe" };
    case "url":
      return { a: "http://a.example:1", b: "http://b.example:2", c: "https://c.example", bad: "ftp://x.example" };
    case "database url":
      return { a: "postgres://gpl:pw-a@a.example:5432/gpl", b: "postgres://b.example/gpl", c: "postgresql://gpl@c.example/gpl", bad: "mysql://gpl:hunter2@x.example/gpl" };
    case "secret":
      return { a: "tok-aaaaaaaaaaaaaaaa", b: "tok-bbbbbbbbbbbbbbbb", c: "tok-cccccccccccccccc", bad: "tok\u0001" };
    case "text":
      return name === "container.options" ? { a: "--shm-size 1g", b: "--ipc host", c: "" } : { a: "alpha", b: "beta", c: "gamma", bad: "a\u0007b" };
    default: {
      const choices = def.kind.name.split(" | ");
      return { a: choices[0]!, b: choices[1]!, c: choices[choices.length - 1]!, bad: "bogus" };
    }
  }
}

const parsed = (name: SettingName, text: string) => (SETTINGS[name] as SettingDef<unknown>).kind.parse(text);

let n = 0;
function withFile(lines: Record<string, string>): Record<string, string> {
  const file = join(box.root, `config-${n++}.yaml`);
  writeFileSync(file, Object.entries(lines).map(([k, v]) => `${k}: ${JSON.stringify(v)}\n`).join(""));
  return { GPULAYER_HOME: box.home, GPULAYER_CONFIG: file };
}

const settable = SETTING_NAMES.filter((name) => (SETTINGS[name] as SettingDef<unknown>).inFile !== false);

describe("every setting: what wins", () => {
  for (const name of settable) {
    const def = SETTINGS[name] as SettingDef<unknown>;
    const s = samples(name);
    const sources = def.flag ? (["flag", "env", "file"] as const) : (["env", "file"] as const);
    // Every subset of the sources this setting has.
    for (let mask = 0; mask < 1 << sources.length; mask++) {
      const used = sources.filter((_, i) => mask & (1 << i));
      test(`${name}: ${used.length ? used.join(" + ") : "nothing set"}`, async () => {
        const env = withFile(used.includes("file") ? { [name]: s.c } : {});
        if (used.includes("env")) env[def.env] = s.b;
        const flags = used.includes("flag") ? { [name]: s.a } : {};
        const r = await resolveSettings(env, flags);
        const winner = used[0];
        const expected = winner === "flag" ? parsed(name, s.a) : winner === "env" ? parsed(name, s.b) : winner === "file" ? parsed(name, s.c) : def.default;
        expect((r.values as Record<string, unknown>)[name]).toEqual(expected);
        expect(r.origins[name].source).toBe(winner ?? "default");
        if (winner === "env") expect(r.origins[name].name).toBe(def.env);
        if (winner === "flag") expect(r.origins[name].name).toBe(def.flag!);
        if (winner === "file") expect(r.origins[name].name).toBe(env.GPULAYER_CONFIG!);
      });
    }
    if (s.bad === undefined) continue;
    for (const source of sources) {
      test(`${name}: a bad value from the ${source} is one line naming it, exit 2`, async () => {
        const env = withFile(source === "file" ? { [name]: s.bad! } : {});
        if (source === "env") env[def.env] = s.bad!;
        let error: unknown;
        try {
          await resolveSettings(env, source === "flag" ? { [name]: s.bad } : {});
        } catch (e) {
          error = e;
        }
        expect(error).toBeInstanceOf(UsageError);
        const message = (error as UsageError).message;
        expect((error as UsageError).exitCode).toBe(ExitCode.usage);
        expect(message).not.toContain("\n");
        // A database URL's password is never shown back, in an error either.
        const shown = def.kind.name === "secret" ? "***" : def.kind.name === "database url" ? s.bad!.replace("hunter2", "***") : s.bad!;
        if (source === "env") expect(message).toStartWith(`${def.env}=${shown} (environment): `);
        if (source === "flag") expect(message).toStartWith(`${def.flag} ${shown}: `);
        if (source === "file") expect(message).toStartWith(`${name}: ${shown} (in ${env.GPULAYER_CONFIG}): `);
        if (def.kind.name === "secret") expect(message.includes(s.bad!)).toBe(false);
        if (def.kind.name === "database url") expect(message).not.toContain("hunter2");
      });
    }
  }

  test("the file may nest keys by their dots; an unknown key, or a group given a value, is refused", async () => {
    const file = join(box.root, "nested.yaml");
    writeFileSync(file, "cache:\n  max_size: 5G\ncoordinator:\n  heartbeat: 3\n");
    const r = await resolveSettings({ GPULAYER_HOME: box.home, GPULAYER_CONFIG: file });
    expect(r.values["cache.max_size"]).toBe(5 * 1024 ** 3);
    expect(r.values["coordinator.heartbeat"]).toBe(3000);
    writeFileSync(file, "cache:\n  max_sise: 5G\n");
    await expect(resolveSettings({ GPULAYER_HOME: box.home, GPULAYER_CONFIG: file })).rejects.toThrow(`${file}: cache.max_sise: unknown key (did you mean cache.max_size?)`);
    writeFileSync(file, "home: /elsewhere\n");
    await expect(resolveSettings({ GPULAYER_HOME: box.home, GPULAYER_CONFIG: file })).rejects.toThrow("home: cannot be set in the config file (set GPULAYER_HOME)");
    writeFileSync(file, "cache: 5G\n");
    await expect(resolveSettings({ GPULAYER_HOME: box.home, GPULAYER_CONFIG: file })).rejects.toThrow(`${file}: cache: expected a mapping of its keys (max_size), not a single value`);
    writeFileSync(file, "cache: [5G]\n");
    await expect(resolveSettings({ GPULAYER_HOME: box.home, GPULAYER_CONFIG: file })).rejects.toThrow(`${file}: cache: expected a mapping of its keys (max_size), not a list`);
    // An empty section is nothing set; one key given both ways is refused, as YAML refuses a plain repeat.
    writeFileSync(file, "cache:\n");
    expect((await resolveSettings({ GPULAYER_HOME: box.home, GPULAYER_CONFIG: file })).origins["cache.max_size"].source).toBe("default");
    writeFileSync(file, "cache.max_size: 1G\ncache: {max_size: 2G}\n");
    await expect(resolveSettings({ GPULAYER_HOME: box.home, GPULAYER_CONFIG: file })).rejects.toThrow(`${file}: cache.max_size: given twice (as a dotted key and inside its section)`);
  });

  test("a config file that is a link to nothing, bad YAML, or control characters: one line each, escaped", async () => {
    const home = join(box.root, "config-odd");
    mkdirSync(home, { recursive: true });
    const file = join(home, "config.yaml");
    symlinkSync(join(box.root, "nowhere.yaml"), file);
    const dangling = await cli(["config"], { env: { ...box.env, GPULAYER_HOME: home } });
    expect([dangling.code, dangling.stderr]).toEqual([2, `error: ${file}: the config file is a symbolic link to nothing (${join(box.root, "nowhere.yaml")})\n`]);
    rmSync(file);
    writeFileSync(file, "prepare_timeout: [\n");
    const yaml = await cli(["config"], { env: { ...box.env, GPULAYER_HOME: home } });
    expect(yaml.code).toBe(2);
    expect(yaml.stderr).toMatch(/^error: .*config\.yaml: not valid YAML: .*line 2, column 1\n$/);
    writeFileSync(file, "cache:\0\x01\x02 binary");
    const binary = await cli(["config"], { env: { ...box.env, GPULAYER_HOME: home } });
    expect([binary.code, binary.stderr]).toEqual([2, `error: ${file}: the config file holds binary data (a NUL byte), not YAML\n`]);
    writeFileSync(file, "\x1b[31mRED: 1\n");
    const esc = await cli(["config"], { env: { ...box.env, GPULAYER_HOME: home } });
    expect([esc.code, esc.stderr]).toEqual([2, `error: ${file}: \\x1b[31mRED: unknown key\n`]);
  });

  test("the issue's traps: sizes in every spelling are powers of 1024, never bytes", async () => {
    const r = await resolveSettings({ GPULAYER_HOME: box.home, GPULAYER_BUNDLE_MAX: "1G", GPULAYER_BUNDLE_MAX_UNPACKED: "2GiB" });
    expect(r.values["bundle.max_size"]).toBe(1024 ** 3);
    expect(r.values["bundle.max_unpacked"]).toBe(2 * 1024 ** 3);
    await expect(resolveSettings({ GPULAYER_HOME: box.home, GPULAYER_CANCEL_GRACE: "later" })).rejects.toThrow("GPULAYER_CANCEL_GRACE=later (environment): not a duration");
    await expect(resolveSettings({ GPULAYER_HOME: box.home, GPULAYER_HEARTBEAT_SECONDS: "0" })).rejects.toThrow("GPULAYER_HEARTBEAT_SECONDS=0 (environment): must be more than 0");
    await expect(resolveSettings({ GPULAYER_HOME: box.home }, { "cache.max_size": "-5G" })).rejects.toThrow("--max-size -5G: a size cannot be negative");
  });
});

describe("gpulayer config", () => {
  test("shows each effective setting with where it came from; the token never", async () => {
    const env: Record<string, string> = { ...box.env, ...withFile({ "cache.max_size": "7G", python: "/opt/py/bin/python" }), GPULAYER_INSTALLER: "pip", GPULAYER_TOKEN: "tok-secret-secret-1234" };
    const r = await cli(["config", "--json"], { env });
    expect(r.code).toBe(0);
    const doc = JSON.parse(r.stdout) as { config_file: string; settings: { name: string; value: unknown; source: string; origin: string }[] };
    const by = Object.fromEntries(doc.settings.map((s) => [s.name, s]));
    expect(by["cache.max_size"]).toMatchObject({ value: 7 * 1024 ** 3, source: "file", origin: env.GPULAYER_CONFIG });
    expect(by.python).toMatchObject({ value: "/opt/py/bin/python", source: "file" });
    expect(by.installer).toMatchObject({ value: "pip", source: "env", origin: "GPULAYER_INSTALLER" });
    expect(by.cancel_grace).toMatchObject({ value: 10, source: "default" });
    expect(by.token).toMatchObject({ value: "***", source: "env" });
    expect(doc.settings.map((s) => s.name)).toEqual(SETTING_NAMES);
    const human = await cli(["config"], { env });
    expect(human.stdout).toMatch(/cache\.max_size\s+7G\s+config file/);
    expect(human.stdout).toMatch(/installer\s+pip\s+GPULAYER_INSTALLER/);
    expect(`${r.stdout}${human.stdout}`).not.toContain("tok-secret");
    const path = await cli(["config", "path"], { env });
    expect(path.stdout.trim()).toBe(env.GPULAYER_CONFIG!);
    // A file named by GPULAYER_CONFIG that is not there is refused (its settings would be dropped without a word); config path still says where it goes.
    const typo = { ...env, GPULAYER_CONFIG: `${env.GPULAYER_CONFIG}.typo` };
    const refused = await cli(["env", "list"], { env: typo });
    expect([refused.code, refused.stderr]).toEqual([2, `error: GPULAYER_CONFIG=${typo.GPULAYER_CONFIG} (environment): no such file (unset it for ${join(env.GPULAYER_HOME!, "config.yaml")}, which may be absent)\n`]);
    expect((await cli(["config", "path"], { env: typo })).stdout.trim()).toBe(typo.GPULAYER_CONFIG);
  });

  test("a bad value anywhere fails every command the same way: one line, exit 2", async () => {
    for (const argv of [["config"], ["env", "list"], ["gc"], ["job", "list"]]) {
      const r = await cli(argv, { env: { ...box.env, GPULAYER_BUNDLE_MAX: "1x" } });
      expect(r.code).toBe(2);
      expect(r.stderr.trim()).toBe("error: GPULAYER_BUNDLE_MAX=1x (environment): not a size (expected a size such as 50G, 500MiB, 1.5T or a number of bytes)");
    }
  });
});

test("the settings reference's table is the table of settings", () => {
  const readme = readFileSync(join(import.meta.dir, "..", "docs", "reference", "settings.md"), "utf8");
  // A boolean, not toContain: a failure should print the table to paste, not the whole README.
  const table = settingsMarkdown();
  if (!readme.includes(table)) console.error(`docs/reference/settings.md's table should read (bun scripts/gen-reference.ts writes it):\n${table}`);
  expect(readme.includes(table)).toBe(true);
});

describe("the token and its file: one setting in two forms, the more directly given one wins", () => {
  /** A stand-in server that answers `job list` and records the token each request carried. */
  const seen: string[] = [];
  const server = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    fetch(req) {
      seen.push((req.headers.get("authorization") ?? "").replace(/^Bearer /, ""));
      return Response.json([]);
    },
  });
  afterAll(() => server.stop(true));
  const url = `http://127.0.0.1:${server.port}`;
  const fileWith = (name: string, token: string) => {
    const f = join(box.root, name);
    writeFileSync(f, `${token}\n`, { mode: 0o600 });
    return f;
  };
  const list = async (args: string[], env: Record<string, string>, config?: string) => {
    writeFileSync(join(box.home, "config.yaml"), config ?? "");
    seen.length = 0;
    const r = await cli(["job", "list", "--json", "--server", url, ...args], { env: { ...box.env, ...env } });
    return { ...r, token: seen[0] };
  };

  test("a flag beats a variable, a variable beats the config file, whichever form each takes", async () => {
    const a = fileWith("a.token", "token-from-file-aaaaaaaa");
    expect((await list(["--token", "token-from-flag-bbbbbbbb"], { GPULAYER_TOKEN_FILE: a })).token).toBe("token-from-flag-bbbbbbbb");
    expect((await list(["--token-file", a], { GPULAYER_TOKEN: "token-from-var-cccccccc" })).token).toBe("token-from-file-aaaaaaaa");
    expect((await list([], { GPULAYER_TOKEN: "token-from-var-cccccccc" }, `token_file: ${a}\n`)).token).toBe("token-from-var-cccccccc");
    expect((await list([], {}, `token_file: ${a}\n`)).token).toBe("token-from-file-aaaaaaaa");
  });

  test("both forms at one level is refused, naming both; an unreadable file names itself", async () => {
    const a = fileWith("b.token", "token-from-file-dddddddd");
    const both = await list([], { GPULAYER_TOKEN: "token-from-var-eeeeeeee", GPULAYER_TOKEN_FILE: a });
    expect(both.code).toBe(2);
    expect(both.stderr.trim()).toBe("error: GPULAYER_TOKEN and GPULAYER_TOKEN_FILE: give the token one way");
    const missing = await list(["--token-file", join(box.root, "nope.token")], {});
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain(`--token-file ${join(box.root, "nope.token")}: cannot read it (ENOENT)`);
  });

  test("--token-file - reads it from standard input", async () => {
    writeFileSync(join(box.home, "config.yaml"), "");
    seen.length = 0;
    const proc = Bun.spawn([...CLI_ARGV, "job", "list", "--json", "--server", url, "--token-file", "-"], { env: box.env, stdin: "pipe", stdout: "pipe", stderr: "pipe" });
    proc.stdin.write("token-from-stdin-ffffffff\n");
    await proc.stdin.end();
    const code = await proc.exited;
    expect(code, await new Response(proc.stderr).text()).toBe(0);
    expect(seen[0]).toBe("token-from-stdin-ffffffff");
  });
});
