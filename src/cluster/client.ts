import { isProblem, serverUrl } from "../config/kinds.ts";
import type { ResolvedSettings } from "../config/resolve.ts";
import { type BundleLimits, bundleLimits } from "./bundle-limits.ts";
import { HttpError, UsageError, UserError } from "../errors.ts";

/** Where a command runs: this machine (null) or a coordinator. */
export interface RemoteTarget {
  url: string;
  token: string;
  /** What a bundle sent there may hold (bundle.max_size, bundle.max_unpacked). */
  bundleLimits: BundleLimits;
  /** cancel_grace: how long a remote cancel waits for the job to stop. */
  cancelGraceMs: number;
}

/**
 * The `server` and `token` settings (--server/--token, GPULAYER_SERVER/GPULAYER_TOKEN,
 * config file). Null when no server is named: the command runs on this
 * machine, exactly as without a cluster.
 */
export function remoteTarget(settings: ResolvedSettings, rawArgs: string[] = []): RemoteTarget | null {
  const { server: url, token } = settings.values;
  const origin = settings.origins.server.name;
  if (!url) {
    if (settings.origins.token.source === "flag") throw new UsageError("--token needs a server: --server URL or GPULAYER_SERVER");
    const beforeDashes = rawArgs.includes("--") ? rawArgs.slice(0, rawArgs.indexOf("--")) : rawArgs;
    if (beforeDashes.some((a) => a === "--label" || a.startsWith("--label="))) throw new UsageError("--label picks among a server's workers: it needs --server URL or GPULAYER_SERVER");
    return null;
  }
  if (!token) throw new UsageError(`${origin} ${url}: a token is needed too (--token or GPULAYER_TOKEN; the server printed it on its first start)`);
  return { url, token, bundleLimits: bundleLimits(settings.values), cancelGraceMs: settings.values.cancel_grace };
}

/** A server URL as the `server` setting reads one (http(s), no credentials in it), for a URL given elsewhere (`join URL`). */
export function normalizeServerUrl(url: string, origin = "server URL"): string {
  const parsed = serverUrl.parse(url);
  if (isProblem(parsed)) throw new UsageError(`${origin} ${url}: ${parsed.problem}`);
  return parsed;
}

type Body = Record<string, unknown> | Uint8Array | undefined;

/** A client of the target's coordinator. */
export function connect(target: RemoteTarget): ClusterClient {
  return new ClusterClient(target.url, target.token);
}

/** The coordinator's API: JSON in and out, the token as a bearer credential (never put in a message). */
export class ClusterClient {
  constructor(
    readonly url: string,
    private readonly token: string,
  ) {}

  async request(method: string, path: string, body?: Body | Blob, opts: { signal?: AbortSignal; raw?: boolean; headers?: Record<string, string> } = {}): Promise<Response> {
    const headers: Record<string, string> = { ...opts.headers, authorization: `Bearer ${this.token}` };
    let payload: string | Uint8Array | Blob | undefined;
    if (body instanceof Blob) {
      // A file, streamed (an env artifact of gigabytes never sits in memory).
      headers["content-type"] = "application/octet-stream";
      payload = body;
    } else if (body instanceof Uint8Array) {
      headers["content-type"] = "application/octet-stream";
      payload = body;
    } else if (body !== undefined) {
      headers["content-type"] = "application/json";
      payload = JSON.stringify(body);
    }
    let res: Response;
    try {
      res = await fetch(`${this.url}${path}`, { method, headers, body: payload, signal: opts.signal });
    } catch (error) {
      if ((error as Error).name === "AbortError") throw error;
      throw new UserError(`cannot reach the gpulayer server at ${this.url}: ${(error as Error).message}`);
    }
    if (res.ok || (opts.raw && res.status === 404)) return res;
    let data: Record<string, unknown> = {};
    try {
      data = (await res.json()) as Record<string, unknown>;
    } catch {
      // not JSON
    }
    if (res.status === 401) throw new HttpError(401, `the server at ${this.url} refused the token (401): check --token / GPULAYER_TOKEN`, data);
    const message = typeof data.error === "string" ? data.error : `${method} ${path}: HTTP ${res.status}`;
    throw new HttpError(res.status, message, data);
  }

  async json<T>(method: string, path: string, body?: Body, opts: { signal?: AbortSignal } = {}): Promise<T> {
    const res = await this.request(method, path, body, opts);
    return (await res.json()) as T;
  }

  async bytes(path: string, opts: { signal?: AbortSignal } = {}): Promise<{ data: Uint8Array; headers: Headers }> {
    const res = await this.request("GET", path, undefined, opts);
    return { data: new Uint8Array(await res.arrayBuffer()), headers: res.headers };
  }
}
