#!/usr/bin/env python3
"""Context-parallel traffic in the summary equals the exact counts (doc/parallelism.md).

usage: cp_traffic.py WORKDIR "MPIEXEC... -np" TESSERA DECK [overrides...]

Runs the (llama) deck with cp = 2 and 4, ring and Ulysses, and reads rank 0's row of the cp
group in the closing traffic table. Per layer and micro-batch, with B sequences of T tokens,
c = T / (2 cp) tokens per zigzag chunk, nkv = B c Hkv D and nq = B (T / cp) Hq D floats:
  ring:    forward cp - 1 K/V sends, backward cp - 1 K/V sends and cp dK/dV sends, each of
           one K/V block of 4 nkv floats (k and v of both chunks), each with its receive:
           calls 2 (3 cp - 2), bytes 4 (3 cp - 2) 4 nkv;
  ulysses: forward 4 all-to-alls (q, k, v to heads, out back), backward 8 (q, k, v, out,
           dout to heads, dq, dk, dv back), each counting its whole input:
           calls 12, bytes 4 (6 nq + 6 nkv) -- with nkv = B (T / cp) Hkv D.
The ring's overlap line counts the requests it timed against attention: per layer and
micro-batch, forward 2 (cp - 1) (K/V send and receive), backward 3 (cp - 1) (K/V send and
receive, dK/dV receive); the dK/dV sends, waited a step later, are not timed.
"""
import os
import re
import subprocess
import sys


def main():
    work, mpiexec, tessera, deck = sys.argv[1:5]
    overrides = sys.argv[5:]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    layers, heads, kv_heads, d_model, T, B, accum, steps = 2, 4, 4, 64, 32, 2, 2, 3
    D = d_model // heads
    bad = 0
    for kind in ("ring", "ulysses"):
        for cp in (2, 4):
            out = os.path.join(work, f"{kind}_cp{cp}")
            cmd = mpiexec.split() + [str(cp), tessera, deck, *overrides, f"--output.dir={out}",
                                     f"--parallel.cp={cp}", f"--parallel.cp_kind={kind}",
                                     f"--model.layers={layers}", f"--model.heads={heads}",
                                     f"--model.kv_heads={kv_heads}", f"--model.d_model={d_model}",
                                     f"--model.seq_len={T}", f"--train.micro_batch={B}",
                                     f"--train.global_batch={B * accum}",
                                     f"--train.steps={steps}", "--train.eval_every=0",
                                     "--checkpoint.every=0", "--checkpoint.overwrite=true",
                                     "--hardware.peak_flops=1e9", "--output.echo_deck=false"]
            log = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            m = re.search(r"^cp\s+(\d+)\s+(\d+)\s", log, re.M)
            if not m:
                print(f"{kind} cp {cp}: no cp row in the summary\n{log}")
                bad += 1
                continue
            calls, nbytes = int(m.group(1)), int(m.group(2))
            per = layers * accum * steps
            if kind == "ring":
                nkv = B * (T // (2 * cp)) * kv_heads * D
                want_calls = per * 2 * (3 * cp - 2)
                want_bytes = per * (3 * cp - 2) * 4 * nkv * 4
            else:
                nq = B * (T // cp) * heads * D
                nkv = B * (T // cp) * kv_heads * D
                want_calls = per * 12
                want_bytes = per * 4 * (6 * nq + 6 * nkv)
            ok = calls == want_calls and nbytes == want_bytes
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {kind} cp {cp}: calls {calls} (exact {want_calls}), "
                  f"bytes {nbytes} (exact {want_bytes})")
            if kind == "ring":
                h = re.search(r"^cp ring: (\d+) K/V and dK/dV transfers.*hidden (\d+)%", log, re.M)
                want_transfers = per * 5 * (cp - 1)
                ok = h is not None and int(h.group(1)) == want_transfers
                bad += not ok
                print(f"{'ok ' if ok else 'BAD'} {kind} cp {cp}: transfers "
                      f"{h.group(1) if h else '?'} (exact {want_transfers}), hidden "
                      f"{h.group(2) if h else '?'}%")
    print("cp traffic: " + ("MATCH" if bad == 0 else "DIFFER"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
