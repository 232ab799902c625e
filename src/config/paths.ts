import { homedir } from "node:os";
import { join, resolve } from "node:path";

/** Where everything lives: GPULAYER_HOME, else $XDG_CACHE_HOME/gpulayer, else ~/.cache/gpulayer. */
export function gpulayerHome(env: NodeJS.ProcessEnv = process.env): string {
  if (env.GPULAYER_HOME) return resolve(env.GPULAYER_HOME);
  if (env.XDG_CACHE_HOME) return join(resolve(env.XDG_CACHE_HOME), "gpulayer");
  return join(env.HOME || homedir(), ".cache", "gpulayer");
}

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

export function homeLayout(root: string = gpulayerHome()): HomeLayout {
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
    configFile: process.env.GPULAYER_CONFIG || join(root, "config.yaml"),
  };
}
