import sys,json,re,collections
d=collections.defaultdict(list); name=None; names=[]
for line in open(sys.argv[1]):
    m=re.match(r'=== latency round (\d+) image (\S+)',line)
    if m:
        name=m.group(2); names.append(name) if name not in names else None; continue
    if line.startswith('=== '): name=None; continue
    if name and line.startswith('{') and '"all_reduce"' in line:
        r=json.loads(line)
        d[(name,r['world'],r['bytes'],r['route'])].append(r['graph_us_per_call'])
keys=sorted({k[1:] for k in d})
print('| world | bytes | route | '+' | '.join(names)+' |')
for k in keys:
    print('|',' | '.join(map(str,k)),'|',' | '.join('/'.join(f"{x:.2f}" for x in d.get((n,)+k,[])) for n in names),'|')
