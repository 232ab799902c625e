import { afterAll, setDefaultTimeout } from "bun:test";
import { removeTempDirs } from "./helpers.ts";

// Preloaded (bunfig.toml), so these belong to the whole run. Real pip builds and real concurrent processes take
// seconds, not milliseconds (bunfig's own `timeout` is not read by this Bun); files may set a longer one.
setDefaultTimeout(120_000);
// The temporary folders the tests made go when the run ends.
afterAll(removeTempDirs);
