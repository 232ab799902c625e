import { readFileSync } from "node:fs";
import { isAbsolute, relative, resolve } from "node:path";
import { InstallError } from "../../errors.ts";

/**
 * What a failed `uv pip install` means for the build. A request uv cannot
 * read, or one nothing satisfies, is final: pip would read it no better
 * (a requirement uv cannot parse is one pip 24.1+ refuses too) and would
 * only run the same resolution again, slower, into a longer message. Said in
 * one line, naming the user's file and line, never gpulayer's own top file.
 * Only where uv's own words say pip could answer otherwise (a pre-release it
 * would not take) is the request left to pip; anything else uv failed on
 * (a build, the network, its cache) is too, as before.
 */

export type UvFailureMeaning = { final: InstallError } | { retry: string } | null;

/** The top file gpulayer wrote (with -p specs), and how to name its lines. */
export interface TopFile {
  top: { path: string; text: string } | null;
  where(line: number): string | null;
}

const AT_POSITION = /in `(.+?)` at position (\d+)/;

/** The 1-based line of a byte offset in a text. */
function lineOf(bytes: Uint8Array, position: number): number {
  let line = 1;
  for (let i = 0; i < Math.min(position, bytes.length); i++) if (bytes[i] === 0x0a) line++;
  return line;
}

/** `FILE at position N` as the user knows it: their file and line, or the -p spec it came from. */
function userLocation(file: string, position: number, cwd: string, files: TopFile): string {
  const abs = isAbsolute(file) ? file : resolve(cwd, file);
  if (files.top && abs === files.top.path) {
    const line = lineOf(new TextEncoder().encode(files.top.text), position);
    return files.where(line) ?? `the request's line ${line}`;
  }
  let bytes: Uint8Array;
  try {
    bytes = readFileSync(abs);
  } catch {
    return `${file} at position ${position}`; // gone since: uv's own words
  }
  const shown = relative(cwd, abs);
  return `${shown && !shown.startsWith("..") && !isAbsolute(shown) ? shown : abs}:${lineOf(bytes, position)}`;
}

const cause = (l: string) => l.trim().replace(/^cause:\s*/, "");

export function uvFailureMeaning(lines: string[], cwd: string, files: TopFile): UvFailureMeaning {
  const text = lines.map((l) => l.trimEnd());
  // The innermost "in `FILE` at position N" is the line at fault; the cause under it is uv's reason.
  const at = text.findLastIndex((l) => AT_POSITION.test(l));
  if (at !== -1) {
    const [, file, position] = AT_POSITION.exec(text[at]!)!;
    const reason = text[at + 1] && /^\s*cause:/.test(text[at + 1]!) ? cause(text[at + 1]!) : cause(text[at]!.replace(/^\s*error:\s*/, ""));
    const shown = text[at + 2] && !/^\s*\^+$/.test(text[at + 2]!) && /^\s{3,}\S/.test(text[at + 2]!) ? text[at + 2]!.trim() : null;
    return { final: new InstallError(`${userLocation(file!, Number(position), cwd, files)}: ${shown ? `invalid requirement '${shown}': ` : ""}${reason}`, "") };
  }
  const unsolvable = text.findIndex((l) => /No solution found when resolving dependencies/.test(l));
  if (unsolvable === -1) return null;
  const rest = text.slice(unsolvable + 1).filter((l) => l.trim());
  const hints = rest.filter((l) => /^\s*hint:/.test(l));
  const explanation = rest
    .filter((l) => !/^\s*hint:/.test(l))
    .map(cause)
    .join(" ")
    .replace(/^[╰─▶\s]+/, "")
    .replace(/\s+/g, " ");
  // uv holds back a pre-release pip might take: pip decides (fast-path.ts says the same of one uv took).
  if (hints.some((h) => /pre-?release/i.test(h))) return { retry: `uv found no solution without a pre-release (${explanation}); pip decides when one counts` };
  return { final: new InstallError(`no solution found when resolving dependencies${explanation ? `: ${explanation}` : ""}`, "") };
}
