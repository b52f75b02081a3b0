"""How much a rejected async-PPO launch costs, relative to starting Python with argparse.

Runs `python train_async.py --advantage-estimator ppo` (rejected by the contract, exit 2) and
`python -c "import argparse"` alternately, and prints the ratio of their median wall times as the last line.
Usage: python bench/contract_startup.py [--repeats 20] [-O]
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def wall_time(command: list[str], expected_status: int) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != expected_status:
        raise SystemExit(f"{command} exited {result.returncode}, expected {expected_status}:\n{result.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("-O", dest="optimize", action="store_true", help="run both under python -O")
    options = parser.parse_args()
    python = [sys.executable, *(["-O"] if options.optimize else [])]
    rejected, baseline = [], []
    for _ in range(options.repeats):
        rejected.append(wall_time([*python, "train_async.py", "--advantage-estimator", "ppo"], expected_status=2))
        baseline.append(wall_time([*python, "-c", "import argparse"], expected_status=0))
    rejected_s, baseline_s = statistics.median(rejected), statistics.median(baseline)
    print(f"rejected launch: {rejected_s * 1e3:.1f} ms median; python -c 'import argparse': {baseline_s * 1e3:.1f} ms")
    print(f"contract rejection costs {rejected_s / baseline_s:.2f}x a bare Python start")


if __name__ == "__main__":
    main()
