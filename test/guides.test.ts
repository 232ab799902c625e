import { describe, expect, setDefaultTimeout, test } from "bun:test";
import { chmodSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { makeDist } from "./fixtures/index.ts";
import { CLI_ARGV, ROOT, run, sandbox } from "./helpers.ts";

/**
 * The guides as a newcomer follows them: every fenced block marked
 * ```` ```sh runnable ```` in docs/ runs, page by page, in order, as written,
 * in one `sh -e` per page (a `cd` or an `export` in one block holds for the
 * next, as in the reader's terminal). Around it: a fresh GPULAYER_HOME, a
 * `gpulayer` first on PATH that is the one under test, and an index on
 * 127.0.0.1 serving stand-ins of the public packages the guides name, given
 * as the machine's pip index (PIP_INDEX_URL, UV_INDEX_URL), as a reader's
 * pip.conf would. Where the machine allows, each page runs in network and
 * process namespaces of its own: no internet, port 7070 its own, and
 * whatever a block started with `&` (a server, workers) ends with the page.
 */

setDefaultTimeout(240_000);

const MARKER = /^```sh runnable\s*$/;

/** The marked blocks of a page, in order, each with the line its fence opens on. */
export function runnableBlocks(text: string): { line: number; body: string }[] {
  const lines = text.split("\n");
  const blocks: { line: number; body: string }[] = [];
  for (let i = 0; i < lines.length; i++) {
    if (!MARKER.test(lines[i]!)) continue;
    const start = i;
    const body: string[] = [];
    for (i++; i < lines.length && !/^```\s*$/.test(lines[i]!); i++) body.push(lines[i]!);
    blocks.push({ line: start + 1, body: body.join("\n") });
  }
  return blocks;
}

/** Stand-ins for the public packages the guides install: importable, and doing what the guides' scripts ask of them. */
const STAND_INS = [{ name: "tqdm", version: "4.67.1", files: { "tqdm/__init__.py": "def tqdm(iterable=None, *args, **kwargs):\n    return iterable\n" } }];

const pages = [...new Bun.Glob("docs/**/*.md").scanSync(ROOT)]
  .sort()
  .map((page) => ({ page, blocks: runnableBlocks(readFileSync(join(ROOT, page), "utf8")) }))
  .filter((p) => p.blocks.length);

/** Whether this machine lets the test make its own network and process namespaces (not in every container). */
const NAMESPACES = Bun.spawnSync(["unshare", "-rn", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", "ip link set lo up"], { stdout: "ignore", stderr: "ignore" }).exitCode === 0;

async function runPage(page: string, blocks: { line: number; body: string }[]) {
  const box = sandbox();
  const bin = join(box.root, "bin");
  const indexDir = join(box.root, "index");
  const work = join(box.root, "work");
  for (const dir of [bin, indexDir, work]) mkdirSync(dir);
  for (const spec of STAND_INS) makeDist("wheel", indexDir, spec);
  const quote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
  writeFileSync(join(bin, "gpulayer"), `#!/bin/sh\nexec ${CLI_ARGV.map(quote).join(" ")} "$@"\n`);
  chmodSync(join(bin, "gpulayer"), 0o755);
  const urlFile = join(box.root, "index.url");
  const script = [
    "set -e",
    NAMESPACES ? "ip link set lo up" : "",
    `${quote(process.execPath)} ${quote(join(ROOT, "test/fixtures/serve-index.ts"))} ${quote(indexDir)} ${quote(urlFile)} &`,
    `while [ ! -s ${quote(urlFile)} ]; do sleep 0.1; done`,
    `PIP_INDEX_URL=$(cat ${quote(urlFile)}); UV_INDEX_URL=$PIP_INDEX_URL; export PIP_INDEX_URL UV_INDEX_URL`,
    // Without namespaces, what the blocks started in the background goes when the page ends.
    NAMESPACES ? "" : "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT",
    `cd ${quote(work)}`,
    ...blocks.flatMap((b) => [`echo '>>> ${page}:${b.line}' >&2`, b.body]),
    "echo '>>> the end' >&2",
  ].join("\n");
  // The machine's own pip.conf stays out (sandbox: PIP_CONFIG_FILE=/dev/null): the index is the one above.
  const env = { ...box.env, PATH: `${bin}:${box.env.PATH}` };
  const argv = NAMESPACES ? ["unshare", "-rn", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", script] : ["sh", "-c", script];
  const r = await run(argv, { env, cwd: work });
  const failedAt = [...r.stderr.matchAll(/^>>> (.+)$/gm)].at(-1)?.[1];
  return { ...r, failedAt: r.code === 0 ? null : failedAt };
}

test("the guides mark their runnable blocks: getting started and the fleet", () => {
  expect(pages.map((p) => p.page)).toEqual(expect.arrayContaining(["docs/getting-started.md", "docs/guides/fleet.md"]));
});

describe("each guide's runnable blocks run as written", () => {
  for (const { page, blocks } of pages) {
    test(page, async () => {
      const r = await runPage(page, blocks);
      if (r.code !== 0) console.error(`${page}: exit ${r.code} in the block at ${r.failedAt}\n${r.stdout.slice(-3000)}\n${r.stderr.slice(-6000)}`);
      expect({ page, code: r.code, failedAt: r.failedAt }).toEqual({ page, code: 0, failedAt: null });
      expect(r.stderr).toContain(">>> the end");
      // The fleet's walk ends with a job that one of its two workers ran.
      if (page === "docs/guides/fleet.md") {
        expect(r.stdout).toContain("hello from the fleet");
        expect(r.stderr).toMatch(/\(job [0-9a-f]{16} succeeded on w[12]\)/);
        expect(r.stdout).toMatch(/^w1 .*\n^w2 /m);
      }
    });
  }
});
