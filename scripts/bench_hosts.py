""".venv/bin/python scripts/bench_hosts.py [--quick] [--hosts 2,4] [--links 10gbit,1gbit] [--data criteo,multihot] [--strategies des,des-measure,alltoall,ps] [--model deepfm] [--batch-size 4096] [--warmup 3] [--steps 10]

des, alltoall and ps on several hosts emulated on this machine (``tests/hosts.py``: network
namespaces on a bridge, each host with its own hostname and /dev/shm; needs root, iproute2 and
the test extra, ``pip install -e '.[test,bench]'``), one rank per host, each host's link shaped
with ``tc``: ``netem rate R delay 50us`` where the kernel has netem, else ``tbf rate R`` (no
added delay; the table says which). For every host count, link and strategy, one job of
``--warmup + --steps`` steps (the timers restart after the warm-up, ``scripts/benchlib.py``) on
the shipped Criteo sample gives: bytes each rank sends per step (mean over ranks) and per call
site, the communication ms per step (the strategy's communication phases, rank 0 or the first ps
worker) and samples/s. ``--data``: ``criteo`` (the shipped sample), ``multihot``
(bench_throughput's multi-hot store, made on first use) or a store's path, each in turn;
``des-measure`` is des with its plan timed over the shaped link (``--plan measure``: the trials'
ms a step of each plan are in the table), so the choice can follow the link.

Expect: bytes do not depend on the link, only on the data, the batches and the plan; ps sends the
most. des's plan (``--plan auto``) ranks plans by bytes plus a cost per collective call, so it may
send a little more than alltoall (recorded run, 2 hosts, B=1024: 312 vs 278 kB per step and rank).
All hosts share one 2-core machine's cores here, so at the --quick size compute and scheduling
decide the times, not the link: in the recorded run the 1 Gbit/s jobs were no slower than the
10 Gbit/s ones (des 26,000 vs 21,000 samples/s, 4 measured steps).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import benchlib
from bench_scaling import plan_name

sys.path.insert(0, str(benchlib.REPO))


def shape_links(hosts, rate: str, delay: str) -> str:
    """Every host's egress on ``eth0`` at ``rate`` (and ``delay`` with netem); returns how."""
    how = f"netem rate {rate} delay {delay}"
    for ns in hosts.namespaces:
        netem = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0", "root", "netem",
                                "rate", rate, "delay", delay], capture_output=True, text=True)
        if netem.returncode != 0:  # no netem in this kernel: the rate alone
            burst = max(32 * 1024, int(_bits(rate) / 8 * 200e-6))  # 200 us at the rate, at least 32 KiB
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate",
                            rate, "burst", str(burst), "latency", "50ms"], check=True, capture_output=True, text=True)
            how = f"tbf rate {rate} burst {burst // 1024} KiB (no netem: no delay)"
    return how


def _bits(rate: str) -> float:
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale
    raise ValueError(f"a rate as tc writes it (10gbit, 1gbit, 500mbit), got {rate!r}")


def job(bench: benchlib.Bench, hosts, count: int, tag: str, strategy: str, data: str | None, args) -> dict | None:
    """One des.train job over ``count`` hosts x 1 rank, timers restarted after the warm-up."""
    ps = strategy == "ps"
    workers = count - 1 if ps else 1
    flags = {**benchlib.strategy_flags(strategy), "model": args.model, **({"data": data} if data else {}),
             "batch_size": args.batch_size,
             "epochs": 0, "max_steps": (args.warmup + args.steps) * workers, "split": "0.9,0.05,0.05",
             "embedding_dim": args.embedding_dim, "hidden": args.hidden, "early_stop": 0,
             "cache_dir": str(bench.folder / "cache")}
    if not ps:
        flags["eval_every"] = flags["max_steps"]
    output = bench.jobs / tag
    argv = [str(Path(benchlib.__file__)), "--restart-timers-after", str(args.warmup),
            *benchlib.train_flags(output, flags)]
    try:
        bench.run_command(hosts.command([1] * count, argv), label=f"{tag} ({count} hosts)")
        summary = json.loads((output / "summary.json").read_text())
    except (benchlib.BenchError, OSError, ValueError) as exc:
        bench.failures.append(str(exc))
        bench.log(f"FAILED {exc}")
        return None
    if ps:
        summary["samples_per_second"] = benchlib.steady_from_phases(summary, args.batch_size)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="2,4", help="host counts, one rank each (default 2,4)")
    parser.add_argument("--links", default="10gbit,1gbit", help="link rates as tc writes them (default 10gbit,1gbit)")
    parser.add_argument("--delay", default="50us", help="added one-way delay where netem exists (default 50us)")
    parser.add_argument("--strategies", default="des,des-measure,alltoall,ps")
    parser.add_argument("--model", default="deepfm")
    parser.add_argument("--data", default="criteo,multihot", help="criteo, multihot or store paths, each in turn")
    parser.add_argument("--cache", default=benchlib.CACHE, help="where multihot is generated")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--embedding-dim", type=int, default=8)
    parser.add_argument("--hidden", default="400,400,400")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.hosts, args.batch_size, args.hidden, args.warmup, args.steps = "2", 1024, "64,32", 2, 4
    from des.strategies import get_strategy
    from tests.hosts import Hosts, unavailable

    reason = unavailable()
    if reason:
        raise SystemExit(f"bench_hosts: {reason}")
    counts = [int(x) for x in args.hosts.split(",")]
    for name in args.strategies.split(","):
        benchlib.strategy_flags(name)  # refuses an unknown name before anything runs
    bench = benchlib.Bench(__file__, args)
    stores = {name: benchlib.dataset(bench, name, args.cache) for name in args.data.split(",")}
    rows = []
    for count in counts:
        hosts = Hosts(count)
        try:
            hosts.create()
            for link in args.links.split(","):
                how = shape_links(hosts, link, args.delay)
                bench.log(f"{count} hosts, links: {how}")
                for (name, store), strategy in ((d, s) for d in stores.items() for s in args.strategies.split(",")):
                    tag = f"{args.model}-{Path(name).name}-{strategy}-{count}hosts-{link}"
                    s = job(bench, hosts, count, tag, strategy, store, args)
                    if s is None:
                        continue
                    phases = get_strategy(benchlib.strategy_flags(strategy)["strategy"]).phases
                    comm = {p: ms for p, ms in s["ms_per_phase"].items() if phases.get(p) == "communication"}
                    sites = {k: v for k, v in s["bytes_per_step_by_site"].items() if v}
                    trials = ((s.get("planner") or {}).get("trials") or {}).get("ms_per_step") or {}
                    row = {"data": Path(name).name, "hosts": count, "link": link, "shaping": how, "strategy": strategy,
                           "plan": plan_name(s.get("plan")),
                           "trials": ", ".join(f"{plan} {ms:.0f}" for plan, ms in trials.items()),
                           "bytes_per_step": s["bytes_per_step"], "communication_ms": sum(comm.values()),
                           "samples_per_second": s["samples_per_second"],
                           "sites": ", ".join(f"{k} {v / 1e3:,.0f} kB" for k, v in sites.items()),
                           "communication_phases": ", ".join(f"{k} {v:.1f}" for k, v in comm.items()),
                           "bytes_per_step_by_site": s["bytes_per_step_by_site"], "ms_per_phase": s["ms_per_phase"]}
                    bench.log(f"  {tag}: {row['bytes_per_step']:,.0f} B/step, communication {row['communication_ms']:.1f} "
                              f"ms/step ({row['communication_phases']}), {row['samples_per_second']:,.0f} samples/s")
                    rows.append(row)
        except subprocess.CalledProcessError as exc:
            bench.failures.append(f"{count} hosts: {' '.join(exc.cmd)}: {exc.stderr.strip()}")
            bench.log(f"FAILED {bench.failures[-1]}")
        finally:
            hosts.close()
    columns = [("data", "data", ""), ("hosts", "hosts x 1 rank", "d"), ("link", "link", ""),
               ("strategy", "strategy", ""), ("plan", "plan", ""), ("trials", "plans timed (ms/step)", ""),
               ("bytes_per_step", "bytes sent/step/rank", ",.0f"), ("sites", "by site (kB/step/rank)", ""),
               ("communication_ms", "communication ms/step", ".1f"), ("communication_phases", "by phase (ms)", ""),
               ("samples_per_second", "samples/s", ",.0f")]
    notes = [f"{args.model} (k={args.embedding_dim}, hidden {args.hidden}), batch {args.batch_size}, "
             f"{args.warmup} warm-up + {args.steps} measured steps per job (ps: per worker; samples/s from its phase "
             "timers); emulated hosts (tests/hosts.py), one rank each, all on this machine's cores.",
             "Links: " + "; ".join(sorted({f"{r['link']}: {r['shaping']}" for r in rows})) + "; ranks on different "
             "hosts talk over TCP (MPICH's ofi netmod) through veth links and a bridge, so the machine line's "
             "'shared memory' holds within a host only.",
             "Data: " + "; ".join(f"{name} = {store or 'the shipped Criteo sample'}" for name, store in stores.items()) + ".",
             benchlib.STRATEGY_NOTE]
    bench.finish(rows, [("Several hosts", columns, rows)], notes)
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
