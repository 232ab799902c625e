import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { installerMessage } from "../src/env/build/run-tool.ts";

/**
 * What a failed build says first: the installers' real output (uv 0.13.9 and
 * pip 26.2.1 building small in-tree backends that fail in different ways, kept
 * in fixtures/installer-output/), read as an error's headline. Never uv's or
 * pip's closing hint; the exception's own first line, a lowercase class
 * included; and a failure told after a handled traceback over that traceback.
 */

const headline = (file: string) => installerMessage(readFileSync(join(import.meta.dir, "fixtures", "installer-output", file), "utf8").split("\n")).headline;

const EXPECTED: Record<string, string> = {
  plain: "RuntimeError: description must be specified",
  multiline: "RuntimeError: CUDA toolkit not found",
  note: "RuntimeError: Python.h not found",
  noexcmsg: "AssertionError",
  reerror: "re.error: unterminated character set at position 0",
  stdoutlog: "ValueError: compiler exited 1",
  handled: "error: command 'gcc' failed: No such file or directory",
};

describe("a failed build's headline", () => {
  for (const installer of ["uv", "pip"]) {
    for (const [kind, line] of Object.entries(EXPECTED)) {
      test(`${installer}: ${kind}`, () => {
        expect(headline(`${installer}-${kind}.txt`)).toBe(line);
      });
    }
    test(`${installer}: a subprocess's own failure names the command, never the hint`, () => {
      expect(headline(`${installer}-sub.txt`)).toStartWith("CalledProcessError: Command ");
      expect(headline(`${installer}-ownerror.txt`)).not.toMatch(/^hint:/);
    });
  }
});
