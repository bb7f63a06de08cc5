#!/usr/bin/env python3
"""Instruction mix of SASS address ranges: sass_mix.py FILE.sass LO-HI [LO-HI ...] (hex
addresses of `cuobjdump -sass`); prints the count, the HMMAs, instructions per HMMA and
the opcodes, predicates stripped."""
import re,sys,collections
ins=[]
for l in open(sys.argv[1]):
    m=re.match(r'\s+/\*([0-9a-f]{4,})\*/\s+(.*?);',l)
    if m: ins.append((int(m.group(1),16),m.group(2)))
tot=collections.Counter(); n=0; h=0
for spec in sys.argv[2:]:
    lo,hi=[int(x,16) for x in spec.split('-')]
    for a,t in ins:
        if lo<=a<hi:
            t2=re.sub(r'^@!?U?P\w+\s+','',t)
            op=t2.split()[0]
            tot[op]+=1; n+=1; h+='HMMA' in op
print("%d instructions, %d HMMA, %.2f/HMMA"%(n,h,n/max(h,1)))
for op,k in tot.most_common(50): print("%6d %s"%(k,op))
