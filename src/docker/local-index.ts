import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, isAbsolute, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** Project pages read to learn where an index's links point: a few, since one index keeps its files in one place. */
const PAGES_READ = 3;

/**
 * The folders to mount for an index on this machine's disk (`file:///srv/pypi/simple`) so that an installer inside
 * a container finds what its pages link to: a PEP 503 page may link outside the index's own folder
 * (`../../files/six-1.17.0-py3-none-any.whl`, a mirror's usual layout), and a mount of the index alone leaves those
 * out ("failed to open file"). The index, and each folder a few of its project pages link to that lies beside it
 * (under the index's own parent, not that parent itself): never wider, so no mount covers the image's own folders
 * (/opt, /etc) or hands the build a home folder. A link elsewhere is left to fail in the installer's words.
 */
export function localIndexFolders(index: string): string[] {
  const parent = dirname(index);
  const folders = new Set([index]);
  let names: string[];
  try {
    names = readdirSync(index).sort();
  } catch {
    return [index];
  }
  let read = 0;
  for (const name of names) {
    if (read >= PAGES_READ) break;
    const page = join(index, name, "index.html");
    if (!existsSync(page)) continue;
    read++;
    let html: string;
    try {
      html = readFileSync(page, "utf8");
    } catch {
      continue;
    }
    for (const [, href] of html.matchAll(/href\s*=\s*["']([^"'#]+)/gi)) {
      const target = linkedPath(dirname(page), href!);
      if (!target) continue;
      const folder = dirname(target);
      const under = relative(parent, folder);
      if (folder !== parent && under && !under.startsWith("..") && !isAbsolute(under)) folders.add(folder);
    }
  }
  // A folder inside another mounted one comes with it.
  return [...folders].filter((f) => ![...folders].some((o) => o !== f && !relative(o, f).startsWith("..") && !isAbsolute(relative(o, f))));
}

/** A page's link as a path on this disk: relative, or a file: URL; null for another host's, or one that is no path. */
function linkedPath(pageDir: string, href: string): string | null {
  try {
    if (/^file:/i.test(href)) return fileURLToPath(href);
    if (/^[a-z][a-z0-9+.-]*:/i.test(href) || href.startsWith("//")) return null;
    const path = decodeURIComponent(href);
    return isAbsolute(path) ? path : resolve(pageDir, path);
  } catch {
    return null; // not a URL or path we can read (a stray %): left to the installer
  }
}
