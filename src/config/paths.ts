import { join } from "node:path";

/** Versioned buckets (as uv's cache does): a layout change bumps the bucket, never reinterprets old entries. */
export interface HomeLayout {
  root: string;
  envs: string;
  locks: string;
  leases: string;
  trash: string;
  interpreters: string;
  /** Stat caches of local inputs' content digests (path, size, mtime, inode → sha256), as git's index. */
  digests: string;
  tools: string;
  jobs: string;
  images: string;
  configFile: string;
}

/** `root` is the `home` setting (src/config/table.ts): GPULAYER_HOME, else $XDG_CACHE_HOME/gpulayer, else ~/.cache/gpulayer. */
export function homeLayout(root: string, configFile: string = join(root, "config.yaml")): HomeLayout {
  return {
    root,
    envs: join(root, "envs-v1"),
    locks: join(root, "locks"),
    leases: join(root, "leases"),
    trash: join(root, "trash"),
    interpreters: join(root, "interpreters-v1"),
    digests: join(root, "digests-v2"),
    tools: join(root, "tools"),
    jobs: join(root, "jobs"),
    images: join(root, "images-v1"),
    configFile,
  };
}
