import type { HomeLayout } from "../config/paths.ts";
import type { EngineEnv } from "../docker/engine.ts";
import { bundleSource } from "./bundle-source.ts";
import { bytecodeSource } from "./bytecode-source.ts";
import { envSource } from "./env-source.ts";
import { imageSource } from "./image-source.ts";
import type { GcSource } from "./types.ts";
import { wheelSource } from "./wheel-source.ts";

/**
 * Everything gc looks after, one source per kind: environments, the
 * images gpulayer pulled and a worker's copies of remote jobs' bundles and the wheels
 * compiled without build isolation (the wheelhouse), and the bytecode store,
 * weighed against one limit, by last use.
 */
export function gcSources(layout: HomeLayout, engineEnv: EngineEnv): GcSource[] {
  return [envSource(layout), imageSource(layout, engineEnv), bundleSource(layout), wheelSource(layout), bytecodeSource(layout)];
}
