import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { chmodSync, copyFileSync, existsSync, mkdirSync, readdirSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";
import { UV_VERSION } from "../src/env/build/uv-tool.ts";
import { PackageIndex } from "./fixtures/index.ts";
import { bigWheel, slowProxy } from "./fixtures/slow-index.ts";
import { importPythonImage, pythonRootfs } from "./fixtures/python-image.ts";
import { ENGINES, engineMatrix, engineTest, useRegistry } from "./fixtures/registry.ts";
import { cli, realUv, run, sandbox, startCli, tempDir } from "./helpers.ts";
import { type Kept, keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * Requirements on top of a container image, on each real engine: an image
 * made from Debian's python3 with `greetb==1.0` installed in its own site,
 * and a real index on 127.0.0.1. A request the image already satisfies
 * installs nothing into the env; one it does not gets its own copy in the
 * env, which the job imports; the next job reuses the env; the env is
 * read-only inside the job's container.
 */

setDefaultTimeout(300_000);

const matrix = await engineMatrix("image-env.test");
const rootfs = await pythonRootfs();
if ("reason" in rootfs) console.warn(`[image-env.test] skipping: ${rootfs.reason}`);
const registryOf = useRegistry(matrix.working);
const world = tempDir("gpl-image-env-");
const index = new PackageIndex(join(world, "index"));

beforeAll(async () => {
  index.start();
  index.wheel({ name: "greetb", version: "1.0" });
  index.wheel({ name: "greetb", version: "2.0" });
  await bigWheel(index, { name: "trickle", version: "1.0", data_bytes: 2_000_000 });
});
afterAll(() => {
  index.stop();
  Bun.spawn(["rm", "-rf", world]);
});

/** The base image, then one with greetb 1.0 in the image's own site (committed from a container that installed it). */
async function imageWithGreetb(engine: string): Promise<string> {
  const base = `gpl-test/python-base:${engine}`;
  const ref = `gpl-test/python-greetb:1`;
  await importPythonImage(engine as "docker" | "podman", base);
  const name = `gpl-test-greetb-${process.pid}`;
  const r = await run([engine, "run", "--name", name, "--network", "host", base, "python3", "-m", "pip", "install", "--break-system-packages", "--index-url", index.url, "greetb==1.0"]);
  if (r.code !== 0) throw new Error(`installing greetb into the image failed: ${r.stderr}`);
  const c = await run([engine, "commit", name, ref]);
  await run([engine, "rm", "-f", name]);
  if (c.code !== 0) throw new Error(`${engine} commit failed: ${c.stderr}`);
  return ref;
}

/** The env-build containers running (or, with "all", there at all) from `ref`: this file's own, though other files may build in the same engine meanwhile. */
async function buildContainers(engine: string, ref: string, which: "running" | "all" = "running"): Promise<string[]> {
  // By the image's id: gpulayer runs its builds by id, and podman matches an ancestor by what a container was run with.
  const id = (await run([engine, "image", "inspect", "--format", "{{.Id}}", ref])).stdout.trim();
  const r = await run([engine, "ps", "-q", ...(which === "all" ? ["-a"] : []), "--filter", "name=gpulayer-envbuild-", "--filter", `ancestor=${id}`]);
  return r.stdout.split("\n").filter(Boolean);
}

/**
 * Skipped only where the Python image cannot be made (no mmdebstrap, no Debian
 * mirror) and no engine is required; where the run requires the engines (CI
 * does), a missing image is a failing test instead.
 */
function withImage(it: typeof test | null): typeof test | null {
  if (!("reason" in rootfs)) return it;
  // No image and no engine required (a machine without mmdebstrap): skipped; CI requires the engines, so there this fails instead.
  if (!matrix.required.has("docker") && !matrix.required.has("podman")) return test.skip;
  test("the Python test image can be made", () => {
    throw new Error(rootfs.reason);
  });
  return null;
}

/** The base image, then one made from it by a shell command, under names of this run's own (the engines are shared). */
async function ownImage(engine: string, what: string, command: string): Promise<{ ref: string; remove(): Promise<void> }> {
  const base = `gpl-test/python-base-${process.pid}:${engine}`;
  const ref = `gpl-test/python-${what}-${process.pid}:1`;
  await importPythonImage(engine as "docker" | "podman", base);
  const name = `gpl-test-${what}-${process.pid}`;
  const r = await run([engine, "run", "--name", name, "--network", "host", base, "sh", "-c", command]);
  if (r.code !== 0) throw new Error(`making ${ref} failed: ${r.stderr}`);
  const c = await run([engine, "commit", name, ref]);
  await run([engine, "rm", "-f", name]);
  if (c.code !== 0) throw new Error(`${engine} commit failed: ${c.stderr}`);
  return { ref, remove: async () => void (await run([engine, "rmi", "-f", ref, base])) };
}

/** The test process's PATH without any folder that holds a uv (a pyenv shims folder among them). */
const NO_UV_PATH = (process.env.PATH ?? "").split(":").filter((d) => d && !existsSync(join(d, "uv"))).join(":");
/** A copy of the official uv wheel (CI downloads it; tests never reach PyPI): the pinned uv's install runs only with it. */
const OFFICIAL = process.env.GPULAYER_TEST_UV_WHEEL && existsSync(process.env.GPULAYER_TEST_UV_WHEEL) ? process.env.GPULAYER_TEST_UV_WHEEL : null;

/**
 * A pyenv root whose `version` file picks `version`, with a `uv` there when given, and a shims folder whose `uv`
 * is pyenv's shim for it: a script that, run, fails (there is no pyenv here to exec).
 */
function pyenvWithShim(root: string, version: string, uv: string | null): string {
  const bin = join(root, "versions", version, "bin");
  mkdirSync(bin, { recursive: true });
  if (uv) copyFileSync(uv, join(bin, "uv"));
  writeFileSync(join(root, "version"), `${version}\n`);
  mkdirSync(join(root, "shims"));
  const shim = join(root, "shims", "uv");
  writeFileSync(shim, `#!/usr/bin/env bash\nset -e\nprogram="\${0##*/}"\nexport PYENV_ROOT="${root}"\nexec "${root}/libexec/pyenv" exec "$program" "$@"\n`);
  chmodSync(shim, 0o755);
  return join(root, "shims");
}

/** A CA and a certificate for 127.0.0.1 signed by it (uv's TLS takes no self-signed leaf), made by openssl. */
function certificateAuthority(dir: string): { ca: string; cert: string; key: string } {
  mkdirSync(dir, { recursive: true });
  const f = (n: string) => join(dir, n);
  const ssl = (args: string[]) => {
    const r = Bun.spawnSync(["openssl", ...args], { stdout: "pipe", stderr: "pipe" });
    if (r.exitCode !== 0) throw new Error(`openssl ${args[0]}: ${r.stderr.toString()}`);
  };
  writeFileSync(f("leaf.ext"), "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n");
  ssl(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=gpulayer test CA", "-keyout", f("ca.key"), "-out", f("ca.pem"), "-days", "2", "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
  ssl(["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", f("key.pem"), "-out", f("leaf.csr")]);
  ssl(["x509", "-req", "-in", f("leaf.csr"), "-CA", f("ca.pem"), "-CAkey", f("ca.key"), "-CAcreateserial", "-days", "2", "-extfile", f("leaf.ext"), "-out", f("cert.pem")]);
  return { ca: f("ca.pem"), cert: f("cert.pem"), key: f("key.pem") };
}

const envDirs = (home: string) => (existsSync(join(home, "envs-v1")) ? readdirSync(join(home, "envs-v1")).filter((n) => !n.startsWith(".")) : []);
/** Every env of a home gone, as gc would leave it: the next prepare builds. */
const rmEnvs = (home: string) => rmSync(join(home, "envs-v1"), { recursive: true, force: true });

describe.each(ENGINES)("an image and requirements, with %s", (name) => {
  const it = withImage(engineTest(matrix, name));
  if (!it) return;

  const installers: [string, string][] = [["pip", "off"], ...(realUv() ? [["uv", realUv()!] as [string, string]] : [])];
  it.each(installers)("by %s: what the image has is not installed again; what it lacks is, in an env the job imports; reused next time; read-only", async (installer, uvSetting) => {
    const ref = await imageWithGreetb(name);
    const box = sandbox();
    box.env.GPULAYER_CONTAINER_ENGINE = name;
    box.env.GPULAYER_UV = uvSetting;
    try {
      const wd = join(box.root, "wd");
      mkdirSync(wd);
      const job = (spec: string, command: string) => cli(["job", "run", "--json", "--image", ref, "-p", spec, "--index-url", index.url, "--", "sh", "-c", command], { env: box.env, cwd: wd });

      // Satisfied by the image: the env holds no greetb of its own.
      const one = await job("greetb>=1", "python -c 'import greetb; print(greetb.__version__)'");
      expect(one.code, one.stderr).toBe(0);
      expect(one.stderr).toContain("1.0");
      const [first] = envDirs(box.home);
      expect(first).toBeDefined();
      const ownSite = (key: string) => readdirSync(join(box.home, "envs-v1", key, "lib")).flatMap((py) => readdirSync(join(box.home, "envs-v1", key, "lib", py, "site-packages")));
      expect(ownSite(first!).filter((n) => n.startsWith("greetb"))).toEqual([]);

      // Not satisfied: 2.0 goes into a new env, and the job imports it.
      const two = await job("greetb>=2", "python -c 'import greetb; print(greetb.__version__)'; touch /opt/gpulayer/env/x 2>/dev/null && echo writable || echo read-only");
      expect(two.code, two.stderr).toBe(0);
      expect(two.stderr).toContain("2.0");
      expect(two.stderr).toContain("read-only");
      const second = envDirs(box.home).find((k) => k !== first)!;
      expect(ownSite(second).some((n) => n.startsWith("greetb-2.0"))).toBe(true);
      const built = JSON.parse(two.stdout).phases.find((p: any) => p.name === "task.prepare");
      expect(built.cache).toBe("miss");
      const shown = JSON.parse((await cli(["env", "show", second, "--json"], { env: box.env })).stdout);
      expect(shown.installer_path).toBe(`${installer} (inside the image)`);
      expect(shown.installed).toEqual(["greetb==2.0"]);
      expect(JSON.parse((await cli(["env", "show", first!, "--json"], { env: box.env })).stdout).installed).toEqual([]);
      // No stand-in of the image's packages is left in the env.
      expect(ownSite(second).filter((n) => n.startsWith("pip-"))).toEqual([]);

      // The same again: the env is reused, nothing built.
      const again = await job("greetb>=2", "python -c 'import greetb; print(greetb.__version__)'");
      expect(again.code).toBe(0);
      expect(JSON.parse(again.stdout).phases.find((p: any) => p.name === "task.prepare").cache).toBe("hit");
      expect(envDirs(box.home).length).toBe(2);

      // Warmed ahead by env prepare: the job after it builds nothing. The machine's default Python (GPULAYER_PYTHON)
      // is for host envs: an image brings its own, so it is not a contradiction as --python is.
      index.wheel({ name: "greetc", version: "3.0" });
      const warm = await cli(["env", "prepare", "--image", ref, "-p", "greetc", "--index-url", index.url, "--json"], { env: { ...box.env, GPULAYER_PYTHON: "python3" }, cwd: wd });
      expect(warm.code, warm.stderr).toBe(0);
      expect(JSON.parse(warm.stdout).env).toMatchObject({ status: "built" });
      const warmAgain = await cli(["env", "prepare", "--image", ref, "-p", "greetc", "--index-url", index.url, "--json"], { env: box.env, cwd: wd });
      expect(JSON.parse(warmAgain.stdout).env).toMatchObject({ status: "reused", key: JSON.parse(warm.stdout).env.key });
      const after = await job("greetc", "python -c 'import greetc; print(greetc.__version__)'");
      expect(after.stderr).toContain("3.0");
      expect(JSON.parse(after.stdout).phases.find((p: any) => p.name === "task.prepare").cache).toBe("hit");
    } finally {
      box.cleanup();
      await run([name, "rmi", "-f", ref, `gpl-test/python-base:${name}`]);
    }
  });

  it("uv on PATH is a pyenv shim and the image has no pip: the build uses the uv a host build would (the one the shim runs; else the pinned uv, fetched from the index)", async () => {
    const image = await ownImage(name, "nopip", "rm -rf /usr/lib/python3/dist-packages/pip /usr/lib/python3/dist-packages/pip-*");
    const boxes: ReturnType<typeof sandbox>[] = [];
    try {
      const prepare = async (version: string, uv: string | null, spec: string) => {
        const box = sandbox();
        boxes.push(box);
        for (const v of ["PYENV_VERSION", "PYENV_DIR", "PYENV_ROOT"]) delete box.env[v];
        box.env.GPULAYER_CONTAINER_ENGINE = name;
        box.env.PATH = `${pyenvWithShim(join(box.root, "pyenv"), version, uv)}:${NO_UV_PATH}`;
        const r = await cli(["env", "prepare", "--image", image.ref, "-p", spec, "--index-url", index.url, "--json"], { env: box.env, cwd: box.root });
        expect(r.code, r.stderr).toBe(0);
        const env = JSON.parse(r.stdout).env;
        expect(env.status).toBe("built");
        const shown = JSON.parse((await cli(["env", "show", env.key, "--json"], { env: box.env })).stdout);
        expect(shown.installer_path).toBe("uv (inside the image)");
        expect(shown.installed).toEqual([spec]);
        return { box, stderr: r.stderr };
      };
      // The shim's Python version has a uv: that binary is mounted in (the shim itself is a script, and fails when run).
      const own = await prepare("3.99.1", realUv(), "greetb==2.0");
      expect(own.stderr).toContain(`with uv ${join(own.box.root, "pyenv", "versions", "3.99.1", "bin", "uv")}, mounted in`);
      // It has none: the pinned uv, installed once into the tools folder from the request's index, as for a host build.
      if (OFFICIAL) {
        copyFileSync(OFFICIAL, join(index.dir, basename(OFFICIAL)));
        const pinned = await prepare("3.99.2", null, "greetb==1.0");
        expect(pinned.stderr).toContain(`with the pinned uv ${UV_VERSION} (${join(pinned.box.home, "tools", `uv-${UV_VERSION}`, "uv")}), mounted in`);
        expect(existsSync(join(pinned.box.home, "tools", `uv-${UV_VERSION}`, "uv"))).toBe(true);
      } else console.warn(`[image-env.test] the pinned uv's fetch is not tried: set GPULAYER_TEST_UV_WHEEL to a copy of the official uv ${UV_VERSION} wheel`);
    } finally {
      for (const box of boxes) box.cleanup();
      await image.remove();
    }
  });

  it("an index over HTTPS whose CA only the host's pip configuration names: the host build and the image build (pip and uv) both get it; another configuration, another env", async () => {
    expect(Bun.which("openssl"), "openssl makes the test's CA").not.toBeNull();
    const image = await ownImage(name, "tls", "true");
    const box = sandbox();
    const tls = certificateAuthority(join(box.root, "tls"));
    const upstream = new URL(index.url);
    const https = Bun.serve({ port: 0, hostname: "127.0.0.1", tls: { cert: Bun.file(tls.cert), key: Bun.file(tls.key) }, fetch: (req) => fetch(new URL(new URL(req.url).pathname, upstream.origin)) });
    try {
      const conf = join(box.root, "pip.conf");
      const secure = `https://127.0.0.1:${https.port}${upstream.pathname}`;
      writeFileSync(conf, `[global]\nindex-url = ${secure}\ncert = ${tls.ca}\n`);
      // Only that file names the CA: no certificate variable, and no other pip configuration of this machine's.
      mkdirSync(join(box.root, "xdg"));
      const env: Record<string, string> = { ...box.env, PIP_CONFIG_FILE: conf, XDG_CONFIG_DIRS: join(box.root, "xdg"), XDG_CONFIG_HOME: join(box.root, "xdg"), GPULAYER_CONTAINER_ENGINE: name };
      for (const v of ["REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS"]) delete env[v];
      const onHost = await cli(["env", "prepare", "-p", "greetb==2.0", "--json"], { env, cwd: box.root });
      expect(onHost.code, onHost.stderr).toBe(0);
      // The same index without the CA named: the image build is refused the server's certificate (it is the CA that lets it in).
      writeFileSync(conf, `[global]\nindex-url = ${secure}\nretries = 0\n`);
      const refused = await cli(["env", "prepare", "--image", image.ref, "-p", "greetb==2.0", "--json"], { env: { ...env, GPULAYER_UV: "off" }, cwd: box.root });
      expect(refused.code).not.toBe(0);
      expect(refused.stderr).toMatch(/certificate/i);
      writeFileSync(conf, `[global]\nindex-url = ${secure}\ncert = ${tls.ca}\n`);
      const installers: [string, string][] = [["pip", "off"], ...(realUv() ? [["uv", realUv()!] as [string, string]] : [])];
      for (const [installer, uvSetting] of installers) {
        const inImage = await cli(["env", "prepare", "--image", image.ref, "-p", "greetb==2.0", "--json"], { env: { ...env, GPULAYER_UV: uvSetting }, cwd: box.root });
        expect(inImage.code, inImage.stderr).toBe(0);
        // What the build was given, in its steps.
        expect(inImage.stderr).toContain(`building with the host's pip configuration (`);
        expect(inImage.stderr).toContain(`${conf}): index ${secure}, cert ${tls.ca} (read-only)\n`);
        const key = JSON.parse(inImage.stdout).env.key;
        expect(JSON.parse((await cli(["env", "show", key, "--json"], { env })).stdout).installer_path).toBe(`${installer} (inside the image)`);
        const job = await cli(["job", "run", "--image", image.ref, "-p", "greetb==2.0", "--", "python", "-c", "import greetb; print(greetb.__version__)"], { env: { ...env, GPULAYER_UV: uvSetting }, cwd: box.root });
        expect(job.code, job.stderr).toBe(0);
        expect(job.stdout.trim()).toBe("2.0");
        rmEnvs(box.home);
      }
      // The key covers the host's configuration: one built under it is not reused under another.
      const prepare = async (e: Record<string, string>) => JSON.parse((await cli(["env", "prepare", "--image", image.ref, "-p", "greetb==2.0", "--json"], { env: e, cwd: box.root })).stdout).env;
      const first = await prepare(env);
      expect((await prepare(env)).key).toBe(first.key);
      writeFileSync(conf, `[global]\nindex-url = ${secure}\ncert = ${tls.ca}\ntimeout = 31\n`);
      const other = await prepare(env);
      expect(other.status).toBe("built");
      expect(other.key).not.toBe(first.key);
    } finally {
      await https.stop(true);
      box.cleanup();
      await image.remove();
    }
  });

  it("an index on the host's disk, named by its pip configuration, whose pages link to files beside it (a mirror's layout): the image build reaches them as the host's does", async () => {
    const box = sandbox();
    try {
      // mirror/simple/greetb/index.html links ../../files/greetb-2.0-...whl: the files are outside the index's own folder.
      const mirror = join(box.root, "mirror");
      const wd = join(box.root, "wd");
      mkdirSync(wd);
      const wheel = readdirSync(index.dir).find((f) => f.startsWith("greetb-2.0-") && f.endsWith(".whl"))!;
      mkdirSync(join(mirror, "files"), { recursive: true });
      mkdirSync(join(mirror, "simple", "greetb"), { recursive: true });
      copyFileSync(join(index.dir, wheel), join(mirror, "files", wheel));
      writeFileSync(join(mirror, "simple", "greetb", "index.html"), `<!DOCTYPE html><html><body><a href="../../files/${wheel}">${wheel}</a></body></html>\n`);
      const conf = join(box.root, "pip.conf");
      writeFileSync(conf, `[global]\nindex-url = file://${join(mirror, "simple")}\n`);
      mkdirSync(join(box.root, "xdg"));
      const env: Record<string, string> = { ...box.env, PIP_CONFIG_FILE: conf, XDG_CONFIG_DIRS: join(box.root, "xdg"), XDG_CONFIG_HOME: join(box.root, "xdg"), GPULAYER_CONTAINER_ENGINE: name };
      const image = await ownImage(name, "mirror", "true");
      try {
        const installers: [string, string][] = [["pip", "off"], ...(realUv() ? [["uv", realUv()!] as [string, string]] : [])];
        for (const [, uvSetting] of installers) {
          // The job's folder is mounted into the build: the mirror is not in it.
          const job = await cli(["job", "run", "--image", image.ref, "-p", "greetb==2.0", "--", "python", "-c", "import greetb; print(greetb.__version__)"], { env: { ...env, GPULAYER_UV: uvSetting }, cwd: wd });
          expect(job.code, job.stderr).toBe(0);
          expect(job.stdout.trim()).toBe("2.0");
          rmEnvs(box.home);
        }
      } finally {
        await image.remove();
      }
    } finally {
      box.cleanup();
    }
  });

  it("gpulayer SIGKILLed while the image's pip installs: the orphaned build container is ended, and the next prepare builds", async () => {
    const ref = await imageWithGreetb(name);
    const box = sandbox();
    box.env.GPULAYER_CONTAINER_ENGINE = name;
    const slow = slowProxy(index);
    try {
      const args = ["env", "prepare", "--image", ref, "-p", "trickle", "--index-url", slow.url, "--json"];
      const first = startCli(args, { env: box.env, cwd: box.root });
      const builders = () => buildContainers(name, ref);
      await waitFor("the build container to download", async () => slow.state.downloads > 0 && (await builders()).length > 0, 60_000);
      first.kill("SIGKILL");
      await first.exited;
      const orphans = await builders();
      expect(orphans).not.toEqual([]); // the engine keeps it running: it is still writing into the env's folder
      slow.state.slow = false;
      const second = await cli(args, { env: box.env, cwd: box.root });
      expect(second.code, second.stderr).toBe(0);
      expect(JSON.parse(second.stdout).env.status).toBe("built");
      expect(await builders()).toEqual([]);
      const check = await cli(["job", "run", "--image", ref, "-p", "trickle", "--index-url", slow.url, "--", "python", "-c", "import trickle; print(trickle.__version__)"], { env: box.env, cwd: box.root });
      expect(check.stdout.trim()).toBe("1.0");
    } finally {
      slow.stop();
      box.cleanup();
      await run([name, "rmi", "-f", ref, `gpl-test/python-base:${name}`]);
    }
  });

  it("a new image pushed under the same tag, with --pull always: a new env (the key is the image, not its tag)", async () => {
    const local = await imageWithGreetb(name);
    const ref = `${registryOf().host}/image-env-${name}:1`;
    const push = async () => {
      expect((await run([name, "tag", local, ref])).code).toBe(0);
      expect((await run([name, "push", ...(name === "podman" ? ["--tls-verify=false"] : []), ref])).code).toBe(0);
      // Only the registry has it under that name: gpulayer's pull brings it, so it is gc's to remove.
      await run([name, "rmi", ref]);
    };
    const box = sandbox();
    box.env.GPULAYER_CONTAINER_ENGINE = name;
    try {
      await push();
      const prepare = async () => JSON.parse((await cli(["env", "prepare", "--image", ref, "--pull", "always", "-p", "greetb>=2", "--index-url", index.url, "--json"], { env: box.env, cwd: box.root })).stdout);
      const first = await prepare();
      expect(first.env.status).toBe("built");
      expect((await prepare()).env).toMatchObject({ status: "reused", key: first.env.key });
      // A job with the default pull policy: the image and the env reused, the registry not asked.
      const asked = registryOf().manifestRequests(`image-env-${name}`, "1");
      const job = await cli(["job", "run", "--json", "--image", ref, "-p", "greetb>=2", "--index-url", index.url, "--", "python", "-c", "import greetb"], { env: box.env, cwd: box.root });
      expect(job.code, job.stderr).toBe(0);
      expect(JSON.parse(job.stdout).phases.find((p: any) => p.name === "task.prepare").cache).toBe("hit");
      expect(registryOf().manifestRequests(`image-env-${name}`, "1")).toBe(asked);
      // Another image under the same tag: one more file in it is another image id.
      const c = `gpl-test-retag-${process.pid}`;
      expect((await run([name, "run", "--name", c, local, "sh", "-c", "echo 2 > /etc/image-version"])).code).toBe(0);
      expect((await run([name, "commit", c, local])).code).toBe(0);
      await run([name, "rm", "-f", c]);
      await push();
      const second = await prepare();
      expect(second.image_id).not.toBe(first.image_id);
      expect(second.env.status).toBe("built");
      expect(second.env.key).not.toBe(first.env.key);

      // gc takes the image (its record follows the tag: the new one), and the env built on it goes along, though the limit alone would keep it.
      const gc = async (args: string[]) => JSON.parse((await cli(["gc", "--min-age", "0", "--json", ...args], { env: box.env })).stdout);
      await run([name, "rmi", local]); // the image is the pulled reference's alone now: removing it frees its bytes
      // The old env used last of all (gc orders by this file's mtime): the limit is met without it.
      const now = new Date();
      utimesSync(join(box.home, "envs-v1", first.env.key, ".gpulayer", "last-used"), now, now);
      const plan = await gc(["--max-size", "0", "--dry-run"]);
      expect(plan.removed[0]).toMatchObject({ kind: "image", id: second.image_id });
      const total = plan.total_before_bytes;
      const done = await gc(["--max-size", String(total - plan.removed[0].size_bytes)]);
      expect(done.removed.map((r: any) => [r.kind, r.id, r.reason])).toEqual([
        ["image", second.image_id, "lru"],
        ["env", second.env.key, "image"],
      ]);
      expect(existsSync(join(box.home, "envs-v1", first.env.key))).toBe(true);
    } finally {
      box.cleanup();
      await run([name, "rmi", "-f", ref, local, `gpl-test/python-base:${name}`]);
    }
  });

  it("an image without Python: one line naming it, in task.prepare; nothing built", async () => {
    const box = sandbox();
    box.env.GPULAYER_CONTAINER_ENGINE = name;
    const ref = "gpl-test/no-python:1";
    try {
      const root = join(box.root, "rootfs");
      mkdirSync(join(root, "bin"), { recursive: true });
      await run(["cp", "/bin/busybox", join(root, "bin", "busybox")]);
      await run(["ln", "-s", "busybox", join(root, "bin", "sh")]);
      const tar = join(box.root, "rootfs.tar");
      await run(["tar", "-C", root, "-cf", tar, "."]);
      const imported = await run([name, "import", tar, ref]);
      expect(imported.code, imported.stderr).toBe(0);
      const r = await cli(["job", "run", "--image", ref, "-p", "greetb", "--index-url", index.url, "--", "true"], { env: box.env, cwd: box.root });
      expect(r.code).not.toBe(0);
      expect(r.stderr).toContain(`image ${ref} has no Python`);
      expect(envDirs(box.home)).toEqual([]);
    } finally {
      box.cleanup();
      await run([name, "rmi", "-f", ref]);
    }
  });

  it("a requirement the image's Python cannot install: the installer's message, in task.prepare; nothing kept", async () => {
    const ref = await imageWithGreetb(name);
    const box = sandbox();
    box.env.GPULAYER_CONTAINER_ENGINE = name;
    try {
      const r = await cli(["job", "run", "--image", ref, "-p", "nosuchpkg-gpl", "--index-url", index.url, "--", "echo", "ran"], { env: box.env, cwd: box.root });
      expect(r.code).not.toBe(0);
      expect(r.stdout).not.toContain("ran");
      expect(r.stderr).toContain("nosuchpkg-gpl");
      expect(envDirs(box.home)).toEqual([]);
      const [job] = JSON.parse((await cli(["job", "list", "--json"], { env: box.env })).stdout);
      expect(job.phases.map((p: any) => [p.name, p.state])).toEqual([["task.prepare", "failed"]]);
    } finally {
      box.cleanup();
      await run([name, "rmi", "-f", ref, `gpl-test/python-base:${name}`]);
    }
  });

  // The lock is read by uv here (uv export): skipped only without uv (CI installs it).
  (realUv() ? it : test.skip)("a uv project on the image: exactly the lock's packages, for the image's Python; the image's own kept at the locked version, another version shadowed and reported; a stale lock refused in one line", async () => {
    const ref = await imageWithGreetb(name);
    const box = sandbox();
    box.env.GPULAYER_CONTAINER_ENGINE = name;
    box.env.GPULAYER_UV = realUv()!;
    index.wheel({ name: "greetd", version: "1.0", requires: ["greetb"] });
    index.wheel({ name: "greetd", version: "2.0" });
    try {
      const wd = join(box.root, "wd");
      const app = join(wd, "app");
      mkdirSync(app, { recursive: true });
      // greetb as the image has it; greetd 1.0 (not the index's newest) in a group; the project itself is not a package.
      const pyproject = `[project]\nname = "app"\nversion = "0.1"\nrequires-python = ">=3.8"\ndependencies = ["greetb==1.0"]\n\n[dependency-groups]\nextra = ["greetd<2"]\n\n[tool.uv]\npackage = false\n\n[[tool.uv.index]]\nurl = "${index.url}"\ndefault = true\n`;
      writeFileSync(join(app, "pyproject.toml"), pyproject);
      const locked = await run(["uv", "lock", "--project", app], { env: box.env, cwd: wd });
      expect(locked.code, locked.stderr).toBe(0);
      const job = await cli(["job", "run", "--json", "--image", ref, "--project", "app", "--group", "extra", "--", "python", "-c", "import greetb, greetd; print(greetb.__version__, greetd.__version__)"], { env: box.env, cwd: wd });
      expect(job.code, job.stderr).toBe(0);
      expect(job.stderr).toContain("1.0 1.0");
      const [key] = envDirs(box.home);
      const shown = JSON.parse((await cli(["env", "show", key!, "--json"], { env: box.env })).stdout);
      // greetd from the lock, into the env; greetb 1.0 is the image's, as locked: not installed again.
      expect(shown.installed).toEqual(["greetd==1.0"]);
      expect(shown.summary).toBe(`uv project app (uv.lock --group extra) on ${ref}`);
      const again = await cli(["env", "prepare", "--image", ref, "--project", "app", "--group", "extra", "--json"], { env: box.env, cwd: wd });
      expect(again.code, again.stderr).toBe(0);
      expect(JSON.parse(again.stdout).env).toMatchObject({ status: "reused", key });

      // pyproject.toml asks for what the lock does not hold: refused in uv's words, nothing kept.
      writeFileSync(join(app, "pyproject.toml"), pyproject.replace('["greetb==1.0"]', '["greetb==1.0", "greetd"]'));
      const stale = await cli(["env", "prepare", "--image", ref, "--project", "app"], { env: box.env, cwd: wd });
      expect(stale.code, stale.stderr).toBe(2);
      expect(stale.stderr.trim().split("\n").at(-1)).toBe(`error: ${app}/uv.lock: the lockfile needs to be updated: run uv lock`);
      // Refused before anything is said of a build in the image.
      expect(stale.stderr).not.toContain("building the env inside");
      expect(envDirs(box.home)).toEqual([key!]);

      // A lock that pins another greetb than the image's: the lock's goes into the env, and is reported as shadowing the image's.
      writeFileSync(join(app, "pyproject.toml"), pyproject.replace('["greetb==1.0"]', '["greetb==2.0"]'));
      expect((await run(["uv", "lock", "--project", app], { env: box.env, cwd: wd })).code).toBe(0);
      const newer = await cli(["job", "run", "--json", "--image", ref, "--project", "app", "--", "python", "-c", "import greetb; print(greetb.__version__)"], { env: box.env, cwd: wd });
      expect(newer.code, newer.stderr).toBe(0);
      expect(newer.stderr).toContain("2.0");
      const third = envDirs(box.home).find((k) => k !== key)!;
      const shadows = [{ name: "greetb", worker: "1.0", locked: "2.0" }];
      expect(JSON.parse((await cli(["env", "show", third, "--json"], { env: box.env })).stdout)).toMatchObject({ installed: ["greetb==2.0"], shadowed: shadows });
      expect(JSON.parse(newer.stdout).events.find((e: any) => e.type === "task.prepare.finished").data.shadowed).toEqual(shadows);
      const prepared = await cli(["env", "prepare", "--image", ref, "--project", "app", "--json"], { env: box.env, cwd: wd });
      expect(JSON.parse(prepared.stdout).env).toMatchObject({ status: "reused", key: third, shadowed: shadows });
    } finally {
      box.cleanup();
      await run([name, "rmi", "-f", ref, `gpl-test/python-base:${name}`]);
    }
  });

  it("what an image cannot honour (a lock's local packages, conda, a Python of its own, no build isolation, a pylock.toml) is refused in one line before anything is pulled or built", async () => {
    const box = sandbox();
    box.env.GPULAYER_CONTAINER_ENGINE = name;
    // An image no engine has: a refusal comes before any pull, so it is never looked for.
    const ref = `gpl-test/never-pulled-${process.pid}:1`;
    const wd = join(box.root, "wd");
    try {
      mkdirSync(join(wd, "proj"), { recursive: true });
      writeFileSync(join(wd, "proj", "pyproject.toml"), `[project]\nname = "proj"\nversion = "0.1"\ndependencies = ["greetb==2.0"]\n`);
      writeFileSync(join(wd, "pylock.toml"), `lock-version = "1.0"\ncreated-by = "test"\n`);
      // A project that is a package: its lock installs it (editable), which the image's Python cannot be given.
      mkdirSync(join(wd, "pkg"));
      writeFileSync(join(wd, "pkg", "pyproject.toml"), `[project]\nname = "pkg"\nversion = "0.1"\ndependencies = []\n\n[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n`);
      writeFileSync(join(wd, "pkg", "uv.lock"), `version = 1\nrevision = 3\nrequires-python = ">=3.8"\n\n[[package]]\nname = "pkg"\nversion = "0.1"\nsource = { editable = "." }\n`);
      writeFileSync(join(wd, "job.yaml"), `command: python3 -c 'import greetb'\nenvironment:\n  python: python3\n`);
      const on = `does not go with an image (${ref})`;
      const cases: [string[], string][] = [
        [["job", "run", "--image", ref, "--project", "pkg", "--", "true"], `a uv project whose lock installs local packages (${join(wd, "pkg")}) ${on} yet: set [tool.uv] package = false for the project itself, publish the others to an index, or build the image with them`],
        [["job", "run", "--image", ref, "--conda", "base", "-p", "greetb", "--", "true"], `a conda environment (base) ${on}: the env is built for the image's own Python`],
        [["job", "run", "--image", ref, "--python", "python3", "-p", "greetb", "--", "true"], `--python python3 ${on}: the env is built for the image's own Python`],
        [["job", "run", "-f", "job.yaml", "--image", ref], `job.yaml: environment.python (python3) ${on}: the env is built for the image's own Python`],
        [["job", "run", "--image", ref, "-p", "greetb", "--no-build-isolation-package", "greetb", "--", "true"], `no build isolation (greetb) ${on} yet: build those packages into the image, or run it without --image`],
        [["job", "run", "--image", ref, "-r", "pylock.toml", "--", "true"], `a pylock.toml (${join(wd, "pylock.toml")}) ${on} yet: give its packages as requirements, or run it without --image`],
        [["env", "prepare", "--image", ref, "--python", "python3", "-p", "greetb"], `--python python3 ${on}: the env is built for the image's own Python`],
      ];
      for (const [args, line] of cases) {
        const r = await cli(args, { env: box.env, cwd: wd });
        expect([r.code, r.stderr], args.join(" ")).toEqual([2, `error: ${line}\n`]);
        expect(r.stdout).toBe("");
      }
      expect(envDirs(box.home)).toEqual([]);
      expect((await run([name, "image", "inspect", ref])).code).not.toBe(0);
    } finally {
      box.cleanup();
    }
  });

  it("prepare_timeout holds for the env inside an image: one line says so, the build container is ended, nothing is kept", async () => {
    const ref = await imageWithGreetb(name);
    const box = sandbox();
    box.env.GPULAYER_CONTAINER_ENGINE = name;
    // trickle's download crawls until told otherwise: the limit comes while the image's installer is at it.
    const slow = slowProxy(index);
    try {
      const r = await cli(["env", "prepare", "--image", ref, "-p", "trickle", "--index-url", slow.url, "--prepare-timeout", "8s"], { env: box.env, cwd: box.root });
      expect(r.code).toBe(1);
      expect(r.stderr.trim().split("\n").at(-1)).toBe(`error: timed out after 8 s while building the env inside ${ref} (prepare_timeout; nothing was kept)`);
      expect(slow.state.downloads).toBeGreaterThan(0); // the build did start
      await waitFor("the build container to go", async () => (await buildContainers(name, ref, "all")).length === 0, 30_000);
      expect(envDirs(box.home)).toEqual([]);
    } finally {
      slow.stop();
      box.cleanup();
      await run([name, "rmi", "-f", ref, `gpl-test/python-base:${name}`]);
    }
  });
});

describe("an image and requirements, through a server", () => {
  const engine = matrix.status.docker.ok ? "docker" : matrix.status.podman.ok ? "podman" : null;
  // No engine at all: the engine suites above already fail where engines are required, and say why where not.
  const it = withImage(engine ? test : test.skip);
  if (!it) return;
  it("env prepare --server warms the env on the worker; a remote job then builds nothing and imports it", async () => {
    const ref = await imageWithGreetb(engine!);
    const box = sandbox();
    const procs: Kept[] = [];
    const TOKEN = "image-env-server-token-0123456789";
    try {
      const fast = { GPULAYER_HEARTBEAT_SECONDS: "0.3", GPULAYER_CONTAINER_ENGINE: engine!, GPULAYER_TOKEN: TOKEN };
      const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { ...box.env, ...fast, GPULAYER_HOME: join(box.root, "server-home") } }), procs);
      const url = await waitFor("the server", () => /"url": "([^"]+)"/.exec(server.out())?.[1]);
      const worker = keepOutput(startCli(["join", url, "--name", "w1", "--python", "python3"], { env: { ...box.env, ...fast, GPULAYER_HOME: join(box.root, "w1-home") } }), procs);
      await waitFor("the worker", () => worker.out().includes("as w1"));
      const client = { ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN };
      index.wheel({ name: "greetd", version: "4.0" });
      const warm = await cli(["env", "prepare", "--image", ref, "-p", "greetd", "--index-url", index.url, "--json"], { env: client, cwd: box.root });
      expect(warm.code, warm.stderr).toBe(0);
      const [w] = JSON.parse(warm.stdout).workers;
      expect(w).toMatchObject({ worker: "w1", status: "built" });
      expect(warm.stderr).toContain("[w1] building the env inside");
      const job = await cli(["job", "run", "--json", "--image", ref, "-p", "greetd", "--index-url", index.url, "--", "python", "-c", "import greetd; print(greetd.__version__)"], { env: client, cwd: box.root });
      expect(job.code, job.stderr).toBe(0);
      expect(job.stderr).toContain("4.0");
      expect(JSON.parse(job.stdout).phases.find((p: any) => p.name === "task.prepare").cache).toBe("hit");
    } finally {
      await stopAll(procs);
      box.cleanup();
      await run([engine!, "rmi", "-f", ref, `gpl-test/python-base:${engine}`]);
    }
  });

  // The lock is read by uv on the worker (uv export): skipped only without uv (CI installs it).
  (realUv() ? it : test.skip)("a uv project on an image through a server: the project and its lock travel in the bundle; the worker's env holds the locked version", async () => {
    const ref = await imageWithGreetb(engine!);
    const box = sandbox();
    const procs: Kept[] = [];
    const TOKEN = "image-env-server-token-0123456789";
    index.wheel({ name: "greete", version: "1.0" });
    index.wheel({ name: "greete", version: "2.0" });
    try {
      const fast = { GPULAYER_HEARTBEAT_SECONDS: "0.3", GPULAYER_CONTAINER_ENGINE: engine!, GPULAYER_TOKEN: TOKEN, GPULAYER_UV: realUv()! };
      const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { ...box.env, ...fast, GPULAYER_HOME: join(box.root, "server-home") } }), procs);
      const url = await waitFor("the server", () => /"url": "([^"]+)"/.exec(server.out())?.[1]);
      const worker = keepOutput(startCli(["join", url, "--name", "w1", "--python", "python3"], { env: { ...box.env, ...fast, GPULAYER_HOME: join(box.root, "w1-home") } }), procs);
      await waitFor("the worker", () => worker.out().includes("as w1"));
      const wd = join(box.root, "wd");
      mkdirSync(join(wd, "app"), { recursive: true });
      // Locked at greete 1.0; the index also offers 2.0.
      writeFileSync(join(wd, "app", "pyproject.toml"), `[project]\nname = "app"\nversion = "0.1"\nrequires-python = ">=3.8"\ndependencies = ["greete<2"]\n\n[tool.uv]\npackage = false\n\n[[tool.uv.index]]\nurl = "${index.url}"\ndefault = true\n`);
      const locked = await run(["uv", "lock", "--project", join(wd, "app")], { env: box.env, cwd: wd });
      expect(locked.code, locked.stderr).toBe(0);
      writeFileSync(join(wd, "job.yaml"), ["command: python -c 'import greete; print(\"greete\", greete.__version__)'", "environment:", `  image: ${ref}`, "  project: app", ""].join("\n"));
      const job = await cli(["job", "run", "-f", "job.yaml", "--json"], { env: { ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN }, cwd: wd });
      expect(job.code, job.stderr).toBe(0);
      expect(job.stderr + job.stdout).toContain("greete 1.0");
      expect(job.stderr).toContain("[w1] building the env inside");
    } finally {
      await stopAll(procs);
      box.cleanup();
      await run([engine!, "rmi", "-f", ref, `gpl-test/python-base:${engine}`]);
    }
  });
});
