import { lostCredentials, redactDeep } from "../env/url-credentials.ts";

/**
 * What a request held that the server's database may not: the request as
 * sent, credentials included, kept in this process's memory only, by job or
 * prepare id, until it ends. The database keeps the redacted copy. After a
 * restart the memory is empty: a stored request that had credentials cannot
 * be built any more, and says so rather than going to the index without them.
 */
export class HeldSecrets<T> {
  private held = new Map<string, T>();

  /** Keep the original only when the stored copy lost something. */
  hold(id: string, original: T): void {
    if (JSON.stringify(original) !== JSON.stringify(redactDeep(original))) this.held.set(id, original);
  }

  /** The request to hand a worker, or null when its credentials were lost with a restart. */
  resolve(id: string, stored: T): T | null {
    return this.held.get(id) ?? (lostCredentials(stored) ? null : stored);
  }

  /** Drop what no longer runs. */
  keepOnly(alive: (id: string) => boolean): void {
    for (const id of this.held.keys()) if (!alive(id)) this.held.delete(id);
  }
}

export const CREDENTIALS_LOST = "the index credentials it was submitted with were kept in the server's memory only, and the server has restarted since: submit it again";
