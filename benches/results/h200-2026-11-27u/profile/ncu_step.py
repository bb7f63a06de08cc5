#!/usr/bin/env python3
"""Summarise one decode step of an `ncu --graph-profiling node --csv --page raw` capture:
the launches between the last two lm-head launches (reads > 250 MB)."""
import csv, gzip, sys, collections
p = sys.argv[1]
f = gzip.open(p, 'rt') if p.endswith('.gz') else open(p)
lines = [l for l in f if l.startswith('"')]
rows = list(csv.reader(lines))
hdr = rows[0]; data = [r for r in rows[2:] if len(r) == len(hdr)]
ix = {h: i for i, h in enumerate(hdr)}
def val(r, k):
    try: return float(r[ix[k]].replace(',', ''))
    except: return 0.0
# units row
units = rows[1]
tu = units[ix['gpu__time_duration.sum']]; bu = units[ix['dram__bytes_read.sum']]
tscale = {'nsecond': 1e-3, 'ns': 1e-3, 'usecond': 1, 'us': 1, 'msecond': 1e3, 'ms': 1e3}.get(tu, 1)
bscale = {'byte': 1e-6, 'Kbyte': 1e-3, 'KB': 1e-3, 'Mbyte': 1, 'MB': 1, 'Gbyte': 1e3, 'GB': 1e3}.get(bu, 1)
K = [(r[ix['Kernel Name']].split('<')[0].split('(')[0], r[ix['launch__grid_size']], r[ix['launch__block_size']], val(r,'launch__registers_per_thread'), val(r,'gpu__time_duration.sum')*tscale, val(r,'dram__bytes_read.sum')*bscale) for r in data]
heads = [i for i, k in enumerate(K) if k[5] > 250]
print(f"{len(K)} launches profiled; lm-head launches at {heads}")
if len(heads) < 2: sys.exit(0)
a, b = heads[-2] + 1, heads[-1] + 1
step = K[a:b]
tot = sum(k[4] for k in step); mb = sum(k[5] for k in step)
print(f"one decode step: {len(step)} kernels, {tot:.1f} us, {mb:.1f} MB read, {mb/tot*1e-3*1e3:.0f} GB/s overall")
g = collections.OrderedDict()
for k in step:
    key = (k[0], k[1], k[2])
    e = g.setdefault(key, [0, 0.0, 0.0, k[3]]); e[0] += 1; e[1] += k[4]; e[2] += k[5]
print(f"{'kernel':50s} {'grid':>14s} {'block':>12s} {'regs':>4s} {'n':>4s} {'us_each':>8s} {'us_tot':>8s} {'MB_each':>8s} {'GB/s':>6s} {'%':>5s}")
for (n, gr, bl), (c, t, m, rg) in sorted(g.items(), key=lambda x: -x[1][1]):
    print(f"{n[:50]:50s} {gr:>14s} {bl:>12s} {rg:4.0f} {c:4d} {t/c:8.1f} {t:8.1f} {m/c:8.2f} {m/t*1e3 if t else 0:6.0f} {100*t/tot:5.1f}")
print("\nsequence (first 40 of the step):")
for k in step[:40]:
    print(f"   {k[0][:50]:50s} {k[1]:>14s} {k[2]:>12s} {k[4]:7.1f}us {k[5]:8.2f}MB")
