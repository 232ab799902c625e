import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { makeDist, PackageIndex } from "./fixtures/index.ts";
import { cli, HAS_UV, makeWorkerVenv, sandbox, tempDir } from "./helpers.ts";

/**
 * The machine's pip configuration (a pip.conf named by PIP_CONFIG_FILE, PIP_*
 * variables), as GPU boxes behind a mirror have it: each setting uv can
 * honour is given to uv, and the same request built by both paths, on fresh
 * homes, installs the same set. A setting uv cannot honour is named, and pip
 * builds.
 */

setDefaultTimeout(120_000);

const world = tempDir("gpl-pipconf-");
const main = new PackageIndex(join(world, "main"));
const extra = new PackageIndex(join(world, "extra"));
const links = join(world, "links");
let worker: string;

beforeAll(async () => {
  main.start();
  extra.start();
  main.wheel({ name: "top", version: "1.0", requires: ["dep"] });
  main.wheel({ name: "dep", version: "1.0" });
  main.wheel({ name: "dep", version: "2.0" });
  main.wheel({ name: "pre-pkg", version: "1.0" });
  main.wheel({ name: "pre-pkg", version: "2.0b1" });
  main.sdist({ name: "both-forms", version: "1.0" });
  main.wheel({ name: "both-forms", version: "1.0" });
  extra.wheel({ name: "from-extra", version: "3.0" });
  mkdirSync(links);
  makeDist("wheel", links, { name: "linked", version: "0.5" });
  worker = await makeWorkerVenv(join(world, "worker"), { env: sandbox().env, withPip: true });
});

afterAll(() => {
  main.stop();
  extra.stop();
});

/** The env's own `name==version` set. */
function installed(path: string): string[] {
  const site = join(path, "lib", "python3.11", "site-packages");
  return readdirSync(site)
    .map((n) => /^(.+)-([^-]+)\.dist-info$/.exec(n))
    .filter((m): m is RegExpExecArray => Boolean(m))
    .map((m) => `${m[1]!.toLowerCase().replace(/_/g, "-")}==${m[2]}`)
    .sort();
}

async function build(specs: string[], conf: string, vars: Record<string, string>, installer: "pip" | "auto") {
  const s = sandbox();
  const file = join(s.root, "pip.conf");
  writeFileSync(file, conf);
  const env = { ...s.env, ...vars, PIP_CONFIG_FILE: file, GPULAYER_INSTALLER: installer };
  const r = await cli(["env", "prepare", ...specs.flatMap((p) => ["-p", p]), "--python", worker, "--json"], { env, cwd: s.root });
  if (r.code !== 0) throw new Error(`${installer}: ${r.stderr}`);
  const doc = JSON.parse(r.stdout) as { path: string; installer_path: string };
  return { set: installed(doc.path), path: doc.installer_path, stderr: r.stderr };
}

const constraints = join(world, "constraints.txt");
writeFileSync(constraints, "dep<2\n");

const cases: { name: string; specs: string[]; conf: () => string; vars?: Record<string, string>; expect: string[] }[] = [
  { name: "index-url in pip.conf", specs: ["top"], conf: () => `[global]\nindex-url = ${main.url}\n`, expect: ["dep==2.0", "top==1.0"] },
  { name: "extra-index-url in pip.conf", specs: ["from-extra", "top"], conf: () => `[global]\nindex-url = ${main.url}\nextra-index-url = ${extra.url}\n`, expect: ["dep==2.0", "from-extra==3.0", "top==1.0"] },
  { name: "a constraint file in pip.conf", specs: ["top"], conf: () => `[global]\nindex-url = ${main.url}\nconstraint = ${constraints}\n`, expect: ["dep==1.0", "top==1.0"] },
  { name: "find-links and no-index from PIP_* variables", specs: ["linked"], conf: () => "", vars: { PIP_FIND_LINKS: links, PIP_NO_INDEX: "1" }, expect: ["linked==0.5"] },
  { name: "PIP_PRE", specs: ["pre-pkg"], conf: () => `[global]\nindex-url = ${main.url}\n`, vars: { PIP_PRE: "1" }, expect: ["pre-pkg==2.0b1"] },
  { name: "only-binary in [install]", specs: ["both-forms"], conf: () => `[global]\nindex-url = ${main.url}\n[install]\nonly-binary = :all:\n`, expect: ["both-forms==1.0"] },
  {
    name: "timeout, retries, trusted-host and cert: how it talks, same set",
    specs: ["top"],
    conf: () => `[global]\nindex-url = ${main.url}\ntimeout = 30\nretries = 2\ntrusted-host = 127.0.0.1\ncert = /etc/ssl/certs/ca-certificates.crt\n`,
    expect: ["dep==2.0", "top==1.0"],
  },
];

// Skipped only on a machine without uv: what is tested is what uv is given. CI installs uv (.ci/run), so there it runs.
describe.skipIf(!HAS_UV)("machine pip configuration, honoured by uv", () => {
  for (const c of cases) {
    test(`${c.name}: both paths install the same set, and auto takes the fast path`, async () => {
      const [pip, auto] = await Promise.all([build(c.specs, c.conf(), c.vars ?? {}, "pip"), build(c.specs, c.conf(), c.vars ?? {}, "auto")]);
      expect(pip.set).toEqual(c.expect);
      expect(auto.set).toEqual(pip.set);
      expect(pip.path).toBe("pip");
      expect(auto.path).toBe("uv (fast path)");
    });
  }

  for (const installer of ["pip", "auto"] as const) {
    test(`a -c nested in the machine's constraint file (PIP_CONSTRAINT, pip.conf) is in the key (${installer})`, async () => {
      const s = sandbox();
      writeFileSync(join(s.root, "outer.txt"), "-c inner.txt\n");
      writeFileSync(join(s.root, "inner.txt"), "dep<2\n");
      writeFileSync(join(s.root, "pip.conf"), `[global]\nindex-url = ${main.url}\n`);
      writeFileSync(join(s.root, "pip-c.conf"), `[global]\nindex-url = ${main.url}\nconstraint = outer.txt\n`);
      const ways: Record<string, string>[] = [{ PIP_CONFIG_FILE: join(s.root, "pip.conf"), PIP_CONSTRAINT: "outer.txt" }, { PIP_CONFIG_FILE: join(s.root, "pip-c.conf") }];
      const prepare = async (vars: Record<string, string>) => {
        const r = await cli(["env", "prepare", "-p", "top", "--python", worker, "--json"], { env: { ...s.env, ...vars, GPULAYER_INSTALLER: installer }, cwd: s.root });
        if (r.code !== 0) throw new Error(r.stderr);
        return JSON.parse(r.stdout) as { path: string; status: string };
      };
      for (const vars of ways) expect(installed((await prepare(vars)).path)).toEqual(["dep==1.0", "top==1.0"]);
      // --dry-run names what of the machine's configuration counts: the variable, the file, the constraint file it names.
      const dry = await cli(["env", "prepare", "-p", "top", "--python", worker, "--dry-run", "--json"], { env: { ...s.env, ...ways[0]! }, cwd: s.root });
      const sources = (JSON.parse(dry.stdout) as { inputs: { index: { machine_pip_config_sources: string[] } } }).inputs.index.machine_pip_config_sources;
      expect(sources).toEqual(expect.arrayContaining(["PIP_CONFIG_FILE", "PIP_CONSTRAINT", join(s.root, "pip.conf"), join(s.root, "outer.txt")]));
      const lines = await cli(["env", "prepare", "-p", "top", "--python", worker, "--dry-run"], { env: { ...s.env, ...ways[0]! }, cwd: s.root });
      expect(lines.stdout).toContain(`pip config   ${join(s.root, "outer.txt")}`);
      writeFileSync(join(s.root, "inner.txt"), "dep>1\n");
      for (const vars of ways) {
        const again = await prepare(vars);
        expect(again.status).toBe("built");
        expect(installed(again.path)).toEqual(["dep==2.0", "top==1.0"]);
      }
    });
  }

  test("a find-links folder the machine's configuration names (twice: variable and file) is listed once by --dry-run with its digest, and a wheel dropped in it changes that and the key", async () => {
    const s = sandbox();
    try {
      const folder = join(s.root, "machine-links");
      mkdirSync(folder);
      writeFileSync(join(s.root, "pip.conf"), `[global]\nindex-url = ${main.url}\nfind-links = ${folder}\n`);
      const env = { ...s.env, PIP_CONFIG_FILE: join(s.root, "pip.conf"), PIP_FIND_LINKS: folder };
      const dry = async () => JSON.parse((await cli(["env", "prepare", "-p", "top", "--python", worker, "--dry-run", "--json"], { env, cwd: s.root })).stdout) as { key: string; inputs: { find_links: { origin: string; path?: string; digest?: string }[] } };
      // This machine's own files may name folders too (they apply beside PIP_CONFIG_FILE): only ours is looked at.
      const ours = async () => {
        const d = await dry();
        expect(d.inputs.find_links.filter((f) => f.path === folder)).toHaveLength(1);
        return { key: d.key, link: d.inputs.find_links.find((f) => f.path === folder) };
      };
      const before = await ours();
      expect(before.link).toMatchObject({ origin: "the machine's pip configuration", path: folder });
      makeDist("wheel", folder, { name: "linked", version: "0.6" });
      const after = await ours();
      expect(after.link!.digest).not.toBe(before.link!.digest);
      expect(after.key).not.toBe(before.key);
      const human = await cli(["env", "prepare", "-p", "top", "--python", worker, "--dry-run"], { env, cwd: s.root });
      expect(human.stdout).toContain(`find-links   ${folder} sha256:${after.link!.digest!.slice(0, 12)} (from the machine's pip configuration)`);
    } finally {
      s.cleanup();
    }
  });

  test("build isolation turned off (PIP_NO_BUILD_ISOLATION=false, as pip reads it) is pip's to build with", async () => {
    const s = sandbox();
    writeFileSync(join(s.root, "pip.conf"), `[global]\nindex-url = ${main.url}\n`);
    const r = await cli(["env", "prepare", "-p", "top", "--python", worker, "--json"], { env: { ...s.env, PIP_CONFIG_FILE: join(s.root, "pip.conf"), PIP_NO_BUILD_ISOLATION: "false" }, cwd: s.root });
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout).installer_path).toBe("pip");
    expect(r.stderr).toContain("sets --no-build-isolation (from PIP_NO_BUILD_ISOLATION)");
  });

  for (const installer of ["pip", "auto"] as const) {
    test(`a setting that installs outside the env (target, prefix, root) is refused with one line, nothing kept (${installer})`, async () => {
      const s = sandbox();
      const target = join(s.root, "elsewhere");
      writeFileSync(join(s.root, "pip.conf"), `[global]\nindex-url = ${main.url}\ntarget = ${target}\n`);
      const r = await cli(["env", "prepare", "-p", "top", "--python", worker], { env: { ...s.env, PIP_CONFIG_FILE: join(s.root, "pip.conf"), GPULAYER_INSTALLER: installer }, cwd: s.root });
      expect(r.code).toBe(2);
      expect(r.stderr.trim().split("\n").at(-1)).toMatch(/^error: the machine's pip configuration sets --target \(from .*pip\.conf\), which makes pip install outside the env; unset it for gpulayer, or give --index-url/);
      expect(readdirSync(join(s.home, "envs-v1")).filter((n) => !n.startsWith("."))).toEqual([]);
      expect(existsSync(target)).toBe(false);
    });
  }

  test("an HTTPS index behind a certificate pip trusts by the machine's configuration (trusted-host) is not refused by gpulayer's own look: it builds", async () => {
    const s = sandbox();
    const tls = join(s.root, "tls");
    mkdirSync(tls);
    const made = Bun.spawnSync(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", join(tls, "key.pem"), "-out", join(tls, "cert.pem"), "-days", "1"], { stderr: "pipe" });
    expect(made.exitCode, made.stderr.toString()).toBe(0);
    // The fixture index over HTTPS, with a self-signed certificate nothing here trusts but what pip is told to.
    const upstream = new URL(main.url);
    const https = Bun.serve({
      port: 0,
      hostname: "127.0.0.1",
      tls: { cert: Bun.file(join(tls, "cert.pem")), key: Bun.file(join(tls, "key.pem")) },
      fetch: (req) => fetch(new URL(new URL(req.url).pathname, upstream.origin)),
    });
    try {
      writeFileSync(join(s.root, "pip.conf"), `[global]\nindex-url = https://127.0.0.1:${https.port}${upstream.pathname}\ntrusted-host = 127.0.0.1:${https.port}\n`);
      const env = { ...s.env, PIP_CONFIG_FILE: join(s.root, "pip.conf") };
      for (const v of ["REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "PIP_CERT", "NODE_EXTRA_CA_CERTS"]) delete (env as Record<string, string | undefined>)[v];
      const r = await cli(["env", "prepare", "-p", "top", "--python", worker, "--json"], { env, cwd: s.root });
      expect(r.code, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout).status).toBe("built");
    } finally {
      await https.stop(true);
      s.cleanup();
    }
  });

  test("an index the machine's configuration names that does not answer, or a file:// index that is not there: one line at once", async () => {
    const s = sandbox();
    const dead = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
    const port = dead.port;
    dead.stop(true);
    writeFileSync(join(s.root, "pip.conf"), `[global]\nindex-url = http://127.0.0.1:${port}/simple\n`);
    const t = performance.now();
    const r = await cli(["env", "prepare", "-p", "top", "--python", worker], { env: { ...s.env, PIP_CONFIG_FILE: join(s.root, "pip.conf") }, cwd: s.root });
    expect(performance.now() - t).toBeLessThan(8_000);
    expect(r.code).toBe(1);
    expect(r.stderr.trim().split("\n").at(-1)).toMatch(new RegExp(`^error: index unreachable: http://127\\.0\\.0\\.1:${port}/simple \\(set by the machine's pip configuration: .*pip\\.conf\\) \\(`));
    const missing = await cli(["env", "prepare", "-p", "top", "--python", worker, "--index-url", "file:///nonexistent/simple"], { env: s.env, cwd: s.root });
    expect(missing.code).toBe(1);
    expect(missing.stderr.trim().split("\n").at(-1)).toBe("error: index not found: file:///nonexistent/simple (no such folder: /nonexistent/simple)");
  });

  test("a setting uv cannot honour the same way is named, with how to get the fast path, and pip builds", async () => {
    const s = sandbox();
    writeFileSync(join(s.root, "pip.conf"), `[global]\nindex-url = ${main.url}\nprefer-binary = true\n`);
    const r = await cli(["env", "prepare", "-p", "top", "--python", worker], { env: { ...s.env, PIP_CONFIG_FILE: join(s.root, "pip.conf") }, cwd: s.root });
    expect(r.code).toBe(0);
    expect(installed(r.stdout.trim().split("\n").at(-1)!)).toEqual(["dep==2.0", "top==1.0"]);
    // The one file that sets it (pip's own configuration says which), not every source there is.
    expect(r.stderr).toContain(`(not uv: the machine's pip configuration sets --prefer-binary (from ${join(s.root, "pip.conf")}), which uv cannot honour the same way; for the fast path, remove it or give --index-url`);
  });
});
