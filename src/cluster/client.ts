import { isProblem, serverUrl, serverUrls } from "../config/kinds.ts";
import type { ResolvedSettings } from "../config/resolve.ts";
import { type BundleLimits, bundleLimits } from "./bundle-limits.ts";
import { HttpError, UsageError, UserError } from "../errors.ts";

/** Where a command runs: this machine (null) or a coordinator. */
export interface RemoteTarget {
  /** The server's URLs joined with "," (for display; one URL for most). */
  url: string;
  /** Its replicas, in the order they are tried. */
  urls: string[];
  token: string;
  /** What a bundle sent there may hold (bundle.max_size, bundle.max_unpacked). */
  bundleLimits: BundleLimits;
  /** cancel_grace: how long a remote cancel waits for the job to stop. */
  cancelGraceMs: number;
}

/**
 * The `server` and `token` settings (--server/--token, GPULAYER_SERVER/GPULAYER_TOKEN,
 * config file). Null when no server is named, or with --local: the command
 * runs on this machine, exactly as without a cluster.
 */
export function remoteTarget(settings: ResolvedSettings, rawArgs: string[] = [], opts: { local?: boolean } = {}): RemoteTarget | null {
  const { token } = settings.values;
  const origin = settings.origins.server.name;
  if (opts.local && settings.origins.server.source === "flag") throw new UsageError("--local and --server name two places: give one");
  // --local: this machine, whatever server the variable or the config file names.
  const url = opts.local ? undefined : settings.values.server;
  if (!url) {
    if (settings.origins.token.source === "flag") throw new UsageError("--token needs a server: --server URL or GPULAYER_SERVER");
    const beforeDashes = rawArgs.includes("--") ? rawArgs.slice(0, rawArgs.indexOf("--")) : rawArgs;
    if (beforeDashes.some((a) => a === "--label" || a.startsWith("--label="))) throw new UsageError("--label picks among a server's workers: it needs --server URL or GPULAYER_SERVER");
    return null;
  }
  if (!token) throw new UsageError(`${origin} ${url}: a token is needed too (--token or GPULAYER_TOKEN; the server printed it on its first start)`);
  return { url, urls: serverUrls(url), token, bundleLimits: bundleLimits(settings.values), cancelGraceMs: settings.values.cancel_grace };
}

/** A server URL (or several, comma-separated) as the `server` setting reads it (http(s), no credentials in it), for one given elsewhere (`join URL`). */
export function normalizeServerUrl(url: string, origin = "server URL"): string {
  const parsed = serverUrl.parse(url);
  if (isProblem(parsed)) throw new UsageError(`${origin} ${url}: ${parsed.problem}`);
  return parsed;
}

type Body = Record<string, unknown> | Uint8Array | undefined;
type RequestOpts = { signal?: AbortSignal; raw?: boolean; headers?: Record<string, string> };

/** Answers that say "this replica cannot serve now" (a proxy in front of a stopped one, or one shedding load): the next replica is asked. */
export const isUnavailable = (status: number): boolean => status === 502 || status === 503 || status === 504;

/**
 * `fn` asked again while no replica can be reached or serve now (502/503/504:
 * one without its database), backing off up to 5 s, until it answers or
 * `stopped()`: an outage of the coordinator fails nothing a worker was
 * already given. Any other answer is the caller's.
 */
export async function untilServed<T>(fn: () => Promise<T>, stopped: () => boolean): Promise<T> {
  for (let delay = 200; ; delay = Math.min(delay * 2, 5000)) {
    try {
      return await fn();
    } catch (error) {
      // The client throws an HttpError for an answer, anything else when no replica could be reached.
      const outage = !(error instanceof HttpError) || isUnavailable(error.status);
      if (!outage || stopped()) throw error;
      await new Promise((resolve) => setTimeout(resolve, delay));
    }
  }
}

/**
 * The replicas of one server and which of them answered last: shared by the
 * clients of one target (and a worker's clients), so that after a failover
 * every request goes to the replica that answers.
 */
export class Replicas {
  readonly urls: string[];
  current = 0;
  /**
   * A replica that takes the connection and then says nothing (stopped,
   * frozen, cut off without a reset) is given this long beyond the request's
   * own long-poll wait to start answering; then the next one is asked.
   */
  answerMarginMs = 15_000;

  constructor(
    urls: string | readonly string[],
    /** Told when requests move to another replica (modules never print: the caller logs it). */
    readonly onMove?: (from: string, to: string) => void,
  ) {
    this.urls = typeof urls === "string" ? serverUrls(urls) : [...urls];
    if (!this.urls.length) throw new UsageError("no server URL given");
  }
}

const sharedReplicas = new WeakMap<RemoteTarget, Replicas>();

/** A client of the target's coordinator; clients of one target share which replica answers. */
export function connect(target: RemoteTarget): ClusterClient {
  let replicas = sharedReplicas.get(target);
  if (!replicas) sharedReplicas.set(target, (replicas = new Replicas(target.urls)));
  return new ClusterClient(replicas, target.token);
}

/** A network error in a line of ours: what happened, without Bun's advice to the programmer. */
function networkMessage(error: unknown): string {
  const code = String((error as { code?: unknown }).code ?? "");
  const plain: Record<string, string> = { ECONNREFUSED: "connection refused", ConnectionRefused: "connection refused", ECONNRESET: "connection reset", ConnectionClosed: "connection closed", ETIMEDOUT: "timed out", EHOSTUNREACH: "host unreachable", ENOTFOUND: "no such host" };
  if (plain[code]) return plain[code];
  return (error as Error).message.replace(/\s*Is the computer able to access the url\?/, "").replace(/\s*For more information, pass `verbose: true`.*$/s, "").trim();
}

/** One replica's failure: a network error (message) or an unavailable answer. */
type Failure = { url: string; message: string; answer?: { status: number; data: Record<string, unknown> } };

async function readJson(res: Response): Promise<Record<string, unknown>> {
  try {
    return (await res.json()) as Record<string, unknown>;
  } catch {
    return {}; // not JSON
  }
}

/**
 * The coordinator's API: JSON in and out, the token as a bearer credential
 * (never put in a message). Given several replicas, a request that cannot
 * reach one (a network error, or 502/503/504) is sent to the next, once
 * around the list, and the one that answered is asked first next time.
 */
export class ClusterClient {
  readonly replicas: Replicas;

  constructor(
    urls: string | readonly string[] | Replicas,
    private readonly token: string,
  ) {
    this.replicas = urls instanceof Replicas ? urls : new Replicas(urls);
  }

  /** The replica requests go to first: the one that answered last. */
  get url(): string {
    return this.replicas.urls[this.replicas.current]!;
  }

  get urls(): string[] {
    return this.replicas.urls;
  }

  /** A client with another token (a worker's credential) that follows the same replica as this one. */
  withToken(token: string): ClusterClient {
    return new ClusterClient(this.replicas, token);
  }

  async request(method: string, path: string, body?: Body | Blob | ReadableStream<Uint8Array>, opts: RequestOpts = {}): Promise<Response> {
    const headers: Record<string, string> = { ...opts.headers, authorization: `Bearer ${this.token}` };
    let payload: string | Uint8Array | Blob | ReadableStream<Uint8Array> | undefined;
    if (body instanceof Blob || body instanceof ReadableStream) {
      // A file, streamed (an env artifact of gigabytes never sits in memory). A Blob can be sent again; a stream cannot.
      headers["content-type"] = "application/octet-stream";
      payload = body;
    } else if (body instanceof Uint8Array) {
      headers["content-type"] = "application/octet-stream";
      payload = body;
    } else if (body !== undefined) {
      headers["content-type"] = "application/json";
      payload = JSON.stringify(body);
    }
    const replayable = !(payload instanceof ReadableStream);
    const { urls } = this.replicas;
    const first = this.replicas.current;
    const failures: Failure[] = [];
    // Twice around on network errors: the second time on fresh connections (a pooled one to a replica that restarted is dead, though the replica answers).
    const rounds = replayable ? 2 : 1;
    for (let i = 0; i < urls.length * rounds && (i === 0 || replayable); i++) {
      const at = (first + i) % urls.length;
      const url = urls[at]!;
      const fresh = i >= urls.length;
      // A replica that answered 502/503/504 is not asked again in the second round.
      if (fresh && failures.some((f) => f.url === url && f.answer)) continue;
      let res: Response;
      // Until the answer starts only (a download then streams as long as it takes); not for uploads, whose sending takes its own time.
      const silent = new AbortController();
      // With one replica there is nowhere else to go: it is waited for.
      const patience = urls.length < 2 || payload instanceof Blob || payload instanceof ReadableStream ? null : setTimeout(() => silent.abort(), this.answerWithinMs(path));
      try {
        res = await fetch(`${url}${path}`, { method, headers, body: payload, signal: opts.signal ? AbortSignal.any([opts.signal, silent.signal]) : silent.signal, ...(fresh ? { keepalive: false } : {}) });
      } catch (error) {
        // The caller's own abort (or timeout) is an answer, not a replica's failure: never retried.
        if (opts.signal?.aborted) throw error;
        if (silent.signal.aborted) failures.push({ url, message: `no answer within ${(this.answerWithinMs(path) / 1000).toFixed(1)} s` });
        else if ((error as Error).name === "AbortError") throw error;
        else failures.push({ url, message: networkMessage(error) });
        continue;
      } finally {
        if (patience) clearTimeout(patience);
      }
      if (isUnavailable(res.status)) {
        const data = await readJson(res);
        failures.push({ url, message: typeof data.error === "string" ? data.error : `HTTP ${res.status}`, answer: { status: res.status, data } });
        continue;
      }
      this.answered(at);
      return this.checked(res, url, method, path, opts);
    }
    throw this.allFailed(failures, method, path, replayable);
  }

  /** The request's long-poll wait (`wait=` seconds) plus the margin. */
  private answerWithinMs(path: string): number {
    const wait = Number(/[?&]wait=([\d.]+)/.exec(path)?.[1] ?? 0);
    return (Number.isFinite(wait) ? wait * 1000 : 0) + this.replicas.answerMarginMs;
  }

  private answered(at: number): void {
    const from = this.replicas.current;
    if (from === at) return;
    this.replicas.current = at;
    this.replicas.onMove?.(this.replicas.urls[from]!, this.replicas.urls[at]!);
  }

  private async checked(res: Response, url: string, method: string, path: string, opts: RequestOpts): Promise<Response> {
    if (res.ok || (opts.raw && res.status === 404)) return res;
    const data = await readJson(res);
    if (res.status === 401) throw new HttpError(401, `the server at ${url} refused the token (401): it is not one of that server's tokens, or it was revoked`, data);
    throw new HttpError(res.status, typeof data.error === "string" ? data.error : notOurs(url, method, path, res.status), data);
  }

  /** One line naming every replica tried; an HttpError (5xx) when one of them answered, so callers that wait out a 5xx still do. */
  private allFailed(tries: Failure[], method: string, path: string, replayable: boolean): UserError {
    // Each replica once, with how it failed last (it may have been tried twice).
    const failures = [...new Map(tries.map((f) => [f.url, f])).values()];
    const answered = failures.findLast((f) => f.answer)?.answer;
    const untried = replayable ? "" : " (the request's body cannot be sent again, so no other replica was tried)";
    if (failures.length === 1 && this.replicas.urls.length === 1) {
      const [f] = failures as [Failure];
      if (answered) return new HttpError(answered.status, typeof answered.data.error === "string" ? answered.data.error : notOurs(f.url, method, path, answered.status), answered.data);
      return new UserError(`cannot reach the gpulayer server at ${f.url}: ${f.message}`);
    }
    // Replicas that answered (503: no database) were reached; only the others could not be.
    const what = failures.every((f) => f.answer) ? "no replica of the gpulayer server can serve it now" : failures.length === 1 ? `cannot reach the gpulayer server at ${failures[0]!.url}` : `cannot reach the gpulayer server at any of ${failures.map((f) => f.url).join(", ")}`;
    const message = failures.length === 1 ? `${what}: ${failures[0]!.message}${untried}` : `${what}: ${failures.map((f) => `${f.url}: ${f.message}`).join("; ")}`;
    return answered ? new HttpError(answered.status, message, answered.data) : new UserError(message);
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

/** An answer without gpulayer's error document: what answered is something else (a web server, a proxy's own page). */
function notOurs(url: string, method: string, path: string, status: number): string {
  return `${url} answered ${method} ${path} with HTTP ${status}, not as a gpulayer server does: is it the URL \`gpulayer server\` printed?`;
}
