import { existsSync, readFileSync, statSync } from "node:fs";
import { dirname, isAbsolute, resolve } from "node:path";
import { clean as cleanVersion, validRange } from "@renovatebot/pep440";
import { UsageError } from "../errors.ts";
import { contentHash, hideCredentials, treeHash } from "./hashing.ts";

/**
 * Requirements as pip reads them (pip/_internal/req/req_file.py): `\`
 * continuations joined, comments dropped, `${VAR}` expanded, `-r`/`-c`
 * inlined, options collected. Each requirement is brought to one canonical
 * text so that reordering, case and whitespace do not change the key.
 */

export interface InstallerOptions {
  indexUrl?: string;
  extraIndexUrls: string[];
  findLinks: string[];
  noIndex: boolean;
  pre: boolean;
  preferBinary: boolean;
  noBinary: string[];
  onlyBinary: string[];
  trustedHosts: string[];
  requireHashes: boolean;
}

export interface Requirement {
  /** Canonical text: the identity that goes into the key. */
  canonical: string;
  /** What pip is given: local paths made absolute, options kept. */
  install: string;
  /** PEP 503 name when known (absent for bare paths and URLs). */
  name?: string;
  /** file:line, for messages. */
  origin: string;
}

export interface RequirementSet {
  requirements: Requirement[];
  constraints: Requirement[];
  options: InstallerOptions;
}

export function emptyOptions(): InstallerOptions {
  return { extraIndexUrls: [], findLinks: [], noIndex: false, pre: false, preferBinary: false, noBinary: [], onlyBinary: [], trustedHosts: [], requireHashes: false };
}

/** PEP 503 normalisation. */
export function normalizeName(name: string): string {
  return name.toLowerCase().replace(/[-_.]+/g, "-");
}

const NAME = /^([A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9]|[A-Za-z0-9])/;
const ENV_VAR = /\$\{([A-Z0-9_]+)\}/g; // pip expands only this form
const COMMENT = /(^|\s+)#.*$/;
const ARCHIVE = /\.(whl|tar\.gz|tgz|zip|tar\.bz2|tar)$/i;

interface ParseContext {
  env: Record<string, string | undefined>;
  cwd: string; // pip resolves local package paths against the working directory
  seen: Set<string>;
}

/** Parse a requirements file, inlining what it includes. */
export function parseRequirementsFile(path: string, ctx: Omit<ParseContext, "seen"> & { seen?: Set<string> }, into?: RequirementSet): RequirementSet {
  const set = into ?? { requirements: [], constraints: [], options: emptyOptions() };
  const abs = resolve(ctx.cwd, path);
  if (!existsSync(abs) || !statSync(abs).isFile()) throw new UsageError(`requirements file not found: ${path}`);
  const seen = ctx.seen ?? new Set<string>();
  if (seen.has(abs)) throw new UsageError(`requirements file includes itself: ${path}`);
  seen.add(abs);
  parseLines(readFileSync(abs, "utf8"), abs, { ...ctx, seen }, set, "requirements");
  seen.delete(abs);
  return set;
}

/** Parse specs given on the command line (`-p SPEC`) or as a list in a job file. */
export function parseSpecs(specs: string[], ctx: Omit<ParseContext, "seen">, into?: RequirementSet, origin = "-p"): RequirementSet {
  const set = into ?? { requirements: [], constraints: [], options: emptyOptions() };
  specs.forEach((spec, i) => {
    if (!spec.trim()) throw new UsageError(`${origin}: empty requirement`);
    const req = parseRequirementLine(spec.trim(), `${origin}[${i}]`, ctx.cwd);
    set.requirements.push(req);
  });
  return set;
}

/** pip's join_lines: `\` continues a line (joined with nothing between), a line that starts with a comment ends one. */
function logicalLines(text: string): { line: string; lineNo: number }[] {
  const out: { line: string; lineNo: number }[] = [];
  let parts: string[] = [];
  let start = 0;
  text.split(/\r\n|\n|\r/).forEach((line, i) => {
    const startsWithComment = /^\s*#/.test(line);
    if (!line.endsWith("\\") || startsWithComment) {
      // pip puts a space before a comment line so that it is dropped with the comments later.
      const piece = startsWithComment ? ` ${line}` : line;
      if (parts.length) {
        out.push({ line: parts.join("") + piece, lineNo: start });
        parts = [];
      } else out.push({ line: piece, lineNo: i + 1 });
      return;
    }
    if (!parts.length) start = i + 1;
    parts.push(line.replace(/^\\+|\\+$/g, ""));
  });
  if (parts.length) out.push({ line: parts.join(""), lineNo: start });
  return out;
}

function parseLines(text: string, file: string, ctx: ParseContext, set: RequirementSet, kind: "requirements" | "constraints"): void {
  for (const { line: rawLine, lineNo } of logicalLines(text)) {
    const origin = `${file}:${lineNo}`;
    const line = rawLine.replace(COMMENT, "").replace(ENV_VAR, (whole, name: string) => ctx.env[name] ?? whole).trim();
    if (!line) continue;
    if (line.startsWith("-")) {
      parseOptionLine(line, origin, file, ctx, set, kind);
      continue;
    }
    const req = parseRequirementLine(line, origin, ctx.cwd);
    (kind === "constraints" ? set.constraints : set.requirements).push(req);
  }
}

function splitOption(line: string): [string, string] {
  const m = /^(--?[A-Za-z-]+)(?:[=\s]\s*(.*))?$/.exec(line);
  if (!m) return [line, ""];
  return [m[1]!, (m[2] ?? "").trim()];
}

function parseOptionLine(line: string, origin: string, file: string, ctx: ParseContext, set: RequirementSet, kind: "requirements" | "constraints"): void {
  const [flag, value] = splitOption(line);
  const need = () => {
    if (!value) throw new UsageError(`${origin}: ${flag} needs a value`);
    return value;
  };
  const o = set.options;
  switch (flag) {
    case "-r":
    case "--requirement":
    case "-c":
    case "--constraint": {
      const target = resolve(dirname(file), need());
      if (!existsSync(target)) throw new UsageError(`${origin}: file not found: ${value}`);
      const nestedKind = flag === "-c" || flag === "--constraint" || kind === "constraints" ? "constraints" : "requirements";
      if (ctx.seen.has(target)) throw new UsageError(`${origin}: ${value} includes itself`);
      ctx.seen.add(target);
      parseLines(readFileSync(target, "utf8"), target, ctx, set, nestedKind);
      ctx.seen.delete(target);
      return;
    }
    case "-e":
    case "--editable": {
      const target = need();
      const isPath = !/^[a-z+]+:\/\//i.test(target);
      const abs = isPath ? resolve(ctx.cwd, target) : target;
      if (isPath && !existsSync(abs)) throw new UsageError(`${origin}: editable path not found: ${target}`);
      const identity = isPath ? `${abs}#${projectFilesHash(abs)}` : hideCredentials(target);
      set.requirements.push({ canonical: `-e ${identity}`, install: `-e ${abs}`, origin });
      return;
    }
    case "-i":
    case "--index-url":
      o.indexUrl = need();
      return;
    case "--extra-index-url":
      o.extraIndexUrls.push(need());
      return;
    case "-f":
    case "--find-links":
      o.findLinks.push(/^[a-z+]+:\/\//i.test(need()) ? value : resolve(dirname(file), value));
      return;
    case "--no-index":
      o.noIndex = true;
      return;
    case "--pre":
      o.pre = true;
      return;
    case "--prefer-binary":
      o.preferBinary = true;
      return;
    case "--no-binary":
      o.noBinary.push(need());
      return;
    case "--only-binary":
      o.onlyBinary.push(need());
      return;
    case "--trusted-host":
      o.trustedHosts.push(need());
      return;
    case "--require-hashes":
      o.requireHashes = true;
      return;
    case "--use-feature":
      return; // changes pip's behaviour, not what is installed
    default:
      throw new UsageError(`${origin}: unsupported option ${flag}`);
  }
}

/** Split `spec --hash=... --config-settings=...` into the spec and its per-requirement options. */
function splitPerRequirementOptions(line: string, origin: string): { spec: string; options: string[] } {
  const idx = line.search(/\s--?[a-z]/i);
  if (idx === -1) return { spec: line, options: [] };
  const spec = line.slice(0, idx).trim();
  const options = line.slice(idx).trim().split(/\s+(?=--)/).map((o) => o.trim().replace(/\s+/, "="));
  for (const opt of options) {
    if (!/^--(hash|config-settings|global-option)=\S+$/.test(opt)) throw new UsageError(`${origin}: unsupported option on a requirement: ${opt}`);
  }
  return { spec, options: options.sort() };
}

const URL = /^[a-z][a-z0-9+.-]*:\/\//i;
/** `name @ url` or `name[extra] @ url`: a named URL requirement, never a path. */
const NAMED_URL = /^[A-Za-z0-9][A-Za-z0-9._-]*\s*(\[[^\]]*\])?\s*@/;

function looksLikePath(spec: string): boolean {
  if (NAMED_URL.test(spec)) return false;
  return /^(\.{1,2}\/|\/|~|file:)/.test(spec) || ARCHIVE.test(spec.split(/\s*;/)[0]!);
}

export function parseRequirementLine(line: string, origin: string, cwd: string): Requirement {
  const { spec, options } = splitPerRequirementOptions(line, origin);
  const suffix = options.length ? ` ${options.join(" ")}` : "";
  if (URL.test(spec) && !/^file:/i.test(spec)) {
    // A bare URL to an archive or a VCS checkout: its text is its identity, credentials hashed.
    const [url, marker] = spec.split(/\s+;\s*/, 2) as [string, string | undefined];
    const markerText = marker ? `; ${canonicalMarker(marker)}` : "";
    return { canonical: `${hideCredentials(url)}${markerText}${suffix}`, install: `${url}${marker ? ` ; ${marker}` : ""}${suffix}`, origin };
  }
  if (looksLikePath(spec)) {
    const [pathPart, marker] = spec.split(/\s+;\s*/, 2) as [string, string | undefined];
    const raw = pathPart.replace(/^file:(\/\/)?/, "");
    const abs = isAbsolute(raw) ? raw : resolve(cwd, raw);
    if (!existsSync(abs)) throw new UsageError(`${origin}: local package not found: ${pathPart}`);
    const markerText = marker ? `; ${canonicalMarker(marker)}` : "";
    const identity = statSync(abs).isDirectory() ? treeHash(abs) : contentHash(readFileSync(abs));
    // The key holds the content, not the path: the same wheel anywhere is the same request.
    return { canonical: `file#sha256=${identity}${markerText}${suffix}`, install: `${abs}${marker ? ` ; ${marker}` : ""}${suffix}`, origin };
  }
  const m = NAME.exec(spec);
  if (!m) throw new UsageError(`${origin}: invalid requirement: ${line}`);
  const name = normalizeName(m[0]);
  let rest = spec.slice(m[0].length).trim();
  let extras: string[] = [];
  if (rest.startsWith("[")) {
    const close = rest.indexOf("]");
    if (close === -1) throw new UsageError(`${origin}: invalid requirement (unclosed extras): ${line}`);
    extras = rest.slice(1, close).split(",").map((e) => e.trim()).filter(Boolean);
    for (const e of extras) if (!NAME.test(e) || NAME.exec(e)![0] !== e) throw new UsageError(`${origin}: invalid extra '${e}' in: ${line}`);
    extras = [...new Set(extras.map(normalizeName))].sort();
    rest = rest.slice(close + 1).trim();
  }
  let marker = "";
  let url = "";
  let specifier = "";
  if (rest.startsWith("@")) {
    const afterAt = rest.slice(1).trim();
    const sp = afterAt.split(/\s+;\s*/, 2);
    url = sp[0]!;
    marker = sp[1] ?? "";
    if (!/^[a-z+]+:\/\/\S+$/i.test(url) && !url.startsWith("file:")) throw new UsageError(`${origin}: invalid URL in requirement: ${line}`);
  } else {
    const semi = rest.indexOf(";");
    specifier = (semi === -1 ? rest : rest.slice(0, semi)).trim();
    marker = semi === -1 ? "" : rest.slice(semi + 1).trim();
    if (specifier.startsWith("(") && specifier.endsWith(")")) specifier = specifier.slice(1, -1).trim();
    if (specifier) specifier = canonicalSpecifier(specifier, origin, line);
  }
  if (rest.includes(";") && !marker) throw new UsageError(`${origin}: empty environment marker in: ${line}`);
  const extrasText = extras.length ? `[${extras.join(",")}]` : "";
  const markerText = marker ? `; ${canonicalMarker(marker)}` : "";
  const body = url ? `${name}${extrasText} @ ${url}` : `${name}${extrasText}${specifier}`;
  const identity = url ? `${name}${extrasText} @ ${hideCredentials(url)}` : body;
  return { canonical: `${identity}${markerText}${suffix}`, install: `${body}${marker ? ` ; ${marker}` : ""}${suffix}`, name, origin };
}

const CLAUSE = /^(~=|===|==|!=|<=|>=|<|>)\s*(\S+)$/;

function canonicalSpecifier(specifier: string, origin: string, line: string): string {
  const clauses = specifier.split(",").map((c) => c.trim());
  const out: string[] = [];
  for (const clause of clauses) {
    const m = CLAUSE.exec(clause);
    if (!m) throw new UsageError(`${origin}: invalid requirement: ${line}`);
    const [, op, version] = m as unknown as [string, string, string];
    const normalized = version.endsWith(".*") || op === "===" ? version : cleanVersion(version);
    if (!normalized || (op !== "===" && !validRange(`${op}${version}`))) throw new UsageError(`${origin}: invalid version '${version}' in: ${line}`);
    out.push(`${op}${normalized}`);
  }
  return [...new Set(out)].sort().join(",");
}

/** Markers in one spelling: single spaces, double quotes. */
function canonicalMarker(marker: string): string {
  return marker.replace(/'/g, '"').replace(/\s+/g, " ").replace(/\s*(==|!=|<=|>=|<|>|~=)\s*/g, " $1 ").trim();
}

/** A local project's identity: its build files, so an edit to them changes the key. */
function projectFilesHash(dir: string): string {
  const parts: string[] = [];
  for (const f of ["pyproject.toml", "setup.py", "setup.cfg"]) {
    const p = resolve(dir, f);
    if (existsSync(p)) parts.push(`${f}:${contentHash(readFileSync(p))}`);
  }
  return contentHash(parts.join("\n"));
}
