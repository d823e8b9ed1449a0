#!/usr/bin/env python3
"""tables.py: the tables of ../h200-2026-12-05-epilogue-rows.md from this folder's logs.
rule LOG    per world, hidden, rows (both rounds): graph us of the all_reduce, the two launches,
            the one kernel (the form before: every batch of <= 64 rows) and the front door's
            call (fused), with fused - one kernel
forms LOG   the same for every block of a log (default table and forced routes), one line a point"""
import collections, re, sys

BLOCKS = {2: 66, 4: 33, 8: 16}  # 132 multiprocessors over the ranks sharing the H200

def points(log):
    cur = None
    for l in open(log):
        if l.startswith('=== '):
            cur = l[4:].split(' (')[0]; continue
        f = [x.strip() for x in l.split('|')]
        if cur and len(f) > 17 and f[16].startswith('ipc_'):
            yield cur, int(f[1]), int(f[2]), int(f[3]), f[16], float(f[10]), float(f[11]), float(f[12]), float(f[14]), f[17], f[18]

def rule(log):
    d = collections.defaultdict(list)
    for _, w, h, r, route, ar, unf, fused, one, same, ref in points(log):
        d[(w, h, r, route)].append((ar, unf, one, fused, same, ref))
    print("| world | hidden | rows | route | blocks | ar | two launches | one kernel (before) | fused (now) | fused - one kernel | bits |")
    print("| ---: | ---: | ---: | :--- | ---: | :--- | :--- | :--- | :--- | :--- | :---: |")
    for (w, h, r, route), v in sorted(d.items()):
        col = lambda i: ' / '.join(f"{x[i]:.2f}" for x in v)
        diff = ' / '.join(f"{x[3] - x[2]:+.2f}" for x in v)
        bits = 'yes' if all(x[4] == 'yes' and x[5] == 'yes' for x in v) else 'NO'
        print(f"| {w} | {h} | {r} | {route} | {BLOCKS[w]} | {col(0)} | {col(1)} | {col(2)} | {col(3)} | {diff} | {bits} |")

def forms(log):
    for block, w, h, r, route, ar, unf, fused, one, same, ref in points(log):
        print(f"{block:45s} {w} {h:5d} {r:3d} {route:13s} ar {ar:6.2f} two {unf:6.2f} one {one:6.2f} fused {fused:6.2f} bits {same}/{ref}")

if __name__ == '__main__':
    {'rule': rule, 'forms': forms}[sys.argv[1]](sys.argv[2])
