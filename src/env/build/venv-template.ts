import { lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, statSync, symlinkSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { writeFileAtomic, writeFileNamed } from "../../core/atomic.ts";
import { contentHash } from "../../core/hashing.ts";
import type { InterpreterInfo } from "../request/interpreter.ts";

/**
 * A bare venv as `uv venv` made it for the first build of a base interpreter,
 * kept and written out again for the next builds. `uv venv` costs a process
 * and, with a fresh uv cache, an interpreter query: about 45 ms here, a third
 * of a small cold build; writing its ~20 entries back costs a millisecond.
 *
 * What is kept is uv's own output, never our idea of a venv. The one thing
 * that differs between two envs is the env's own path, which uv writes into
 * its activation scripts: each occurrence is the origin's path, replaced by
 * the new env's. A venv holding anything but text and links (an interpreter
 * copied in, not linked) is not kept: then uv makes every venv.
 *
 * Kept under `<tools>/venv-templates-v1/<id>.json`, one file written
 * atomically; `id` covers the uv binary (path, inode, size, mtime), the
 * interpreter it was given and the one that runs, so a new uv or a reinstalled
 * Python makes a new template.
 */

interface Entry {
  path: string;
  kind: "dir" | "file" | "link";
  mode: number;
  /** A file's text, or a link's target. */
  data?: string;
}

interface Template {
  origin: string;
  entries: Entry[];
}

/** A path no activation script quotes or escapes. */
const PLAIN_PATH = /^[\w./-]+$/;

function identity(path: string): string {
  const s = statSync(path, { throwIfNoEntry: false });
  return s ? `${path}:${s.ino}:${s.size}:${s.mtimeMs}` : `${path}:-`;
}

function templateFile(toolsDir: string, uv: string, info: InterpreterInfo): string {
  const id = contentHash([identity(uv), info.executable, identity(info.realExecutable), info.version, info.platform].join("\0")).slice(0, 32);
  return join(toolsDir, "venv-templates-v1", `${id}.json`);
}

/** Writes the kept venv to `dir` (which must not exist yet); false when there is none for this uv and interpreter. */
export function venvFromTemplate(dir: string, toolsDir: string, uv: string, info: InterpreterInfo): boolean {
  let template: Template;
  try {
    template = JSON.parse(readFileSync(templateFile(toolsDir, uv, info), "utf8")) as Template;
  } catch {
    return false;
  }
  // Plain paths, as the origin's (keepVenvTemplate): written as they are, quoted by no script.
  if (!PLAIN_PATH.test(dir)) return false;
  const moved = (text: string) => text.replaceAll(template.origin, dir);
  mkdirSync(dirname(dir), { recursive: true });
  mkdirSync(dir);
  for (const e of template.entries) {
    const target = join(dir, e.path);
    if (e.kind === "dir") mkdirSync(target, { mode: e.mode });
    else if (e.kind === "link") symlinkSync(moved(e.data!), target);
    else writeFileNamed(target, moved(e.data!), { mode: e.mode });
  }
  return true;
}

/** Keeps the venv uv just made at `dir` (nothing else in it yet) for the next builds; a venv that cannot be kept is not. */
export function keepVenvTemplate(dir: string, toolsDir: string, uv: string, info: InterpreterInfo): void {
  const entries: Entry[] = [];
  const decoder = new TextDecoder("utf-8", { fatal: true });
  const walk = (rel: string): boolean => {
    for (const name of readdirSync(join(dir, rel)).sort()) {
      const path = rel ? `${rel}/${name}` : name;
      const full = join(dir, path);
      const st = lstatSync(full);
      const mode = st.mode & 0o7777;
      if (st.isSymbolicLink()) entries.push({ path, kind: "link", mode, data: readlinkSync(full) });
      else if (st.isDirectory()) {
        entries.push({ path, kind: "dir", mode });
        if (!walk(path)) return false;
      } else if (st.isFile()) {
        try {
          entries.push({ path, kind: "file", mode, data: decoder.decode(readFileSync(full)) });
        } catch {
          return false; // not text: an interpreter copied in
        }
      } else return false;
    }
    return true;
  };
  // Kept only where the path is the one thing that differs and is written as is: no character a script would quote,
  // and the env's name nowhere but inside its path (a prompt of its own would not be replaced).
  if (!PLAIN_PATH.test(dir)) return;
  const name = basename(dir);
  try {
    if (!walk("")) return;
    if (entries.some((e) => e.data !== undefined && e.data.replaceAll(dir, "").includes(name))) return;
    const file = templateFile(toolsDir, uv, info);
    mkdirSync(join(file, ".."), { recursive: true });
    writeFileAtomic(file, JSON.stringify({ origin: dir, entries } satisfies Template));
  } catch {
    // not kept: the next build asks uv again
  }
}
