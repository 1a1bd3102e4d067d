#!/usr/bin/python3
"""The layering is enforced by the build: a file of one layer cannot include a header of a
layer it does not link (doc/architecture.md, "Layers").

For each layer, takes the compile command of one of its sources from compile_commands.json
and compiles two probes with it: one including a header of a layer below (must compile) and
one including a header of a layer above (must fail: the header is not on its include path).

usage: layering.py BUILD_DIR
"""
import json
import os
import shlex
import subprocess
import sys
import tempfile

# layer: (a source of the layer, a header it may include, a header it must not reach)
CASES = {
    "core": ("src/core/deck.cpp", "core/error.hpp", "tensor/tensor.hpp"),
    "config": ("src/config/run_config.cpp", "core/deck.hpp", "tensor/tensor.hpp"),
    "tensor": ("src/tensor/tensor.cpp", "core/error.hpp", "kernels/kernels.hpp"),
    "kernels": ("src/kernels/cpu/backend.cpp", "tensor/tensor.hpp", "model/param.hpp"),
    "comm": ("src/comm/communicator.cpp", "tensor/tensor.hpp", "model/param.hpp"),
    "io": ("src/io/checkpoint.cpp", "config/run_config.hpp", "train/trainer.hpp"),
    "model": ("src/model/linear.cpp", "kernels/kernels.hpp", "parallel/dp/grad_buckets.hpp"),
    "optim": ("src/optim/adamw.cpp", "model/param.hpp", "parallel/dp/zero.hpp"),
    "parallel": ("src/parallel/dp/zero.cpp", "optim/adamw.hpp", "train/trainer.hpp"),
    "perf": ("src/perf/memory.cpp", "parallel/pp/schedule.hpp", "plan/search.hpp"),
    "plan": ("src/plan/search.cpp", "perf/cost_model.hpp", "train/trainer.hpp"),
    "train": ("src/train/trainer.cpp", "io/checkpoint.hpp", "report/run_log.hpp"),
    "report": ("src/report/run_log.cpp", "train/trainer.hpp", "app/errors.hpp"),
}


def command_for(commands, source):
    for c in commands:
        if os.path.realpath(c["file"]).endswith(source):
            args = c.get("arguments") or shlex.split(c["command"])
            # Keep the compiler and its flags; drop the output, the dependency file and the source.
            kept, skip = [], False
            for a in args:
                if skip:
                    skip = False
                    continue
                if a in ("-o", "-MF", "-MT", "-c"):
                    skip = a != "-c"
                    continue
                if a == "-MD" or os.path.realpath(a) == os.path.realpath(c["file"]):
                    continue
                kept.append(a)
            return kept, c["directory"]
    sys.exit(f"layering: no compile command for {source}")


def compiles(cmd, cwd, header, tmp):
    probe = os.path.join(tmp, "probe.cpp")
    with open(probe, "w") as f:
        f.write(f'#include "{header}"\n')
    r = subprocess.run(cmd + ["-fsyntax-only", probe], cwd=cwd, capture_output=True, text=True)
    return r.returncode == 0, r.stderr


def main():
    build = sys.argv[1]
    with open(os.path.join(build, "compile_commands.json")) as f:
        commands = json.load(f)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for layer, (source, below, above) in CASES.items():
            cmd, cwd = command_for(commands, source)
            ok, err = compiles(cmd, cwd, below, tmp)
            if not ok:
                print(f"layering: FAIL: {layer} cannot include {below}:\n{err}")
                failures += 1
            ok, err = compiles(cmd, cwd, above, tmp)
            if ok or "No such file" not in err:
                print(f"layering: FAIL: {layer} can include {above}" + ("" if ok else f":\n{err}"))
                failures += 1
            else:
                print(f"layering: {layer} includes {below}, not {above}")
    if failures:
        sys.exit(1)
    print(f"layering: enforced for {len(CASES)} layers")


main()
