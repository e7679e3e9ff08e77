"""Compares the fleet's verdicts with Apple's library on a corpus written by
`FLEET_FUZZ_DIFFERENTIAL=DIR .build-fuzz/debug/fleet-fuzz` (the same corpus DifferentialTests builds).

Usage: compare.py DIR   -> one line per (mutation, fleet verdict, Apple's verdict) group where they disagree.
"""
import collections
import os
import subprocess
import sys

d = sys.argv[1]
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(d, "input.tsv")) as f:
    theirs = subprocess.run(
        [sys.executable, os.path.join(here, "apple_verdicts.py"), os.path.join(d, "root.der"), "com.example.fleet",
         "1234567890", "Sandbox"], stdin=f, capture_output=True, text=True, check=True).stdout.splitlines()
ours = open(os.path.join(d, "fleet.txt")).read().splitlines()
mutations = open(os.path.join(d, "mutations.txt")).read().splitlines()
assert len(ours) == len(theirs) == len(mutations), (len(ours), len(theirs), len(mutations))
agree = sum((a == "verified") == (b == "verified") for a, b in zip(ours, theirs))
both = sum(a == b == "verified" for a, b in zip(ours, theirs))
groups = collections.Counter(
    (m.split(":")[0] + (":" + m.split(":")[1] if m.startswith("claim") else ""), a, b)
    for m, a, b in zip(mutations, ours, theirs) if (a == "verified") != (b == "verified"))
print(f"{len(ours)} inputs, {agree} agree ({both} verified by both), {len(ours) - agree} disagree")
for (m, a, b), n in groups.most_common():
    print(f"  {n:5d}  {m:28s} fleet {a.replace(chr(9), ' '):40s} Apple {b.replace(chr(9), ' ')}")
