"""Which kernels' PTX differs between two GPU proxy builds (dev/gpu_proxy/build.py build --out DIR): each entry
point's body compared with its labels, local-depot and callee names numbered alike, so a change to how kernels are
written (templates and instantiation lines instead of written-out kernels) that leaves the generated code alone
shows as "identical", and needs no GPU to show it.

    python3 dev/gpu_proxy/ptx_diff.py BEFORE_DIR AFTER_DIR      # exit status 1 when some kernel differs
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\((.*?)\n\}\n", re.S)


def entries(ptx: Path) -> dict[str, str]:
    """{entry name: its parameter list and body, numbering and comments normalised}."""
    out = {}
    for m in _ENTRY.finditer(ptx.read_text()):
        body = re.sub(r"//.*", "", m.group(2))
        body = re.sub(r"__local_depot\d+", "__local_depot", body)
        body = re.sub(r"\$L__BB\d+_", "$L__BB_", body)
        body = re.sub(r"\b(?:gpu_proxy_entry_\w+|_Z\w+)", "F", body)
        out[m.group(1)] = body
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args()
    differ = 0
    for a in sorted(args.before.rglob("*.ptx")):
        rel = a.relative_to(args.before)
        b = args.after / rel
        if not b.is_file():
            print(f"{rel}: missing in {args.after}")
            differ += 1
            continue
        ea, eb = entries(a), entries(b)
        same = [k for k in ea if eb.get(k) == ea[k]]
        changed = sorted(k for k in ea if k in eb and eb[k] != ea[k])
        gone, new = sorted(set(ea) - set(eb)), sorted(set(eb) - set(ea))
        differ += len(changed) + len(gone) + len(new)
        print(f"{rel}: {len(same)} of {len(ea)} entry points identical"
              + (f"; differ: {', '.join(changed)}" if changed else "")
              + (f"; only before: {', '.join(gone)}" if gone else "") + (f"; only after: {', '.join(new)}" if new else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
