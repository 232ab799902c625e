import { readFileSync, type Stats } from "node:fs";
import { join } from "node:path";

/**
 * What a project's build configuration says the build reads, beyond what it
 * installs: the modules it names (for an editable project, whose live link
 * serves the others), and whether its setup.py may read any file at all.
 * Read conservatively: a name too many costs a rebuild, a name missed a stale env.
 */

export interface BuildReads {
  /** Modules the build reads (setuptools' `attr:`, hatch's version `path`, a `*.py` a setup.py opens or imports), by path relative to the project. */
  modules: Set<string>;
  /** A setup.py that computes a path may read any file: then every file of the project counts, whatever .gitignore says. */
  wholeProject: boolean;
}

/** The files a project's build configuration is read from. */
const BUILD_CONFIG_FILES = ["pyproject.toml", "setup.cfg", "setup.py"];

/**
 * What makes a setup.py read files the key cannot name from its text: a path joined from parts, a path made from its
 * own location, a listing, an open() of anything but a plain string, a changed import path, data_files. Any one of
 * them is enough, comments and `"".join` included: a whole-project key costs rebuilds, a missed read a stale env.
 */
const COMPUTES_PATHS = [
  /\bjoin\s*\(/,
  /\bpathlib\b|\b(?:Pure|Posix|Windows)*Path\s*\(/,
  /\b__file__\b/,
  /\b(?:glob|iglob|listdir|scandir|walk|find_namespace_packages|read_text|read_bytes|run_path|import_module|__import__|execfile|chdir)\b/,
  /\bopen\s*\(\s*(?![rRbBuU]{0,2}(["'])[^"'\\\n]*\1\s*[,)])/,
  /\bsys\.path\b/,
  /\bdata_files\b/,
];

export function buildReads(root: string, see: (relPath: string) => Stats | null): BuildReads {
  const modules = new Set<string>();
  let wholeProject = false;
  for (const file of BUILD_CONFIG_FILES) {
    if (!see(file)?.isFile()) continue; // a FIFO would block the read
    let text: string;
    try {
      text = readFileSync(join(root, file), "utf8");
    } catch {
      // unreadable: a setup.py that cannot be read cannot be vouched for
      if (file === "setup.py") wholeProject = true;
      continue;
    }
    for (const m of text.matchAll(/\battr\s*[:=]\s*["']?([A-Za-z_][\w.]*)/g)) addModule(modules, m[1]!.split(".").slice(0, -1));
    for (const m of text.matchAll(/["']([^"'\s]+\.py)["']/g)) modules.add(m[1]!.replace(/^\.\//, ""));
    if (file !== "setup.py") continue;
    if (COMPUTES_PATHS.some((pattern) => pattern.test(text))) wholeProject = true;
    // `from localpkg.meta import VERSION`: the build runs the module, wherever the live link serves it from.
    for (const m of text.matchAll(/^[ \t]*from[ \t]+([A-Za-z_][\w.]*)[ \t]+import[ \t]+([\w \t,()]+)/gm)) {
      const parts = m[1]!.split(".");
      addModule(modules, parts);
      for (const name of m[2]!.split(/[\s,()]+/).filter(Boolean)) addModule(modules, [...parts, name]);
    }
    for (const m of text.matchAll(/^[ \t]*import[ \t]+([\w., \t]+)/gm)) for (const name of m[1]!.split(/\s*,\s*/)) addModule(modules, name.trim().split(/\s+/)[0]!.split("."));
  }
  return { modules, wholeProject };
}

/** A dotted module name as the files it may be, at the root or under src/. */
function addModule(modules: Set<string>, parts: string[]): void {
  const module = parts.filter(Boolean).join("/");
  if (!module) return;
  for (const base of ["", "src/"]) modules.add(`${base}${module}.py`).add(`${base}${module}/__init__.py`);
}
