#!/usr/bin/env python3
"""The suite's own checks, each shown to fail on the defect it names (doc/testing.md,
"Every test can fail").

usage: selftest.py WORKDIR BUILD_DIR PYTHON TESSERA DECK DATA [CUDA_TESTS]

Makes one short fp32 run on one rank, then feeds the harness deliberately wrong inputs:
  * check_layout.py: the fp32 run claimed as bf16 (a 16-bit test whose run multiplied in fp32)
    and as tp 2 on 2 ranks (a layout that did not run) must be WRONG; the truth must be AS ASKED;
  * compare_runs.py: one loss and, separately, one gradient norm moved by 2e-5 relative must
    DIFFER at the 1e-5 bar (the gradient norm at the same bar as the loss), 5e-6 must MATCH;
    with --moe-stats, experts' statistics doubled in one step (a rerun that counted its tokens
    twice) or missing must DIFFER, the same ones MATCH;
  * exit_status.sh prints the status of a command that crashes after its pass text, and every
    CTest test with a PASS_REGULAR_EXPRESSION runs under it with the matching
    FAIL_REGULAR_EXPRESSION, and its pass regex is one expression, not a list that a ';' split
    into alternatives (ctest --show-only=json-v1);
  * with CUDA_TESTS (the CUDA kernel tests' binary) and no GPU: TESSERA_REQUIRE_GPU=1 fails them
    instead of skipping, as bench/gpu-check relies on.
Prints 'harness selftest: PASS' or the checks that did not catch their defect.
"""
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REGRESSION = os.path.join(HERE, "..", "regression")


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return p.returncode, p.stdout + p.stderr


def main():
    work, build, python, tessera, deck, data = sys.argv[1:7]
    cuda_tests = sys.argv[7] if len(sys.argv) > 7 else ""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    bad = []

    def expect(name, ok, out=""):
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
        if not ok:
            bad.append(name)
            print(out)

    ref = os.path.join(work, "ref")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    status, out = run([tessera, deck, f"--data.path={data}", "--train.steps=3",
                       f"--output.dir={ref}", "--output.echo_deck=false",
                       "--hardware.peak_flops=1e9", "--checkpoint.at_end=false"], env)
    if status != 0:
        print(out)
        print("harness selftest: FAIL (the reference run did not complete)")
        return 1

    layout = [python, os.path.join(REGRESSION, "check_layout.py"), ref]
    status, out = run(layout + ["1"])
    expect("check_layout: the run as it ran is AS ASKED", status == 0 and "AS ASKED" in out, out)
    status, out = run(layout + ["1", "--train.precision=bf16"])
    expect("check_layout: an fp32 run claimed as bf16 is WRONG",
           status == 1 and "layout: WRONG" in out and "compute_dtype" in out
           and "GEMM FLOPs" in out, out)
    status, out = run(layout + ["2", "--parallel.tp=2"])
    expect("check_layout: a serial run claimed as tp 2 on 2 ranks is WRONG",
           status == 1 and "tp asked 2 ran 1" in out and "world asked 2 ran 1" in out, out)

    with open(os.path.join(ref, "metrics.jsonl")) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    compare = [python, os.path.join(REGRESSION, "compare_runs.py"), "--rtol", "1e-5", ref]
    for key, factor, want in (("loss", 1 + 2e-5, 1), ("grad_norm", 1 + 2e-5, 1),
                              ("loss", 1 + 5e-6, 0), ("grad_norm", 1 + 5e-6, 0)):
        moved = os.path.join(work, f"moved_{key}_{factor}")
        os.makedirs(moved)
        with open(os.path.join(moved, "metrics.jsonl"), "w") as f:
            for i, s in enumerate(steps):
                s = dict(s)
                if i == len(steps) - 1:
                    s[key] *= factor
                f.write(json.dumps(s) + "\n")
        status, out = run(compare + [moved])
        verdict = "runs: DIFFER" if want else "runs: MATCH"
        expect(f"compare_runs: {key} x {factor:.6f} gives {verdict}",
               status == want and verdict in out, out)

    # The experts' statistics (compare_runs.py --moe-stats), on the same steps with one made-up
    # MoE layer's entries added.
    def with_moe(name, routed_last, keep=True):
        d = os.path.join(work, name)
        os.makedirs(d)
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            for i, s in enumerate(steps):
                s = dict(s)
                if keep:
                    s["moe"] = [{"layer": "layers.1.moe", "routed": routed_last
                                 if i == len(steps) - 1 else 512, "aux": 1.0177, "z": 4.1}]
                f.write(json.dumps(s) + "\n")
        return d
    moe_ref = with_moe("moe_ref", 512)
    for name, routed, keep, want in (("moe_same", 512, True, 0), ("moe_twice", 1024, True, 1),
                                     ("moe_missing", 512, False, 1)):
        status, out = run(compare[:-1] + ["--moe-stats", moe_ref, with_moe(name, routed, keep)])
        verdict = "runs: DIFFER" if want else "runs: MATCH"
        expect(f"compare_runs --moe-stats: {name} gives {verdict}",
               status == want and verdict in out, out)

    status, out = run([os.path.join(HERE, "exit_status.sh"), "sh", "-c",
                       "echo 'runs: MATCH'; exit 3"])
    expect("exit_status.sh: a crash after the pass text reports its status",
           status == 3 and out.rstrip().endswith("tessera-test: exit status 3"), out)
    status, out = run(["ctest", "--test-dir", build, "--show-only=json-v1"])
    tests = json.loads(out)["tests"] if status == 0 else []
    unchecked = []
    for t in tests:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        if "PASS_REGULAR_EXPRESSION" not in props:
            continue
        if len(props["PASS_REGULAR_EXPRESSION"]) != 1:  # a ';' split it into alternatives
            unchecked.append(t["name"] + " (pass regex split at ';')")
        wrapped = t.get("command", [""])[0].endswith("exit_status.sh")
        if not wrapped or "tessera-test: exit status [1-9]" not in props.get(
                "FAIL_REGULAR_EXPRESSION", []):
            unchecked.append(t["name"])
    expect(f"every test with a pass regex fails on a non-zero exit "
           f"({sum('PASS_REGULAR_EXPRESSION' in str(t) for t in tests)} tests)",
           tests and not unchecked, "unchecked: " + " ".join(unchecked[:20]))

    if cuda_tests:
        status, out = run([cuda_tests, "--gtest_filter=CudaKernels.ElementwiseMatchCpuExactly"],
                          dict(os.environ, TESSERA_REQUIRE_GPU="1", CUDA_VISIBLE_DEVICES=""))
        expect("TESSERA_REQUIRE_GPU=1: a CUDA test without a usable GPU fails",
               status != 0 and "TESSERA_REQUIRE_GPU=1 but no usable CUDA device" in out, out)
        status, out = run([cuda_tests, "--gtest_filter=CudaKernels.ElementwiseMatchCpuExactly"],
                          dict(os.environ, CUDA_VISIBLE_DEVICES=""))
        expect("without TESSERA_REQUIRE_GPU the same test is skipped",
               status == 0 and "SKIPPED" in out, out)

    print("harness selftest: PASS" if not bad else f"harness selftest: FAIL ({len(bad)})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
