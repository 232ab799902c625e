import { contentHash } from "../../core/hashing.ts";
import { hideCredentials, hideCredentialsIn } from "./url-credentials.ts";
import type { ResolvedRequest } from "./key.ts";

/**
 * The inputs a key covers, for people: which files (with digests), which
 * variables (by name), local projects, find-links folders, the interpreter
 * that runs and the base. What `env prepare --dry-run` prints and `env show`
 * lists; it answers "why did it rebuild, or not". Never a secret in it.
 */
export function inputsReport(r: ResolvedRequest) {
  const { inputs, flags, interpreter } = r;
  return {
    files: inputs.files.map((f) => ({ path: f.path, kind: f.kind, via: f.via, digest: contentHash(JSON.stringify([f.lines, f.requirements])) })),
    specs: inputs.specs.map(hideCredentialsIn),
    variables: [...inputs.variables.entries()].map(([name, value]) => ({ name, set: value !== undefined })).sort((a, b) => (a.name < b.name ? -1 : 1)),
    locals: inputs.locals.map((l) => ({ kind: l.kind, path: l.path, digest: l.digest, ...(l.files === undefined ? {} : { files: l.files }), origin: l.origin })),
    find_links: <{ origin: string; url?: string; path?: string; digest?: string }[]>[
      ...inputs.findLinks.map((f) => ({ origin: f.origin, ...(f.url ? { url: f.shown ?? f.url } : { path: f.path, digest: f.digest }) })),
      ...flags.findLinks.map((f) => ({ origin: "--find-links", ...(f.url ? { url: hideCredentials(f.url) } : { path: f.path, digest: f.digest }) })),
      ...(r.machineFindLinks ?? []).map((f) => ({ origin: "the machine's pip configuration", path: f.path, digest: f.digest })),
    ],
    index: {
      index_url: flags.indexUrl ? hideCredentials(flags.indexUrl) : null,
      extra_index_urls: flags.extraIndexUrls.map(hideCredentials),
      in_files: inputs.indexUrlsShown.map(hideCredentials),
      machine_pip_config: r.doc.installer_config !== null,
      machine_pip_config_sources: r.machineConfig ?? [],
    },
    interpreter: { path: interpreter.path, via: r.interpreterVia, executable: interpreter.realExecutable, version: interpreter.version, platform: interpreter.platform },
    base: r.doc.base,
    // A lock is the whole input (its local packages are in locals): uv.lock with its pyproject.toml and selection, or a pylock.toml.
    ...(r.project && r.doc.project ? { lock: { kind: "uv.lock" as const, path: `${r.project.dir}/uv.lock`, digest: r.doc.project.lock, pyproject_digest: r.doc.project.pyproject, groups: r.doc.project.groups, extras: r.doc.project.extras } } : {}),
    ...(r.pylock && r.doc.pylock ? { lock: { kind: "pylock.toml" as const, path: r.pylock, digest: r.doc.pylock } } : {}),
    ...(r.conda ? { conda: { prefix: r.conda.prefix, name: r.conda.name, packages: r.conda.packages.length, meta_digest: r.conda.metaDigest } } : {}),
  };
}

export type InputsReport = ReturnType<typeof inputsReport>;

/** The report as lines for a terminal. */
export function inputsLines(report: InputsReport): string[] {
  const out: string[] = [];
  out.push(`python       ${report.interpreter.path} (${report.interpreter.version}, ${report.interpreter.platform})${report.interpreter.via ? ` via ${report.interpreter.via}` : ""}`);
  const { lock } = report;
  if (lock?.kind === "uv.lock") {
    const selection = [...lock.groups.map((g) => `--group ${g}`), ...lock.extras.map((e) => `--extra ${e}`)];
    out.push(`lock         ${lock.path} sha256:${lock.digest.slice(0, 12)}, pyproject.toml sha256:${lock.pyproject_digest.slice(0, 12)}${selection.length ? ` (${selection.join(" ")})` : ""}`);
  } else if (lock) out.push(`lock         ${lock.path} sha256:${lock.digest.slice(0, 12)}`);
  for (const s of report.specs) out.push(`spec         ${s}`);
  for (const f of report.files) out.push(`file         ${f.path} (${f.kind}${f.via === "REQ_FILE" ? "" : `, from ${f.via}`}) sha256:${f.digest.slice(0, 12)}`);
  for (const v of report.variables) out.push(`variable     \${${v.name}} ${v.set ? "(set; its value by digest)" : "(unset: left as written)"}`);
  for (const l of report.locals) out.push(`local        ${l.kind} ${l.path}${l.files === undefined ? "" : ` (${l.files} files)`} sha256:${l.digest.slice(0, 12)}`);
  const MACHINE = "the machine's pip configuration";
  for (const f of report.find_links) out.push(`find-links   ${f.url ?? `${f.path} sha256:${f.digest?.slice(0, 12)}`}${f.origin === MACHINE ? ` (from ${MACHINE})` : ""}`);
  // A lock names each package's own index: what uv sync and uv pip install read, not pip's settings.
  const index = lock ? "the lock's own (each package's source in it)" : report.index.index_url ?? (report.index.in_files.length ? `named in the requirements files: ${report.index.in_files.join(", ")}` : report.index.machine_pip_config ? "the machine's pip configuration (in the key)" : "pip's default");
  out.push(`index        ${index}${report.index.extra_index_urls.length ? ` + ${report.index.extra_index_urls.join(", ")}` : ""}`);
  for (const source of report.index.machine_pip_config_sources) out.push(`pip config   ${source}`);
  if (report.conda) out.push(`conda        ${report.conda.name ?? report.conda.prefix} (${report.conda.prefix}; ${report.conda.packages} conda packages, conda-meta sha256:${report.conda.meta_digest.slice(0, 12)})`);
  out.push(`base         sha256:${report.base.slice(0, 12)} (the interpreter's installed name==version set)`);
  return out;
}
