#!/usr/bin/env python3
"""latcmp.py ALL.LOG A B: cuda_bench latency all_reduce lines of runs lat_A and lat_B side by side (graph, eager)."""
import sys, json, re
log, A, B = sys.argv[1:4]
runs, cur = {}, None
for line in open(log):
    m = re.match(r'##### (\S+) rc=', line)
    if m: cur = m.group(1); runs[cur] = {}; continue
    if cur and cur.startswith('lat_') and line.startswith('{'):
        d = json.loads(line)
        if d.get('op') == 'all_reduce': runs[cur][(d['world'], d['bytes'], d['route'])] = (d['graph_us_per_call'], d['eager_us_per_call'])
print(f'| world | bytes | route | graph {A} | {B} | {B}/{A} | eager {A} | {B} |')
print('| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |')
for k in runs['lat_' + A]:
    a, b = runs['lat_' + A][k], runs['lat_' + B].get(k, (float('nan'),) * 2)
    print(f'| {k[0]} | {k[1]} | {k[2]} | {a[0]:.2f} | {b[0]:.2f} | {b[0]/a[0]:.3f} | {a[1]:.2f} | {b[1]:.2f} |')
