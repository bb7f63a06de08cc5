"""Compiles the embedded PTX with the GPU machine's ptxas (-v) and lists, per entry, the
registers and spill bytes the NVIDIA compiler chose: the NVPTX twin of the code-object
checks (build-support only sees the PTX, where spills do not show yet).

usage: ptxas_report.py FILE.ptx [sm_90]
"""
import re
import subprocess
import sys


def main():
    ptx, arch = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "sm_90")
    out = subprocess.run(["ptxas", f"-arch={arch}", "-v", ptx, "-o", "/dev/null"], capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stderr)
        sys.exit(1)
    entries, cur = {}, None
    for line in out.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            cur = m.group(1)
            entries[cur] = dict(regs=0, spill=0)
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            entries[cur]["spill"] = int(m.group(1)) + int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            entries[cur]["regs"] = int(m.group(1))
    spilling = {k: v for k, v in entries.items() if v["spill"]}
    print(f"ptxas {arch}: {len(entries)} entries, max {max(v['regs'] for v in entries.values())} registers, "
          f"{len(spilling)} with spills {spilling}")


if __name__ == "__main__":
    main()
