#!/usr/bin/env python3
"""Compare llama.cpp's two CPU attention paths in the greedy goldens (greedy-fa.jsonl vs
greedy-nofa.jsonl) and print a Markdown table: per prompt, the first step where the greedy
tokens differ, the largest difference of the top-1 logit while both runs still share their
context (steps up to and including the first difference), and FA's margin between its top two
logits at the first difference.

Usage: crates/llm/reference/compare-fa.py [GOLDEN_DIR]  (default: crates/llm/tests/golden)
"""
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
gdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "golden")


def load(name):
    with open(os.path.join(gdir, name), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


fa, nofa = load("greedy-fa.jsonl"), load("greedy-nofa.jsonl")
assert len(fa) == len(nofa)
print("| # | chat | prompt tokens | first differing step (FA / no-FA token) | max top-1 logit diff | FA top-2 margin there |")
print("|---|---|---|---|---|---|")
same = 0
overall = 0.0
for i, (a, b) in enumerate(zip(fa, nofa)):
    assert a["prompt"] == b["prompt"] and a["prompt_tokens"] == b["prompt_tokens"]
    n = min(len(a["tokens"]), len(b["tokens"]))
    first = next((s for s in range(n) if a["tokens"][s] != b["tokens"][s]), None)
    if first is None and len(a["tokens"]) == len(b["tokens"]):
        same += 1
    last = first if first is not None else n - 1
    diff = max(abs(a["top5"][s][0][1] - b["top5"][s][0][1]) for s in range(last + 1))
    overall = max(overall, diff)
    where, margin = "identical", ""
    if first is not None:
        where = "%d (%d / %d)" % (first, a["tokens"][first], b["tokens"][first])
        margin = "%.4f" % (a["top5"][first][0][1] - a["top5"][first][1][1])
    print("| %d | %s | %d | %s | %.4f | %s |" % (i, "yes" if a["chat"] else "no", len(a["prompt_tokens"]),
                                                where, diff, margin))
print()
print("%d of %d prompts give identical tokens with and without flash attention; "
      "largest top-1 logit difference on a shared context: %.4f" % (same, len(fa), overall))
