/** Examples shown under `--help`, by command path: a help that teaches by showing. */
export const EXAMPLES: Record<string, string[]> = {
  "": [
    "gpulayer env prepare requirements.txt --python /opt/venv/bin/python",
    "gpulayer job run -p tqdm -- python train.py --epochs 3",
    "gpulayer gc --max-size 200G --quiet          # from cron",
  ],
  "env prepare": [
    "gpulayer env prepare requirements.txt                      # build once, then reuse (prints the env's path)",
    "gpulayer env prepare -p tqdm -p 'numpy<3' --json           # {key, path, status: built|reused, seconds}",
    "gpulayer env prepare -r req.txt --index-url http://mirror/simple --python /opt/venv/bin/python",
    "gpulayer env prepare --image registry.local/team/train:1   # pull ahead of jobs",
    "gpulayer env prepare requirements.txt --dry-run            # the key, reuse or build, and every input it covers",
    "GPULAYER_INSTALLER=pip gpulayer env prepare req.txt        # force the pip build (default: uv fast path when possible)",
  ],
  "env list": ["gpulayer env list", "gpulayer env list --json"],
  "env show": ["gpulayer env show 9c1e", "gpulayer env show 9c1e --json"],
  "env rm": ["gpulayer env rm 9c1e", "gpulayer env rm 9c1e --force    # even while a job uses it"],
  "job run": [
    "gpulayer job run -f job.yaml",
    "gpulayer job run -p tqdm -p 'numpy<3' -- python train.py --epochs 3",
    "gpulayer job run -r requirements.txt -e WANDB_MODE=offline -- python train.py",
    "gpulayer job run --image busybox:1 -- sh -c 'echo hi'",
    "gpulayer job run -d -f job.yaml          # background; prints the job id",
    "gpulayer job run --json -f job.yaml      # status document on stdout, job output on stderr",
  ],
  "job status": ["gpulayer job status 3f0c", "gpulayer job status 3f0c --json"],
  "job logs": ["gpulayer job logs 3f0c", "gpulayer job logs 3f0c --follow"],
  "job list": ["gpulayer job list", "gpulayer job list --limit 10 --json"],
  "job cancel": ["gpulayer job cancel 3f0c", "GPULAYER_CANCEL_GRACE=30 gpulayer job cancel 3f0c"],
  gc: [
    "gpulayer gc --max-size 50G --dry-run      # what would go, nothing removed",
    "gpulayer gc --max-size 200G --quiet       # cron: */15 * * * * root gpulayer gc --max-size 200G --quiet",
    "gpulayer gc --high-watermark 85 --low-watermark 80",
    "gpulayer gc --max-size 50G --keep 9c1e --json",
  ],
  join: [
    "gpulayer join --python /opt/venv/bin/python --label zone=a     # save this box's worker settings, show its probe",
    "gpulayer join http://coord:7070 --token T --python /opt/venv/bin/python",
  ],
  server: ["gpulayer server --listen 0.0.0.0:7070     # prints a join token on first start"],
  workers: ["GPULAYER_SERVER=http://coord:7070 GPULAYER_TOKEN=T gpulayer workers"],
  version: ["gpulayer version", "gpulayer version --json"],
};
