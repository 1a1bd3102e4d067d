#!/usr/bin/env python3
"""tessera-prep on several MPI ranks writes the same bytes as on one (doc/data.md, "Preparing on
several ranks"): the KJV split into uneven files plus an empty one, byte-level and GPT-2 BPE,
one file and shards, prompt/response records with a loss mask, and fewer files than ranks.
Each case runs on 1, 2 and 3 ranks into directories of its own, under the same file name;
every file written (dataset, shards, index) must be identical, and no part file may be left.
usage: prep_ranks.py PREP WORK GPT2_VOCAB_DIR CORPUS SFT_JSONL MPIEXEC NUMPROC_FLAG [PREFLAGS...]"""
import os
import shutil
import subprocess
import sys

prep, work, vocab_dir, corpus, sft = sys.argv[1:6]
mpiexec, numproc_flag, preflags = sys.argv[6], sys.argv[7], sys.argv[8:]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def fail(what):
    print("prep-ranks: FAIL:", what)
    sys.exit(1)


def split(path, parts, folder, suffix):
    """Writes path's lines as `parts` files of uneven sizes (1, 2, ..., parts shares) and an
    empty file into work/folder; returns the folder."""
    lines = open(path, "rb").read().splitlines(keepends=True)
    out = os.path.join(work, folder)
    os.makedirs(out)
    weights = list(range(1, parts + 1))
    begin = 0
    for i, w in enumerate(weights):
        end = len(lines) if i == parts - 1 else begin + len(lines) * w // sum(weights)
        with open(os.path.join(out, f"in-{i:02d}{suffix}"), "wb") as f:
            f.writelines(lines[begin:end])
        begin = end
    open(os.path.join(out, f"in-empty{suffix}"), "wb").close()
    return out


texts = split(corpus, 6, "texts", ".txt")
records = split(sft, 4, "records", ".jsonl")
gpt2 = ["--tokenizer", "gpt2", "--vocab-dir", vocab_dir]
cases = {
    "byte": ["--tokenizer", "byte", texts],
    "byte-shards": ["--tokenizer", "byte", "--split-lines", "--shard-tokens", "300000", texts],
    "gpt2": gpt2 + ["--split-lines", texts],
    "loss-mask": ["--tokenizer", "byte", "--loss-mask", "--prompt-field", "instruction",
                  "--response-field", "output", records],
    "one-file": ["--tokenizer", "byte", "--split-lines", corpus],
}
env = dict(os.environ, OMP_NUM_THREADS="1")
for name, args in cases.items():
    written = {}
    for ranks in (1, 2, 3):
        folder = os.path.join(work, f"{name}-np{ranks}")
        os.makedirs(folder)
        cmd = [prep, "--threads", "1", "--out", os.path.join(folder, "out.h5")] + args
        if ranks > 1:
            cmd = [mpiexec, numproc_flag, str(ranks)] + preflags + cmd
        run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        print(run.stdout + run.stderr, end="")
        if run.returncode != 0:
            fail(f"{name} on {ranks} rank(s) exited with {run.returncode}")
        if ranks > 1 and f"on each of {ranks} ranks" not in run.stdout:
            fail(f"{name} on {ranks} ranks: the summary does not say it ran on {ranks} ranks")
        files = sorted(os.listdir(folder))
        left = [f for f in files + os.listdir(args[-1] if os.path.isdir(args[-1]) else work)
                if ".part-" in f or f.endswith(".tmp")]
        if left:
            fail(f"{name} on {ranks} ranks left {left}")
        written[ranks] = {f: open(os.path.join(folder, f), "rb").read() for f in files}
    for ranks in (2, 3):
        if written[ranks].keys() != written[1].keys():
            fail(f"{name}: {ranks} ranks wrote {sorted(written[ranks])}, one rank "
                 f"{sorted(written[1])}")
        for f, data in written[1].items():
            if written[ranks][f] != data:
                fail(f"{name}: {f} written on {ranks} ranks differs from the one-rank file")
    print(f"prep-ranks: {name}: {len(written[1])} file(s), the same bytes on 1, 2 and 3 ranks")
print(f"prep-ranks: pass: {len(cases)} cases")
