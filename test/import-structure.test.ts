import { describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";

// Real processes and real builds take seconds; a file that sets none gets 5 s, whatever another file set.
setDefaultTimeout(120_000);

/**
 * The shape of src/: no two files import each other, however far round, and
 * src/core/ (the shared primitives) imports nothing of the rest. Read from
 * the source text, so a type-only import counts too: it ties two files as
 * much as a value does.
 */

const ROOT = resolve(import.meta.dir, "..");
const SRC = join(ROOT, "src");
const CORE = "src/core/";

// Each pattern's last group is the specifier. Clauses span lines; they never hold a quote, `;` or parentheses.
const IMPORT_PATTERNS = [
  /\bimport\s+(?:type\s+)?[^'"`;()]*?\bfrom\s*(["'])([^"'\n]+)\1/g, // import x, { y } from / import type { Y } from
  /\bimport\s*(["'])([^"'\n]+)\1/g, // import "./x.ts" (for its effects)
  /\bexport\s+(?:type\s+)?(?:\*(?:\s+as\s+[\w$]+)?|\{[^}]*\})\s*from\s*(["'])([^"'\n]+)\1/g, // export { x } from / export * from
  /\bimport\s*\(\s*(["'`])([^"'`\n]+)\1\s*[,)]/g, // import("./x.ts")
];

/** The relative specifiers a file names, in any of the forms above. */
function relativeImports(code: string): string[] {
  const found = new Set<string>();
  for (const pattern of IMPORT_PATTERNS) for (const m of code.matchAll(pattern)) if (m[2]!.startsWith(".")) found.add(m[2]!);
  return [...found];
}

const files = [...new Bun.Glob("**/*.ts").scanSync(SRC)].map((f) => `src/${f}`).sort();

/** file -> the src files it imports; specifiers that name no file are kept apart. */
const graph = new Map<string, string[]>();
/** The same without `import()`: what loading a file loads at once. */
const loadGraph = new Map<string, string[]>();
const unresolved: string[] = [];
for (const file of files) {
  const targets: string[] = [];
  const code = readFileSync(join(ROOT, file), "utf8");
  // Not loaded at once: `import()`, and imports of types alone (`import type`, or every name marked `type`), which are erased.
  const typesOnly = (clause: string) => /^(?:import|export)\s+type\b/.test(clause) || /^(?:import|export)\s*\{(?:\s*type\s+[\w$]+(?:\s+as\s+[\w$]+)?\s*,?)+\s*\}/.test(clause);
  const loadedSpecs = new Set([0, 1, 2].flatMap((i) => [...code.matchAll(IMPORT_PATTERNS[i]!)].filter((m) => !typesOnly(m[0])).map((m) => m[2]!)));
  const loaded: string[] = [];
  for (const spec of relativeImports(code)) {
    const target = resolve(ROOT, dirname(file), spec);
    if (!existsSync(target)) unresolved.push(`${file}: ${spec}`);
    else if (target.startsWith(`${SRC}/`) && target.endsWith(".ts")) {
      targets.push(relative(ROOT, target));
      if (loadedSpecs.has(spec)) loaded.push(relative(ROOT, target));
    }
  }
  graph.set(file, targets.sort());
  loadGraph.set(file, loaded.sort());
}

/** Every file loading `from` loads at once (static imports, followed). */
function loads(from: string): Set<string> {
  const seen = new Set<string>();
  const walk = (f: string) => {
    if (seen.has(f)) return;
    seen.add(f);
    for (const next of loadGraph.get(f) ?? []) walk(next);
  };
  walk(from);
  return seen;
}

/** Each file's strongly connected component (Tarjan): a cycle never leaves one. */
function components(g: Map<string, string[]>): Map<string, number> {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const component = new Map<string, number>();
  let next = 0;
  const visit = (v: string) => {
    index.set(v, next);
    low.set(v, next++);
    stack.push(v);
    onStack.add(v);
    for (const w of g.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) !== index.get(v)) return;
    const id = component.size;
    for (let w = stack.pop()!; ; w = stack.pop()!) {
      onStack.delete(w);
      component.set(w, id);
      if (w === v) break;
    }
  };
  for (const v of g.keys()) if (!index.has(v)) visit(v);
  return component;
}

/**
 * Every elementary cycle, each once, starting at its least file: `a.ts -> b.ts -> a.ts`. Walked only within each
 * strongly connected component: walking every path of an acyclic graph of 350 files took CI 37 s to find none.
 */
const MAX_CYCLES = 20; // enough to show what to mend; a large tangle has exponentially many

function cycles(all: Map<string, string[]>): string[] {
  const component = components(all);
  const g = new Map([...all].map(([f, targets]) => [f, targets.filter((t) => component.get(t) === component.get(f))]));
  const out: string[] = [];
  for (const start of [...g.keys()].sort()) {
    if (!g.get(start)!.length) continue;
    const path = [start];
    const onPath = new Set(path);
    const walk = (at: string) => {
      for (const next of g.get(at) ?? []) {
        if (out.length >= MAX_CYCLES) return;
        if (next === start) out.push([...path, start].join(" -> "));
        else if (next > start && !onPath.has(next)) {
          path.push(next);
          onPath.add(next);
          walk(next);
          onPath.delete(next);
          path.pop();
        }
      }
    };
    walk(start);
  }
  return out;
}

describe("import structure of src/", () => {
  test("the imports are read: files found, every relative import names a file", () => {
    expect(files.length).toBeGreaterThan(50);
    expect([...graph.values()].flat().length).toBeGreaterThan(100);
    expect(unresolved).toEqual([]);
  });

  test("the reader sees every form of import", () => {
    const code = [
      'import { a,\n  b } from "./multi.ts";',
      'import type {\n  T,\n} from "./types.ts";',
      'import D, { type E } from "./default.ts";',
      'import * as ns from "./ns.ts";',
      'import "./effects.ts";',
      'export { x } from "./reexport.ts";',
      'export type { Y } from "./retype.ts";',
      'export * from "./star.ts";',
      'const m = await import("./dynamic.ts");',
      'import { sleep } from "bun";',
    ].join("\n");
    expect(relativeImports(code).sort()).toEqual(["./default.ts", "./dynamic.ts", "./effects.ts", "./multi.ts", "./ns.ts", "./reexport.ts", "./retype.ts", "./star.ts", "./types.ts"]);
    expect(cycles(new Map([["a.ts", ["b.ts"]], ["b.ts", ["a.ts", "c.ts"]], ["c.ts", ["b.ts"]]]))).toEqual(["a.ts -> b.ts -> a.ts", "b.ts -> c.ts -> b.ts"]);
    // A file importing itself, and a cycle reached through files on none.
    expect(cycles(new Map([["a.ts", ["b.ts", "d.ts"]], ["b.ts", ["c.ts"]], ["c.ts", ["e.ts"]], ["d.ts", ["d.ts", "e.ts"]], ["e.ts", ["f.ts"]], ["f.ts", ["e.ts"]]]))).toEqual(["d.ts -> d.ts", "e.ts -> f.ts -> e.ts"]);
  });

  test("no import cycles", () => {
    expect(cycles(graph)).toEqual([]);
  });

  test("src/core/ imports nothing outside src/core/", () => {
    const outside = files.filter((f) => f.startsWith(CORE)).flatMap((f) => graph.get(f)!.filter((t) => !t.startsWith(CORE)).map((t) => `${f} -> ${t}`));
    expect(files.some((f) => f.startsWith(CORE))).toBe(true);
    expect(outside).toEqual([]);
  });

  test("the rest of src/ reaches src/env/ only through its entry points", () => {
    const ENTRIES = ["src/env/index.ts", "src/env/index-light.ts", "src/env/index-warm.ts"];
    const inside = files.filter((f) => !f.startsWith("src/env/")).flatMap((f) => graph.get(f)!.filter((t) => t.startsWith("src/env/") && !ENTRIES.includes(t)).map((t) => `${f} -> ${t}`));
    expect(inside).toEqual([]);
  });

  test("a warm prepare loads no build code: env/index-light.ts reaches the build only through import()", () => {
    const BUILD = ["src/env/build/build.ts", "src/env/build/fast-path.ts", "src/env/build/pip-path.ts", "src/env/store/artifact.ts"];
    for (const f of BUILD) expect(files).toContain(f);
    expect([...loads("src/env/index-light.ts")].filter((f) => BUILD.includes(f))).toEqual([]);
    expect([...loads("src/commands/env/_warm-lane.ts")].filter((f) => BUILD.includes(f))).toEqual([]);
    // Nor what a build under a lock, or a fetch from the fleet, needs: the lane only looks.
    const NOT_WARM = ["src/env/prepare.ts", "src/env/store/cache-entry.ts", "src/env/store/shipping.ts", "src/env/request/nearest.ts"];
    for (const f of NOT_WARM) expect(files).toContain(f);
    expect([...loads("src/commands/env/_warm-lane.ts")].filter((f) => NOT_WARM.includes(f))).toEqual([]);
    // And the check sees static imports: the full entry point does load the build.
    expect(loads("src/env/index.ts").has("src/env/build/build.ts")).toBe(true);
  });

  test("settings are built in one place: nothing else in src/ reads process.env", () => {
    const ONE_PLACE = "src/commands/_context.ts";
    // `process.env`, `process["env"]`, and a destructured `{ env } = process`.
    const reads = /\bprocess\s*(?:\.\s*env\b|\[\s*["'`]env["'`]\s*\])|\{[^}]*\benv\b[^}]*\}\s*=\s*process\b/;
    const readers = files.filter((f) => f !== ONE_PLACE && reads.test(readFileSync(join(ROOT, f), "utf8").replace(/\/\*[\s\S]*?\*\/|\/\/.*$/gm, "")));
    expect(readers).toEqual([]);
    expect(reads.test(readFileSync(join(ROOT, ONE_PLACE), "utf8"))).toBe(true);
  });
});
