#!/usr/bin/env python3
"""Training speed of two builds of loraplex, side by side in one run.

Runs `loraplex-bench-train` of build A and of build B alternately (A B A B
...), so both see the same machine, and prints for every shape the bench
measures the median time of B's step over A's: below 1.0 B is faster.

  python3 bench/compare_builds.py BUILD_A BUILD_B [--runs 5] [--threads 2]
      [--rounds 3] [--env-a NAME=VALUE] [--env-b NAME=VALUE]
      [--bench "flags for loraplex-bench-train"]

BUILD_A and BUILD_B may be the same build with different environments
(e.g. --env-b OMP_WAIT_POLICY=active).

e.g. Debian's LibTorch 1.13 build (A) against the PyPI LibTorch 2.x one (B):

  python3 bench/compare_builds.py build-debian build --runs 5
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

LINE = re.compile(r"^(?P<label>\d+ slots x .*?): co-batched (?P<co>[0-9.]+) ms, "
                  r"\d+ single-slot steps (?P<apart>[0-9.]+) ms")


def run_bench(build, args, env):
    program = os.path.join(build, "bin", "loraplex-bench-train")
    command = [program, "--threads", str(args.threads), "--rounds",
               str(args.rounds)] + args.bench.split()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n"
                 f"{done.stdout}{done.stderr}")
    times = {}
    for line in done.stdout.splitlines():
        match = LINE.match(line)
        if match:
            times[match["label"]] = (float(match["co"]), float(match["apart"]))
    if not times:
        sys.exit(f"no step times in the output of {program}:\n{done.stdout}")
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_a")
    parser.add_argument("build_b")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--env-a", action="append", default=[],
                        metavar="NAME=VALUE", help="for A's runs only")
    parser.add_argument("--env-b", action="append", default=[],
                        metavar="NAME=VALUE", help="for B's runs only")
    parser.add_argument("--bench", default="",
                        help='flags for loraplex-bench-train, e.g. '
                             '"--budgets 2048"')
    args = parser.parse_args()
    envs = {}
    for name, extra in (("A", args.env_a), ("B", args.env_b)):
        envs[name] = dict(os.environ)
        for item in extra:
            key, _, value = item.partition("=")
            envs[name][key] = value
    samples = {"A": [], "B": []}
    for run in range(args.runs):
        for name, build in (("A", args.build_a), ("B", args.build_b)):
            samples[name].append(run_bench(build, args, envs[name]))
            print(f"run {run + 1}/{args.runs}: {name} done", flush=True)
    labels = [label for label in samples["A"][0] if label in samples["B"][0]]
    print(f"\nA = {args.build_a} {' '.join(args.env_a)}, "
          f"B = {args.build_b} {' '.join(args.env_b)}, {args.runs} alternating "
          f"runs, {args.threads} thread(s); median step time, B / A "
          "(below 1: B faster)")
    worst = 0.0
    for label in labels:
        ratios = []
        for column, what in ((0, "co-batched"), (1, "single-slot steps")):
            a = statistics.median(s[label][column] for s in samples["A"])
            b = statistics.median(s[label][column] for s in samples["B"])
            ratios.append(f"{what} {b / a:5.2f} ({a:8.1f} -> {b:8.1f} ms)")
            worst = max(worst, b / a)
        print(f"  {label:44s} {'   '.join(ratios)}")
    print(f"slowest B / A: {worst:.2f} (B at least 0.9x as fast as A: "
          f"{'yes' if worst <= 1 / 0.9 else 'no'})")


if __name__ == "__main__":
    main()
