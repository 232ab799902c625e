import type { SettingValues } from "../config/table.ts";

/** What a bundle may hold; a module of its own, so naming a server costs no tar code. */
export interface BundleLimits {
  /** The packed bundle (what travels). */
  maxBytes: number;
  /** The files inside it, unpacked. */
  maxUnpackedBytes: number;
  maxEntries: number;
}

/** From the bundle.max_size and bundle.max_unpacked settings. */
export function bundleLimits(values: Pick<SettingValues, "bundle.max_size" | "bundle.max_unpacked">): BundleLimits {
  return { maxBytes: values["bundle.max_size"], maxUnpackedBytes: values["bundle.max_unpacked"], maxEntries: 200_000 };
}
