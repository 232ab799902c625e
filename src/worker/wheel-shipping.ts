import { rmSync } from "node:fs";
import type { SharedWheel, WheelClaim, WheelSharing } from "../env/index.ts";
import { DigestMismatch, downloadChecked, putShared, RENEW_MS, type ShippingSettings as AllSettings } from "./shipping-transfer.ts";

/** What of the env shipping's settings the wheels use. */
type ShippingSettings = Pick<AllSettings, "client" | "share" | "log" | "uploads">;

/**
 * A joined worker's side of the fleet's wheels (env/build/wheelhouse.ts, server/wheel-routes.ts): list the
 * wheels of an sdist under this interpreter and build variables, fetch one (its sha256 checked as it comes; a
 * mismatch is reported, and the server drops it once it finds the same), claim a compile for this task (the
 * others wait for its wheel), and upload each wheel compiled here under its claim in the background. Under the env artifacts' switch (worker.share_envs).
 */

export function wheelSharing(s: ShippingSettings, taskId: string): WheelSharing | undefined {
  if (!s.share) return undefined;
  return {
    list: async (sdist, conditions, signal) => {
      const got = await s.client.json<{ share: boolean; wheels: SharedWheel[] }>("GET", `/v1/wheels?sdist=${sdist}&conditions=${conditions}`, undefined, { signal });
      return got.share ? got.wheels : [];
    },
    listByName: async (name, conditions, signal) => {
      const got = await s.client.json<{ share: boolean; wheels: SharedWheel[] }>("GET", `/v1/wheels?name=${encodeURIComponent(name)}&conditions=${conditions}`, undefined, { signal });
      return got.share ? got.wheels : [];
    },
    fetch: (wheel, file, signal) => fetchWheel(s, wheel, file, signal),
    claim: async (sdist, conditions, signal) => {
      const got = await s.client.json<{ granted: boolean; holder?: string }>("POST", "/v1/wheels/claim", { sdist, conditions, task: taskId }, { signal });
      return got.granted ? { claim: claimed(s, taskId, sdist, conditions) } : { holder: got.holder ?? "another worker" };
    },
  };
}

/** The compile is ours: renew the claim while it runs and while its wheel uploads (the server takes it only under the claim), then let the claim go. */
function claimed(s: ShippingSettings, taskId: string, sdist: string, conditions: string): WheelClaim {
  const renew = setInterval(() => void s.client.json("POST", "/v1/wheels/claim", { sdist, conditions, task: taskId }).catch(() => undefined), RENEW_MS);
  renew.unref();
  let released = false;
  const release = () => {
    if (released) return;
    released = true;
    clearInterval(renew);
    void s.client.json("POST", "/v1/wheels/claim", { sdist, conditions, release: true }).catch(() => undefined);
  };
  return {
    share: (file, entry) => {
      const upload = shareWheel(s, taskId, sdist, conditions, file, entry)
        .catch((error) => s.log(`wheel ${entry.wheel}: not shared (${(error as Error).message})`))
        .finally(() => {
          release();
          s.uploads.delete(upload);
        });
      s.uploads.add(upload);
    },
    release,
  };
}

async function fetchWheel(s: ShippingSettings, wheel: SharedWheel, file: string, signal?: AbortSignal): Promise<void> {
  try {
    await downloadChecked(s.client, `/v1/wheels/${wheel.sha256}`, file, wheel.sha256, signal);
  } catch (error) {
    rmSync(file, { force: true });
    // The server hashes its copy too, and drops it when it finds the same: a compile here then takes its place.
    if (error instanceof DigestMismatch) await s.client.json("POST", "/v1/wheels/report", { sha: wheel.sha256 }, { signal }).catch(() => undefined);
    throw error;
  }
}

async function shareWheel(s: ShippingSettings, taskId: string, sdist: string, conditions: string, file: string, entry: Omit<SharedWheel, "sha256" | "bytes" | "built_by" | "sdist">): Promise<void> {
  const bytes = await Bun.file(file).bytes();
  const sha = new Bun.CryptoHasher("sha256").update(bytes).digest("hex");
  const header = Buffer.from(JSON.stringify(entry)).toString("base64");
  // null: another worker's wheel of the same build is there, which is fine.
  const res = await putShared(s.client, `/v1/wheels/${sha}?task=${encodeURIComponent(taskId)}&sdist=${sdist}&conditions=${conditions}`, new Blob([bytes]), { "x-gpulayer-wheel": header });
  if (res) s.log(`wheel ${entry.wheel}: shared as ${sha.slice(0, 12)} (${(bytes.length / 1024).toFixed(0)} KiB)`);
}
