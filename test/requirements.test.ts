import { afterAll, describe, expect, test } from "bun:test";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { UsageError } from "../src/errors.ts";
import { normalizeName, parseRequirementLine, parseRequirementsFile, parseSpecs, type RequirementSet } from "../src/env/requirements.ts";
import { makeDist } from "./fixtures/index.ts";
import { tempDir } from "./helpers.ts";
import { rmSync } from "node:fs";

const dir = tempDir("gpl-req-");
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let n = 0;
/** Write a requirements file (and any files it includes) and parse it. */
function parse(text: string, opts: { env?: Record<string, string>; files?: Record<string, string> } = {}): RequirementSet {
  const root = join(dir, `case${n++}`);
  mkdirSync(root, { recursive: true });
  for (const [name, body] of Object.entries(opts.files ?? {})) {
    mkdirSync(join(root, name, ".."), { recursive: true });
    writeFileSync(join(root, name), body);
  }
  writeFileSync(join(root, "requirements.txt"), text);
  return parseRequirementsFile("requirements.txt", { env: opts.env ?? {}, cwd: root });
}

const canon = (set: RequirementSet) => set.requirements.map((r) => r.canonical).sort();
const line = (text: string) => parseRequirementLine(text, "x.txt:1", dir).canonical;

function parseError(text: string, opts: Parameters<typeof parse>[1] = {}): string {
  try {
    parse(text, opts);
  } catch (error) {
    expect(error).toBeInstanceOf(UsageError);
    return (error as Error).message;
  }
  throw new Error("expected a UsageError");
}

describe("requirement lines", () => {
  test("names are PEP 503 normalised, extras sorted, specifiers sorted", () => {
    expect(normalizeName("Foo__Bar.baz")).toBe("foo-bar-baz");
    expect(line("Foo_Bar[Tests, Security] >= 1.0 , <2")).toBe("foo-bar[security,tests]<2,>=1.0");
    expect(line("foo-bar[security,tests]<2,>=1.0")).toBe(line("FOO.BAR [ tests,security ]>=1.0,<2"));
    expect(line("foo (>=1)")).toBe("foo>=1");
    expect(line("foo==1.0.*")).toBe("foo==1.0.*");
    expect(line("foo===weird")).toBe("foo===weird");
  });

  test("markers in one spelling", () => {
    expect(line(`foo>=1; python_version<'3.8'`)).toBe(`foo>=1; python_version < "3.8"`);
    expect(line(`foo >= 1 ;python_version < "3.8"`)).toBe(line(`foo>=1; python_version<'3.8'`));
    expect(line(`foo; sys_platform == 'linux' and extra == 'x'`)).toBe(`foo; sys_platform == "linux" and extra == "x"`);
  });

  test("URL requirements keep their URL, credentials hashed", () => {
    const named = parseRequirementLine("Foo @ https://user:secret@example.com/foo-1.0-py3-none-any.whl", "x:1", dir);
    expect(named.name).toBe("foo");
    expect(named.canonical).toStartWith("foo @ https://cred-");
    expect(named.canonical).not.toContain("secret");
    expect(named.install).toContain("user:secret@"); // pip still gets them
    const bare = parseRequirementLine("https://user:secret@example.com/foo-1.0-py3-none-any.whl", "x:1", dir);
    expect(bare.canonical).not.toContain("secret");
    expect(bare.install).toBe("https://user:secret@example.com/foo-1.0-py3-none-any.whl");
    expect(line("foo@https://example.com/foo-1.0-py3-none-any.whl")).toBe("foo @ https://example.com/foo-1.0-py3-none-any.whl");
  });

  test("per-requirement options are kept and sorted", () => {
    expect(line("foo==1.0 --hash=sha256:bbb --hash sha256:aaa")).toBe("foo==1.0 --hash=sha256:aaa --hash=sha256:bbb");
    expect(() => line("foo==1.0 --no-deps")).toThrow(/unsupported option on a requirement/);
  });

  test("invalid requirements are usage errors naming where", () => {
    expect(() => line("foo bar")).toThrow(/x.txt:1: invalid requirement: foo bar/);
    expect(() => line("!!!")).toThrow(/invalid requirement/);
    expect(() => line("foo[bar")).toThrow(/unclosed extras/);
    expect(() => line("foo>=1;")).toThrow(/empty environment marker/);
    expect(() => line("foo @ not-a-url")).toThrow(/invalid URL/);
  });

  test("local wheels count by content, not by path", () => {
    const a = makeDist("wheel", join(dir, "wa"), { name: "loc", version: "1.0" });
    const b = makeDist("wheel", join(dir, "wb"), { name: "loc", version: "1.0" });
    const c = makeDist("wheel", join(dir, "wc"), { name: "loc", version: "1.0", files: { "loc/extra.py": "x = 1\n" } });
    const ra = parseRequirementLine(a, "x:1", dir);
    expect(ra.canonical).toStartWith("file#sha256=");
    expect(ra.install).toBe(a);
    expect(ra.canonical).toBe(parseRequirementLine(b, "x:1", dir).canonical);
    expect(ra.canonical).not.toBe(parseRequirementLine(c, "x:1", dir).canonical);
    expect(parseRequirementLine("./wa/loc-1.0-py3-none-any.whl", "x:1", dir).install).toBe(a);
    expect(() => parseRequirementLine("./nowhere/loc-1.0-py3-none-any.whl", "x:1", dir)).toThrow(/local package not found/);
  });
});

describe("requirements files", () => {
  test("comments, blank lines, order and case do not matter", () => {
    const a = parse("# top\nnumpy<3\n\nTQDM  # progress bars\n");
    const b = parse("tqdm\n# other comment\nNumPy <3\n");
    expect(canon(a)).toEqual(["numpy<3", "tqdm"]);
    expect(canon(b)).toEqual(canon(a));
  });

  test("`\\` continuations join as pip joins them", () => {
    expect(canon(parse("num\\\npy\\\n<3\n"))).toEqual(["numpy<3"]);
    expect(canon(parse("foo \\\n  >=1.0 \\\n  ,<2\nbar\n"))).toEqual(["bar", "foo<2,>=1.0"]);
    // A comment line ends a continuation and is dropped.
    expect(canon(parse("foo>=1 \\\n# a comment\nbar\n"))).toEqual(["bar", "foo>=1"]);
    // A continuation at the end of the file.
    expect(canon(parse("foo\\"))).toEqual(["foo"]);
    // The line number of a joined line is its first line.
    expect(parseError("ok\nfoo \\\n bar\n")).toMatch(/requirements\.txt:2: invalid requirement/);
  });

  test("${VAR} is expanded (only that form), unset ones are left as they are", () => {
    const set = parse("foo==${FOO_VERSION}\n-i https://${IDX_USER}:${IDX_TOKEN}@example.com/simple\n", { env: { FOO_VERSION: "1.2", IDX_USER: "u", IDX_TOKEN: "t" } });
    expect(canon(set)).toEqual(["foo==1.2"]);
    expect(set.options.indexUrl).toBe("https://u:t@example.com/simple");
    expect(parseError("foo==$FOO_VERSION\n", { env: { FOO_VERSION: "1" } })).toMatch(/:1: invalid/);
    expect(parseError("foo==${UNSET_VAR}\n")).toMatch(/:1: invalid/);
  });

  test("-r and -c nest, resolved against the including file, inlined by content", () => {
    const set = parse("-r sub/more.txt\n-c constraints.txt\nfoo\n", {
      files: { "sub/more.txt": "bar>=2\n-r deeper.txt\n", "sub/deeper.txt": "baz\n", "constraints.txt": "bar<3\n-r c2.txt\n", "c2.txt": "qux==1\n" },
    });
    expect(canon(set)).toEqual(["bar>=2", "baz", "foo"]);
    // Everything under -c is a constraint, even what it includes with -r.
    expect(set.constraints.map((r) => r.canonical).sort()).toEqual(["bar<3", "qux==1"]);
    expect(set.requirements.find((r) => r.name === "baz")!.origin).toMatch(/sub\/deeper\.txt:1$/);
  });

  test("include errors: missing file, self-inclusion", () => {
    expect(parseError("foo\n-r missing.txt\n")).toMatch(/requirements\.txt:2: file not found: missing\.txt/);
    expect(parseError("-r requirements.txt\n")).toMatch(/includes itself/);
    expect(parseError("-r a.txt\n", { files: { "a.txt": "-r b.txt\n", "b.txt": "-r a.txt\n" } })).toMatch(/b\.txt:1: .*includes itself/);
    expect(() => parseRequirementsFile("nope.txt", { env: {}, cwd: dir })).toThrow(/requirements file not found: nope\.txt/);
  });

  test("installer options are collected", () => {
    const set = parse("--index-url https://example.com/simple\n--extra-index-url=https://x.example/simple\n-f ./wheels\n--pre\n--prefer-binary\n--only-binary :all:\n--no-binary foo\n--trusted-host x.example\n--require-hashes\nfoo==1 --hash=sha256:aa\n");
    const o = set.options;
    expect(o.indexUrl).toBe("https://example.com/simple");
    expect(o.extraIndexUrls).toEqual(["https://x.example/simple"]);
    expect(o.findLinks).toHaveLength(1);
    expect(o.findLinks[0]).toMatch(/^\/.*\/wheels$/);
    expect([o.pre, o.preferBinary, o.requireHashes]).toEqual([true, true, true]);
    expect(o.onlyBinary).toEqual([":all:"]);
    expect(o.noBinary).toEqual(["foo"]);
    expect(o.trustedHosts).toEqual(["x.example"]);
    expect(parse("--no-index\nfoo\n").options.noIndex).toBe(true);
  });

  test("bad option lines name file and line", () => {
    expect(parseError("foo\n\n--frobnicate\n")).toMatch(/requirements\.txt:3: unsupported option --frobnicate/);
    expect(parseError("--index-url\n")).toMatch(/requirements\.txt:1: --index-url needs a value/);
    expect(parseError("foo\nbar==\n")).toMatch(/requirements\.txt:2: invalid requirement: bar==/);
    expect(parseError("foo >= one.two\n")).toMatch(/requirements\.txt:1: invalid/);
  });

  test("-e of a local project counts its build files", () => {
    const proj = makeDist("project", join(dir, "proj"), { name: "edproj", version: "0.1" });
    const a = parse(`-e ${proj}\n`);
    expect(a.requirements[0]!.install).toBe(`-e ${proj}`);
    writeFileSync(join(proj, "pyproject.toml"), "[build-system]\nrequires = []\nbuild-backend = \"backend\"\nbackend-path = [\".\"]\n# changed\n");
    expect(parse(`-e ${proj}\n`).requirements[0]!.canonical).not.toBe(a.requirements[0]!.canonical);
    expect(parseError("-e ./not-here\n")).toMatch(/:1: editable path not found/);
  });

  test("specs from the command line", () => {
    const set = parseSpecs(["Foo>=1", "bar"], { env: {}, cwd: dir });
    expect(canon(set)).toEqual(["bar", "foo>=1"]);
    expect(() => parseSpecs(["ok", " "], { env: {}, cwd: dir })).toThrow(/empty requirement/);
    expect(() => parseSpecs(["foo bar"], { env: {}, cwd: dir })).toThrow(/-p\[0\]: invalid requirement/);
  });
});
