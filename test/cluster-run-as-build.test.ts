import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, copyFileSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { cli, readyKeys, realUv, sandbox, startCli } from "./helpers.ts";
import { type Kept, keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * Builds as the job's user (worker.run_as). A real server and two workers on
 * 127.0.0.1, both as root with `--run-as` a user made here with useradd: one
 * builds on the fast path (uv), one with pip. Each job asks for a local
 * project whose in-tree PEP 517 backend records, as it builds, its uid and
 * whether it could read the worker's token file, identity, job records and bundle copies; the job
 * then imports what was built and prints what the build saw. Another local
 * user (nobody) then tries to read the env and the build's caches.
 */

const IS_ROOT = process.getuid?.() === 0;
const ADMIN = "run-as-build-admin-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.3", GPULAYER_WORKER_LOST_SECONDS: "10", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
const T = 180_000;
const JOB_USER = "gpl-runas-build";
const NOBODY = 65534;
const box = sandbox();
const procs: Kept[] = [];
let url = "";
let uid = -1;
let gid = -1;
const homes = { uv: join(box.root, "w-uv-home"), pip: join(box.root, "w-pip-home") };
const tokenFile = join(box.root, "join.token");

/** The backend writes a module holding what its build could do; `runasprobe` exists only in the built wheel. */
function backend(paths: Record<string, string>): string {
  return `
import os, zipfile
PATHS = ${JSON.stringify(paths)}
def _seen():
    facts = {"uid": os.getuid(), "euid": os.geteuid()}
    for name, path in PATHS.items():
        try:
            if os.path.isdir(path):
                os.listdir(path)
            else:
                open(path, "rb").read()
            facts[name] = "read"
        except OSError as e:
            facts[name] = type(e).__name__
    return facts
def get_requires_for_build_wheel(config_settings=None):
    return []
def build_wheel(wd, config_settings=None, metadata_directory=None):
    dist = "runasprobe-1.0.dist-info"
    files = {
        "runasprobe/__init__.py": "FACTS = %r\\n" % (_seen(),),
        dist + "/METADATA": "Metadata-Version: 2.1\\nName: runasprobe\\nVersion: 1.0\\n",
        dist + "/WHEEL": "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
    files[dist + "/RECORD"] = "".join("%s,,\\n" % p for p in list(files) + [dist + "/RECORD"])
    fn = "runasprobe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wd, fn), "w") as z:
        for p, d in files.items():
            z.writestr(p, d)
    return fn
`;
}

function projectFor(kind: keyof typeof homes, name = `job-${kind}`): string {
  const dir = join(box.root, name);
  const src = join(dir, "probe-src");
  mkdirSync(src, { recursive: true });
  writeFileSync(join(src, "pyproject.toml"), '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n');
  const home = homes[kind];
  writeFileSync(join(src, "backend.py"), backend({ [name]: box.root, token: tokenFile, bundles: join(home, "cluster", "bundles"), identity: join(home, "cluster", "identity"), jobs: join(home, "jobs") }));
  writeFileSync(join(dir, "requirements.txt"), "--no-index\n./probe-src\n");
  return dir;
}

const asNobody = (args: string[]) => Bun.spawnSync(["setpriv", `--reuid=${NOBODY}`, `--regid=${NOBODY}`, "--clear-groups", "--", ...args], { stdout: "ignore", stderr: "ignore" }).exitCode === 0;

beforeAll(async () => {
  if (!IS_ROOT) return;
  if (Bun.spawnSync(["id", "-u", JOB_USER]).exitCode !== 0) {
    const made = Bun.spawnSync(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", JOB_USER], { stderr: "pipe" });
    if (made.exitCode !== 0 && Bun.spawnSync(["id", "-u", JOB_USER]).exitCode !== 0) throw new Error(`useradd ${JOB_USER}: ${made.stderr.toString()}`);
  }
  uid = Number(Bun.spawnSync(["id", "-u", JOB_USER]).stdout.toString());
  gid = Number(Bun.spawnSync(["id", "-g", JOB_USER]).stdout.toString());
  // Others enter the sandbox: the job user reaches the env store, the workdirs and the uv below.
  chmodSync(box.root, 0o755);
  const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { ...box.env, ...FAST, GPULAYER_HOME: join(box.root, "server-home"), GPULAYER_TOKEN: ADMIN } }), procs);
  url = await waitFor("the server", () => /"url": "([^"]+)"/.exec(server.out())?.[1]);
  const made = await cli(["server", "token", "create", "--role", "join", "--name", "boxes", "--json"], { env: { ...box.env, GPULAYER_HOME: join(box.root, "server-home") } });
  writeFileSync(tokenFile, `${JSON.parse(made.stdout).token}\n`, { mode: 0o600 });
  // A uv the job user can run (the machine's may sit under /root).
  const uv = join(box.root, "bin", "uv");
  mkdirSync(join(box.root, "bin"));
  copyFileSync(realUv()!, uv);
  chmodSync(uv, 0o755);
  for (const [kind, installer] of [["uv", "auto"], ["pip", "pip"]] as const) {
    const w = keepOutput(
      startCli(["join", url, "--token-file", tokenFile, "--name", `w-${kind}`, "--python", "/usr/bin/python3", "--label", `via=${kind}`, "--run-as", JOB_USER], {
        env: { ...box.env, ...FAST, GPULAYER_HOME: homes[kind], GPULAYER_UV: uv, GPULAYER_INSTALLER: installer },
      }),
      procs,
    );
    await waitFor(`w-${kind} to join`, () => w.out().includes(`as w-${kind}`));
  }
}, T);

afterAll(async () => {
  await stopAll(procs);
  box.cleanup();
  if (IS_ROOT) Bun.spawnSync(["userdel", JOB_USER]);
}, 30_000);

// Skipped only when not root: the workers start builds and jobs as another user (setpriv), which only root may; CI runs as root.
describe.skipIf(!IS_ROOT)("worker.run_as: the build of a job's requirements runs as the job's user", () => {
  for (const kind of ["uv", "pip"] as const) {
    test(`${kind === "uv" ? "fast path" : "pip"}: the build's uid is the user's, it reads none of the worker's; the job imports what it built`, async () => {
      const dir = projectFor(kind);
      // The store open to anyone: a compile given it would write there.
      mkdirSync(join(homes[kind], "bytecode-v1"), { recursive: true });
      chmodSync(join(homes[kind], "bytecode-v1"), 0o777);
      const code = "import json, os, runasprobe; print('FACTS=' + json.dumps(runasprobe.FACTS)); print('job uid=%d' % os.getuid()); print('writable=%s' % os.access(runasprobe.__file__, os.W_OK))";
      const r = await cli(["job", "run", "--label", `via=${kind}`, "--workdir", ".", "-r", "requirements.txt", "--", "python", "-c", code], { env: { ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: ADMIN }, cwd: dir });
      expect(r.code, r.stderr + r.stdout).toBe(0);
      const facts = JSON.parse(/FACTS=(.*)/.exec(r.stdout)![1]!);
      expect(facts).toEqual({ [`job-${kind}`]: "read", uid, euid: uid, token: "PermissionError", bundles: "PermissionError", identity: "PermissionError", jobs: "PermissionError" });
      expect(r.stdout).toContain(`job uid=${uid}`);
      // The env is the worker's again: the job reads it and cannot change it.
      expect(r.stdout).toContain("writable=False");

      const home = homes[kind];
      const [key] = readyKeys(home);
      const env = join(home, "envs-v1", key!);
      const site = join(env, "lib", readdirSync(join(env, "lib"))[0]!, "site-packages");
      // Each by the installer its worker was set for (the fast path did not quietly fall back to pip).
      expect(JSON.parse(readFileSync(join(env, ".gpulayer", "meta.json"), "utf8")).installerPath).toBe(kind === "uv" ? "uv (fast path)" : "pip");
      for (const path of [env, site, join(site, "runasprobe", "__init__.py")]) {
        const st = statSync(path);
        expect([st.uid, st.gid, st.mode & 0o7027]).toEqual([0, gid, 0]);
      }
      // The user's caches: its own, closed to everyone else; another local user reads neither them nor the env.
      const caches = join(home, "users", String(uid));
      expect([statSync(caches).uid, statSync(caches).mode & 0o777]).toEqual([uid, 0o700]);
      expect(asNobody(["ls", caches])).toBe(false);
      expect(asNobody(["ls", site])).toBe(false);
      // The user's compile neither fed nor read the worker's bytecode store: a process of that user could write any code under any key.
      expect(readdirSync(join(home, "bytecode-v1"))).toEqual([]);
    }, T);
  }

  test("a uv project: its lock is checked and synced as the user, whose build the job then imports", async () => {
    const dir = join(box.root, "job-locked");
    const src = join(dir, "probe-src");
    mkdirSync(src, { recursive: true });
    // A virtual project whose one dependency is the probe, from a folder beside it (built as a wheel, not linked).
    writeFileSync(join(dir, "pyproject.toml"), '[project]\nname = "app"\nversion = "0.1"\nrequires-python = ">=3.8"\ndependencies = ["runasprobe"]\n\n[tool.uv.sources]\nrunasprobe = { path = "probe-src" }\n');
    writeFileSync(join(src, "pyproject.toml"), '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n\n[project]\nname = "runasprobe"\nversion = "1.0"\n');
    writeFileSync(join(src, "backend.py"), backend({ project: dir, token: tokenFile }));
    const locked = Bun.spawnSync([realUv()!, "lock", "--no-config"], { cwd: dir, env: box.env, stderr: "pipe" });
    expect(locked.exitCode, locked.stderr.toString()).toBe(0);
    const code = "import json, runasprobe; print('FACTS=' + json.dumps(runasprobe.FACTS))";
    const r = await cli(["job", "run", "--label", "via=uv", "--workdir", ".", "--project", ".", "--", "python", "-c", code], { env: { ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: ADMIN }, cwd: dir });
    expect(r.code, r.stderr + r.stdout).toBe(0);
    expect(JSON.parse(/FACTS=(.*)/.exec(r.stdout)![1]!)).toEqual({ project: "read", uid, euid: uid, token: "PermissionError" });
  }, T);

  test("fast path: a requirements file that a constraints file includes is read from the user's copy too, not the worker's (which the user cannot read)", async () => {
    const dir = projectFor("uv", "under-constraints");
    // pip reads inner.txt as requirements; uv is handed it as such (-r by path), which must be the user's copy, not the worker's.
    writeFileSync(join(dir, "requirements.txt"), "--no-index\n-c c.txt\n./probe-src\n");
    writeFileSync(join(dir, "c.txt"), "-r inner.txt\n");
    writeFileSync(join(dir, "inner.txt"), "runasprobe\n");
    const before = new Set(readyKeys(homes.uv));
    const r = await cli(["job", "run", "--label", "via=uv", "--workdir", ".", "-r", "requirements.txt", "--", "python", "-c", "import runasprobe"], { env: { ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: ADMIN }, cwd: dir });
    expect(r.code, r.stderr + r.stdout).toBe(0);
    const [key] = readyKeys(homes.uv).filter((k) => !before.has(k));
    const meta = JSON.parse(readFileSync(join(homes.uv, "envs-v1", key!, ".gpulayer", "meta.json"), "utf8"));
    expect([meta.installerPath, meta.installerFallback ?? null]).toEqual(["uv (fast path)", null]);
  }, T);

  test("a prepare task (env prepare to the fleet) builds as the user too, from its own copy of the folder", async () => {
    const dir = projectFor("pip", "prepare-pip");
    const r = await cli(["env", "prepare", "requirements.txt", "--label", "via=pip", "--json"], { env: { ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: ADMIN }, cwd: dir });
    expect(r.code, r.stderr + r.stdout).toBe(0);
    const done = JSON.parse(r.stdout).workers[0];
    expect(done.status).toBe("built");
    const env = join(homes.pip, "envs-v1", done.key);
    const seen = Bun.spawnSync([join(env, "bin", "python"), "-c", "import json, runasprobe; print(json.dumps(runasprobe.FACTS))"], { cwd: "/", stdout: "pipe", stderr: "pipe" });
    expect(JSON.parse(seen.stdout.toString() || "null"), seen.stderr.toString()).toEqual({ "prepare-pip": "read", uid, euid: uid, token: "PermissionError", bundles: "PermissionError", identity: "PermissionError", jobs: "PermissionError" });
  }, T);

  test("an editable requirement is refused with one line: the env would link to the job's own copy, which goes with it", async () => {
    const dir = projectFor("uv", "editable");
    writeFileSync(join(dir, "requirements.txt"), "--no-index\n-e ./probe-src\n");
    const r = await cli(["job", "run", "--label", "via=uv", "--workdir", ".", "-r", "requirements.txt", "--", "true"], { env: { ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: ADMIN }, cwd: dir });
    expect(r.code).not.toBe(0);
    expect(r.stderr + r.stdout).toContain("worker.run_as: an editable requirement (-e ");
  }, T);
});
