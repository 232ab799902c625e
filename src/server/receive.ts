import { open } from "node:fs/promises";
import { HttpFail } from "./http-fail.ts";

/**
 * The body into `file` (created, owner only), refused (413, `tooLarge`) past the limit as it arrives, never held in
 * memory whole; its sha256 and size. The one receiving of bundles, outputs, env artifacts and wheels.
 */
export async function receiveTo(req: Request, limit: number, file: string, tooLarge = `request body too large (limit ${limit} bytes)`): Promise<{ hash: string; bytes: number }> {
  const declared = Number(req.headers.get("content-length") ?? "0");
  if (declared > limit) throw new HttpFail(413, tooLarge);
  const hasher = new Bun.CryptoHasher("sha256");
  const handle = await open(file, "wx", 0o600);
  let total = 0;
  try {
    for await (const chunk of (req.body ?? []) as AsyncIterable<Uint8Array>) {
      total += chunk.length;
      if (total > limit) throw new HttpFail(413, tooLarge);
      hasher.update(chunk);
      await handle.write(chunk);
    }
  } finally {
    await handle.close();
  }
  return { hash: hasher.digest("hex"), bytes: total };
}
