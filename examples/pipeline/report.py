"""Sums the rows with a progress bar; says which tqdm its env has."""
import json
import os

import tqdm

rows = json.load(open("rows.json"))[: int(os.environ["ROWS"])]
total = sum(tqdm.tqdm(rows, desc="summing", disable=None))
print(f"tqdm {tqdm.__version__}: sum of {len(rows)} rows = {total}")
