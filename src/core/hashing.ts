/** sha256 of the data, in hex. */
export function contentHash(data: string | Uint8Array): string {
  return new Bun.CryptoHasher("sha256").update(data).digest("hex");
}
