import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, isAbsolute, join, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

/** Project pages read to learn where an index's links point: a few, since one index keeps its files in one place. */
const PAGES_READ = 3;

/**
 * The folder to mount for an index on this machine's disk (`file:///srv/pypi/simple`) so that an installer
 * inside a container finds what its pages link to: a PEP 503 page may link outside the index's own folder
 * (`../../files/six-1.17.0-py3-none-any.whl`, a mirror's usual layout), and a mount of the index alone
 * leaves those out ("failed to open file"). The nearest folder holding the index and every file a few of
 * its project pages link to; the index itself when they link inside it, or to other hosts.
 */
export function localIndexReach(index: string): string {
  let reach = index;
  let names: string[];
  try {
    names = readdirSync(index).sort();
  } catch {
    return index;
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
      if (target) reach = commonFolder(reach, dirname(target));
    }
  }
  return reach;
}

/** A page's link as a path on this disk: relative, or a file: URL; null for another host's. */
function linkedPath(pageDir: string, href: string): string | null {
  if (/^file:/i.test(href)) {
    try {
      return fileURLToPath(href);
    } catch {
      return null;
    }
  }
  if (/^[a-z][a-z0-9+.-]*:/i.test(href) || href.startsWith("//")) return null;
  return isAbsolute(href) ? href : resolve(pageDir, decodeURIComponent(href));
}

function commonFolder(a: string, b: string): string {
  const x = a.split(sep);
  const y = b.split(sep);
  let i = 0;
  while (i < x.length && i < y.length && x[i] === y[i]) i++;
  return x.slice(0, i).join(sep) || sep;
}
