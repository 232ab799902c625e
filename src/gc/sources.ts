import type { HomeLayout } from "../config/paths.ts";
import { envSource } from "./env-source.ts";
import type { GcSource } from "./types.ts";

/**
 * Everything gc looks after, one source per kind. Images plug in here:
 * `imageSource(layout)` from src/gc/image-source.ts (see types.ts), and gc
 * then weighs environments and images against one limit, by last use.
 */
export function gcSources(layout: HomeLayout): GcSource[] {
  return [envSource(layout)];
}
