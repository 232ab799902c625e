import { afterAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { chmodSync, existsSync, mkdirSync, readFileSync, statSync, symlinkSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { inspectBundle, listWorkdir, packFiles, packWorkdir, unpackBundle } from "../src/cluster/bundle.ts";
import { carriedFiles } from "../src/cluster/bundle-carry.ts";
import { BundleError } from "../src/errors.ts";
import { run, tempDir } from "./helpers.ts";

// Real processes and real builds take seconds; a file that sets none gets 5 s, whatever another file set.
setDefaultTimeout(120_000);

const LIMITS = { maxBytes: 200 * 1024 ** 2, maxUnpackedBytes: 2 * 1024 ** 3, maxEntries: 200_000 };

const root = tempDir("gpl-bundle-");
afterAll(() => Bun.spawn(["rm", "-rf", root]));

function tree(dir: string, files: Record<string, string>): string {
  for (const [path, content] of Object.entries(files)) {
    mkdirSync(join(dir, path, ".."), { recursive: true });
    writeFileSync(join(dir, path), content);
  }
  return dir;
}

/** A tar.gz written by Python's tarfile, entry by entry: what a hostile client could send. */
async function craft(name: string, entries: [string, "file" | "sym" | "hard" | "dir" | "fifo", string][]): Promise<string> {
  const file = join(root, `${name}.tar.gz`);
  const script = `
import io, json, sys, tarfile
kinds = {"sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE, "dir": tarfile.DIRTYPE, "fifo": tarfile.FIFOTYPE}
with tarfile.open(sys.argv[1], "w:gz") as t:
    for name, kind, extra in json.loads(sys.argv[2]):
        ti = tarfile.TarInfo(name)
        if kind == "file":
            data = b"0" * int(extra[6:]) if extra.startswith("zeros:") else extra.encode()
            ti.size = len(data); t.addfile(ti, io.BytesIO(data))
        else:
            ti.type = kinds[kind]; ti.linkname = extra; t.addfile(ti)
`;
  const r = await run(["python3", "-c", script, file, JSON.stringify(entries)]);
  if (r.code !== 0) throw new Error(r.stderr);
  return file;
}

describe("packing a workdir", () => {
  const dir = tree(join(root, "proj"), {
    "train.py": "print('train')\n",
    "run.sh": "#!/bin/sh\necho run\n",
    ".gitignore": "*.log\ndata/\n!keep.log\n",
    ".gpulayerignore": "secrets.env\n",
    "secrets.env": "TOKEN=x\n",
    "debug.log": "noise\n",
    "keep.log": "kept\n",
    "data/big.bin": "0".repeat(1000),
    "pkg/mod.py": "x = 1\n",
    "pkg/.gitignore": "local.py\n",
    "pkg/local.py": "y = 2\n",
    ".git/HEAD": "ref: refs/heads/main\n",
    ".venv/bin/python": "",
    "pkg/__pycache__/mod.cpython-311.pyc": "",
    "node_modules/x/index.js": "",
  });
  chmodSync(join(dir, "run.sh"), 0o755);
  symlinkSync("train.py", join(dir, "link-inside.py"));
  symlinkSync("/etc/passwd", join(dir, "link-outside"));

  test("honours .gitignore (nested, negated), .gpulayerignore and the default excludes; keeps links that stay inside", () => {
    const list = listWorkdir(dir);
    expect(list.entries).toEqual([".gitignore", ".gpulayerignore", "keep.log", "link-inside.py", "pkg", "pkg/.gitignore", "pkg/mod.py", "run.sh", "train.py"]);
    expect(list.skipped).toEqual([{ path: "link-outside", reason: "link to /etc/passwd points outside the workdir" }]);
  });

  test("the same content packs to the same hash; times do not count, content does", () => {
    const a = packWorkdir(dir, join(root, "a.tar.gz"), LIMITS);
    utimesSync(join(dir, "train.py"), new Date(), new Date(Date.now() + 5000));
    const b = packWorkdir(dir, join(root, "b.tar.gz"), LIMITS);
    expect(b.hash).toBe(a.hash);
    writeFileSync(join(dir, "pkg", "mod.py"), "x = 2\n");
    const c = packWorkdir(dir, join(root, "c.tar.gz"), LIMITS);
    expect(c.hash).not.toBe(a.hash);
    expect(a.hash).toBe(new Bun.CryptoHasher("sha256").update(readFileSync(a.file)).digest("hex"));
  });

  test("unpacks what was packed: contents, the executable bit, links", async () => {
    const packed = packWorkdir(dir, join(root, "d.tar.gz"), LIMITS);
    const out = join(root, "unpacked");
    await unpackBundle(packed.file, out, LIMITS);
    expect(readFileSync(join(out, "train.py"), "utf8")).toBe("print('train')\n");
    expect(statSync(join(out, "run.sh")).mode & 0o111).not.toBe(0);
    expect(readFileSync(join(out, "link-inside.py"), "utf8")).toBe("print('train')\n");
    expect(existsSync(join(out, "secrets.env"))).toBe(false);
    expect(existsSync(join(out, "data"))).toBe(false);
  });

  test("setuid and setgid bits do not come of a bundle (a root-owned copy on a worker running as root)", async () => {
    const src = join(root, "suid-src");
    mkdirSync(join(src, "d"), { recursive: true });
    writeFileSync(join(src, "tool"), "#!/bin/sh\n");
    chmodSync(join(src, "tool"), 0o6755);
    chmodSync(join(src, "d"), 0o2755);
    const file = join(root, "suid.tar.gz");
    const tarred = await run(["tar", "czf", file, "-C", src, "."]);
    expect(tarred.code, tarred.stderr).toBe(0);
    const out = join(root, "suid-out");
    await unpackBundle(file, out, LIMITS);
    expect(statSync(join(out, "tool")).mode & 0o7777).toBe(0o755);
    expect(statSync(join(out, "d")).mode & 0o7000).toBe(0);
  });

  test("an empty folder packs and unpacks", async () => {
    const empty = join(root, "empty");
    mkdirSync(empty);
    const packed = packWorkdir(empty, join(root, "e.tar.gz"), LIMITS);
    await unpackBundle(packed.file, join(root, "e-out"), LIMITS);
    expect(existsSync(join(root, "e-out"))).toBe(true);
  });

  test("a workdir over the size limit is refused with its biggest entries named", () => {
    const big = tree(join(root, "big"), { "weights/model.bin": "x".repeat(200_000), "small.py": "pass\n" });
    const limits = { maxBytes: 1024 ** 3, maxUnpackedBytes: 100_000, maxEntries: 1000 };
    expect(() => packWorkdir(big, join(root, "big.tar.gz"), limits)).toThrow(/over the limit of .*GPULAYER_BUNDLE_MAX_UNPACKED.*weights/);
  });

  test("a task's outputs over the limits are refused with a hint at its outputs:, which .gpulayerignore does not narrow", () => {
    const dir = tree(join(root, "outs"), { "weights/model.bin": "x".repeat(200_000), "a.txt": "a", "b.txt": "b" });
    const files = [{ path: "a.txt", bytes: 1 }, { path: "b.txt", bytes: 1 }, { path: "weights/model.bin", bytes: 200_000 }];
    const refused = (limits: typeof LIMITS) => {
      try {
        packFiles(dir, files, join(root, "outs.tar.gz"), limits, "the outputs of task train");
      } catch (error) {
        return (error as Error).message;
      }
      return "packed";
    };
    const raw = refused({ maxBytes: 1024 ** 3, maxUnpackedBytes: 100_000, maxEntries: 1000 });
    expect(raw).toMatch(/^the outputs of task train is .*over the limit of .*GPULAYER_BUNDLE_MAX_UNPACKED.*weights\/model\.bin.*; name fewer or smaller files in the task's outputs:$/);
    const packed = refused({ maxBytes: 100, maxUnpackedBytes: 1024 ** 3, maxEntries: 1000 });
    expect(packed).toMatch(/^the outputs of task train, packed, is .*GPULAYER_BUNDLE_MAX\).*; name fewer or smaller files in the task's outputs:$/);
    const many = refused({ maxBytes: 1024 ** 3, maxUnpackedBytes: 1024 ** 3, maxEntries: 2 });
    expect(many).toBe("the outputs of task train: 3 entries, over the limit of 2; name fewer or smaller files in the task's outputs:");
    for (const line of [raw, packed, many]) expect(line).not.toContain(".gpulayerignore");
  });
});

describe("a local project's installed files travel whatever .gitignore says", () => {
  const dir = tree(join(root, "with-project"), {
    "requirements.txt": "./localpkg\n",
    ".gitignore": "*.so\nscratch/\n",
    "scratch/notes.txt": "not sent\n",
    "localpkg/pyproject.toml": "[project]\nname = 'localpkg'\n",
    "localpkg/.gitignore": "data/\nweights/\n*.egg-info/\n",
    "localpkg/weights/model.bin": "outside the package: not sent\n",
    "localpkg/localpkg.egg-info/PKG-INFO": "a build's own: not sent\n",
    "localpkg/localpkg/__init__.py": "",
    "localpkg/localpkg/data/table.json": "{}\n",
    "localpkg/localpkg/_kernels.so": "prebuilt\n",
    "localpkg/localpkg/vendor.egg-info/notes.txt": "package data\n",
    "localpkg/localpkg/node_modules/x.js": "package data\n",
    "localpkg/localpkg/__pycache__/x.pyc": "",
  });
  const reading = { env: {}, digestCache: null };

  test("inside the package: ignored data, a prebuilt library, an egg-info and node_modules folder; outside it .gitignore decides", () => {
    const list = listWorkdir(dir, undefined, carriedFiles(dir, [{ requirementsFile: "requirements.txt", specs: [] }], { ...reading, cwd: dir }));
    expect(list.entries).toEqual([
      ".gitignore",
      "localpkg",
      "localpkg/.gitignore",
      "localpkg/localpkg",
      "localpkg/localpkg/__init__.py",
      "localpkg/localpkg/_kernels.so",
      "localpkg/localpkg/data",
      "localpkg/localpkg/data/table.json",
      "localpkg/localpkg/node_modules",
      "localpkg/localpkg/node_modules/x.js",
      "localpkg/localpkg/vendor.egg-info",
      "localpkg/localpkg/vendor.egg-info/notes.txt",
      "localpkg/pyproject.toml",
      "requirements.txt",
    ]);
  });

  test("a -p spec naming the project carries the same; a request without local projects carries nothing", () => {
    const bySpec = listWorkdir(dir, undefined, carriedFiles(dir, [{ specs: ["./localpkg"] }], { ...reading, cwd: dir }));
    expect(bySpec.entries).toContain("localpkg/localpkg/data/table.json");
    const none = listWorkdir(dir, undefined, carriedFiles(dir, [{ specs: ["tqdm==4.66.5"] }], { ...reading, cwd: dir }));
    expect(none.entries.filter((e) => e.startsWith("localpkg/localpkg/"))).toEqual(["localpkg/localpkg/__init__.py"]);
  });

  test("a .gpulayerignore still leaves one out: the bundle is the user's to trim", () => {
    const trimmed = tree(join(root, "with-project-trimmed"), {
      "requirements.txt": "./localpkg\n",
      ".gpulayerignore": "localpkg/localpkg/data/\n",
      "localpkg/pyproject.toml": "[project]\nname = 'localpkg'\n",
      "localpkg/.gitignore": "data/\n*.so\n",
      "localpkg/localpkg/__init__.py": "",
      "localpkg/localpkg/data/table.json": "{}\n",
      "localpkg/localpkg/_kernels.so": "prebuilt\n",
    });
    const list = listWorkdir(trimmed, undefined, carriedFiles(trimmed, [{ requirementsFile: "requirements.txt", specs: [] }], { ...reading, cwd: trimmed }));
    expect(list.entries.filter((e) => e.startsWith("localpkg/localpkg/"))).toEqual(["localpkg/localpkg/__init__.py", "localpkg/localpkg/_kernels.so"]);
  });

  test("a request the worker will refuse (a project outside the folder) carries nothing and packs as before", () => {
    const list = listWorkdir(dir, undefined, carriedFiles(dir, [{ specs: ["../elsewhere"] }], { ...reading, cwd: dir }));
    expect(list.entries).not.toContain("localpkg/localpkg/data/table.json");
  });
});

describe("unpacking refuses unsafe bundles before anything is written", () => {
  const cases: [string, [string, "file" | "sym" | "hard" | "dir" | "fifo", string][], RegExp][] = [
    ["an absolute path", [["ok.txt", "file", "fine"], [join(root, "escaped-abs"), "file", "x"]], /is absolute/],
    ["a path with ..", [["ok.txt", "file", "fine"], ["a/../../escaped-dotdot", "file", "x"]], /climbs out with \.\./],
    ["a link pointing outside", [["ok.txt", "file", "fine"], ["l", "sym", root], ["l/escaped-link", "file", "x"]], /link to .* outside the bundle/],
    ["a chain of links that climbs out", [["d", "dir", ""], ["d/x", "sym", ".."], ["d/x/z", "sym", ".."], ["d/x/z/escaped-chain", "file", "x"]], /goes through a link/],
    ["a hard link outside", [["ok.txt", "file", "fine"], ["h", "hard", "../../etc/passwd"]], /hard link/],
    // Chains of links, each harmless when read alone: only resolving them through one another shows where they lead.
    ["a two-link chain out, the inner link first", [["CHAIN", "dir", ""], ["CHAIN/up", "sym", ".."], ["root", "sym", "CHAIN/up/.."], ["root/escaped-chain", "file", "x"]], /"root" is a link to "CHAIN\/up\/\.\.", which leads outside the bundle/],
    ["a two-link chain out, the outer link first", [["root", "sym", "CHAIN/up/.."], ["CHAIN", "dir", ""], ["CHAIN/up", "sym", ".."]], /"root" is a link to "CHAIN\/up\/\.\.", which leads outside the bundle/],
    ["a three-link chain out", [["esc", "sym", "a/up2/.."], ["a", "dir", ""], ["a/b", "dir", ""], ["a/up2", "sym", "b/up/.."], ["a/b/up", "sym", ".."]], /"esc" is a link to "a\/up2\/\.\.", which leads outside the bundle/],
    ["a link to a link that points outside", [["l2", "sym", "l1/x"], ["ok.txt", "file", "fine"], ["l1", "sym", "../.."]], /"l2" is a link to "l1\/x", which leads outside/],
    ["a loop of links", [["a", "sym", "b"], ["b", "sym", "c/x"], ["c", "sym", "a"]], /which loops/],
    ["an entry under a folder that a later entry turns into a link", [["a/x", "file", "x"], ["b", "dir", ""], ["a", "sym", "b"]], /"a\/x" goes through a link/],
    ["a hard link to a link", [["sub", "dir", ""], ["sub/l", "sym", ".."], ["h", "hard", "sub/l"]], /hard link to "sub\/l", a link/],
    ["a hard link through a link", [["d", "dir", ""], ["d/f", "file", "x"], ["l", "sym", "d"], ["h", "hard", "l/f"]], /hard link to "l\/f", through the link/],
    ["a device or fifo", [["ok.txt", "file", "fine"], ["f", "fifo", ""]], /FIFO/],
  ];
  for (const [label, entries, message] of cases) {
    test(label, async () => {
      const file = await craft(label.replace(/\W+/g, "-"), entries);
      const dest = join(root, `dest-${label.replace(/\W+/g, "-")}`);
      await expect(inspectBundle(file, LIMITS)).rejects.toThrow(BundleError);
      await expect(unpackBundle(file, dest, LIMITS)).rejects.toThrow(message);
      expect(existsSync(dest)).toBe(false);
      for (const name of ["escaped-abs", "escaped-dotdot", "escaped-link", "escaped-chain"]) expect(existsSync(join(root, name))).toBe(false);
    });
  }

  test("a chain of links that stays inside passes and unpacks, whatever the order", async () => {
    const file = await craft("inside-chain", [
      // (tar itself will not create a link whose target goes through a link already on disk: y comes before b/up)
      ["x", "sym", "a/f.txt"],
      ["y", "sym", "b/up/b/up/a/f.txt"],
      ["a", "sym", "b/c"],
      ["b", "dir", ""],
      ["b/c", "sym", "../d/e"],
      ["b/up", "sym", ".."],
      ["d", "dir", ""],
      ["d/e", "dir", ""],
      ["d/e/f.txt", "file", "inside"],
      ["h", "hard", "d/e/f.txt"],
    ]);
    expect((await inspectBundle(file, LIMITS)).entries).toBe(10);
    const out = join(root, "inside-chain-out");
    await unpackBundle(file, out, LIMITS);
    for (const name of ["x", "y", "h", "a/f.txt"]) expect(readFileSync(join(out, name), "utf8")).toBe("inside");
  });

  test("garbage is not a bundle", async () => {
    const file = join(root, "garbage.tar.gz");
    writeFileSync(file, "not a tarball at all");
    await expect(inspectBundle(file, LIMITS)).rejects.toThrow(/not a valid tar.gz/);
  });

  test("a bundle over the unpacked limit is refused (a gzip bomb stays compressed)", async () => {
    const file = await craft("bomb", [["zeros.bin", "file", "zeros:500000"]]);
    await expect(inspectBundle(file, { maxBytes: 1024 ** 3, maxUnpackedBytes: 100_000, maxEntries: 10 })).rejects.toThrow(/more than 97.66KB unpacked/);
  });
});
