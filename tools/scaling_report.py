#!/usr/bin/python3
"""The report of a scaling study (tools/scaling-study): report.md, report.json and plots.

  tools/scaling_report.py STUDY_DIR

Per point, from its own outputs:
  * metrics.jsonl: step_time of every step (the slowest rank's, as tessera records it);
    the steady state is the steps after the study's warm-up; T = their median, spread =
    interquartile range (and min..max);
  * the time split of T: the phase seconds of the steady-state steps (metrics.jsonl's
    phase_max_s, the slowest rank per phase and step; runs that predate it: the closing
    summary's phase table, all steps) give the shares of compute (forward + backward),
    communication (grad sync: the gradient reduction not hidden behind backward) and other
    (data, optimizer, other); with pipeline parallelism the bubble is each rank's time
    blocked in pipeline receive waits (the summary's "idle", mean over ranks, steady steps),
    which the timer counts inside forward/backward, so it is moved from compute to bubble.
Efficiencies against the smallest point G0 of each series (G0 = 1 gives the textbook forms):
  strong: speedup S = T(G0)/T(G), ideal G/G0, efficiency E = G0 T(G0) / (G T(G))
  weak:   efficiency E = T(G0)/T(G) (the work per rank is the same at every point)
"""
import json
import math
import re
import statistics
import sys
from pathlib import Path

PHASES = ("data", "forward", "backward", "grad sync", "optimizer", "other")
SPLIT = {"compute": ("forward", "backward"), "communication": ("grad sync",),
         "other": ("data", "optimizer", "other")}


def quantile(sorted_values, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    n = len(sorted_values)
    pos = q * (n - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def steady_steps(metrics_path, warmup):
    """The records of the steps after `warmup` (the last record of a step counts), and the
    number of steps recorded."""
    by_step = {}
    for line in Path(metrics_path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            by_step[r["step"]] = r
    return [by_step[s] for s in sorted(by_step) if s > warmup], len(by_step)


def pipeline_idle(run_log):
    """(mean idle seconds, seconds of the steps they were measured over) per rank of a
    pipeline run's summary, or None. Idle is the time blocked in pipeline receive waits over
    the steady steps ("steady steps" in the pipeline line; older runs: all steps)."""
    if not Path(run_log).exists():
        return None
    text = Path(run_log).read_text()
    idle = [float(x) for x in re.findall(r"^  rank \d+ \(stage \d+\): idle ([0-9.]+) s", text, re.M)]
    phases = phase_seconds(run_log)
    if not idle or not phases:
        return None
    steady = re.search(r"^steady state \(steps (\d+)\.\.(\d+)\): ([0-9.]+) ms/step", text, re.M)
    if steady and "idle: blocked in receive waits, steady steps" in text:
        steps = int(steady.group(2)) - int(steady.group(1)) + 1
        return sum(idle) / len(idle), steps * float(steady.group(3)) / 1e3
    return sum(idle) / len(idle), sum(phases.values())


def phase_seconds(run_log):
    """{phase: mean seconds over ranks} from the closing summary, or {} without one."""
    phases = {}
    pattern = re.compile(r"^(%s)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)%%\s*$" %
                         "|".join(re.escape(p) for p in PHASES))
    if Path(run_log).exists():
        for line in Path(run_log).read_text().splitlines():
            m = pattern.match(line)
            if m:
                phases[m.group(1)] = float(m.group(2))
    return phases


def analyse_point(study, p, warmup):
    """Pools the steady-state steps of the point's runs (one, or --repeats of them)."""
    r = dict(p)
    times, phases, loads, steps = [], {}, [], []
    idle_frac = []
    per_step_phases = True
    for run in p.get("runs", [p["dir"]]):
        out = study / run
        metrics = out / "metrics.jsonl"
        if not metrics.exists():
            r["error"] = f"no metrics.jsonl in {run} (the run failed; see its run.log)"
            return r
        recs, n = steady_steps(metrics, warmup)
        if not recs:
            r["error"] = f"{run}: {n} steps, none after the warm-up of {warmup}"
            return r
        times += [x["step_time"] for x in recs]
        steps.append(n)
        run_phases = {}
        if all("phase_max_s" in x for x in recs):
            for x in recs:
                for k, v in x["phase_max_s"].items():
                    k = k.replace("_", " ")
                    run_phases[k] = run_phases.get(k, 0) + v
        else:
            per_step_phases = False
            run_phases = phase_seconds(out / "run.log")
        for k, v in run_phases.items():
            phases[k] = phases.get(k, 0) + v
        pipe = pipeline_idle(out / "run.log")
        if pipe:
            idle_frac.append(pipe[0] / max(pipe[1], 1e-12))
        if (out / "load").exists():  # host load average before and after (local launchers)
            loads += [float(x) for x in (out / "load").read_text().split()]
        run_json = out / "run.json"
        if run_json.exists() and "seq_len" not in r:
            seq = json.loads(run_json.read_text()).get("deck", {}).get("model", {}).get("seq_len")
            if seq:
                r["seq_len"] = int(seq)
    s = sorted(times)
    r.update(steps=sum(steps), runs_analysed=len(steps), steady_steps=len(s),
             t_median=statistics.median(s), t_q1=quantile(s, 0.25), t_q3=quantile(s, 0.75),
             t_min=s[0], t_max=s[-1])
    if "seq_len" in r:
        r["tokens_per_s"] = p["global_batch"] * r["seq_len"] / r["t_median"]
    if loads:
        r["load"] = [min(loads), max(loads)]
    total = sum(phases.values())
    if phases and total > 0:
        r["phase_seconds"] = phases
        r["phase_source"] = "steady-state steps" if per_step_phases else "whole run (summary)"
        frac = {k: sum(phases.get(x, 0) for x in v) / total for k, v in SPLIT.items()}
        bubble = min(statistics.mean(idle_frac), frac["compute"]) if idle_frac else 0.0
        frac["compute"] -= bubble
        frac["bubble"] = bubble
        r["split_ms"] = {k: 1e3 * r["t_median"] * frac[k]
                         for k in ("compute", "communication", "bubble", "other")}
    return r


def efficiencies(points):
    """Adds speedup / efficiency (and their spread from the quartiles of T(G))."""
    ok = [p for p in points if "t_median" in p]
    if not ok:
        return
    base = min(ok, key=lambda p: p["ranks"])
    g0, t0 = base["ranks"], base["t_median"]
    for p in ok:
        g, t = p["ranks"], p["t_median"]
        p["baseline_ranks"] = g0
        if p["mode"] == "strong":
            p["speedup"] = t0 / t
            p["ideal_speedup"] = g / g0
            p["efficiency"] = g0 * t0 / (g * t)
            p["efficiency_range"] = [g0 * t0 / (g * p["t_q3"]), g0 * t0 / (g * p["t_q1"])]
        else:
            p["efficiency"] = t0 / t
            p["speedup"] = p["efficiency"] * g / g0  # throughput relative to G0
            p["ideal_speedup"] = g / g0
            p["efficiency_range"] = [t0 / p["t_q3"], t0 / p["t_q1"]]


def fmt(x, spec):
    return format(x, spec) if x is not None else "-"


def table(points, mode):
    eff = "E = G0·T(G0)/(G·T(G))" if mode == "strong" else "E = T(G0)/T(G)"
    speed = "speedup T(G0)/T(G)" if mode == "strong" else "throughput / G0's"
    rows = ["| G ranks | nodes | dp | global batch | micro x accum per dp rank | T median (ms) "
            f"| IQR (ms) | min..max (ms) | steady steps | tokens/s | {speed} | ideal "
            f"| efficiency {eff} | E from IQR | compute ms | comm ms | bubble ms | other ms "
            "| host load (min..max) |",
            "|" + "---|" * 19]
    for p in points:
        head = (f"| {p['ranks']} | {p['nodes'] or '-'} | {p.get('dp', p['ranks'])} | "
                f"{p['global_batch']} | {p['micro_batch']} x {p['accumulation']} | ")
        if "t_median" not in p:
            rows.append(head + f"failed: {p.get('error', '?')} |" + " |" * 13)
            continue
        sp = p.get("split_ms", {})
        rows.append(
            head + f"{1e3 * p['t_median']:.2f} | "
            f"{1e3 * p['t_q1']:.2f}..{1e3 * p['t_q3']:.2f} | "
            f"{1e3 * p['t_min']:.2f}..{1e3 * p['t_max']:.2f} | {p['steady_steps']} | "
            f"{fmt(p.get('tokens_per_s'), '.0f')} | {p['speedup']:.3f} | "
            f"{p['ideal_speedup']:.0f} | {p['efficiency']:.3f} | "
            f"{p['efficiency_range'][0]:.3f}..{p['efficiency_range'][1]:.3f} | "
            f"{fmt(sp.get('compute'), '.2f')} | {fmt(sp.get('communication'), '.2f')} | "
            f"{fmt(sp.get('bubble'), '.2f')} | {fmt(sp.get('other'), '.2f')} | "
            + (f"{p['load'][0]:.1f}..{p['load'][1]:.1f} |" if "load" in p else "- |"))
    return "\n".join(rows)


def plots(study, series):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(study / name, dpi=110)
        plt.close(fig)
        made.append(name)

    def log2_ranks(ax, allg, ylabel, title):
        if allg:
            ax.set_xscale("log", base=2)
            ax.set_xticks(allg, [str(g) for g in allg])
            ax.legend(fontsize=8)
        ax.set_xlabel("ranks G")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)

    done = {m: [p for p in pts if "t_median" in p] for m, pts in series.items()}
    colors = {"strong": "tab:blue", "weak": "tab:orange"}

    fig, ax = plt.subplots(figsize=(5, 4))
    for mode, pts in done.items():
        if pts:
            g = [p["ranks"] for p in pts]
            ax.plot(g, [p["speedup"] for p in pts], "o-", color=colors[mode],
                    label=f"{mode}: " + ("T(G0)/T(G)" if mode == "strong" else "throughput / G0's"))
    allg = sorted({p["ranks"] for pts in done.values() for p in pts})
    if allg:
        ax.plot(allg, [g / allg[0] for g in allg], "k--", label="ideal G/G0")
    log2_ranks(ax, allg, "speedup", "Speedup vs ideal")
    save(fig, "speedup.png")

    fig, ax = plt.subplots(figsize=(5, 4))
    for mode, pts in done.items():
        if pts:
            g = [p["ranks"] for p in pts]
            e = [p["efficiency"] for p in pts]
            lo = [p["efficiency"] - p["efficiency_range"][0] for p in pts]
            hi = [p["efficiency_range"][1] - p["efficiency"] for p in pts]
            ax.errorbar(g, e, yerr=[lo, hi], fmt="o-", capsize=4, color=colors[mode],
                        label=mode)
    if allg:
        ax.axhline(1.0, color="k", ls="--", lw=1, label="ideal")
    ax.set_ylim(bottom=0)
    log2_ranks(ax, allg, "parallel efficiency E", "Efficiency (bars: from the IQR of T(G))")
    save(fig, "efficiency.png")

    bars = [(m, p) for m, pts in done.items() for p in pts if "split_ms" in p]
    if bars:
        fig, ax = plt.subplots(figsize=(2.6 + 0.8 * len(bars), 4))
        x = range(len(bars))
        bottom = [0.0] * len(bars)
        for part, color in (("compute", "tab:green"), ("communication", "tab:red"),
                            ("bubble", "tab:purple"), ("other", "tab:gray")):
            h = [p["split_ms"][part] for _, p in bars]
            ax.bar(x, h, bottom=bottom, color=color, label=part)
            bottom = [b + v for b, v in zip(bottom, h)]
        ax.set_xticks(list(x), [f"{m}\nG={p['ranks']}" for m, p in bars], fontsize=8)
        ax.set_ylabel("ms per step (median step, split by phase shares)")
        ax.set_title("Time per step")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        save(fig, "time_split.png")
    return made


def write_report(study):
    study = Path(study)
    meta = json.loads((study / "study.json").read_text())
    warmup = meta["warmup"]
    series = {}
    for p in meta["points"]:
        series.setdefault(p["mode"], []).append(analyse_point(study, p, warmup))
    for pts in series.values():
        pts.sort(key=lambda p: p["ranks"])
        efficiencies(pts)
    images = plots(study, series)

    cores = meta.get("cores")
    maxg = max(p["ranks"] for p in meta["points"])
    # The deck as the user would name it: relative to the working directory when inside it.
    deck = Path(meta["deck"])
    try:
        deck = deck.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    lines = [f"# Scaling study: {deck.name}", "",
             f"* deck `{deck}`" + (f", overrides `{' '.join(meta['overrides'])}`"
                                           if meta["overrides"] else ""),
             f"* launcher {meta['launcher']}, {meta['threads']} OpenMP thread(s) per rank"
             + (f", {meta['ranks_per_node']} rank(s) per node" if meta.get("ranks_per_node")
                else "")
             + (f", Slurm job {meta['slurm_job']}" if meta.get("slurm_job") else ""),
             f"* study host {meta['host']} ({cores} cores)",
             f"* {meta['steps']} steps per run, {meta.get('repeats', 1)} run(s) per point"
             + (" (in rounds over all points)" if meta.get("repeats", 1) > 1 else "")
             + f"; steady state = steps {warmup + 1}..{meta['steps']} of each run"
             " (warm-up excluded); T = median step time (slowest rank per step, from each run's"
             " metrics.jsonl); spread = interquartile range, min..max",
             "* host load: the 1-minute load average before and after each run (local"
             " launchers): anything above the point's own ranks x threads is other work"
             " sharing the cores",
             "* time split: T x the phase shares of the steady-state steps (metrics.jsonl"
             " phase_max_s; runs without it: the closing summary, all steps): compute ="
             " forward + backward, comm = grad sync (the gradient all-reduce not hidden behind"
             " backward), bubble = pipeline receive-wait time (the summary's idle, mean over"
             " ranks; timed inside forward/backward, so taken out of compute; 0 without"
             " parallel.pp), other = data + optimizer + other"]
    if meta["launcher"] == "mpirun" and cores and maxg * meta["threads"] > cores:
        lines.append(f"* **oversubscribed**: up to {maxg} rank(s) x {meta['threads']} thread(s)"
                     f" on {cores} cores; beyond {cores} the points measure time-sharing of "
                     "the cores, not the code's scaling")
    summary = []
    for mode, pts in series.items():
        batch = ("global batch fixed" if mode == "strong" else "batch per rank fixed")
        lines += ["", f"## {mode.capitalize()} scaling ({batch})", "", table(pts, mode)]
        for p in pts:
            if "efficiency" in p:
                summary.append(f"{mode} G={p['ranks']}: T={1e3 * p['t_median']:.2f} ms, "
                               f"speedup {p['speedup']:.3f}, efficiency {p['efficiency']:.3f}")
            else:
                summary.append(f"{mode} G={p['ranks']}: FAILED ({p.get('error')})")
    lines += ["", "## Plots", ""] + [f"![{i[:-4]}]({i})" for i in images] + [""]
    (study / "report.md").write_text("\n".join(lines))
    result = {"study": meta, "series": series, "images": images, "summary": "\n".join(summary)}
    (study / "report.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(write_report(Path(sys.argv[1]))["summary"])
