"""Each thread's share of one core over a replay, from cpu_sample.py's log (CPU ticks a thread
used in each 2 s sample): python docs/results/team-keystrokes-zen4/cpu_summary.py LOG"""
import collections
import json
import sys

ticks, samples = collections.Counter(), 0
for line in open(sys.argv[1]):
    samples += 1
    for key, used in json.loads(line).items():
        role, pid, tid, _ = key.split(":", 3)
        ticks[(role, tid)] += used
seconds = samples * 2
for (role, tid), used in ticks.most_common():
    print(f"{role:7s} thread {tid}: {used / 100:7.1f} CPU s, {used / seconds:5.1f}% of one core")
for role in ("server", "client"):
    print(f"{role} in all: {sum(v for (r, _), v in ticks.items() if r == role) / seconds:.1f}% of one core over {seconds} s")
