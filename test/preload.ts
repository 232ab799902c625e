import { afterAll } from "bun:test";
import { removeTempDirs } from "./helpers.ts";

// Preloaded (bunfig.toml), so this hook belongs to the whole run: the temporary folders the tests made go when it ends.
afterAll(removeTempDirs);
