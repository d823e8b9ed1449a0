import re,collections,sys
d=collections.defaultdict(list)
name=None
names=[]
for line in open(sys.argv[1]):
    m=re.match(r'##### (bench_\S+)_(\d) rc',line)
    if m:
        name=m.group(1)
        if name not in names: names.append(name)
        continue
    if name and line.count("|")>12 and line.startswith('| ') and not line.startswith('| world') and not line.startswith('| ---'):
        c=[x.strip() for x in line.strip().strip('|').split('|')]
        d[(name,c[0],c[1],c[2])].append(float(c[int(sys.argv[2]) if len(sys.argv)>2 else 11]))
print('w hid rows | '+' | '.join(n[6:] for n in names))
keys=sorted({k[1:] for k in d}, key=lambda k:(int(k[0]),int(k[1]),int(k[2])))
for k in keys:
    print(' '.join(k),'|',' | '.join('/'.join(f"{x:.2f}" for x in d.get((n,)+k,[])) or '-' for n in names))
