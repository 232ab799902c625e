import { afterAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { mkdirSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { homeLayout } from "../src/config/paths.ts";
import { dryRunPrepare } from "../src/env/prepare.ts";
import { scanRequest } from "../src/env/request/requirements.ts";
import { UsageError } from "../src/errors.ts";
import { tempDir } from "./helpers.ts";

// Real processes and real builds take seconds; a file that sets none gets 5 s, whatever another file set.
setDefaultTimeout(120_000);

/**
 * A remote job's requirements are read on its worker, inside the unpacked
 * bundle: every file, project and folder they reach must be inside it, links
 * resolved, or the request is refused before anything outside is read (and
 * so never quoted back into an error, a job record or the server).
 */

const root = tempDir("gpl-confine-");
const bundle = join(root, "bundle");
mkdirSync(join(bundle, "sub"), { recursive: true });
mkdirSync(join(bundle, "pkg"));
writeFileSync(join(bundle, "pkg", "pyproject.toml"), "[project]\nname = 'pkg'\nversion = '1'\n");
writeFileSync(join(bundle, "sub", "more.txt"), "tqdm\n");
writeFileSync(join(root, "outside.txt"), "SECRET-LINE-outside\n");
symlinkSync(join(root, "outside.txt"), join(bundle, "looks-inside.txt"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const scan = (text: string) => {
  writeFileSync(join(bundle, "requirements.txt"), text);
  return scanRequest({ requirementsFile: join(bundle, "requirements.txt"), specs: [] }, { env: {}, cwd: bundle, digestCache: null, confine: bundle });
};

describe("a remote job's requirements stay inside its bundle", () => {
  test("what stays inside is read as always", () => {
    const inputs = scan("-r sub/more.txt\n./pkg\n-e ./pkg\n");
    expect(inputs.files.map((f) => f.path)).toEqual([join(bundle, "requirements.txt"), join(bundle, "sub", "more.txt")]);
  });

  const refused: [string, string][] = [
    ["-r /abs/path", `-r ${join(root, "outside.txt")}\n`],
    ["-c ../outside.txt", "-c ../outside.txt\n"],
    ["a link inside that points out", "-r looks-inside.txt\n"],
    ["/proc/self/environ", "-r /proc/self/environ\n"],
    ["a local project outside", `${root}/\n`],
    ["an editable project outside", "-e ..\n"],
    ["a find-links folder outside", `--find-links ${root}\ntqdm\n`],
  ];
  for (const [name, text] of refused) {
    test(`${name}: refused with the line, before anything outside is read`, () => {
      let error: unknown;
      try {
        scan(text);
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(UsageError);
      const message = (error as Error).message;
      expect(message).toMatch(/^requirements\.txt:1: .* is outside the job's bundle; a remote job reads only what it brought$/);
      expect(message).not.toContain("SECRET-LINE");
    });
  }

  test("a --find-links the request itself names (a job file's find_links): refused the same way", () => {
    const home = join(root, "home");
    const ask = (findLinks: string[]) =>
      dryRunPrepare(homeLayout(home), { specs: ["tqdm"], findLinks, extraIndexUrls: [], cwd: bundle, env: process.env, python: Bun.which("python3") ?? "python3", confineTo: bundle });
    expect(() => ask([root])).toThrow(new UsageError(`--find-links: the find-links location ${root} is outside the job's bundle; a remote job reads only what it brought`));
    expect(ask([join(bundle, "sub")]).would).toBe("build");
  });

  test("a file:// index outside the bundle, named by the request or a requirements file: refused; one inside is read", () => {
    const home = join(root, "home");
    const ask = (req: { indexUrl?: string; extraIndexUrls?: string[]; requirementsFile?: string }) =>
      dryRunPrepare(homeLayout(home), { specs: req.requirementsFile ? [] : ["tqdm"], findLinks: [], extraIndexUrls: [], ...req, cwd: bundle, env: process.env, python: Bun.which("python3") ?? "python3", confineTo: bundle });
    const outside = `the index: the file:// index ${root} is outside the job's bundle; a remote job reads only what it brought`;
    expect(() => ask({ indexUrl: `file://${root}` })).toThrow(new UsageError(outside));
    expect(() => ask({ extraIndexUrls: [`file://${root}`] })).toThrow(new UsageError(outside));
    writeFileSync(join(bundle, "req-index.txt"), `--extra-index-url file://${root}\ntqdm\n`);
    expect(() => ask({ requirementsFile: join(bundle, "req-index.txt") })).toThrow(new UsageError(outside));
    expect(ask({ indexUrl: `file://${join(bundle, "sub")}` }).would).toBe("build");
  });
});
