import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";

export function contentHash(data: string | Uint8Array): string {
  return new Bun.CryptoHasher("sha256").update(data).digest("hex");
}

const SKIP_DIRS = new Set([".git", ".hg", ".venv", "venv", "__pycache__", "build", "dist", "node_modules", ".tox", ".mypy_cache"]);

/** A folder's content, for a local project installed by copy: every file's path and bytes. */
export function treeHash(root: string): string {
  const hasher = new Bun.CryptoHasher("sha256");
  const walk = (dir: string) => {
    const entries = readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1));
    for (const e of entries) {
      const p = join(dir, e.name);
      if (e.isDirectory()) {
        if (!SKIP_DIRS.has(e.name) && !e.name.endsWith(".egg-info")) walk(p);
      } else if (e.isFile()) {
        hasher.update(`${relative(root, p)}\0`);
        hasher.update(contentHash(readFileSync(p)));
      }
    }
  };
  walk(root);
  return hasher.digest("hex");
}

/** Replace the credentials in a URL by a short hash of them: stable for the key, useless to a reader. */
export function hideCredentials(url: string): string {
  return url.replace(/^([a-z+]+:\/\/)([^/@\s]+)@/i, (_m, scheme: string, creds: string) => `${scheme}cred-${contentHash(creds).slice(0, 12)}@`);
}

/** For messages: the credentials of every URL in the text shown as *** (pip shows the user name; we do not). */
export function redactUrl(text: string): string {
  return text.replace(/([a-z][a-z0-9+.-]*:\/\/)[^/@\s]+@/gi, "$1***@");
}
