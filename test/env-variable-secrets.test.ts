import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, run, sandbox } from "./helpers.ts";

/**
 * `${VAR}` values in a requirements file's URLs (a password in an index's
 * authority, a token in an index's path, a token in a direct URL's path and
 * query) are used for the build and kept by digest only: no file of the home
 * or of the env (pip's direct_url.json included), and nothing `env show`
 * prints, holds any of them. The env stays what pip expects: `pip freeze`
 * gives the line back as written, and `pip uninstall` removes the package.
 */

setDefaultTimeout(120_000);

const PASSWORD = "pw-SECRET-7731";
const PATH_TOKEN = "path-SECRET-5150";
const QUERY_TOKEN = "query-SECRET-4242";
const SECRETS = [PASSWORD, PATH_TOKEN, QUERY_TOKEN];
const sb = sandbox();
const authIndex = new PackageIndex(join(sb.root, "auth-index"), { basicAuth: `alice:${PASSWORD}` });
const pathIndex = new PackageIndex(join(sb.root, "path-index"), { pathToken: PATH_TOKEN });

beforeAll(() => {
  authIndex.start().wheel({ name: "authpkg", version: "1.0" });
  pathIndex.start().wheel({ name: "pathpkg", version: "1.0" });
  pathIndex.wheel({ name: "urlpkg", version: "1.0" });
});
afterAll(() => {
  authIndex.stop();
  pathIndex.stop();
  sb.cleanup();
});

/** Every file under `dir` (bytes read as latin1) that holds one of the secrets. */
function filesHolding(dir: string): string[] {
  const found: string[] = [];
  const walk = (d: string) => {
    for (const n of readdirSync(d)) {
      const p = join(d, n);
      const st = statSync(p, { throwIfNoEntry: false });
      if (st?.isDirectory()) walk(p);
      else if (st?.isFile()) {
        const text = readFileSync(p, "latin1");
        for (const s of SECRETS) if (text.includes(s)) found.push(`${p.slice(sb.root.length)}: ${s}`);
      }
    }
  };
  walk(dir);
  return found;
}

describe("${VAR} values in URLs are kept by digest only", () => {
  test("no file of the home or the env, and nothing env show prints, holds a value; pip freeze and uninstall still work", async () => {
    const authPort = new URL(authIndex.url).port;
    const pathPort = new URL(pathIndex.url).port;
    const direct = `http://127.0.0.1:${pathPort}/\${PATH_TOKEN}/files/urlpkg-1.0-py3-none-any.whl?t=\${QUERY_TOKEN}`;
    const req = join(sb.root, "requirements.txt");
    writeFileSync(req, [`--index-url http://alice:\${IDX_PASS}@127.0.0.1:${authPort}/simple`, `--extra-index-url http://127.0.0.1:${pathPort}/\${PATH_TOKEN}/simple`, "authpkg", "pathpkg", `urlpkg @ ${direct}`, ""].join("\n"));
    const env = { ...sb.env, IDX_PASS: PASSWORD, PATH_TOKEN, QUERY_TOKEN };

    const r = await cli(["env", "prepare", req, "--json"], { env, cwd: sb.root });
    expect(r.code).toBe(0);
    const { key, path } = JSON.parse(r.stdout) as { key: string; path: string };
    const python = join(path, "bin", "python");
    expect((await run([python, "-c", "import authpkg, pathpkg, urlpkg"], { env })).code).toBe(0);

    expect(filesHolding(sb.home)).toEqual([]);
    const shown = await cli(["env", "show", key], { env, cwd: sb.root });
    const shownJson = await cli(["env", "show", key, "--json"], { env, cwd: sb.root });
    for (const out of [shown, shownJson]) {
      expect(out.code).toBe(0);
      for (const s of SECRETS) expect(out.stdout + out.stderr).not.toContain(s);
    }
    // The index's path is shown as written, its variable by name.
    expect(shown.stdout).toContain(`http://127.0.0.1:${pathPort}/\${PATH_TOKEN}/simple`);

    // pip reads the env as before: the direct URL as the line was written, and an uninstall that removes it.
    const pip = ["python3", "-m", "pip", "--python", python, "--disable-pip-version-check"];
    const site = readdirSync(join(path, "lib")).map((py) => join(path, "lib", py, "site-packages"))[0]!;
    const frozen = await run([...pip, "freeze", "--path", site], { env });
    expect(frozen.code).toBe(0);
    expect(frozen.stdout).toContain(`urlpkg @ ${direct}`);
    const removed = await run([...pip, "uninstall", "-y", "urlpkg"], { env });
    expect(removed.code).toBe(0);
    expect(readdirSync(site).filter((n) => n.startsWith("urlpkg"))).toEqual([]);
    expect((await run([python, "-c", "import urlpkg"], { env })).code).not.toBe(0);
  });

  test("a build that fails on such a URL: its error and its output name the variables, never their values", async () => {
    const pathPort = new URL(pathIndex.url).port;
    const req = join(sb.root, "missing.txt");
    writeFileSync(req, `missing @ http://127.0.0.1:${pathPort}/\${PATH_TOKEN}/files/missing-1.0-py3-none-any.whl?t=\${QUERY_TOKEN}\n`);
    const env = { ...sb.env, PATH_TOKEN, QUERY_TOKEN };
    for (const args of [[req], [req, "--json"], [req, "--verbose"]]) {
      const r = await cli(["env", "prepare", ...args], { env, cwd: sb.root });
      expect(r.code).not.toBe(0);
      expect(r.stdout + r.stderr).toContain("${PATH_TOKEN}");
      for (const s of SECRETS) expect(r.stdout + r.stderr).not.toContain(s);
    }
    expect(filesHolding(sb.home)).toEqual([]);
  });
});
