import { existsSync, realpathSync, statSync } from "node:fs";
import { readRequirementsText } from "./requirements-file.ts";
import { dirname, isAbsolute, join, relative, resolve } from "node:path";
import { quote as shlexQuote } from "shlex";
import { UsageError } from "../../errors.ts";
import { fileDigest, findLinksDigest, type OnHashing } from "./content-digest.ts";
import { treeDigest } from "./tree-digest.ts";
import { canonicalPlainRequirement, normalizeName } from "./canonical.ts";
import { contentHash } from "../../core/hashing.ts";
import { hideCredentials, hideCredentialsIn, redactUrl, unexpandVariables } from "./url-credentials.ts";
import { type FileOption, LineRefused, PIP_FILE_OPTIONS, type PipLine, readPipLines } from "./pip-lines.ts";

/**
 * What a request makes the installer read, found by reading the user's files
 * as pip reads them (pip-lines.ts): every requirements and constraints file,
 * every `${VAR}`, every local project, archive and find-links folder. The
 * installer is handed the user's own files, unchanged; this only tells the
 * key what they reach.
 */


export interface RequestFile {
  path: string;
  kind: "requirements" | "constraints";
  /** `REQ_FILE`, or the file and line that included it. */
  via: string;
  /** In the key: option lines as written (credentials hidden), plain requirements canonical and sorted. */
  lines: string[];
  requirements: string[];
}

export interface LocalInput {
  kind: "project" | "editable" | "archive";
  path: string;
  digest: string;
  origin: string;
  files?: number;
}

export interface FindLinksInput {
  origin: string;
  /** A URL (credentials hidden, `${VAR}`s expanded: for the installer), or a local folder read by content. */
  url?: string;
  /** The URL as stored and shown: credentials hidden, `${VAR}`s by name. */
  shown?: string;
  path?: string;
  digest?: string;
}

/** One requirement line, as the fast path's checks need it; `install` may hold an expanded secret: never stored. */
export interface Requirement {
  origin: string;
  install: string;
  name?: string;
  /** The `${VAR}`s on its line with their values: put back by name wherever the installer recorded the line (direct-url.ts). */
  variables?: [string, string | undefined][];
}

/**
 * The request as pip reads it, whatever file or `-p` each line came from:
 * pip gathers every file's requirements into one set, its constraints into
 * another, and applies option lines wherever they are. What the key holds.
 */
export interface PipReading {
  /** Plain requirements, canonical and sorted (their order does not change pip's result). */
  requirements: string[];
  constraints: string[];
  /** Everything else, in pip's reading order: `r:`/`c:` lines that are not plain, `o:` options one by one. */
  lines: string[];
}

export interface RequestInputs {
  topFile?: string;
  specs: string[];
  /** How messages name the specs (`-p`, or a job file's key), for the installers' findings too. */
  specOrigin?: string;
  specLines: { lines: string[]; requirements: string[] };
  files: RequestFile[];
  /** `${VAR}` names pip would read, with their values (never stored; the key holds digests). */
  variables: Map<string, string | undefined>;
  locals: LocalInput[];
  findLinks: FindLinksInput[];
  requirements: Requirement[];
  /** Index URLs and options the files set (expanded), for reachability checks and isolation. */
  indexUrls: string[];
  /** The same as stored and shown: `${VAR}`s by name (credentials are hidden where they are shown). */
  indexUrlsShown: string[];
  noIndex: boolean;
  optionsSeen: Set<string>;
  /** Why uv might read these files otherwise than pip does; null when it reads them alike. */
  uvDiffers: string | null;
  reading: PipReading;
  /** Requirements files pip reads as requirements although a constraints file names them (`-r` in a `-c` file): uv is told to read them as such too. */
  requirementsUnderConstraints: string[];
}

export interface ScanContext {
  env: Record<string, string | undefined>;
  /** pip resolves local package paths against the working directory. */
  cwd: string;
  digestCache: string | null;
  /** A remote job's bundle: every file, project and folder the request reaches must be inside it (links resolved), or it is refused before it is read. */
  confine?: string;
  /** Told before a big local file is hashed for the key (content-digest.ts). */
  onHashing?: OnHashing;
}

/** Characters Python splits lines on, or that no requirement holds: in a -p spec, they would smuggle lines into what pip reads. */
const SPEC_FORBIDDEN = /[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]/;

const ARCHIVE = /\.(whl|tar\.gz|tgz|tar|zip|tar\.bz2|tbz|tar\.xz|txz|tlz|tar\.lz|tar\.lzma)$/i;
const SCHEME = /^[a-z][a-z0-9+.-]*:/i;
const NAME_AT_URL = /^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*@\s*(\S+)/;
const PER_REQUIREMENT = new Set(PIP_FILE_OPTIONS.filter((o) => o.perRequirement).map((o) => o.long));
const UV_SAFE_OPTIONS = new Set(["--requirement", "--constraint", "--editable", "--index-url", "--extra-index-url", "--find-links", "--no-index"]);

/** A local path for a path or file: URL (its #fragment dropped), or null for another scheme's URL. */
export function localPathOf(target: string): string | null {
  if (/^file:/i.test(target)) {
    try {
      // node:url loaded here, for file: URLs only: its start-up would cost every warm prepare.
      const { fileURLToPath } = require("node:url") as typeof import("node:url");
      return fileURLToPath(target.split("#", 1)[0]!.replace(/^file:(?!\/\/)/i, "file://"));
    } catch {
      return null;
    }
  }
  return SCHEME.test(target) ? null : target;
}

class Scanner {
  readonly inputs: RequestInputs;
  private readonly open = new Set<string>();
  /** Inside a requirements file that a constraints file includes: uv reads it as constraints too (requestFiles adds it as requirements). */
  private underConstraints = 0;

  constructor(private readonly ctx: ScanContext) {
    this.inputs = { specs: [], specLines: { lines: [], requirements: [] }, files: [], variables: new Map(), locals: [], findLinks: [], requirements: [], indexUrls: [], indexUrlsShown: [], noIndex: false, optionsSeen: new Set(), uvDiffers: null, reading: { requirements: [], constraints: [], lines: [] }, requirementsUnderConstraints: [] };
  }

  /** pip's reading of one text; what it refuses is the user's to fix. */
  private read(text: string, name: string): PipLine[] {
    try {
      return readPipLines(text, name, this.ctx.env);
    } catch (error) {
      if (error instanceof LineRefused) throw new UsageError(error.message);
      throw error;
    }
  }

  private uvDiffers(reason: string) {
    this.inputs.uvDiffers ??= reason;
  }

  private noteVariables(line: PipLine) {
    for (const name of line.variables) this.inputs.variables.set(name, this.ctx.env[name] || undefined);
    if (line.variables.length) this.uvDiffers("${VAR} in a requirement is expanded by uv's own rules");
  }

  private inside(abs: string, origin: string, what: string): void {
    if (this.ctx.confine) confineTo(this.ctx.confine, abs, origin, what);
  }

  file(path: string, kind: RequestFile["kind"], via: string, shown: string): void {
    const abs = resolve(this.ctx.cwd, path);
    this.inside(abs, via, kind === "constraints" ? "the constraints file" : "the requirements file");
    let real = abs;
    try {
      real = realpathSync(abs);
    } catch {
      // reported by the read below
    }
    if (this.open.has(real)) throw new UsageError(`${via}: ${shown} includes itself`);
    let text: string;
    try {
      text = readRequirementsText(abs, shown);
    } catch (error) {
      // A file reached by -r/-c: the line that named it comes first, as for every other problem in a file.
      if (error instanceof UsageError && via !== "REQ_FILE") throw new UsageError(`${via}: ${error.message}`);
      throw error;
    }
    this.open.add(real);
    const entry: RequestFile = { path: abs, kind, via, lines: [], requirements: [] };
    this.inputs.files.push(entry);
    for (const line of this.read(text, shown)) this.line(line, `${shown}:${line.lineNo}`, entry, abs);
    entry.requirements.sort();
    this.open.delete(real);
  }

  /** A line's own `${VAR}`s with their values. */
  private lineVariables(line: PipLine): [string, string | undefined][] {
    return line.variables.map((name) => [name, this.inputs.variables.get(name)]);
  }

  private line(line: PipLine, origin: string, into: { lines: string[]; requirements: string[] }, file: string | null): void {
    this.noteVariables(line);
    const kind = into === this.inputs.specLines ? "requirements" : (into as RequestFile).kind;
    const fileDir = file ? dirname(file) : this.ctx.cwd;
    for (const o of line.options) {
      this.inputs.optionsSeen.add(o.name);
      if (!UV_SAFE_OPTIONS.has(o.name)) this.uvDiffers(`${origin}: ${o.name} is left to pip`);
      if (o.spelling === "attached") this.uvDiffers(`${origin}: uv does not read the attached spelling of ${o.name}`);
    }
    if (/["'\\]/.test(line.text.slice(line.args.length))) this.uvDiffers(`${origin}: quoted option values are left to pip`);
    const editable = line.args ? undefined : line.options.find((o) => o.name === "--editable");
    if (line.args || editable) {
      const plain = line.args && !line.options.length && !line.variables.length ? canonicalPlainRequirement(line.args) : null;
      if (plain) into.requirements.push(plain);
      else into.lines.push(hideCredentialsIn(line.text));
      // pip takes only the per-requirement options of a requirement line and ignores the rest; uv may not.
      const ignored = line.options.filter((o) => o !== editable && !PER_REQUIREMENT.has(o.name));
      if (ignored.length) this.uvDiffers(`${origin}: pip ignores ${ignored[0]!.name} on a requirement line`);
      this.readAs(kind, plain ?? this.requirementKeyLine(line, editable));
      refuseAsPip(line, kind, origin, editable);
      if (this.underConstraints && !plain) this.uvDiffers(`${origin}: a requirement other than a name and versions, in a file a constraints file includes, is left to pip (uv reads that file as constraints too)`);
      if (kind === "requirements") this.requirement(line, origin, editable?.value, file);
      else if (editable) this.requirement(line, origin, editable.value, file);
      return;
    }
    into.lines.push(hideCredentialsIn(line.text));
    const nested = line.options.filter((o) => o.name === "--requirement" || o.name === "--constraint");
    // A -r/-c line is read for its file alone: pip ignores its other options, uv may not.
    if (nested.length && line.options.length > nested.length) this.uvDiffers(`${origin}: pip ignores the other options of a ${nested[0]!.name} line`);
    if (!nested.length) {
      if (line.variables.length) this.inputs.reading.lines.push(`o:${hideCredentialsIn(line.text)}`);
      else for (const o of line.options) this.inputs.reading.lines.push(`o:${o.name}${o.value === undefined ? "" : `=${hideCredentials(o.value)}`}`);
    }
    const links = line.options.filter((o) => o.name === "--find-links");
    if (nested.length > 1) throw new UsageError(`${origin}: pip reads only the first -r/-c of a line; put each on its own line`);
    if (links.length > 1) throw new UsageError(`${origin}: pip uses only the first --find-links of a line; put each on its own line`);
    for (const o of line.options) {
      if (o.name === "--index-url" || o.name === "--extra-index-url") {
        this.inputs.indexUrls.push(o.value!);
        this.inputs.indexUrlsShown.push(unexpandVariables(o.value!, this.lineVariables(line)));
      }
      if (o.name === "--no-index") this.inputs.noIndex = true;
    }
    // pip takes `sub.txt#x` as that file's name (a comment needs a space before its #); uv cuts the name at the #.
    if ([...nested, ...links].some((o) => o.value?.includes("#"))) this.uvDiffers(`${origin}: a path holding '#' is left to pip (uv reads it only up to the '#')`);
    if (links[0]) this.findLinks(links[0].value!, origin, fileDir, this.lineVariables(line));
    if (nested[0]) {
      const target = nested[0].value!;
      if (!target) throw new UsageError(`${origin}: ${nested[0].name} needs a value`);
      const local = localPathOf(target);
      if (local === null) throw new UsageError(`${origin}: ${redactUrl(target)} is a remote file, which gpulayer cannot key by content; download it and name the copy`);
      const nestedKind = nested[0].name === "--requirement" ? "requirements" : "constraints";
      const nestedPath = isAbsolute(local) ? local : join(fileDir, local);
      // pip: a -r reads requirements wherever it is; uv reads what a constraints file includes as constraints.
      const underConstraints = nestedKind === "requirements" && kind === "constraints";
      if (underConstraints) {
        const abs = resolve(this.ctx.cwd, nestedPath);
        this.inputs.requirementsUnderConstraints.push(abs);
        if (shlexQuote(abs) !== abs) this.uvDiffers(`${origin}: a requirements file in a constraints file, whose path needs quoting, is left to pip`);
      }
      this.underConstraints += underConstraints ? 1 : 0;
      try {
        this.file(nestedPath, nestedKind, origin, local);
      } finally {
        this.underConstraints -= underConstraints ? 1 : 0;
      }
    }
  }

  private readAs(kind: RequestFile["kind"], plainOrLine: string | { line: string }): void {
    const r = this.inputs.reading;
    if (typeof plainOrLine === "string") (kind === "requirements" ? r.requirements : r.constraints).push(plainOrLine);
    else r.lines.push(`${kind === "requirements" ? "r" : "c"}:${plainOrLine.line}`);
  }

  /** A requirement line that is not plain, in one spelling where pip reads spellings alike: options by their long names, hashes as a set, a local editable by its place. */
  private requirementKeyLine(line: PipLine, editable: FileOption | undefined): { line: string } {
    if (line.variables.length) return { line: hideCredentialsIn(line.text) };
    const options = line.options.filter((o) => PER_REQUIREMENT.has(o.name));
    const hashes = options.filter((o) => o.name === "--hash").map((o) => `--hash=${o.value}`).sort();
    const others = options.filter((o) => o.name !== "--hash").map((o) => `${o.name}=${o.value}`);
    let head: string;
    if (editable) {
      const [, target, extras] = /^(.*?)(\[[^\]]*\])?$/.exec(editable.value!)!;
      const local = localPathOf(target!);
      head = `--editable=${local === null ? hideCredentialsIn(editable.value!) : `${resolve(this.ctx.cwd, local)}${extras ?? ""}`}`;
    } else head = canonicalPlainRequirement(line.args) ?? hideCredentialsIn(line.args);
    return { line: [head, ...others, ...hashes].join(" ") };
  }

  findLinks(value: string, origin: string, fileDir: string | null, variables: [string, string | undefined][] = []): void {
    const local = localPathOf(value);
    if (local === null) {
      this.inputs.findLinks.push({ origin, url: hideCredentials(value), shown: hideCredentials(unexpandVariables(value, variables)) });
      return;
    }
    // pip: relative to the requirements file when it exists there, else as given (the working directory).
    const nearFile = fileDir ? join(fileDir, local) : null;
    const path = nearFile && !isAbsolute(local) && existsSync(nearFile) ? nearFile : resolve(this.ctx.cwd, local);
    this.inside(path, origin, "the find-links location");
    if (fileDir && !isAbsolute(local) && resolve(fileDir) !== resolve(this.ctx.cwd)) this.uvDiffers(`${origin}: a relative --find-links outside the working directory is left to pip`);
    this.inputs.findLinks.push({ origin, path, digest: findLinksDigest(path, this.ctx.digestCache, this.ctx.onHashing) });
  }

  private requirement(line: PipLine, origin: string, editableTarget: string | undefined, file: string | null): void {
    const variables = this.lineVariables(line);
    const push = (r: Requirement) => this.inputs.requirements.push(variables.length ? { ...r, variables } : r);
    if (file && resolve(dirname(file)) !== resolve(this.ctx.cwd) && /(^|[\s@=])\.{1,2}\//.test(line.args || editableTarget || "")) this.uvDiffers(`${origin}: a relative path in a file outside the working directory is left to pip`);
    if (editableTarget !== undefined) {
      const target = editableTarget.replace(/\[[^\]]+\]$/, "");
      const local = localPathOf(target);
      push({ origin, install: `-e ${editableTarget}` });
      if (local === null) return; // a VCS URL: its text is its identity
      const path = resolve(this.ctx.cwd, local);
      this.inside(path, origin, "the editable project");
      if (!existsSync(path) || !statSync(path).isDirectory()) throw new UsageError(`${origin}: editable project not found: ${local}${local !== path ? ` (looked for ${path})` : ""}`);
      const tree = treeDigest(realpathSync(path), { editable: true, cacheDir: this.ctx.digestCache, onHashing: this.ctx.onHashing });
      this.inputs.locals.push({ kind: "editable", path, digest: tree.digest, origin, files: tree.files });
      return;
    }
    const args = line.args;
    const named = NAME_AT_URL.exec(args);
    if (named) {
      push({ origin, install: args, name: normalizeName(named[1]!) });
      const local = localPathOf(named[3]!.replace(/;$/, ""));
      if (local !== null && /^file:/i.test(named[3]!)) this.local(local, origin);
      return;
    }
    const isUrl = SCHEME.test(args) && !/^[A-Za-z0-9._-]+\s*[<>=!~;[(]/.test(args);
    const spec = (isUrl ? args.split("; ", 1)[0]! : args.split(";", 1)[0]!).trim();
    if (isUrl) {
      push({ origin, install: args });
      const local = localPathOf(spec);
      if (local !== null) this.local(local, origin);
      return;
    }
    const path = spec.replace(/\[[^\]]+\]$/, "");
    const looksLikePath = path.includes("/") || path.startsWith(".");
    if (looksLikePath || (ARCHIVE.test(path) && existsSync(resolve(this.ctx.cwd, path)))) {
      push({ origin, install: args });
      this.local(path, origin);
      return;
    }
    const name = /^[A-Za-z0-9][A-Za-z0-9._-]*/.exec(args)?.[0];
    push({ origin, install: args, name: name ? normalizeName(name) : undefined });
  }

  private local(path: string, origin: string): void {
    const abs = resolve(this.ctx.cwd, path);
    this.inside(abs, origin, "the local package");
    let st: ReturnType<typeof statSync>;
    try {
      st = statSync(abs);
    } catch {
      throw new UsageError(`${origin}: local package not found: ${path}${path !== abs ? ` (looked for ${abs})` : ""}`);
    }
    if (st.isDirectory()) {
      const tree = treeDigest(realpathSync(abs), { editable: false, cacheDir: this.ctx.digestCache, onHashing: this.ctx.onHashing });
      this.inputs.locals.push({ kind: "project", path: abs, digest: tree.digest, origin, files: tree.files });
    } else this.inputs.locals.push({ kind: "archive", path: abs, digest: fileDigest(abs, this.ctx.digestCache, this.ctx.onHashing), origin });
  }

  specs(specs: string[], originPrefix: string): void {
    specs.forEach((spec, i) => {
      const origin = `${originPrefix}[${i}]`;
      const bad = SPEC_FORBIDDEN.exec(spec);
      if (bad) throw new UsageError(`${origin}: a requirement holds a control character or line break (U+${bad[0].charCodeAt(0).toString(16).padStart(4, "0").toUpperCase()})`);
      const text = spec.trim();
      if (!text) throw new UsageError(`${origin}: empty requirement`);
      if (text.startsWith("-")) throw new UsageError(`${origin}: '${text.split(/\s/, 1)[0]}' is an option, not a requirement; options go in a requirements file`);
      if (text.endsWith("\\") || /(^|\s)#/.test(text)) throw new UsageError(`${origin}: a requirement may not end with \\ or hold a comment`);
      for (const line of this.read(text, origin)) {
        if (line.options.some((o) => !["--hash", "--config-settings", "--global-option"].includes(o.name))) throw new UsageError(`${origin}: only --hash, --config-settings and --global-option may follow a requirement`);
        this.line(line, origin, this.inputs.specLines, null);
      }
      this.inputs.specs.push(text);
    });
    this.inputs.specLines.requirements.sort();
  }
}

const NAMED = /^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?\s*(\[[^\]]*\])?\s*\(?([^;@()]*)\)?\s*(;.*)?$/s;

/**
 * What pip refuses and uv would read: refused here, in pip's words, for
 * either installer. Each rule is one pip holds in every version (packaging's
 * grammar; pip's check of constraints), and the differential suite holds it
 * against pip's parser and resolver.
 */
function refuseAsPip(line: PipLine, kind: RequestFile["kind"], origin: string, editable: FileOption | undefined): void {
  if (kind === "constraints") {
    if (editable) throw new UsageError(`${origin}: Editable requirements are not allowed as constraints (pip refuses them: make it a requirement)`);
    const extras = NAME_AT_URL.exec(line.args)?.[2] ?? NAMED.exec(line.args)?.[1];
    if (extras?.replace(/[[\]\s,]/g, "")) throw new UsageError(`${origin}: Constraints cannot have extras (pip refuses them: constrain ${line.args.split("[", 1)[0]!.trim()} without them)`);
  }
  const named = NAME_AT_URL.test(line.args) ? null : NAMED.exec(line.args);
  if (!named) return;
  // pip splits options from a requirement at spaces only: after a tab, `--hash=...` is read as part of the requirement.
  if (/[^\S ]-/.test(line.args)) throw new UsageError(`${origin}: Invalid requirement: '${line.args.replace(/\t/g, "\\t")}' (pip separates options from a requirement with a space, not a tab)`);
  if ((named[2] ?? "").includes(",") && named[2]!.split(",").some((c) => !c.trim())) throw new UsageError(`${origin}: Invalid requirement: '${line.args}' (pip takes no empty version clause: a trailing or doubled comma)`);
}

/** Under `root` (a remote job's bundle), links resolved, or a refusal naming where it came from: nothing outside is read, quoted or installed. */
export function confineTo(root: string, abs: string, origin: string, what: string): void {
  let real = abs;
  try {
    real = realpathSync(abs);
  } catch {
    // not there: judged by its path; the read or the lookup says it is missing
  }
  const rootReal = existsSync(root) ? realpathSync(root) : resolve(root);
  const rel = relative(rootReal, real);
  if (rel === ".." || rel.startsWith("../") || isAbsolute(rel)) throw new UsageError(`${origin}: ${what} ${abs} is outside the job's bundle; a remote job reads only what it brought`);
}

/** Everything a request makes the installer read. */
export function scanRequest(source: { requirementsFile?: string; specs: string[]; specOrigin?: string }, ctx: ScanContext): RequestInputs {
  const scanner = new Scanner(ctx);
  if (source.specs.length) scanner.specs(source.specs, source.specOrigin ?? "-p");
  if (source.specOrigin) scanner.inputs.specOrigin = source.specOrigin;
  if (source.requirementsFile) {
    // Named in messages as the user would: relative to where they are, when it is under it.
    const shown = relative(ctx.cwd, resolve(ctx.cwd, source.requirementsFile));
    scanner.file(source.requirementsFile, "requirements", "REQ_FILE", shown && !shown.startsWith("..") && !isAbsolute(shown) ? shown : source.requirementsFile);
    scanner.inputs.topFile = resolve(ctx.cwd, source.requirementsFile);
    if (source.specs.length && shlexQuote(scanner.inputs.topFile) !== scanner.inputs.topFile) scanner.inputs.uvDiffers ??= "a requirements file whose path needs quoting is left to pip";
  }
  const r = scanner.inputs.reading;
  r.requirements.sort();
  r.constraints.sort();
  // Options first, each kind in the order pip met it (a later --index-url wins; --no-binary and --only-binary undo each other); lines after, in order.
  const group = (l: string) => (/^o:--(no|only)-binary/.test(l) ? "o:binary" : l.split("=", 1)[0]!);
  const options = r.lines.filter((l) => l.startsWith("o:"));
  const order = [...new Set(options.map(group))].sort();
  r.lines = [...order.flatMap((g) => options.filter((l) => group(l) === g)), ...r.lines.filter((l) => !l.startsWith("o:"))];
  return scanner.inputs;
}

/** `${VAR}` values by digest only: a change is a new env, the value is never stored. */
export function variableDigests(vars: Map<string, string | undefined>): Record<string, string | null> {
  const out: Record<string, string | null> = {};
  for (const name of [...vars.keys()].sort()) {
    const value = vars.get(name);
    out[name] = value === undefined ? null : contentHash(`var\0${name}\0${value}`);
  }
  return out;
}
