"""``make bench``: attache's figures side by side with their references, measured in the same run.

* render throughput of each pipeline version on one core, against pyvips
  (:mod:`bench.render`);
* worker peak RSS on the 24 MP photo (:mod:`bench.render`);
* end to end at saturation with 1, 2 and 4 worker processes against a raw
  render loop, idle small-photo latency, ingest against raw streaming and
  the 1 MB ``202`` latency, through the real processes (:mod:`bench.system`);
* single-node mode (embedded PostgreSQL, PostgreSQL broker): end to end
  images/s with one worker process and idle small-photo latency, beside
  the RabbitMQ mode's (:mod:`bench.single_node`).

One table at the end gives every figure, its reference, the ratio, the
target of issue 11 and whether it is met; ``docs/performance.md`` records
a run. It took 176-230 s on an idle 2-core machine (the third session
of 2026-12-02), every end-to-end figure having a raw loop just before
and just after it; loaded machines take minutes more. With
``ATTACHE_BENCH_EXTRA=1`` it also prints the memory budget on hostile files
and the sweep benchmark over a million variant rows (:mod:`bench.sweeps`),
which take several minutes more.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

from bench import render, single_node, system
from bench.figures import table


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown CPU")
    ram_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal:"))
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    return (f"{len(os.sched_getaffinity(0))} CPUs usable ({os.cpu_count()} online), {cpu}, "
            f"{ram_kb / 1024 / 1024:.1f} GiB RAM, Python {platform.python_version()}, load average {load}")


def main() -> int:
    import PIL
    import pyvips

    began = time.perf_counter()
    print(f"machine: {machine()}")
    print(f"Pillow {PIL.__version__}, pyvips {pyvips.__version__} on libvips "
          f"{pyvips.version(0)}.{pyvips.version(1)}.{pyvips.version(2)}")
    figures = render.throughput()
    print(table(figures), flush=True)
    figures.append(render.worker_peak())
    rabbitmq = system.main()
    figures += rabbitmq
    figures += single_node.main(rabbitmq)
    print()
    print(table(figures))
    print(f"\nmet {sum(f.met is True for f in figures)} of {len(figures)} targets in "
          f"{time.perf_counter() - began:.0f} s; load average at the end {os.getloadavg()[0]:.2f}")
    if os.environ.get("ATTACHE_BENCH_EXTRA") == "1":
        render.hostile_peaks()
        from bench import sweeps

        return sweeps.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
