import sys, re, collections
# usage: cmp.py LOG  -> per (world,hidden,rows): per image list of (graph ar, graph fused) over rounds
d = collections.OrderedDict(); img = None
for line in open(sys.argv[1]):
    m = re.match(r"=== (?:cmp|rowform) round (\d+) image (\S+)", line)
    if m: img = m.group(2); continue
    if line.startswith("=== "): img = None; continue
    if img and line.startswith("| ") and not line.startswith("| world") and not line.startswith("| ---"):
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(c) < 17: continue
        k = (c[0], c[1], c[2], c[15]); d.setdefault(k, collections.OrderedDict()).setdefault(img, []).append((float(c[9]), float(c[11]), c[16]))
imgs = []
for v in d.values():
    for i in v:
        if i not in imgs: imgs.append(i)
print("| world | hidden | rows | route | " + " | ".join(f"{i} ar | {i} fused" for i in imgs) + " | bits |")
for k, v in d.items():
    cells = []
    for i in imgs:
        r = v.get(i, [])
        cells.append("/".join(f"{a:.2f}" for a, _, _ in r)); cells.append("/".join(f"{f:.2f}" for _, f, _ in r))
    same = all(s == "yes" for r in v.values() for _, _, s in r)
    print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | " + " | ".join(cells) + f" | {'yes' if same else 'NO'} |")
