import { afterAll } from "bun:test";
import { removeTempDirs } from "./helpers.ts";

// Preloaded (bunfig.toml), so this hook belongs to the whole run: the temporary folders the tests made go when it ends.
// (Time limits are each file's own: setDefaultTimeout here would hold only until a file set another.)
// Given minutes: the whole run's folders (envs, caches, a Ray venv's copies) can be gigabytes on a slow disk.
afterAll(removeTempDirs, 300_000);
