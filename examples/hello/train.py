"""A stand-in for a training script: uses its requirement and reports what it ran on."""
import os
import sys
import time

from tqdm import tqdm

total = 0
for step in tqdm(range(20), desc="train", ncols=70):
    total += step
    time.sleep(0.01)

print(f"done: sum={total} python={sys.executable} env={os.environ.get('VIRTUAL_ENV')}")
