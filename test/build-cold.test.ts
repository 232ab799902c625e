import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, statSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";
import { leftoverPlaceholders } from "../src/env/build/standins.ts";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, HAS_UV, makeWorkerVenv, pipInstall, realUv, sandbox, tempDir } from "./helpers.ts";

/**
 * What a cold build leaves and costs, on real builds: bytecode compiled at
 * build time (so no job compiles or writes into a shared env), and the
 * worker's stand-ins made once per worker state and taken by each build after.
 */

setDefaultTimeout(120_000);

const world = tempDir("gpl-cold-");
const index = new PackageIndex(join(world, "index"));
let worker: string;

beforeAll(async () => {
  index.start();
  index.wheel({ name: "alpha", version: "1.0", requires: ["beta"] });
  index.wheel({ name: "beta", version: "1.0" });
  index.wheel({ name: "gamma", version: "1.0" });
  index.wheel({ name: "gamma", version: "2.0" });
  index.wheel({ name: "zeta", version: "1.0" });
  index.wheel({ name: "delta", version: "1.0", requires: ["epsilon", "gamma<2"] });
  index.wheel({ name: "epsilon", version: "1.0" });
  worker = await makeWorkerVenv(join(world, "worker"), { env: sandbox().env, withPip: true, packages: ["gamma==1.0"], findLinks: index.dir });
});
afterAll(() => index.stop());

/** Every file under an env, with its size and mtime: what "unchanged" means (gpulayer's own .gpulayer/last-used aside). */
function snapshot(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    for (const n of readdirSync(d)) {
      const p = join(d, n);
      const st = statSync(p);
      if (st.isDirectory()) {
        if (n !== ".gpulayer") walk(p);
      }
      else out.push(`${relative(dir, p)} ${st.size} ${st.mtimeMs}`);
    }
  };
  walk(dir);
  return out.sort();
}

const site = (env: string) => join(env, "lib", "python3.11", "site-packages");

for (const installer of HAS_UV ? (["auto", "pip"] as const) : (["pip"] as const)) {
  describe(`a cold build (${installer === "auto" ? "fast path" : "pip path"})`, () => {
    const s = sandbox();
    afterAll(() => s.cleanup());
    const env = () => ({ ...s.env, GPULAYER_INSTALLER: installer, PYTHONDONTWRITEBYTECODE: "1" });

    test("compiles the env's bytecode as its own step, even under PYTHONDONTWRITEBYTECODE; a job then writes nothing into the env", async () => {
      const r = await cli(["env", "prepare", "-p", "alpha", "--index-url", index.url, "--python", worker], { env: env(), cwd: s.root });
      expect(r.code).toBe(0);
      expect(r.stderr).toMatch(/\] compiling bytecode of the env's own packages/);
      const path = r.stdout.trim().split("\n").at(-1)!;
      for (const mod of ["alpha", "beta"]) {
        const cache = readdirSync(join(site(path), mod, "__pycache__"));
        expect(cache.some((f) => f.startsWith("__init__.") && f.endsWith(".pyc"))).toBe(true);
      }
      const before = snapshot(path);
      // Without PYTHONDONTWRITEBYTECODE: Python would write any missing .pyc now, into the shared env.
      const job = await cli(["job", "run", "-p", "alpha", "--index-url", index.url, "--python", worker, "--", "python", "-c", "import alpha, beta; print('ok')"], { env: s.env, cwd: s.root });
      expect(job.stdout.trim()).toBe("ok");
      expect(snapshot(path)).toEqual(before);
    });
  });
}

// Skipped only without uv: stand-ins are what the fast path shows uv. CI installs uv (.ci/run), so there it runs.
describe.skipIf(!HAS_UV)("the worker's stand-ins", () => {
  const build = async (s: ReturnType<typeof sandbox>, spec: string, w = worker) => {
    const r = await cli(["env", "prepare", "-p", spec, "--index-url", index.url, "--python", w, "--json"], { env: s.env, cwd: s.root });
    if (r.code !== 0) throw new Error(r.stderr);
    return JSON.parse(r.stdout) as { path: string; check: string[] };
  };
  /** Worker states (folders) and their slots under the home's stand-in root. */
  const slots = (s: ReturnType<typeof sandbox>) => {
    const root = join(s.home, "tools", "standins-v2");
    return readdirSync(root)
      .filter((n) => !n.includes("."))
      .map((state) => readdirSync(join(root, state)).length);
  };

  test("are made once per worker state and taken by each build; none is left in an env; a changed worker gets new ones", async () => {
    const s = sandbox();
    try {
      const a = (await build(s, "alpha")).path;
      expect(slots(s)).toEqual([1]);
      const b = (await build(s, "beta")).path;
      expect(slots(s)).toEqual([1]);
      for (const env of [a, b]) expect(leftoverPlaceholders(site(env))).toEqual([]);
      // The worker's own gamma was shown to uv: neither env installed it again.
      for (const env of [a, b]) expect(readdirSync(site(env)).some((n) => n.startsWith("gamma-"))).toBe(false);
      await pipInstall(worker, ["--find-links", index.dir, "--no-index", "beta"], s.env);
      const c = (await build(s, "alpha==1.0")).path;
      expect(slots(s).sort()).toEqual([1, 1]);
      // beta is the worker's now: the env holds only alpha.
      expect(readdirSync(site(c)).filter((n) => n.endsWith(".dist-info"))).toEqual(["alpha-1.0.dist-info"]);
    } finally {
      s.cleanup();
    }
  });

  test("builds at once each take their own set; a slot uv emptied part of comes back whole", async () => {
    const s = sandbox();
    try {
      await build(s, "alpha");
      const [x, y, z] = await Promise.all([build(s, "beta"), build(s, "gamma==2.0"), build(s, "zeta")]);
      for (const env of [x, y, z]) expect(leftoverPlaceholders(site(env.path))).toEqual([]);
      // gamma 2.0 replaced the worker's 1.0 in its env: the placeholder uv removed was written back into the slot.
      expect(readdirSync(site(y.path)).filter((n) => n.endsWith(".dist-info"))).toEqual(["gamma-2.0.dist-info"]);
      const [count] = slots(s);
      expect(count).toBeGreaterThanOrEqual(1);
      expect(count).toBeLessThanOrEqual(3);
      const root = join(s.home, "tools", "standins-v2");
      const state = readdirSync(root).find((n) => !n.includes("."))!;
      for (const slot of readdirSync(join(root, state))) expect(readdirSync(join(root, state, slot)).some((n) => n.startsWith("gamma-1.0"))).toBe(true);
      // The next build, after the worker's gamma was replaced in one env, still keeps the worker's copy.
      const again = await build(s, "beta");
      expect(readdirSync(site(again.path)).some((n) => n.startsWith("gamma-"))).toBe(false);
    } finally {
      s.cleanup();
    }
  });

  test("the worker's own findings are told by every build, and go where a build's packages change them (pip check as the reference)", async () => {
    const s = sandbox();
    try {
      // delta needs epsilon, which the worker lacks; delta needs gamma<2, which the worker has (1.0).
      const broken = await makeWorkerVenv(join(s.root, "broken"), { env: s.env, withPip: true, packages: ["gamma==1.0"], findLinks: index.dir });
      await pipInstall(broken, ["--find-links", index.dir, "--no-index", "--no-deps", "delta"], s.env);
      const names = (lines: string[]) => ["epsilon", "gamma"].filter((n) => lines.some((l) => l.toLowerCase().includes(n)));
      const viaPip = async (spec: string) => {
        const r = await cli(["env", "prepare", "-p", spec, "--index-url", index.url, "--python", broken, "--json"], { env: { ...s.env, GPULAYER_INSTALLER: "pip" }, cwd: s.root });
        if (r.code !== 0) throw new Error(r.stderr);
        return names((JSON.parse(r.stdout) as { check: string[] }).check);
      };
      for (const [spec, expected] of [
        ["beta", ["epsilon"]], // first build of this worker state: its findings asked once
        ["alpha", ["epsilon"]], // kept findings told again
        ["epsilon", []], // the env has what delta lacked: no finding
        ["gamma==2.0", ["epsilon", "gamma"]], // the env replaced the worker's gamma with one delta cannot use
      ] as const) {
        const got = (await build(s, spec, broken)).check;
        const fast = names(got);
        expect({ spec, fast }).toEqual({ spec, fast: [...expected] });
        expect({ spec, pip: await viaPip(spec) }).toEqual({ spec, pip: [...expected] });
      }
    } finally {
      s.cleanup();
    }
  });
});

// Skipped only without uv: the kept venv is uv's own. CI installs uv (.ci/run), so there it runs.
describe.skipIf(!HAS_UV)("the bare venv of a first build, kept for the next", () => {
  /** Every entry of a tree: kind, mode, and a file's text or a link's target, with `dir` written as <ENV>. */
  const tree = (dir: string, only?: Set<string>) => {
    const out = new Map<string, string>();
    const walk = (rel: string) => {
      for (const n of readdirSync(join(dir, rel))) {
        const r = rel ? `${rel}/${n}` : n;
        if (only && !only.has(r)) continue;
        const st = lstatSync(join(dir, r));
        const body = st.isSymbolicLink() ? readlinkSync(join(dir, r)) : st.isFile() ? readFileSync(join(dir, r), "utf8") : "";
        out.set(r, `${st.mode.toString(8)} ${body.replaceAll(dir, "<ENV>")}`);
        if (st.isDirectory()) walk(r);
      }
    };
    walk("");
    return out;
  };

  test("a later build's venv is what uv venv makes at its path, and its activate script names it", async () => {
    const s = sandbox();
    try {
      const build = async (spec: string) => {
        const r = await cli(["env", "prepare", "-p", spec, "--index-url", index.url, "--python", worker], { env: s.env, cwd: s.root });
        expect(r.code).toBe(0);
        return { path: r.stdout.trim().split("\n").at(-1)!, stderr: r.stderr };
      };
      const first = await build("beta");
      expect(first.stderr).not.toContain("kept from an earlier build");
      const second = await build("zeta");
      expect(second.stderr).toContain("creating virtual environment with uv (kept from an earlier build)");
      // The reference: uv itself, asked for a venv of the same interpreter at a path of the same shape.
      const reference = join(s.root, "f".repeat(64));
      expect(Bun.spawnSync([realUv()!, "venv", "--no-config", "--quiet", "--python", worker, reference], { env: s.env }).exitCode).toBe(0);
      const made = tree(reference);
      const names = new Set(made.keys());
      expect(tree(second.path, names)).toEqual(made);
      const activated = Bun.spawnSync(["bash", "-c", `. '${second.path}/bin/activate' && echo "$VIRTUAL_ENV" && command -v python && python -c 'import zeta, sys; print(sys.prefix)'`], { env: s.env, stdout: "pipe" });
      expect(activated.stdout.toString().trim().split("\n")).toEqual([second.path, join(second.path, "bin", "python"), second.path]);
    } finally {
      s.cleanup();
    }
  });
});

describe("a time limit on preparation", () => {
  const hung = (s: { root: string }, name: string) => {
    const counter = join(s.root, `${name}.builds`);
    index.sdist({ name, version: "1.0", counter, sleep: 600 });
    return counter;
  };
  /** The build's processes: any still alive would hold the counter's marker in its arguments or files. */
  const running = (marker: string) => Bun.spawnSync(["pgrep", "-f", marker]).stdout.toString().trim();

  for (const installer of HAS_UV ? (["auto", "pip"] as const) : (["pip"] as const)) {
    test(`env prepare --prepare-timeout (${installer}): the installer's whole group is killed, one line says where, nothing is kept`, async () => {
      const s = sandbox();
      try {
        const name = `hangs-${installer}`;
        const counter = hung(s, name);
        // The machine's temporary folder: a killed pip's temporary files (its unpacked download, its build) are not left there.
        const machineTmp = join(s.root, "machine-tmp");
        mkdirSync(machineTmp);
        const t = performance.now();
        const r = await cli(["env", "prepare", "-p", name, "--index-url", index.url, "--python", worker, "--prepare-timeout", "4s"], { env: { ...s.env, GPULAYER_INSTALLER: installer, TMPDIR: machineTmp }, cwd: s.root });
        expect(performance.now() - t).toBeLessThan(30_000);
        expect(r.code).toBe(1);
        expect(r.stderr).toMatch(/^error: timed out after 4 s while installing 1 requirement\(s\) with .* \(prepare_timeout; nothing was kept\)$/m);
        expect(readdirSync(counter.replace(/[^/]+$/, "")).includes(`${name}.builds`)).toBe(true); // the build did start
        await Bun.sleep(300);
        expect(running(name)).toBe("");
        expect(readdirSync(join(s.home, "envs-v1")).filter((n) => !n.startsWith("."))).toEqual([]);
        expect(readdirSync(machineTmp)).toEqual([]);
      } finally {
        s.cleanup();
      }
    });
  }

  test("a job file's environment.prepare_timeout: the job fails in task.prepare, its command never runs", async () => {
    const s = sandbox();
    try {
      hung(s, "hangs-job");
      writeFileSync(join(s.root, "job.yaml"), `command: echo ran\nenvironment:\n  requirements: [hangs-job]\n  index_url: ${index.url}\n  python: ${worker}\n  prepare_timeout: 3s\n`);
      const r = await cli(["job", "run", "-f", "job.yaml", "--json"], { env: s.env, cwd: s.root });
      expect(r.code).toBe(1);
      const status = JSON.parse(r.stdout) as { state: string; error: string };
      expect(status.state).toBe("failed");
      expect(status.error).toMatch(/^timed out after 3 s while installing/);
      expect(r.stderr).not.toContain("ran");
      expect(running("hangs-job")).toBe("");
      // The variable is the default; the job file's own limit wins over it.
      const bad = await cli(["job", "run", "-f", "job.yaml"], { env: { ...s.env, GPULAYER_PREPARE_TIMEOUT: "soon" }, cwd: s.root });
      expect(bad.code).toBe(2);
      expect(bad.stderr).toStartWith("error: GPULAYER_PREPARE_TIMEOUT=soon (environment): not a duration");
    } finally {
      s.cleanup();
    }
  });
});
