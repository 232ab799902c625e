import { describe, expect, test } from "bun:test";
import { type ArgsDef, parseArgs } from "citty";
import { plainArgs } from "../src/commands/_plain-args.ts";
import { prepareArgs } from "../src/commands/env/_prepare-args.ts";

/**
 * `env prepare`'s warm lane reads its flags without citty (plainArgs); citty reads them for the command. Held side by
 * side over the command's own definition: every argv the lane reads, it reads as citty does, flag by flag; what it
 * cannot read the same way it refuses (null), and the command then runs as usual.
 */

const WORDS = ["req.txt", "-p", "numpy<3", "--package", "--package=torch==2.1", "-q", "--quiet", "--json", "--verbose", "--python", "/usr/bin/python3", "--python=py3", "--index-url", "http://127.0.0.1:1/simple", "--extra-index-url", "--find-links", "./wheels", "--prepare-timeout", "10m", "--dry-run", "--image", "img:1", "--server", "http://s", "--token", "t", "--label", "gpu=a100", "--conda", "base", "--", "--no-json", "--indexUrl", "x", "-qj", "-pnumpy", "-", "", "--json=false", "--python=", "--unknown", "-r", "extra.txt", "two.txt"];

/** Deterministic argv samples: every word after every word, and seeded random runs of up to 7 words. */
function samples(): string[][] {
  const out: string[][] = [[]];
  for (const a of WORDS) for (const b of WORDS) out.push([a, b]);
  let seed = 42;
  const next = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed);
  for (let i = 0; i < 4000; i++) out.push(Array.from({ length: 1 + (next() % 7) }, () => WORDS[next() % WORDS.length]!));
  return out;
}

/** What a command reads of citty's answer: each flag of the definition by its own name, and the positionals. */
function asCommandReads(parsed: Record<string, unknown>, def: ArgsDef): Record<string, unknown> {
  const out: Record<string, unknown> = { _: parsed._ };
  for (const name of Object.keys(def)) out[name] = parsed[name];
  return out;
}

describe("plainArgs reads argv as citty does", () => {
  test("env prepare's definition: every argv read is read alike, flag by flag", () => {
    let read = 0;
    for (const argv of samples()) {
      const plain = plainArgs(argv, prepareArgs);
      if (!plain) continue;
      read++;
      expect({ argv, args: asCommandReads(plain, prepareArgs) }).toEqual({ argv, args: asCommandReads(parseArgs(argv, prepareArgs), prepareArgs) });
    }
    // The plain forms are most of what people type: the lane must take them, not refuse everything.
    expect(read).toBeGreaterThan(500);
  });

  test("the forms it refuses are left to citty", () => {
    for (const argv of [["--", "x"], ["--no-json"], ["--indexUrl", "x"], ["-qj"], ["-pnumpy"], ["-"], ["--json=false"], ["--unknown"], ["-r", "a.txt"], ["a.txt", "b.txt"], ["--python"], ["--python", "--json"], ["--python", ""], ["--find-links="]]) {
      expect({ argv, plain: plainArgs(argv, prepareArgs) }).toEqual({ argv, plain: null });
    }
  });

  test("the plain forms are read", () => {
    expect(plainArgs(["req.txt", "-p", "a", "--package=b", "-q", "--python", "/p"], prepareArgs)).toMatchObject({ _: ["req.txt"], requirements: "req.txt", package: "b", quiet: true, python: "/p" });
  });
});
