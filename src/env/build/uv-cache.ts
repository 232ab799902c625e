import { accessSync, constants, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { writeFileAtomic } from "../../core/atomic.ts";
import { contentHash } from "../../core/hashing.ts";

/**
 * uv's cache, where this user can write it. uv places its cache itself (`uv
 * cache dir`: UV_CACHE_DIR, else XDG_CACHE_HOME/uv, else ~/.cache/uv). A
 * service user's HOME=/nonexistent, or `docker --user` with HOME=/, leaves
 * that folder unwritable: every uv step then fails and the build falls back
 * to pip. There, uv is given a cache in gpulayer's tools folder instead (a
 * UV_CACHE_DIR the user set is left as it is).
 *
 * uv's answer is kept per uv and per the variables its documentation says the
 * place comes from: one `uv cache dir` for each new combination, then two
 * system calls a build. A kept answer that missed some other input can only
 * send uv to gpulayer's own cache when it need not have, never break a build.
 */
export async function uvCacheOverride(uv: string, env: Record<string, string>, toolsDir: string): Promise<string | null> {
  // A cache the user chose (UV_CACHE_DIR) or turned off is theirs: a wrong one shows as uv's own failure, then pip.
  if (env.UV_NO_CACHE || env.UV_CACHE_DIR) return null;
  const memo = join(toolsDir, "uv-cache-dir-v1", `${contentHash(JSON.stringify([uv, process.getuid?.(), env.XDG_CACHE_HOME, env.HOME])).slice(0, 32)}.txt`);
  let place = readKept(memo);
  if (place === null) {
    place = await askUv(uv, env);
    if (place === null) return null; // uv says nothing usable: left to uv, which says why if it matters
    try {
      mkdirSync(join(memo, ".."), { recursive: true });
      writeFileAtomic(memo, place);
    } catch {
      // not kept: asked again next build
    }
  }
  return writable(place) ? null : join(toolsDir, "uv-cache");
}

function readKept(file: string): string | null {
  try {
    return readFileSync(file, "utf8") || null;
  } catch {
    return null;
  }
}

async function askUv(uv: string, env: Record<string, string>): Promise<string | null> {
  try {
    // A uv that hangs (a broken wrapper) must not hold the build: its answer is only a hint.
    const proc = Bun.spawn([uv, "cache", "dir", "--no-config"], { env, stdin: "ignore", stdout: "pipe", stderr: "ignore", timeout: 10_000 });
    const [out, code] = await Promise.all([new Response(proc.stdout).text(), proc.exited]);
    const place = out.trim();
    return code === 0 && place.startsWith("/") ? place : null;
  } catch {
    return null;
  }
}

/** There, or makeable, and writable by this user. */
function writable(dir: string): boolean {
  try {
    mkdirSync(dir, { recursive: true });
    accessSync(dir, constants.W_OK);
    return true;
  } catch {
    return false;
  }
}
