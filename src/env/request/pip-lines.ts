import { split as shlexSplit } from "shlex";

/**
 * One requirements file read line by line exactly as pip reads it
 * (pip/_internal/req/req_file.py: preprocess, break_args_options,
 * build_parser), so that gpulayer knows every file, path and variable pip
 * will touch. Nothing here is handed to an installer: the installer reads
 * the user's own file. What gpulayer cannot read with certainty (an
 * abbreviated long option, say) is refused, never guessed. The differential
 * suite (test/pip-reading.test.ts) holds this against pip's own parser.
 */

export interface OptionSpec {
  long: string;
  short?: string;
  /** Other long spellings pip accepts for it. */
  aliases?: string[];
  takesValue: boolean;
  /** Options that act per requirement, on a requirement's own line. */
  perRequirement?: boolean;
}

/** pip's requirement-file options (SUPPORTED_OPTIONS and SUPPORTED_OPTIONS_REQ); test/pip-reading.test.ts checks the table against pip's. */
export const PIP_FILE_OPTIONS: OptionSpec[] = [
  { long: "--index-url", short: "-i", aliases: ["--pypi-url"], takesValue: true },
  { long: "--extra-index-url", takesValue: true },
  { long: "--no-index", takesValue: false },
  { long: "--constraint", short: "-c", takesValue: true },
  { long: "--requirement", short: "-r", takesValue: true },
  { long: "--editable", short: "-e", takesValue: true },
  { long: "--find-links", short: "-f", takesValue: true },
  { long: "--no-binary", takesValue: true },
  { long: "--only-binary", takesValue: true },
  { long: "--prefer-binary", takesValue: false },
  { long: "--require-hashes", takesValue: false },
  { long: "--pre", takesValue: false },
  { long: "--trusted-host", takesValue: true },
  { long: "--use-feature", takesValue: true },
  { long: "--global-option", takesValue: true, perRequirement: true },
  { long: "--hash", takesValue: true, perRequirement: true },
  { long: "--config-settings", short: "-C", takesValue: true, perRequirement: true },
];

const BY_LONG = new Map<string, OptionSpec>();
const BY_SHORT = new Map<string, OptionSpec>();
for (const o of PIP_FILE_OPTIONS) {
  BY_LONG.set(o.long, o);
  for (const a of o.aliases ?? []) BY_LONG.set(a, o);
  if (o.short) BY_SHORT.set(o.short, o);
}

/** A line pip cannot read, or one gpulayer will not guess at: one line for the user, naming what to write instead. */
export class LineRefused extends Error {}

export interface FileOption {
  /** The option's long name (`--requirement`), whatever spelling the file used. */
  name: string;
  value?: string;
  /** How the file spelled it: `-r x` (separate), `--requirement=x` (equals), `-rx` (attached). */
  spelling: "flag" | "separate" | "equals" | "attached";
}

export interface PipLine {
  lineNo: number;
  /** The logical line after pip's joining and comment stripping, before `${VAR}` expansion. */
  text: string;
  /** The part before the first option, `${VAR}`s expanded: a requirement, or empty for an option line. */
  args: string;
  options: FileOption[];
  /** `${VAR}` names on the line, in order, whether set or not. */
  variables: string[];
}

/** Python's str.splitlines boundaries: pip splits a file on all of them, not only on \n. */
const PY_LINE_BREAK = /\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]/;
const COMMENT = /(^|\s+)#.*$/;
const ENV_VAR = /\$\{([A-Z0-9_]+)\}/g;

/** pip's preprocess: split, join `\` continuations, drop comments and blank lines. */
export function logicalLines(text: string): { lineNo: number; text: string }[] {
  const out: { lineNo: number; text: string }[] = [];
  let pending: string[] = [];
  let first = 0;
  const emit = (lineNo: number, line: string) => {
    const stripped = line.replace(COMMENT, "").trim();
    if (stripped) out.push({ lineNo, text: stripped });
  };
  text.split(PY_LINE_BREAK).forEach((raw, i) => {
    // pip's COMMENT_RE.match: a line that starts with a comment never continues another.
    const isComment = /^\s*#/.test(raw);
    if (!raw.endsWith("\\") || isComment) {
      const line = isComment ? ` ${raw}` : raw;
      if (pending.length) {
        emit(first, pending.join("") + line);
        pending = [];
      } else emit(i + 1, line);
      return;
    }
    if (!pending.length) first = i + 1;
    pending.push(raw.replace(/^\\+|\\+$/g, ""));
  });
  if (pending.length) emit(first, pending.join(""));
  return out;
}

/** `${VAR}` as pip expands it: set and non-empty is replaced, anything else stays as written. */
function expandVariables(line: string, env: Record<string, string | undefined>): string {
  return line.replace(ENV_VAR, (whole, name: string) => env[name] || whole);
}

function variablesOf(line: string): string[] {
  return [...line.matchAll(ENV_VAR)].map((m) => m[1]!);
}

/** pip's break_args_options: tokens split at single spaces; the first that starts with `-` begins the options. */
function breakArgsOptions(line: string): [string, string] {
  const tokens = line.split(" ");
  const at = tokens.findIndex((t) => t.startsWith("-"));
  if (at === -1) return [line, ""];
  return [tokens.slice(0, at).join(" "), tokens.slice(at).join(" ")];
}

/** optparse over pip's option table, refusing what optparse would guess (abbreviations). */
function parseOptions(tokens: string[], where: string): FileOption[] {
  const out: FileOption[] = [];
  for (let i = 0; i < tokens.length; i++) {
    const token = tokens[i]!;
    if (token === "--") break; // optparse: the rest are arguments, which pip ignores
    if (!token.startsWith("-") || token === "-") continue; // a stray argument: optparse keeps it, pip ignores it
    if (token.startsWith("--")) {
      const eq = token.indexOf("=");
      const name = eq === -1 ? token : token.slice(0, eq);
      const spec = BY_LONG.get(name);
      if (!spec) {
        const full = [...BY_LONG.keys()].filter((k) => k.startsWith(name));
        if (full.length === 1) throw new LineRefused(`${where}: ${name} is an abbreviation of ${full[0]}; write ${full[0]} in full`);
        // pip 23-25 read neither in a requirements file (req_file.py SUPPORTED_OPTIONS): gpulayer's own spelling is said instead.
        const isolation = name === "--no-build-isolation" || name === "--no-build-isolation-package" ? "; name the package with --no-build-isolation-package NAME beside -p NAME, or in a job file's environment.no_build_isolation" : "";
        throw new LineRefused(`${where}: pip does not accept ${name} in a requirements file${isolation}`);
      }
      if (!spec.takesValue) {
        if (eq !== -1) throw new LineRefused(`${where}: ${name} takes no value`);
        out.push({ name: spec.long, spelling: "flag" });
        continue;
      }
      const value = eq !== -1 ? token.slice(eq + 1) : tokens[++i];
      if (value === undefined) throw new LineRefused(`${where}: ${name} needs a value`);
      out.push({ name: spec.long, value, spelling: eq !== -1 ? "equals" : "separate" });
      continue;
    }
    // Short options: every one pip takes here needs a value, attached (-rfile) or next.
    const spec = BY_SHORT.get(token.slice(0, 2));
    if (!spec) throw new LineRefused(`${where}: pip does not accept ${token.slice(0, 2)} in a requirements file`);
    const value = token.length > 2 ? token.slice(2) : tokens[++i];
    if (value === undefined) throw new LineRefused(`${where}: ${token} needs a value`);
    out.push({ name: spec.long, value, spelling: token.length > 2 ? "attached" : "separate" });
  }
  return out;
}

/** Every logical line of one file, read as pip reads it. `name` is how messages name the file. */
export function readPipLines(text: string, name: string, env: Record<string, string | undefined>): PipLine[] {
  return logicalLines(text).map(({ lineNo, text: line }) => {
    const where = `${name}:${lineNo}`;
    const expanded = expandVariables(line, env);
    const [args, optionText] = breakArgsOptions(expanded);
    let tokens: string[] = [];
    try {
      if (optionText) tokens = shlexSplit(optionText);
    } catch {
      throw new LineRefused(`${where}: pip cannot split the options of this line (an unclosed quote?)`);
    }
    return { lineNo, text: line, args: args.trim(), options: parseOptions(tokens, where), variables: variablesOf(line) };
  });
}
