"""A fake system process for cugraphrt.bench.children: ``python bench_child.py MODE NAME``.

Modes: ``decode`` (hf_decode's report, by system name); ``ok`` (samples are CLOCK_MONOTONIC
readings, comparable across processes, so the parent can check the order the children ran
in); ``noisy`` (other output around the protocol, several lines in one write);
``setup_crash``; ``round_crash`` (dies at its second sample); ``silent`` (never says READY).
"""

from __future__ import annotations

import sys
import time

from cugraphrt.bench.children import serve


def main(mode: str, name: str) -> None:
    if mode == "setup_crash":
        print(f"{name}: CUDA error: an illegal memory access was encountered", file=sys.stderr)
        sys.exit(3)
    if mode == "silent":
        time.sleep(60)
    if mode == "noisy":
        sys.stdout.write("compiling...\nREADY-ish line\n")
        sys.stdout.flush()
    count = 0

    def sample() -> float:
        nonlocal count
        count += 1
        if mode == "round_crash" and count == 2:
            print("Segmentation fault", file=sys.stderr)
            sys.stderr.flush()
            sys.exit(139)
        if mode == "noisy":
            sys.stdout.write("a warning from a library\n")
        return time.monotonic()

    info = {"name": name, "tokens": [1, 2, 3]}
    if mode == "decode":  # hf_decode's report: Inductor's numerics part from eager's at 10
        inductor = name in ("torch_inductor", "torch_compile", "cugraphrt_compile")
        info = {"tokens": [7 if inductor and i >= 10 else i for i in range(65)],
                "setup_s": 1.5, "memory_bytes": 3 << 20}
    serve(info, sample)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
