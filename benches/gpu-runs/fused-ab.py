import sys, glob, statistics, re, os
d = sys.argv[1]
# Which two images: `fused-ab.py DIR [NEW OLD]` (default new against old).
NEW, OLD = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else ('new', 'old')
# Columns named once in fused_norm_bench's header (later versions added `fused route` and
# `floor`, so these are looked up, not counted from the end).
col = {}
def load(tag):
    runs = {}
    for f in sorted(glob.glob(f"{d}/{tag}-*.md")):
        for line in open(f):
            c = [x.strip() for x in line.strip().strip('|').split('|')]
            if c and c[0] == 'world':
                col.update({name: i for i, name in enumerate(c)})
            if len(c) < 18 or not c[0].isdigit(): continue
            key = (int(c[0]), int(c[1]), int(c[2]))
            runs.setdefault(key, []).append(c)
    return runs
new, old = load(NEW), load(OLD)
med = lambda rows, i: statistics.median(float(r[i]) for r in rows)
print("| world | hidden | rows | ar route | fused route | ar us (new run) | fused us before | form before | fused us now | form now | now/before | fused/ar before | fused/ar now | one kernel before | one kernel now | ar new/old | bits |")
print("| ---: | ---: | ---: | :--- | :--- | ---: | ---: | :--- | ---: | :--- | ---: | ---: | ---: | ---: | ---: | ---: | :--- |")
for k in sorted(new):
    if k not in old: continue
    n, o = new[k], old[k]
    ar_n, ar_o = med(n, 9), med(o, 9)
    fn, fo = med(n, 11), med(o, 11)
    okn, oko = med(n, 13), med(o, 13)
    bits = all(r[col['same bits']] == 'yes' and r[col['= reference']] == 'yes' for r in n + o)
    form = col['fused form']
    print(f"| {k[0]} | {k[1]} | {k[2]} | {n[0][15]} | {n[0][16]} | {ar_n:.2f} | {fo:.2f} | {o[0][form]} | {fn:.2f} | {n[0][form]} | {fn/fo:.3f} | {fo/ar_o:.3f} | {fn/ar_n:.3f} | {oko:.2f} | {okn:.2f} | {ar_n/ar_o:.3f} | {'yes' if bits else 'NO'} ({len(n)}+{len(o)}) |")
