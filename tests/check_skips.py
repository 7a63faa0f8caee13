#!/usr/bin/env python3
"""`make test`'s last word on skips: a green run means the suite ran.

Reads ctest's JUnit report and fails, naming them, when tests were skipped that should run on this
machine. A test may be skipped only for something this machine lacks, named in its skip message as
`[needs: WHAT]`, and only where the machine really lacks it:

  [needs: gpu]     an NVIDIA GPU (/dev/nvidia0 or `nvidia-smi -L`)
  [needs: no gpu]  no GPU (the CPU-only checks a GPU machine replaces)
  [needs: root]    root with CAP_SYS_ADMIN (mounting a tmpfs, network namespaces, running slurmd)
  [needs: avx512]  the AVX-512 kernels' CPU features (avx512f, bw, vl, dq)

Anything else -- ../shared missing, a reference fixture `make test` should have written, a package
`make test` installs, network namespaces failing as root, a skip that names no need -- fails.

Usage: check_skips.py CTEST_JUNIT.xml
"""
import glob
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

CAP_SYS_ADMIN = 21


def gpu_present():
    if glob.glob("/dev/nvidia[0-9]*"):
        return True
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "GPU " in out


def admin():
    if os.geteuid() != 0:
        return False
    with open("/proc/self/status") as f:
        caps = next((line.split()[1] for line in f if line.startswith("CapEff:")), "0")
    return bool(int(caps, 16) >> CAP_SYS_ADMIN & 1)


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        return set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))


# need -> (whether this machine lacks it, what this machine is in that respect)
def lacks(need):
    if need == "gpu":
        have = gpu_present()
        return not have, "a GPU is here" if have else "no GPU here"
    if need == "no gpu":
        have = gpu_present()
        return have, "a GPU is here" if have else "no GPU here"
    if need == "root":
        have = admin()
        return not have, "root with CAP_SYS_ADMIN" if have else "not root with CAP_SYS_ADMIN"
    if need == "avx512":
        have = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= cpu_flags()
        return not have, "the CPU has AVX-512" if have else "the CPU lacks AVX-512"
    return False, f"'{need}' is no need this check knows"


def reason(output):
    """The skip message: GoogleTest's line after `Skipped`, else the lines that say SKIP."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.endswith(": Skipped") and i + 1 < len(lines):
            return lines[i + 1].strip()
    said = [line.strip() for line in lines if "SKIP" in line.upper() and not line.startswith("[  SKIPPED")]
    return " / ".join(said) or (lines[-1].strip() if lines else "(no output)")


def main(path):
    skipped = []
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.get("status") == "notrun" and case.find("skipped") is not None:
            out = case.find("system-out")
            skipped.append((case.get("name"), reason((out.text or "") if out is not None else "")))
    allowed, wrong = [], []
    for name, why in skipped:
        needs = re.findall(r"\[needs: ([^\]]+)\]", why)
        verdicts = [lacks(n) for n in needs]
        if needs and all(ok for ok, _ in verdicts):
            allowed.append(f"{name} ({', '.join(note for _, note in verdicts)})")
        else:
            notes = [note for ok, note in verdicts if not ok]
            wrong.append(f"  {name}: {why}" + (f"  <- {'; '.join(notes)}" if notes else ""))
    if allowed:
        print(f"skipped, as this machine lacks what they need: {len(allowed)}: " + ", ".join(allowed))
    if wrong:
        print(f"make test: FAILED: {len(wrong)} test(s) skipped that should run on this machine:")
        print("\n".join(wrong))
        print("(a test may be skipped only for a [needs: ...] this machine lacks; see tests/check_skips.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
