import { defineCommand } from "citty";

export default defineCommand({
  meta: { name: "gc", description: "Keep the cache under a size limit" },
  run() {},
});
