#!/usr/bin/env python3
"""Runs tessera with or without output.trace and checks the Chrome-trace files.

usage: check_trace.py on|off OUTDIR "MPIEXEC... -np" NP TESSERA DECK [overrides...]

on:  every rank wrote OUTDIR/trace/rank<R>.json, and nothing else is there; each parses as
     JSON in the Trace Event Format (traceEvents; "X" events with name, cat, ph, pid = rank,
     tid, ts, dur >= 0 and args; a process_name "rank R (pp s, dp d, tp t)" matching the
     rank's coordinates); only the steps otherData names were recorded (output.trace_steps);
     each traced step has one forward and one backward span for every (micro-batch, local
     chunk) on every stage, send and recv-wait spans (as many sends as receives over the
     pipeline, 2 m (C - 1) per step), an optimizer phase and at least one collective with
     its group and bytes; the spans of a rank's pipeline lane never overlap; and on the
     common clock, for every micro-batch, the forward of model chunk c ends before the
     forward of model chunk c + 1 starts (on the next stage), and the backward of c + 1 ends
     before the backward of c starts.
off: the run wrote no trace directory.
Prints "trace: PASS" or the failures and "trace: FAIL".
"""
import json
import os
import re
import subprocess
import sys

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def load(path, rank):
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    other = doc["otherData"]
    check(other["rank"] == rank, f"{path}: otherData rank {other['rank']}")
    for e in events:
        for key in ("name", "ph", "pid", "tid"):
            check(key in e, f"{path}: event without {key}: {e}")
        check(e["pid"] == rank, f"{path}: pid {e['pid']} is not the rank")
        if e["ph"] == "X":
            for key in ("cat", "ts", "dur", "args"):
                check(key in e, f"{path}: X event without {key}: {e}")
            check(isinstance(e["ts"], (int, float)) and e["dur"] >= 0, f"{path}: bad ts/dur {e}")
    names = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    c = other["coord"]
    want = f"rank {rank} (pp {c['pp']}, dp {c['dp']}, tp {c['tp']})"
    check(names == [want], f"{path}: process_name {names}, expected [{want!r}]")
    return other, [e for e in events if e["ph"] == "X"]


def run_on(out, ranks):
    files = sorted(os.listdir(os.path.join(out, "trace")))
    check(files == sorted(f"rank{r}.json" for r in range(ranks)), f"trace files {files}")
    docs = [load(os.path.join(out, "trace", f"rank{r}.json"), r) for r in range(ranks)]
    other = docs[0][0]
    layout = other["layout"]
    p, m = layout["pp"], layout["accumulation"]
    v = other["pp_schedule"]["chunks"] if p > 1 else 1
    C = p * v
    first, last = other["steps"]
    steps = range(first, last + 1)
    check(last - first + 1 >= 1, f"steps {other['steps']}")
    print(f"trace: {ranks} ranks, p {p}, m {m}, v {v}, steps {first}-{last}, "
          f"{sum(len(d[1]) for d in docs)} spans")
    # Per (stage, step, micro, local chunk): forward / backward spans of the dp 0, tp 0 ranks.
    span = {}
    sends = {s: 0 for s in steps}
    recvs = {s: 0 for s in steps}
    for rank, (o, events) in enumerate(docs):
        check(o["steps"] == [first, last], f"rank {rank}: steps {o['steps']}")
        check(o["dropped_events"] == 0, f"rank {rank}: {o['dropped_events']} events dropped")
        stage = o["coord"]["pp"]
        for e in events:
            check(e["args"]["step"] in steps, f"rank {rank}: event of untraced step {e}")
        for s in steps:
            ev = [e for e in events if e["args"]["step"] == s]
            names = {e["name"] for e in ev}
            check("optimizer" in names, f"rank {rank} step {s}: no optimizer span")
            check("step" in names, f"rank {rank} step {s}: no step span")
            coll = [e for e in ev if e["cat"] == "collective"]
            check(len(coll) > 0 and all("group" in e["args"] and "bytes" in e["args"]
                                        for e in coll),
                  f"rank {rank} step {s}: no collective span with group and bytes")
            if p == 1:
                continue
            n_send = sum(e["name"] == "send" for e in ev)
            n_recv = sum(e["name"] == "recv-wait" for e in ev)
            check(n_send > 0 and n_recv > 0,
                  f"rank {rank} step {s}: {n_send} sends, {n_recv} recv-waits")
            sends[s] += n_send
            recvs[s] += n_recv
            if o["coord"]["dp"] != 0 or o["coord"]["tp"] != 0:
                continue  # the pipeline of dp 0, tp 0 stands for all
            for e in ev:
                if e["cat"] == "compute":
                    key = (e["name"], stage, s, e["args"]["micro"], e["args"]["chunk"])
                    check(key not in span, f"rank {rank}: two spans {key}")
                    span[key] = (e["ts"], e["ts"] + e["dur"])
        # The pipeline lane (tid 1): one span after another.
        lane = sorted((e for e in events if e["tid"] == 1), key=lambda e: e["ts"])
        for a, b in zip(lane, lane[1:]):
            check(a["ts"] + a["dur"] <= b["ts"] + 0.002,
                  f"rank {rank}: {a['name']} {a['args']} overlaps {b['name']} {b['args']}")
    if p > 1:
        for s in steps:
            check(sends[s] == recvs[s] == 2 * m * (C - 1) * (ranks // p),
                  f"step {s}: {sends[s]} sends and {recvs[s]} recv-waits, expected "
                  f"2 m (C - 1) = {2 * m * (C - 1)} per pipeline")
            for i in range(m):
                for c in range(C):
                    for kind in ("forward", "backward"):
                        check((kind, c % p, s, i, c // p) in span,
                              f"step {s}: no {kind} of micro-batch {i}, model chunk {c}")
                for c in range(C - 1):
                    f0 = span.get(("forward", c % p, s, i, c // p))
                    f1 = span.get(("forward", (c + 1) % p, s, i, (c + 1) // p))
                    b0 = span.get(("backward", c % p, s, i, c // p))
                    b1 = span.get(("backward", (c + 1) % p, s, i, (c + 1) // p))
                    if f0 and f1:
                        check(f0[1] <= f1[0], f"step {s} micro {i}: forward of model chunk {c} "
                              f"ends at {f0[1]:.3f} us, after chunk {c + 1}'s starts at "
                              f"{f1[0]:.3f}")
                    if b0 and b1:
                        check(b1[1] <= b0[0], f"step {s} micro {i}: backward of model chunk "
                              f"{c + 1} ends at {b1[1]:.3f} us, after chunk {c}'s starts at "
                              f"{b0[0]:.3f}")


def main():
    mode, out, mpiexec, ranks, tessera, deck = sys.argv[1:7]
    ranks = int(ranks)
    subprocess.run(["rm", "-rf", out], check=True)
    cmd = mpiexec.split() + [str(ranks), tessera, deck, *sys.argv[7:], f"--output.dir={out}",
                             "--checkpoint.at_end=false", "--output.echo_deck=false",
                             "--hardware.peak_flops=1e9"]
    if mode == "on":
        cmd.append("--output.trace=true")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    log = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(log.stdout[-3000:])
    check(log.returncode == 0, f"tessera exited with {log.returncode}")
    if mode == "on":
        check(re.search(r"trace: .*rank0\.json", log.stdout), "no trace line in the log")
        if not failures:
            run_on(out, ranks)
    else:
        check(not os.path.exists(os.path.join(out, "trace")), "a trace directory was written")
        check("trace:" not in log.stdout, "the log mentions a trace")
    for f in failures[:30]:
        print("FAIL:", f)
    print("trace: PASS" if not failures else f"trace: FAIL ({len(failures)})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
