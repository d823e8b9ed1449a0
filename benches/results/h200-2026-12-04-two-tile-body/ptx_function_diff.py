#!/usr/bin/env python3
"""fcmp.py A.ptx B.ptx: per-function comparison of two PTX files (line info, comments, labels and register numbers normalised)."""
import re, sys
def funcs(path):
    txt = open(path, 'rb').read().decode('latin1')
    out = {}; name = None; buf = []
    for line in txt.split('\n'):
        l = line.strip()
        if l.startswith('.loc') or l.startswith('//') or l.startswith('.file') or not l: continue
        m = re.match(r'^(?:\.visible\s+|\.weak\s+)?(?:\.entry|\.func)\s+(?:\(.*?\)\s*)?([A-Za-z0-9_$]+)', l)
        if m:
            if name: out[name] = buf
            name = m.group(1); buf = []
            continue
        if name is None: continue
        l = re.sub(r'\$L__[A-Za-z0-9_]*', 'L', l)
        l = re.sub(r'%(rd|r|p|f|rs|fd|h)[0-9]+', r'%\1', l)
        l = re.sub(r'\.reg \.(\w+)\s+%(\w+)<\d+>', r'.reg .\1 %\2<N>', l)
        l = re.sub(r'_ZZ[A-Za-z0-9_]*?E(\d+)?(s_?[a-z0-9_]*)\b', r'SH_\2', l)
        buf.append(l)
    if name: out[name] = buf
    return out
a, b = funcs(sys.argv[1]), funcs(sys.argv[2])
fix = lambda d: {k.replace("ELi1EEvRK", "EEvRK"): [x.replace("ELi1EEvRK", "EEvRK") for x in v] for k, v in d.items()}
a, b = fix(a), fix(b)
for n in sorted(set(a) | set(b)):
    if n not in a: print(f"+ {n} ({len(b[n])} lines)"); continue
    if n not in b: print(f"- {n} ({len(a[n])} lines)"); continue
    if a[n] != b[n]:
        import difflib
        d = [x for x in difflib.unified_diff(a[n], b[n], lineterm='', n=0) if x[:1] in '+-' and x[:3] not in ('+++', '---')]
        print(f"~ {n}: {len(a[n])} -> {len(b[n])} lines, {len(d)} changed")
import os
show = os.environ.get("SHOW")
if show:
    import difflib
    k = [n for n in a if show in n][0]
    for x in difflib.unified_diff(a[k], b[k], lineterm='', n=1): print(x)
