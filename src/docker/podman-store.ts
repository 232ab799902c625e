import { mkdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import type { HomeLayout } from "../config/paths.ts";
import { writeFileAtomic } from "../core/atomic.ts";
import { userHome } from "../core/home.ts";
import { type Engine, type EngineEnv, engineExec } from "./engine.ts";

/**
 * Whether Podman's image store changed since gpulayer last asked Podman
 * about an image, without asking again. Podman has no daemon: every
 * `podman image inspect` starts Podman and opens its store (about 40 ms),
 * which a warm image job would pay on every run. Podman's store (its
 * containers/storage library) marks every write to its image index itself:
 * `images.lock` holds the last writer's token, rewritten on each change,
 * and `images.json` is replaced whole. A stamp of both, taken before an
 * inspect, therefore vouches for that inspect's answer for as long as it
 * stays the same: a pull, a tag, an rmi or a prune changes it, and the
 * next run asks Podman again.
 *
 * Where the store is comes from Podman itself (`podman info`), asked again
 * whenever anything that could move it changes: the binary, the user, the
 * variables Podman reads for its configuration, the configuration files.
 * Without an answer that is sure (a remote Podman, an image store elsewhere
 * or beside the main one), there is no stamp and every run asks Podman.
 */

/** The variables that choose Podman's configuration and store. */
const INPUT_VARIABLES = ["CONTAINERS_STORAGE_CONF", "CONTAINERS_CONF", "CONTAINERS_CONF_OVERRIDE", "CONTAINER_HOST", "CONTAINER_CONNECTION", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR", "HOME"] as const;

interface StoreAnswer {
  /** What Podman's answer depended on when it was given. */
  inputs: string;
  /** The image index's folder ($graphRoot/$driver-images), or null where no stamp can vouch for it. */
  imagesDir: string | null;
}

const cacheFile = (layout: HomeLayout) => join(layout.images, "podman-store.json");

function statLine(path: string): string {
  const s = statSync(path, { throwIfNoEntry: false, bigint: true });
  return s ? `${s.dev}:${s.ino}:${s.size}:${s.mtimeNs}:${s.ctimeNs}` : "-";
}

/** The configuration files Podman may read, as containers/storage and containers/common look for them. */
function configFiles(env: EngineEnv): string[] {
  const config = env.XDG_CONFIG_HOME || join(userHome(env), ".config");
  const files = ["/etc/containers/storage.conf", "/usr/share/containers/storage.conf", join(config, "containers", "storage.conf")];
  for (const dir of ["/usr/share/containers", "/etc/containers", join(config, "containers")]) files.push(join(dir, "containers.conf"), join(dir, "containers.conf.d"));
  for (const name of ["CONTAINERS_STORAGE_CONF", "CONTAINERS_CONF", "CONTAINERS_CONF_OVERRIDE"] as const) if (env[name]) files.push(env[name]!);
  return files;
}

function inputsOf(engine: Engine, env: EngineEnv): string {
  const lines = [`bin ${engine.bin} ${statLine(engine.bin)}`, `uid ${process.getuid?.() ?? "-"}`];
  for (const name of INPUT_VARIABLES) lines.push(`${name}=${env[name] ?? ""}`);
  for (const file of configFiles(env)) lines.push(`${file} ${statLine(file)}`);
  return lines.join("\n");
}

/** Podman's own answer: where its image index is, or null where a stamp cannot vouch for it. */
async function askPodman(engine: Engine, env: EngineEnv): Promise<string | null> {
  const r = await engineExec(engine, ["info", "--format", "json"], { env, timeoutMs: 20_000 });
  if (r.code !== 0) return null;
  try {
    const info = JSON.parse(r.stdout) as { host?: { serviceIsRemote?: boolean }; store?: { graphRoot?: string; graphDriverName?: string; graphOptions?: Record<string, unknown> } };
    const store = info.store;
    if (info.host?.serviceIsRemote !== false || !store?.graphRoot || !store.graphDriverName) return null;
    // Images kept in a store of their own, or in read-only stores beside it, change without this index.
    if (Object.keys(store.graphOptions ?? {}).some((k) => /imagestore/i.test(k))) return null;
    return join(store.graphRoot, `${store.graphDriverName}-images`);
  } catch {
    return null;
  }
}

async function imagesDir(layout: HomeLayout, engine: Engine, env: EngineEnv): Promise<string | null> {
  const inputs = inputsOf(engine, env);
  try {
    const cached = JSON.parse(readFileSync(cacheFile(layout), "utf8")) as StoreAnswer;
    if (cached.inputs === inputs) return cached.imagesDir;
  } catch {
    // not asked yet
  }
  const answer: StoreAnswer = { inputs, imagesDir: await askPodman(engine, env) };
  try {
    mkdirSync(layout.images, { recursive: true });
    writeFileAtomic(cacheFile(layout), JSON.stringify(answer));
  } catch {
    // only saves the next run a question
  }
  return answer.imagesDir;
}

/**
 * The image store's stamp now: take it before asking Podman, keep it with
 * the answer, and the answer holds while the stamp is the same. null where
 * none can be taken (then ask Podman every time).
 */
export async function podmanStoreStamp(layout: HomeLayout, engine: Engine, env: EngineEnv): Promise<string | null> {
  const dir = await imagesDir(layout, engine, env);
  if (!dir) return null;
  let token: string;
  try {
    token = readFileSync(join(dir, "images.lock")).toString("hex");
  } catch {
    return null; // no store yet, or not ours to read
  }
  const index = statLine(join(dir, "images.json"));
  return index === "-" ? null : `${token}/${index}`;
}
