import { UsageError } from "../errors.ts";

/** HOST:PORT, :PORT or PORT (default 127.0.0.1:7070). */
export function parseListen(value: string | undefined, flag = "--listen"): { hostname: string; port: number } {
  const text = value ?? "127.0.0.1:7070";
  const m = /^(?:\[?([^\]]*?)\]?:)?(\d{1,5})$/.exec(text);
  const port = Number(m?.[2]);
  if (!m || port > 65535) throw new UsageError(`${flag} ${text}: expected HOST:PORT (e.g. 0.0.0.0:7070)`);
  return { hostname: m[1] || "127.0.0.1", port };
}
