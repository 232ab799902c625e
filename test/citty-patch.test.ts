import { describe, expect, test } from "bun:test";
import { resolve } from "node:path";
import type { ArgsDef, CommandDef } from "citty";
import { camelCase as sculeCamel, kebabCase as sculeKebab } from "scule";

/**
 * The patched casing answers as scule itself does (the library citty's copy
 * comes from, installed at the same version as the reference) for every
 * argument name and alias of every command, and for names the fast path
 * must leave to the original walk.
 */

const ROOT = resolve(import.meta.dir, "..");
// citty bundles its own copy of scule; patches/citty@0.2.2.patch gives its casing a fast path.
const cittyScule = resolve(ROOT, "node_modules/citty/dist/_chunks/libs/scule.mjs");
const { n: cittyKebab, t: cittyCamel } = (await import(cittyScule)) as { n: typeof sculeKebab; t: typeof sculeCamel };

async function argNames(): Promise<string[]> {
  const names = new Set<string>();
  for (const file of new Bun.Glob("commands/**/*.ts").scanSync(resolve(ROOT, "src"))) {
    const mod = (await import(resolve(ROOT, "src", file))) as { default?: CommandDef };
    const args = (await mod.default?.args) as ArgsDef | undefined;
    for (const [name, def] of Object.entries(args ?? {})) {
      names.add(name);
      const alias = "alias" in def ? def.alias : undefined;
      for (const a of Array.isArray(alias) ? alias : alias ? [alias] : []) names.add(a);
    }
  }
  return [...names];
}

const EDGES = ["index-url", "a-2b", "x", "abc123", "dry-run", "no-index", "Foo", "fooBar", "foo_bar", "FOO", "foo--bar", "-foo", "foo-", "2fa", "foo.bar", "ünïcode-name", "prepare-timeout", ""];

describe("citty's casing, patched", () => {
  test("every command's argument names are cased as scule cases them", async () => {
    const names = await argNames();
    expect(names.length).toBeGreaterThan(40);
    for (const name of names) {
      expect([name, cittyCamel(name)]).toEqual([name, sculeCamel(name)]);
      expect([name, cittyKebab(name)]).toEqual([name, sculeKebab(name)]);
    }
  });

  test("names outside the fast path take the original walk, with the same answers", () => {
    for (const name of EDGES) {
      expect([name, cittyCamel(name)]).toEqual([name, sculeCamel(name)]);
      expect([name, cittyKebab(name)]).toEqual([name, sculeKebab(name)]);
      expect([name, cittyKebab(name, "_")]).toEqual([name, sculeKebab(name, "_")]);
    }
  });
});
