import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { InstallError } from "../../errors.ts";
import { redactUrl } from "../request/url-credentials.ts";

/**
 * The indexes a build reads, looked at while it builds: an index that
 * certainly does not answer stops the build at once with one line naming it,
 * instead of after the installers' retries (and pip's after uv's). The look
 * runs beside the installer, not before it: a cold build from a remote index
 * does not wait a round trip (a TLS handshake and the index's first bytes, about
 * 80 ms to PyPI) for an answer that only matters when the build fails.
 *
 * A file:// index is a folder, checked at once. Behind a proxy nothing is
 * looked at: our direct look would prove nothing about the installers' way.
 */
export class IndexWatch {
  /** Aborted, with the InstallError as its reason, when an index certainly does not answer: the build's tools stop. */
  readonly signal: AbortSignal;
  private readonly unreachable = new AbortController();
  private readonly over = new AbortController();
  private readonly looks: Promise<void>[] = [];
  private readonly seen = new Set<string>();

  constructor() {
    this.signal = this.unreachable.signal;
  }

  /** Start looking at `urls`; `from` says where they were set (after the URL in the message). Throws at once for a missing file:// folder. */
  watch(urls: string[], from: string, viaProxy: boolean): void {
    for (const url of urls) {
      if (!/^file:/i.test(url)) continue;
      let path: string;
      try {
        path = fileURLToPath(url);
      } catch {
        continue; // pip's to judge
      }
      if (!existsSync(path)) throw new InstallError(`index not found: ${redactUrl(url)}${from} (no such folder: ${path})`, "");
    }
    if (viaProxy) return;
    for (const url of urls) {
      // Named twice (a flag and the machine's configuration; pip's attempt after uv's): looked at once.
      if (!/^https?:\/\//.test(url) || this.seen.has(url)) continue;
      this.seen.add(url);
      this.looks.push(this.look(url, from));
    }
  }

  /** After a failed build: the index that did not answer, if one did not (looks still running are waited for, each at most 10 s). */
  async failure(): Promise<InstallError | null> {
    await Promise.all(this.looks);
    return this.signal.aborted ? (this.signal.reason as InstallError) : null;
  }

  /** The build is over: looks still running are dropped. */
  stop(): void {
    this.over.abort();
  }

  private async look(url: string, from: string): Promise<void> {
    const bare = url.replace(/^(https?:\/\/)[^/@]+@/, "$1");
    try {
      const answer = await fetch(bare, { method: "GET", signal: AbortSignal.any([AbortSignal.timeout(10_000), this.over.signal]), redirect: "manual" });
      await answer.body?.cancel();
    } catch (error) {
      if (this.over.signal.aborted || this.signal.aborted) return;
      const { message, code } = error as Error & { code?: string };
      // Anything else is the installer's to judge, with the settings it reads.
      if (CERTAINLY_UNREACHABLE.test(`${code ?? ""} ${message}`)) this.unreachable.abort(new InstallError(`index unreachable: ${redactUrl(url)}${from} (${message})`, ""));
    }
  }
}

/**
 * Failures that say no installer can reach the host either: nothing listens there, or its name is unknown. A TLS
 * refusal or a slow answer is not one: pip's cert, trusted-host and timeout settings may well make it work.
 */
const CERTAINLY_UNREACHABLE = /ConnectionRefused|ECONNREFUSED|ENOTFOUND|getaddrinfo|Unable to connect/i;

/** A proxy the installers would go through (pip's and uv's own variables): our direct look at an index proves nothing then. */
export const proxied = (env: NodeJS.ProcessEnv): boolean => ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "PIP_PROXY"].some((v) => Boolean(env[v]));
