"""How long `grpo-service ... --help` takes to start, against a bare interpreter (median of N runs).

    python scripts/measure_cli_startup.py [--runs 7]

The goal is under 0.5 s for `grpo-service --help` on the development machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python -c pass (baseline)": [sys.executable, "-c", "pass"],
    "grpo-service --help": [sys.executable, "-m", "grpo_service.cli", "--help"],
    "grpo-service rollout --help": [sys.executable, "-m", "grpo_service.cli", "rollout", "--help"],
    "grpo-service eval --help": [sys.executable, "-m", "grpo_service.cli", "eval", "--help"],
    "grpo-service traces show --help": [sys.executable, "-m", "grpo_service.cli", "traces", "show", "--help"],
}


def seconds(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    for name, argv in COMMANDS.items():
        seconds(argv)  # warm the page cache
        times = sorted(seconds(argv) for _ in range(runs))
        median = statistics.median(times)
        print(f"{name:36s} median {median:.3f} s  (min {times[0]:.3f}, max {times[-1]:.3f})")


if __name__ == "__main__":
    main()
