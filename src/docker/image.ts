import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { type Engine, engineExec, engineMessage, type EngineEnv } from "./engine.ts";
import { userHome } from "../core/home.ts";

export { validateRef } from "./image-ref.ts";

/** The repository part of a reference: without its tag and digest. */
export function repositoryOf(ref: string): string {
  const noDigest = ref.split("@")[0]!;
  const lastSlash = noDigest.lastIndexOf("/");
  const colon = noDigest.indexOf(":", lastSlash + 1);
  return colon === -1 ? noDigest : noDigest.slice(0, colon);
}

/** The digest a reference pins (name@sha256:...), if any. */
export function pinnedDigest(ref: string): string | undefined {
  const at = ref.indexOf("@");
  return at === -1 ? undefined : ref.slice(at + 1);
}

/** Does the reference name its registry (registry.example.com/x, 127.0.0.1:5000/x, localhost/x)? Else it is a short name, which each engine resolves its own way. */
export function namesRegistry(ref: string): boolean {
  const first = ref.split("@")[0]!.split("/")[0]!;
  return ref.includes("/") && (first.includes(".") || first.includes(":") || first === "localhost");
}

/** How Docker and Podman spell a repository in full: docker.io/library/busybox for busybox. */
function normalizeRepository(repo: string): string {
  if (namesRegistry(repo)) return repo;
  return repo.includes("/") ? `docker.io/${repo}` : `docker.io/library/${repo}`;
}

export interface ImageInfo {
  /** The local image id (sha256 of its config): what a container is started from. */
  id: string;
  /** The registry's manifest digest for this reference when known, else the image id. */
  digest: string;
  repoDigests: string[];
  sizeBytes: number;
}

export type InspectOutcome = { kind: "present"; info: ImageInfo } | { kind: "absent" } | { kind: "failed"; message: string };

const withPrefix = (id: string) => (id.startsWith("sha256:") ? id : `sha256:${id}`);

export function imageInfoFrom(ref: string, data: Record<string, unknown>): ImageInfo {
  const id = withPrefix(String(data.Id ?? ""));
  const repoDigests = Array.isArray(data.RepoDigests) ? (data.RepoDigests as unknown[]).map(String) : [];
  const want = normalizeRepository(repositoryOf(ref));
  const match = repoDigests.find((d) => normalizeRepository(d.split("@")[0]!) === want);
  const digest = pinnedDigest(ref) ?? match?.split("@")[1] ?? (typeof data.Digest === "string" && data.Digest ? data.Digest : undefined) ?? repoDigests[0]?.split("@")[1] ?? id;
  return { id, digest, repoDigests, sizeBytes: Number(data.Size ?? 0) || 0 };
}

/** Is the image here? One engine call; "absent" only when the engine itself says so. */
export async function inspectImage(engine: Engine, ref: string, env: EngineEnv): Promise<InspectOutcome> {
  if (engine.name === "docker") {
    const fast = await inspectViaDockerSocket(ref, env);
    if (fast) return fast;
  }
  const r = await engineExec(engine, ["image", "inspect", ref], { env, timeoutMs: 60_000 });
  if (r.code === 0) {
    try {
      const list = JSON.parse(r.stdout) as Record<string, unknown>[];
      if (list[0]) return { kind: "present", info: imageInfoFrom(ref, list[0]) };
    } catch {
      return { kind: "failed", message: `${engine.name} image inspect printed something that is not JSON` };
    }
    return { kind: "absent" };
  }
  const message = engineMessage(`${r.stderr}\n${r.stdout}`);
  if (/no such image|image not known|not found|does not exist/i.test(message) && !/cannot connect|connection refused|permission denied/i.test(message)) return { kind: "absent" };
  return { kind: "failed", message: message || `${engine.name} image inspect exited ${r.code}` };
}

const DOCKER_SOCKET = "/var/run/docker.sock";

/** The default local daemon, as the docker CLI would reach it: no DOCKER_HOST, no other context. */
function defaultDockerSocket(env: NodeJS.ProcessEnv): string | null {
  if (env.DOCKER_HOST || (env.DOCKER_CONTEXT && env.DOCKER_CONTEXT !== "default") || !existsSync(DOCKER_SOCKET)) return null;
  try {
    const config = JSON.parse(readFileSync(join(env.DOCKER_CONFIG || join(userHome(env), ".docker"), "config.json"), "utf8")) as { currentContext?: string };
    if (config.currentContext && config.currentContext !== "default") return null;
  } catch {
    // no config: the default context
  }
  return DOCKER_SOCKET;
}

/**
 * `docker image inspect` through the daemon's socket: the same document in
 * about 1 ms instead of the CLI's ~15, which a warm image job pays on every
 * run. null when the socket is not the CLI's default or does not answer: the
 * caller then asks the CLI.
 */
async function inspectViaDockerSocket(ref: string, env: NodeJS.ProcessEnv): Promise<InspectOutcome | null> {
  const socket = defaultDockerSocket(env);
  if (!socket) return null;
  try {
    const r = await fetch(`http://docker/images/${encodeURI(ref)}/json`, { unix: socket, signal: AbortSignal.timeout(5000) } as RequestInit);
    if (r.status === 404) return { kind: "absent" };
    if (!r.ok) return null;
    return { kind: "present", info: imageInfoFrom(ref, (await r.json()) as Record<string, unknown>) };
  } catch {
    return null;
  }
}
