import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, chownSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { CLI_ARGV, cli, sandbox, serverDatabaseText, startCli } from "./helpers.ts";
import { type Kept, keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * Tokens with roles, and a token no job can read. A real server and workers
 * on 127.0.0.1. Named tokens are made with `server token create`; a user
 * token does what clients do and cannot register a worker, a join token
 * registers and does nothing else, and a revoked one is refused at once,
 * taking the workers that joined with it along. Jobs then hunt for every
 * secret on the machine (every process's command line and environment, every
 * file under the worker's home): as another OS user (worker.run_as, the
 * worker as root) and as the worker's own user (the worker non-dumpable).
 */

const ADMIN = "tokens-test-admin-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.3", GPULAYER_WORKER_LOST_SECONDS: "10", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
const T = 120_000;
const IS_ROOT = process.getuid?.() === 0;
const NOBODY = 65534;
const box = sandbox();
const procs: Kept[] = [];
const serverHome = join(box.root, "server-home");
let url = "";
const tokens: Record<string, string> = {};

const as = (token: string) => ({ ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: token });
const gpl = (args: string[], token = tokens.alice!, cwd = box.root) => cli(args, { env: as(token), cwd });
const onServer = (args: string[]) => cli(["server", "token", ...args], { env: { ...box.env, GPULAYER_HOME: serverHome } });
const json = <T = any>(text: string): T => JSON.parse(text) as T;
const api = (path: string, token: string, init: RequestInit = {}) => fetch(`${url}${path}`, { ...init, headers: { authorization: `Bearer ${token}`, "content-type": "application/json" } });

/**
 * A job that looks for the secrets everywhere it can, and prints where it
 * found any. It is given them base64-encoded (so its own environment, and the
 * client's command line, hold none of them) and keeps them in a pattern file
 * outside the places it searches.
 */
const HUNT = String.raw`
pat=$(mktemp)
echo "$SECRETS_B64" | base64 -d | tr ' ' '\n' > "$pat"
found=""
for f in /proc/[0-9]*/cmdline /proc/[0-9]*/environ; do
  if tr '\0' '\n' < "$f" 2>/dev/null | grep -qaF -f "$pat"; then found="$found $f"; fi
done
for f in $(find "$HUNT_HOME" -type f 2>/dev/null); do
  if grep -qaF -f "$pat" "$f" 2>/dev/null; then found="$found $f"; fi
done
rm -f "$pat"
echo "uid=$(id -u)"
echo "found:$found"
`;

function credentialsOf(home: string): string[] {
  const out = Bun.spawnSync(["sh", "-c", `cat ${join(home, "cluster", "identity")}/*.json 2>/dev/null`]).stdout.toString();
  return [...out.matchAll(/"credential": "([^"]+)"/g)].map((m) => m[1]!);
}

async function hunt(workerName: string, home: string): Promise<{ uid: string; found: string }> {
  const secrets = Buffer.from([ADMIN, tokens.box1!, tokens.box2!, ...credentialsOf(home)].join(" ")).toString("base64");
  const r = await gpl(["job", "run", "--label", `who=${workerName}`, "-e", `SECRETS_B64=${secrets}`, "-e", `HUNT_HOME=${home}`, "--", "sh", "-c", HUNT]);
  expect(r.code, r.stderr).toBe(0);
  return { uid: /uid=(\d+)/.exec(r.stdout)?.[1] ?? "", found: /found:(.*)/.exec(r.stdout)?.[1]?.trim() ?? "?" };
}

beforeAll(async () => {
  // Others must be able to enter the sandbox: the job user reaches the env store and workdirs under it.
  chmodSync(box.root, 0o755);
  const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { ...box.env, ...FAST, GPULAYER_HOME: serverHome, GPULAYER_TOKEN: ADMIN } }), procs);
  url = await waitFor("the server", () => /"url": "([^"]+)"/.exec(server.out())?.[1]);
  for (const [name, role] of [["alice", "user"], ["box1", "join"], ["box2", "join"]] as const) {
    const r = await onServer(["create", "--role", role, "--name", name, "--json"]);
    expect(r.code, r.stderr).toBe(0);
    tokens[name] = json(r.stdout).token;
  }
}, T);

afterAll(async () => {
  await stopAll(procs);
  box.cleanup();
}, 30_000);

describe("a first start", () => {
  test("the join line a new server prints uses a join token, made as it says, never the server's own", async () => {
    const home = join(box.root, "first-start-home");
    // A new server of its own (its own store too: the suite's PostgreSQL database already holds another server's state).
    const { GPULAYER_DATABASE: _shared, ...fresh } = box.env;
    const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0"], { env: { ...fresh, GPULAYER_HOME: home } }), procs);
    const text = await waitFor("the server's lines", () => (/^clients: /m.test(server.out()) ? server.out() : null));
    const own = readFileSync(join(home, "server", "token"), "utf8").trim();
    const lines = text.split("\n");
    const at = lines.findIndex((l) => l.startsWith("workers: "));
    const [create, joinLine] = [lines[at]!, lines[at + 1]!];
    expect(create.includes(own) || joinLine.includes(own)).toBe(false);
    expect(create).toStartWith("workers: gpulayer server token create --role join --name NAME > join.token");
    const first = /"?(http:\/\/[^\s"]+)/.exec(text)![1]!;
    expect(joinLine.trim()).toStartWith(`gpulayer join ${new URL(first).origin} --token-file join.token`);
    // The command works as printed: a join token, which registers and does nothing else.
    const made = await cli(["server", "token", "create", "--role", "join", "--name", "NAME", "--json"], { env: { ...fresh, GPULAYER_HOME: home } });
    expect(made.code, made.stderr).toBe(0);
    expect(json(made.stdout).role).toBe("join");
  }, T);
});

describe("a first start that fails", () => {
  test("keeps no token it never showed: the next start makes one and shows it", async () => {
    const home = join(box.root, "failed-start-home");
    const { GPULAYER_DATABASE: _shared, ...fresh } = box.env;
    const taken = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
    try {
      const failed = await cli(["server", "--listen", `127.0.0.1:${taken.port}`], { env: { ...fresh, GPULAYER_HOME: home } });
      expect(failed.code).toBe(2);
      expect(failed.stderr).toContain(`cannot listen on 127.0.0.1:${taken.port}`);
      expect(failed.stderr + failed.stdout).not.toContain("gpl_");
    } finally {
      taken.stop(true);
    }
    const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0"], { env: { ...fresh, GPULAYER_HOME: home } }), procs);
    const text = await waitFor("the server's lines", () => (/^clients: /m.test(server.out()) ? server.out() : null));
    const own = readFileSync(join(home, "server", "token"), "utf8").trim();
    expect(text).toContain(`(shown once; kept in ${join(home, "server", "token")}): ${own}`);
  }, T);
});

// The fleet guide's client setup (GPULAYER_TOKEN_FILE exported), then `gpulayer server` started in that same shell.
describe("a server's own token", () => {
  // A world of its own (on PostgreSQL, a database of its own): its tokens and servers are not the other tests'.
  const own = sandbox();
  const home = join(own.root, "server-home-own");
  const env = (extra: Record<string, string>) => ({ ...own.env, ...FAST, GPULAYER_HOME: home, ...extra });
  test("a named token given as the server's own is refused in one line naming where it came from, before anything is served", async () => {
    const made = await cli(["server", "token", "create", "--role", "user", "--name", "me", "--json"], { env: env({}) });
    expect(made.code, made.stderr).toBe(0);
    const file = join(own.root, "me.token");
    writeFileSync(file, json(made.stdout).token, { mode: 0o600 });
    const r = await cli(["server", "--listen", "127.0.0.1:0"], { env: env({ GPULAYER_TOKEN_FILE: file }) });
    expect(r.code).toBe(1);
    expect(r.stderr.trim().split("\n")).toEqual(["error: the server's token (GPULAYER_TOKEN_FILE) is the user token named me: the server's own token may do everything, so it must be no named token (leave out GPULAYER_TOKEN_FILE to use the one kept in the server's home)"]);
    expect(r.stdout).not.toContain("listening");
    // The same token kept in the home as the server's own (put there by hand) is refused too, with what to do about it.
    const kept = join(home, "server", "token");
    writeFileSync(kept, `${json(made.stdout).token}\n`, { mode: 0o600 });
    const fromHome = await cli(["server", "--listen", "127.0.0.1:0"], { env: env({}) });
    expect([fromHome.code, fromHome.stderr.trim()]).toEqual([1, `error: the server's token kept in ${kept} is the user token named me: the server's own token may do everything, so it must be no named token (remove that file and start again: a new one is made)`]);
    rmSync(kept);
  }, T);
  test("a given token other than the one kept in the home is said, with what it shuts out", async () => {
    const kept: Kept[] = [];
    try {
      // The first start without a token keeps one in the home; a second start is given another.
      const first = keepOutput(startCli(["server", "--listen", "127.0.0.1:0"], { env: env({}) }), kept);
      await waitFor("the first server", () => first.out().includes("listening"));
      await stopAll(kept.splice(0));
      const second = keepOutput(startCli(["server", "--listen", "127.0.0.1:0"], { env: env({ GPULAYER_TOKEN: "another-token-0123456789abcdef" }) }), kept);
      await waitFor("the second server", () => second.out().includes("listening"));
      expect(second.out()).toContain(`the server's token comes from GPULAYER_TOKEN, not the one kept in ${join(home, "server", "token")}: clients and workers holding that one are refused`);
    } finally {
      await stopAll(kept);
    }
  }, T);
});

describe("named tokens", () => {
  test("list shows names and roles, never a token; the database holds only hashes", async () => {
    const r = await onServer(["list", "--json"]);
    expect(json<any[]>(r.stdout).map((t) => [t.name, t.role])).toEqual([["alice", "user"], ["box1", "join"], ["box2", "join"]]);
    const db = serverDatabaseText(box.env, serverHome);
    for (const t of Object.values(tokens)) {
      expect(r.stdout).not.toContain(t);
      expect(db).not.toContain(t);
    }
    expect((await onServer(["create", "--role", "admin", "--name", "x"])).stderr).toContain("--role admin: one of user, join");
    expect((await onServer(["create", "--role", "user", "--name", "alice"])).stderr).toContain("a token named alice exists already");
  });

  test("a user token does what clients do and cannot register; a join token registers and nothing else", async () => {
    expect((await api("/v1/workers", tokens.alice!)).status).toBe(200);
    const register = await api("/v1/workers/register", tokens.alice!, { method: "POST", body: "{}" });
    expect(register.status).toBe(403);
    expect(((await register.json()) as { error: string }).error).toContain("join token");
    expect((await api("/v1/workers", tokens.box1!)).status).toBe(403);
    expect((await api("/v1/jobs", tokens.box1!, { method: "POST", body: "{}" })).status).toBe(403);
    const list = await gpl(["job", "list"], tokens.box1!);
    expect(list.code).not.toBe(0);
    expect(list.stderr).toContain("a join token only registers workers");
  });

  test("join refuses a token on its command line, and takes one from a file or standard input", async () => {
    const r = await cli(["join", url, "--token", tokens.box1!, "--python", "python3"], { env: { ...box.env, GPULAYER_HOME: join(box.root, "refused-home") } });
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("/proc/PID/cmdline");
    const empty = join(box.root, "empty-token");
    writeFileSync(empty, "\n");
    const e = await cli(["join", url, "--token-file", empty, "--python", "python3"], { env: { ...box.env, GPULAYER_HOME: join(box.root, "refused-home") } });
    expect(e.code).toBe(2);
    expect(e.stderr).toContain("holds no token");
  });
});

describe("no job can read a token", () => {
  // These start processes as another user (setpriv, chown to nobody), which only root may; CI runs as root.
  test.skipIf(!IS_ROOT)("worker.run_as: the job runs as that user and finds no secret in any process or under the worker's home", async () => {
    const home = join(box.root, "w1-home");
    const tokenFile = join(box.root, "box1.token");
    writeFileSync(tokenFile, `${tokens.box1}\n`, { mode: 0o600 });
    const w1 = keepOutput(startCli(["join", url, "--token-file", tokenFile, "--name", "w1", "--python", "/usr/bin/python3", "--label", "who=w1", "--run-as", "nobody"], { env: { ...box.env, ...FAST, GPULAYER_HOME: home } }), procs);
    await waitFor("w1 to join", () => w1.out().includes("as w1"));
    const r = await hunt("w1", home);
    expect(r.uid).toBe(String(NOBODY));
    expect(r.found).toBe("");
    expect(json<any[]>((await gpl(["workers", "--json"])).stdout).find((w) => w.name === "w1")?.joined_with).toBe("box1");
  }, T);

  // Skipped only when not root: it starts processes as another user (setpriv, nobody), which only root may; CI runs as root.
  test.skipIf(!IS_ROOT)("a token file the job user could read stops the worker before it joins", async () => {
    const open = join(box.root, "open.token");
    writeFileSync(open, `${tokens.box1}\n`, { mode: 0o644 });
    chmodSync(open, 0o644);
    const r = await cli(["join", url, "--token-file", open, "--name", "w9", "--python", "python3", "--run-as", "nobody"], { env: { ...box.env, GPULAYER_HOME: join(box.root, "w9-home") } });
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`nobody, who runs the jobs, can read ${open}`);
  });

  // Skipped only when not root: it starts processes as another user (setpriv, nobody), which only root may; CI runs as root.
  test.skipIf(!IS_ROOT)("the worker's own user: its environment is closed to the job (non-dumpable), its command line holds no token", async () => {
    // The whole worker as nobody, its token in GPULAYER_TOKEN: the job runs as the same user.
    const home = join(box.root, "w2-home");
    mkdirSync(home, { recursive: true });
    chownSync(home, NOBODY, NOBODY);
    const readable = Bun.spawnSync(["setpriv", `--reuid=${NOBODY}`, `--regid=${NOBODY}`, "--clear-groups", "test", "-r", CLI_ARGV.at(-1)!]).exitCode === 0;
    expect(readable, `nobody cannot read ${CLI_ARGV.at(-1)} (the checkout must be readable by others for this test)`).toBe(true);
    const proc = Bun.spawn(["setpriv", `--reuid=${NOBODY}`, `--regid=${NOBODY}`, "--clear-groups", "--", ...CLI_ARGV, "join", url, "--name", "w2", "--python", "/usr/bin/python3", "--label", "who=w2"], {
      env: { ...box.env, ...FAST, GPULAYER_HOME: home, HOME: home, UV_CACHE_DIR: join(home, "uv-cache"), GPULAYER_TOKEN: tokens.box2! },
      cwd: home,
      stdin: "ignore",
      stdout: "pipe",
      stderr: "pipe",
    });
    const w2 = keepOutput(proc, procs);
    await waitFor("w2 to join", () => w2.out().includes("as w2"));
    const r = await hunt("w2", join(home, "nothing-here"));
    expect(r.uid).toBe(String(NOBODY));
    expect(r.found).toBe("");
  }, T);

  test("a worker given its token file by GPULAYER_TOKEN_FILE hands the job neither the variable nor the file's path", async () => {
    const tokenFile = join(box.root, "w3.token");
    writeFileSync(tokenFile, `${tokens.box1}\n`, { mode: 0o600 });
    const w3 = keepOutput(startCli(["join", url, "--name", "w3", "--python", "python3", "--label", "who=w3"], { env: { ...box.env, ...FAST, GPULAYER_HOME: join(box.root, "w3-home"), GPULAYER_TOKEN_FILE: tokenFile } }), procs);
    await waitFor("w3 to join", () => w3.out().includes("as w3"));
    const r = await gpl(["job", "run", "--label", "who=w3", "--", "env"]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain("PATH=");
    expect(r.stdout).not.toContain("GPULAYER_TOKEN");
    expect(r.stdout).not.toContain(tokenFile);
    expect(r.stdout).not.toContain(tokens.box1!);
  }, T);

  test("a revoked join token is refused at once, and its workers are dropped", async () => {
    const r = await onServer(["revoke", "box2", "--json"]);
    expect(json(r.stdout)).toEqual({ name: "box2", revoked: true });
    expect((await api("/v1/workers/register", tokens.box2!, { method: "POST", body: "{}" })).status).toBe(401);
    if (IS_ROOT) {
      await waitFor("w2 to be dropped", async () => json<any[]>((await gpl(["workers", "--all", "--json"])).stdout).find((w) => w.name === "w2")?.state === "left", 5000).catch(async (e) => {
        throw new Error(`${e.message}: ${(await gpl(["workers", "--json"])).stdout.slice(0, 3000)}`);
      });
    }
    expect((await onServer(["revoke", "box2"])).stderr).toContain("no token named box2");
  }, T);
});
