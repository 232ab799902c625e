import { describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { referencePages } from "../scripts/gen-reference.ts";

// The generator starts `gpulayer --help` once and loads every command's definition.
setDefaultTimeout(60_000);

/**
 * The documentation as a reader meets it: the README short, the reference
 * pages made from the code as committed, and every relative link and #anchor
 * in README.md and docs/ landing on a file and a heading that are there.
 */

const ROOT = resolve(import.meta.dir, "..");
const PAGES = ["README.md", ...[...new Bun.Glob("docs/**/*.md").scanSync(ROOT)].sort()];

/** A page's text outside code: fenced blocks and inline code hold examples, not links. */
function prose(text: string): string {
  return text.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, "").replace(/`[^`\n]*`/g, "");
}

/** GitHub's anchor for a heading: lowercase, punctuation removed, spaces to `-`; repeats get -1, -2, ... */
function anchors(text: string): Set<string> {
  const seen = new Map<string, number>();
  const found = new Set<string>();
  const withoutFences = text.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, "");
  for (const m of withoutFences.matchAll(/^#{1,6}\s+(.+?)\s*#*\s*$/gm)) {
    const slug = m[1]!
      .replace(/<[^>]+>/g, "")
      .replace(/\[([^\]]*)\]\([^)]*\)/g, "$1")
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, "")
      .replace(/ /g, "-");
    const n = seen.get(slug) ?? 0;
    seen.set(slug, n + 1);
    found.add(n ? `${slug}-${n}` : slug);
  }
  for (const m of withoutFences.matchAll(/<a\s+(?:name|id)="([^"]+)"/g)) found.add(m[1]!);
  return found;
}

/** Every link target in a page's prose: [text](target), ![alt](target), [text]: target. */
function links(text: string): string[] {
  const body = prose(text);
  const inline = [...body.matchAll(/!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)].map((m) => m[1]!);
  const defined = [...body.matchAll(/^\s*\[[^\]]+\]:\s*(\S+)/gm)].map((m) => m[1]!);
  return [...inline, ...defined];
}

describe("the README", () => {
  const readme = readFileSync(join(ROOT, "README.md"), "utf8");

  test("is under 300 lines", () => {
    expect(readme.split("\n").length).toBeLessThan(300);
  });

  test("its quick start is two commands, and both are there to run", () => {
    const start = readme.indexOf("## Quick start");
    expect(start).toBeGreaterThan(-1);
    const block = /```sh\n([\s\S]*?)```/.exec(readme.slice(start))![1]!;
    const commands = block.split("\n").filter((l) => l.trim() && !l.trim().startsWith("#"));
    expect(commands.map((c) => c.split("#")[0]!.trim())).toEqual(["./scripts/quickstart.sh", "bun run test"]);
    expect(statSync(join(ROOT, "scripts/quickstart.sh")).mode & 0o111).not.toBe(0);
    const script = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")).scripts.test as string;
    expect(statSync(join(ROOT, /^bun run (\S+)$/.exec(script)![1]!)).isFile()).toBe(true);
  });
});

test("the reference pages are what scripts/gen-reference.ts makes from the code", async () => {
  for (const [file, [committed, expected]] of Object.entries(await referencePages())) {
    // A boolean first: a failure should name the page and the command that fixes it, not print it whole.
    if (committed !== expected) console.error(`${file} is out of date: run bun scripts/gen-reference.ts`);
    expect({ file, current: committed === expected }).toEqual({ file, current: true });
  }
});

test("every relative link and #anchor in README.md and docs/ resolves", () => {
  const texts = new Map(PAGES.map((p) => [p, readFileSync(join(ROOT, p), "utf8")]));
  const anchorsOf = new Map<string, Set<string>>();
  const broken: string[] = [];
  let checked = 0;
  for (const [page, text] of texts) {
    for (const target of links(text)) {
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto: ...
      checked++;
      const [path, anchor] = target.split("#", 2) as [string, string | undefined];
      const file = path ? relative(ROOT, resolve(dirname(join(ROOT, page)), decodeURI(path))) : page;
      if (!existsSync(join(ROOT, file))) {
        broken.push(`${page}: ${target} (no such file)`);
        continue;
      }
      if (anchor === undefined || !file.endsWith(".md")) continue;
      if (!anchorsOf.has(file)) anchorsOf.set(file, anchors(texts.get(file) ?? readFileSync(join(ROOT, file), "utf8")));
      if (!anchorsOf.get(file)!.has(decodeURIComponent(anchor))) broken.push(`${page}: ${target} (no heading #${anchor} in ${file})`);
    }
  }
  expect(broken).toEqual([]);
  expect(checked).toBeGreaterThan(50);
});

test("the link check reads headings as GitHub does", () => {
  const found = anchors("# The env key: what counts, and why a rebuild\n## `env list: an env`\n## Flags\n## Flags\n```\n# not a heading\n```\n");
  expect([...found]).toEqual(["the-env-key-what-counts-and-why-a-rebuild", "env-list-an-env", "flags", "flags-1"]);
});
