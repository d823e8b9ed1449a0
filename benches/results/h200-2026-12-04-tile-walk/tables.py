#!/usr/bin/env python3
"""tables.py: the tables of ../h200-2026-12-04-tile-walk.md from this folder's logs.
latency LOG IMG_A IMG_B   plain all_reduce, graph and eager us per image and round
fused LOG                 fused_norm_bench rows: graph ar/fused (fused/ar) per image and table"""
import collections, json, re, sys

def latency(log, a, b):
    cur, d = None, collections.defaultdict(lambda: collections.defaultdict(list))
    for l in open(log):
        m = re.match(r'=== latency (?:round \d|world 2) image (\w+)', l)
        if m: cur = m.group(1); continue
        if l.startswith('=== '): cur = None; continue
        if cur and l.startswith('{') and '"all_reduce"' in l:
            j = json.loads(l)
            d[(j['world'], j['bytes'], j['asked'])][cur].append((j['graph_us_per_call'], j['eager_us_per_call']))
    print(f"| world | bytes | route | {a} graph | {b} graph | {b}/{a} | {a} eager | {b} eager |")
    print("| ---: | ---: | :--- | ---: | ---: | ---: | ---: | ---: |")
    for (w, n, r), v in sorted(d.items()):
        if a not in v or b not in v: continue
        ga = [x[0] for x in v[a]]; gb = [x[0] for x in v[b]]
        ratio = (sum(gb) / len(gb)) / (sum(ga) / len(ga))
        f = lambda xs: '/'.join(f"{x:.2f}" for x in xs)
        print(f"| {w} | {n} | {r} | {f(ga)} | {f(gb)} | {ratio:.2f} | {f([x[1] for x in v[a]])} | {f([x[1] for x in v[b]])} |")

def fused(log):
    cur, d = None, collections.defaultdict(lambda: collections.defaultdict(list))
    for l in open(log):
        m = re.match(r'=== (?:cmp|w2x?) round \d image (\w+)(?: (\w+))?', l)
        if m: cur = (m.group(1), m.group(2) or 'table'); continue
        if l.startswith('=== '): cur = None; continue
        if cur and l.startswith('| ') and l[2].isdigit():
            c = [x.strip() for x in l.split('|')[1:-1]]
            d[(int(c[0]), int(c[1]), int(c[2]), cur[1], c[15])][cur[0]].append(
                f"{c[9]}/{c[11]} ({c[12]}){'' if c[16] == 'yes' else ' bits differ'}")
    print("| world | hidden | rows | table | route | image: graph ar/fused us (fused/ar), per round |")
    print("| ---: | ---: | ---: | :--- | :--- | :--- |")
    for (w, hd, r, t, route), v in sorted(d.items()):
        print(f"| {w} | {hd} | {r} | {t} | {route} | " + '; '.join(f"{i}: {', '.join(x)}" for i, x in v.items()) + " |")

if __name__ == '__main__':
    {'latency': lambda: latency(*sys.argv[2:5]), 'fused': lambda: fused(sys.argv[2])}[sys.argv[1]]()
