"""Wall time of ``autolayout demo`` as a new user runs it, and whether it leaves the tree clean.

    python benchmarks/demo_time.py              # 3 runs of `autolayout demo`
    python benchmarks/demo_time.py --runs 1 --no-execute

Each run is a fresh process (``python -m autolayout.cli demo``, imports included), as
the README's quickstart runs it, compiling everything (the demo does not use jax's
persistent compilation cache: ``autolayout.demo.compile_cache_dir``). Prints every run's wall time, the median, the machine's
load average before each run (timings on a shared machine are noisy: compare medians),
where the demo said its report is, and whether ``git status --porcelain`` is the same
before and after (the quickstart must not touch the repository). The target is 60 s on
the project's 2-core machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 60.0


def git_status() -> str:
    try:
        return subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"(git status unavailable: {exc})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-execute", action="store_true", help="time `autolayout demo --no-execute`")
    args = parser.parse_args(argv)
    cmd = [sys.executable, "-m", "autolayout.cli", "demo", "--quiet"] + (["--no-execute"] if args.no_execute else [])
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    before = git_status()
    times = []
    for i in range(args.runs):
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if run.returncode != 0:
            print(run.stdout[-2000:], run.stderr[-2000:], sep="\n")
            print(f"run {i + 1}: `{' '.join(cmd[2:])}` failed with exit code {run.returncode}")
            return 1
        last = run.stdout.strip().splitlines()[-1]
        times.append(wall)
        print(f"run {i + 1}: {wall:5.1f} s wall (load average {load:.1f} before)  last line: {last}")
    clean = git_status() == before
    med = statistics.median(times)
    print(f"`autolayout demo{' --no-execute' if args.no_execute else ''}` "
          f"(no compilation cache): median {med:.1f} s over {len(times)} "
          f"run(s) (min {min(times):.1f} s, max {max(times):.1f} s); target {TARGET_S:.0f} s: "
          f"{'met' if med <= TARGET_S else 'MISSED'}")
    print(f"git status after the runs: {'unchanged' if clean else 'CHANGED'}")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
