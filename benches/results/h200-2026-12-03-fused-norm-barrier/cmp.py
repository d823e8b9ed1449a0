#!/usr/bin/env python3
"""cmp.py ALL.LOG A B [suffixes]: compare fused_norm_bench tables of runs bench_A_* and bench_B_* (median over rounds)."""
import sys, re, statistics as st
log, A, B = sys.argv[1], sys.argv[2], sys.argv[3]
sfx = sys.argv[4].split(',') if len(sys.argv) > 4 else ['1', '2']
runs, cur = {}, None
for line in open(log):
    m = re.match(r'##### (\S+) rc=', line)
    if m: cur = m.group(1); runs[cur] = {}; continue
    if cur and cur.startswith("bench_") and line.startswith("| ") and not line.startswith('| world') and not line.startswith('| ---'):
        c = [x.strip() for x in line.strip().strip('|').split('|')]
        key = (int(c[0]), int(c[1]), int(c[2]))
        runs[cur][key] = dict(ar=float(c[4]), unf=float(c[5]), fu=float(c[6]), gar=float(c[9]), gunf=float(c[10]), gfu=float(c[11]), same=c[13])
def med(v, s, key, f):
    xs = [runs[f'bench_{v}_{x}'][key][f] for x in s if f'bench_{v}_{x}' in runs and key in runs[f'bench_{v}_{x}']]
    return st.median(xs) if xs else float('nan')
keys = sorted(set().union(*[runs[f'bench_{A}_{x}'].keys() for x in sfx if f'bench_{A}_{x}' in runs]))
print(f'| world | hidden | rows | graph ar {A} | {B} | graph fused {A} | {B} | fused/ar {A} | {B} | eager ar {A} | {B} | eager fused {A} | {B} | same |')
print('| ---: '*13 + '| :---: |')
for k in keys:
    ga, gb = med(A, sfx, k, 'gar'), med(B, sfx, k, 'gar'); fa, fb = med(A, sfx, k, 'gfu'), med(B, sfx, k, 'gfu')
    ea, eb = med(A, sfx, k, 'ar'), med(B, sfx, k, 'ar'); efa, efb = med(A, sfx, k, 'fu'), med(B, sfx, k, 'fu')
    same = all(runs[f'bench_{v}_{x}'][k]['same'] == 'yes' for v in (A, B) for x in sfx if f'bench_{v}_{x}' in runs and k in runs[f'bench_{v}_{x}'])
    print(f'| {k[0]} | {k[1]} | {k[2]} | {ga:.2f} | {gb:.2f} | {fa:.2f} | **{fb:.2f}** | {fa/ga:.2f} | **{fb/gb:.2f}** | {ea:.2f} | {eb:.2f} | {efa:.2f} | {efb:.2f} | {"yes" if same else "NO"} |')
