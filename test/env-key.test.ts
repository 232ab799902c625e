import { keyDifferences } from "../src/env/request/nearest.ts";
import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { homeLayout } from "../src/config/paths.ts";
import { type PrepareRequest, resolveRequest } from "../src/env/request/lookup.ts";
import { makeDist, PackageIndex } from "./fixtures/index.ts";
import { cli, makeWorkerVenv, pipInstall, sandbox, tempDir } from "./helpers.ts";

/**
 * The env key: stable under what pip does not see as a change (order, case,
 * comments, continuations, how a variable is spelled), changed by all that
 * changes a build (an included file's content, the index, the interpreter,
 * the worker's installed set, the machine's pip config when not shut out).
 */

setDefaultTimeout(60_000);

const world = tempDir("gpl-key-");
const index = new PackageIndex(join(world, "index"));
const layout = homeLayout(join(world, "home"));
let pyA: string;
let pyB: string;
const files = join(world, "files");

beforeAll(async () => {
  index.start();
  index.wheel({ name: "tiny", version: "1.0" });
  index.wheel({ name: "extra-pkg", version: "1.0" });
  mkdirSync(files, { recursive: true });
  const s = sandbox();
  [pyA, pyB] = await Promise.all([makeWorkerVenv(join(world, "a"), { env: s.env }), makeWorkerVenv(join(world, "b"), { env: s.env })]);
  s.cleanup();
}, 60_000);

afterAll(() => {
  index.stop();
  rmSync(world, { recursive: true, force: true });
});

let n = 0;
/** The key of a request whose requirements file holds `text` (and any files next to it). */
function keyOf(text: string, opts: Partial<PrepareRequest> & { files?: Record<string, string> } = {}): string {
  const dir = join(files, `r${n++}`);
  mkdirSync(dir, { recursive: true });
  for (const [name, body] of Object.entries(opts.files ?? {})) writeFileSync(join(dir, name), body);
  writeFileSync(join(dir, "requirements.txt"), text);
  const env = { PATH: process.env.PATH ?? "", HOME: world, PIP_CONFIG_FILE: "/dev/null", ...opts.env };
  return resolveRequest(layout, { requirementsFile: "requirements.txt", specs: [], extraIndexUrls: [], findLinks: [], python: pyA, indexUrl: index.url, cwd: dir, ...opts, env }).key;
}

describe("env key", () => {
  test("stable only where pip certainly reads alike: line order, name case, whitespace, comments, continuations, equal versions", () => {
    const base = keyOf("numpy<3,>=1.2\ntqdm[notebook]\nrequests ; python_version >= '3.8'\n");
    expect(keyOf("# the same, shuffled\nrequests ; python_version >= '3.8'\nTQDM[notebook]   # bars\n\nNumPy >=1.2, <3\n")).toBe(base);
    expect(keyOf("tqdm[notebook]\nnum\\\npy>=1.2,\\\n<3\nrequests ; python_version >= '3.8'\n")).toBe(base);
    expect(keyOf("numpy<3.0,>=1.2.0\ntqdm[notebook]\nrequests ; python_version >= '3.8'\n")).toBe(base);
    expect(keyOf("numpy<3,>=1.2\ntqdm[notebook]\nrequests ; python_version >= '3.8'\n", { env: { UNRELATED: "x" } })).toBe(base);
  });

  test("anything not certainly equal is keyed by its exact text: extras' spelling, markers, ~= lengths, local versions", () => {
    const base = keyOf("tqdm[notebook]\n");
    // pip before 23.3 does not normalise extras: [dev_tools] and [dev-tools] may install different things.
    expect(keyOf("bar[dev_tools]\n")).not.toBe(keyOf("bar[dev-tools]\n"));
    expect(keyOf("tqdm[Notebook]\n")).not.toBe(base);
    expect(keyOf("foo; python_version<'3'\n")).not.toBe(keyOf("foo; python_version < '3'\n"));
    expect(keyOf("foo~=1.0\n")).not.toBe(keyOf("foo~=1.0.0\n"));
    expect(keyOf("torch==2.1.0+rocm5.7\n")).not.toBe(keyOf("torch==2.1.0+rocm5.8\n"));
    expect(keyOf("torch==2.1.0+rocm5.7\n")).not.toBe(keyOf("torch==2.1.0\n"));
  });

  test("changed by what a requirement says, and by a variable's value (held by digest)", () => {
    const base = keyOf("numpy<3\n");
    expect(keyOf("numpy<4\n")).not.toBe(base);
    expect(keyOf("numpy<3\ntqdm\n")).not.toBe(base);
    expect(keyOf("numpy[extra]<3\n")).not.toBe(base);
    const v3 = keyOf("numpy<${V}\n", { env: { V: "3" } });
    expect(keyOf("numpy<${V}\n", { env: { V: "3" } })).toBe(v3);
    expect(keyOf("numpy<${V}\n", { env: { V: "4" } })).not.toBe(v3);
    // pip leaves an unset or empty variable as written: both are "unset".
    expect(keyOf("numpy<${V}\n", { env: { V: "" } })).toBe(keyOf("numpy<${V}\n"));
  });

  test("changed by the content of a -r or -c file", () => {
    const base = keyOf("-r more.txt\n", { files: { "more.txt": "tqdm\nnumpy\n" } });
    expect(keyOf("-r more.txt\n", { files: { "more.txt": "numpy\ntqdm\n" } })).toBe(base);
    expect(keyOf("-r more.txt\n", { files: { "more.txt": "tqdm\nnumpy<2\n" } })).not.toBe(base);
    const constrained = keyOf("-r more.txt\n-c c.txt\n", { files: { "more.txt": "tqdm\nnumpy\n", "c.txt": "numpy<2\n" } });
    expect(constrained).not.toBe(base);
    expect(keyOf("-r more.txt\n-c c.txt\n", { files: { "more.txt": "tqdm\nnumpy\n", "c.txt": "numpy<3\n" } })).not.toBe(constrained);
    // Every spelling pip takes: attached, =value, quoted, several options on a line.
    for (const spelling of ["-rmore.txt", "--requirement=more.txt", "--requirement 'more.txt'", "--pre -r more.txt"]) {
      const a = keyOf(`${spelling}\n`, { files: { "more.txt": "tqdm\n" } });
      expect(keyOf(`${spelling}\n`, { files: { "more.txt": "tqdm<5\n" } })).not.toBe(a);
    }
  });

  test("one request, one key: -p specs and the same lines in a file, an included file and its lines inline, option spellings", () => {
    const inFile = keyOf("tiny\nextra-pkg>=1\n");
    // The installer reads `-p a -p b` as it reads a file of those two lines (a top file of them, for pip and uv alike).
    expect(keyOf("", { requirementsFile: undefined, specs: ["tiny", "extra-pkg>=1"] })).toBe(inFile);
    expect(keyOf("", { requirementsFile: undefined, specs: ["extra-pkg >= 1.0", "TINY"] })).toBe(inFile);
    expect(keyOf("extra-pkg>=1\n", { specs: ["tiny"] })).toBe(inFile);
    expect(keyOf("-r more.txt\n", { files: { "more.txt": "tiny\nextra-pkg>=1\n" } })).toBe(inFile);
    expect(keyOf("", { requirementsFile: undefined, specs: ["tiny"] })).not.toBe(inFile);
    // Option lines: pip reads every spelling of one option alike; a -c file's lines stay constraints.
    const index = keyOf("--index-url http://127.0.0.1:9/simple\ntiny\n");
    for (const spelling of ["-i http://127.0.0.1:9/simple", "--index-url=http://127.0.0.1:9/simple", "--pypi-url http://127.0.0.1:9/simple"]) expect(keyOf(`${spelling}\ntiny\n`)).toBe(index);
    expect(keyOf("-c more.txt\ntiny\n", { files: { "more.txt": "extra-pkg>=1\n" } })).not.toBe(inFile);
    expect(keyOf("tiny==1.0 --hash=sha256:aa --hash sha256:bb\n")).toBe(keyOf("tiny==1 \\\n  --hash=sha256:bb \\\n  --hash=sha256:aa\n"));
  });

  test("changed by the index and the installer options", () => {
    const base = keyOf("tiny\n");
    expect(keyOf("tiny\n", { indexUrl: index.url.replace("127.0.0.1", "localhost") })).not.toBe(base);
    expect(keyOf("tiny\n", { extraIndexUrls: ["http://127.0.0.1:9/simple"] })).not.toBe(base);
    expect(keyOf("tiny\n", { findLinks: ["./wheels"] })).not.toBe(base);
    expect(keyOf("--pre\ntiny\n")).not.toBe(base);
    expect(keyOf("--only-binary :all:\ntiny\n")).not.toBe(base);
    // Every option of a line counts, not only the first.
    expect(keyOf("--no-index --find-links ./a\ntiny\n")).not.toBe(keyOf("--no-index --find-links ./b\ntiny\n"));
    expect(keyOf("--trusted-host a --trusted-host b\ntiny\n")).not.toBe(keyOf("--trusted-host a --trusted-host c\ntiny\n"));
  });

  test("credentials count in the key, hashed: never in the key document", () => {
    const url = (cred: string) => index.url.replace("http://", `http://${cred}@`);
    const dir = join(files, "cred");
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "requirements.txt"), "tiny\n");
    const req = (indexUrl: string) => resolveRequest(layout, { requirementsFile: "requirements.txt", specs: [], extraIndexUrls: [], findLinks: [], python: pyA, indexUrl, cwd: dir, env: { PATH: process.env.PATH ?? "" } });
    const a = req(url("alice:s3cr@tpw"));
    expect(JSON.stringify(a.doc)).not.toContain("s3cr");
    expect(JSON.stringify(a.doc)).not.toContain("tpw");
    expect(JSON.stringify(a.doc)).not.toContain("alice");
    expect(req(url("alice:s3cr@tpw")).key).toBe(a.key);
    // In the file too: the line is keyed with its credentials as a digest.
    writeFileSync(join(dir, "requirements.txt"), `-i ${url("bob:pa@ss:wd")}\ntiny\n`);
    const inFile = resolveRequest(layout, { requirementsFile: "requirements.txt", specs: [], extraIndexUrls: [], findLinks: [], python: pyA, cwd: dir, env: { PATH: process.env.PATH ?? "" } });
    expect(JSON.stringify(inFile.doc)).not.toMatch(/bob|pa@ss|ss:wd/);
    writeFileSync(join(dir, "requirements.txt"), "tiny\n");
    expect(req(url("alice:other")).key).not.toBe(a.key);
    expect(req(index.url).key).not.toBe(a.key);
  });

  test("changed by the interpreter: two worker venvs", () => {
    const a = keyOf("tiny\n");
    const b = keyOf("tiny\n", { python: pyB });
    expect(b).not.toBe(a);
    expect(keyOf("tiny\n", { python: pyB })).toBe(b);
  });

  test("changed by the worker's installed set", async () => {
    const s = sandbox();
    try {
      const before = keyOf("tiny\n", { python: pyB });
      await pipInstall(pyB, ["--find-links", index.dir, "extra-pkg"], s.env);
      const after = keyOf("tiny\n", { python: pyB });
      expect(after).not.toBe(before);
      expect(keyOf("tiny\n", { python: pyB })).toBe(after);
    } finally {
      s.cleanup();
    }
  });

  test("without an index, the machine's pip config counts; with one, it is shut out", () => {
    const noIndex = { indexUrl: undefined };
    const base = keyOf("tiny\n", { ...noIndex, env: { PIP_CONFIG_FILE: "" } });
    expect(keyOf("tiny\n", { ...noIndex, env: { PIP_CONFIG_FILE: "", PIP_INDEX_URL: "https://mirror.example/simple" } })).not.toBe(base);
    const conf = join(files, "pip.conf");
    writeFileSync(conf, "[global]\nindex-url = https://mirror.example/simple\n");
    const withConf = keyOf("tiny\n", { ...noIndex, env: { PIP_CONFIG_FILE: conf } });
    expect(withConf).not.toBe(base);
    writeFileSync(conf, "[global]\nindex-url = https://other.example/simple\n");
    expect(keyOf("tiny\n", { ...noIndex, env: { PIP_CONFIG_FILE: conf } })).not.toBe(withConf);
    // Where pip keeps its cache changes nothing that is installed.
    expect(keyOf("tiny\n", { ...noIndex, env: { PIP_CONFIG_FILE: "", PIP_CACHE_DIR: "/elsewhere" } })).toBe(base);
    // With an index given, pip is isolated: its variables and files cannot change a build.
    const isolated = keyOf("tiny\n");
    expect(keyOf("tiny\n", { env: { PIP_CONFIG_FILE: conf, PIP_PRE: "1" } })).toBe(isolated);
  });

  test("end to end: a reordered, recased, commented file reuses the env", async () => {
    const s = sandbox();
    try {
      writeFileSync(join(s.root, "a.txt"), "tiny\nextra-pkg>=1\n");
      writeFileSync(join(s.root, "b.txt"), "# same\nExtra_Pkg >= 1.0   # comment\n\\\nTINY\n");
      const args = ["--index-url", index.url, "--python", pyA, "--json"];
      const first = await cli(["env", "prepare", "a.txt", ...args], { env: s.env, cwd: s.root });
      expect(first.code).toBe(0);
      const second = await cli(["env", "prepare", "b.txt", ...args], { env: s.env, cwd: s.root });
      expect(second.code).toBe(0);
      const [a, b] = [JSON.parse(first.stdout), JSON.parse(second.stdout)];
      expect(a.status).toBe("built");
      expect(b).toMatchObject({ key: a.key, path: a.path, status: "reused" });
    } finally {
      s.cleanup();
    }
  });
});

describe("why a rebuild: env prepare --dry-run names the nearest env built and what differs", () => {
  test("the env with the fewest differing inputs, each in words: a file's lines, a variable, an option, a local project's content; none for another interpreter", async () => {
    const s = sandbox();
    try {
      const proj = makeDist("project", join(s.root, "projects"), { name: "near-proj", version: "1.0" });
      writeFileSync(join(s.root, "reqs.txt"), "tiny\n");
      writeFileSync(join(s.root, "reqs-v.txt"), "tiny\nextra-pkg<${V}\n");
      const gpl = async (args: string[], env: Record<string, string> = {}) => {
        const r = await cli(["env", "prepare", ...args, "--python", pyA, "--index-url", index.url], { env: { ...s.env, ...env }, cwd: s.root });
        if (r.code !== 0) throw new Error(r.stderr);
        return r.stdout;
      };
      type Plan = { key: string; would: string; nearest: { key: string; differs: string[] } | null };
      const dry = async (args: string[], env: Record<string, string> = {}) => JSON.parse(await gpl([...args, "--dry-run", "--json"], env)) as Plan;
      const built = async (args: string[], env: Record<string, string> = {}) => (JSON.parse(await gpl([...args, "--json"], env)) as { key: string }).key;
      expect((await dry(["reqs.txt"])).nearest).toBeNull(); // nothing built yet
      const plain = await built(["reqs.txt"]);
      const withVar = await built(["reqs-v.txt"], { V: "2" });
      const withProj = await built(["reqs.txt", "-p", "./projects/near-proj"]);
      expect(await dry(["reqs.txt"])).toMatchObject({ key: plain, would: "reuse", nearest: null });

      // One line more in the file: the plain env, one difference (the env with ${V} differs in the file and the variable).
      writeFileSync(join(s.root, "reqs.txt"), "tiny\nextra-pkg\n");
      const moreLines = await dry(["reqs.txt"]);
      expect(moreLines.nearest).toEqual(expect.objectContaining({ key: plain, differs: ["the requirements: + extra-pkg"] }));
      writeFileSync(join(s.root, "reqs.txt"), "tiny\n");

      expect((await dry(["reqs-v.txt"], { V: "3" })).nearest).toEqual(expect.objectContaining({ key: withVar, differs: ["the variable ${V}: its value"] }));
      const option = await dry(["reqs.txt", "--extra-index-url", "http://127.0.0.1:9/simple"]);
      expect(option.nearest).toEqual(expect.objectContaining({ key: plain, differs: ["the option --extra-index-url: + http://127.0.0.1:9/simple"] }));
      writeFileSync(join(proj, "near_proj", "data.txt"), "new\n");
      const local = await dry(["reqs.txt", "-p", "./projects/near-proj"]);
      expect(local.nearest).toEqual(expect.objectContaining({ key: withProj, differs: [`local project ${proj}: a file's content, a file added or removed`] }));
      // For people: the same answer after the inputs.
      const human = await gpl(["reqs.txt", "-p", "./projects/near-proj", "--dry-run"]);
      expect(human).toContain(`nearest      ${withProj.slice(0, 12)} (`);
      expect(human).toContain(`  local project ${proj}: a file's content, a file added or removed\n`);

      const otherPython = await cli(["env", "prepare", "reqs.txt", "--python", pyB, "--index-url", index.url, "--dry-run", "--json"], { env: s.env, cwd: s.root });
      expect(JSON.parse(otherPython.stdout).nearest).toBeNull();
    } finally {
      s.cleanup();
    }
  });
});

describe("why a rebuild: every part of the key that differs is named", () => {
  test("a lock, a build without isolation and its variables, and a field the list does not know", () => {
    const doc = { schema: 3, reading: { requirements: [], constraints: [], lines: [] }, variables: {}, locals: [], find_links: [], flags: { index_url: null, extra_index_urls: [], find_links: [] }, installer_config: null, interpreter: { version: "3.11.7", implementation: "cpython", platform: "linux", soabi: "x" }, base: "b" };
    const ours = { ...doc, project: { lock: "l2", pyproject: "p", groups: [], extras: [] }, no_build_isolation: ["kernels"], build_variables: { TORCH_CUDA_ARCH_LIST: "9.0", CUDA_HOME: null }, later: 1 };
    const theirs = { ...doc, project: { lock: "l1", pyproject: "p", groups: [], extras: [] }, no_build_isolation: ["kernels"], build_variables: { TORCH_CUDA_ARCH_LIST: "8.0", CUDA_HOME: null } };
    const differs = keyDifferences(theirs as never, { doc: ours, inputs: { locals: [] } } as never);
    expect(differs).toEqual(["the uv project: its uv.lock, its pyproject.toml, or the groups and extras chosen", "the variables a build without isolation reads (TORCH_CUDA_ARCH_LIST, CUDA_HOME)", "the key's later"]);
  });
});
