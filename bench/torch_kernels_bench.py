#!/usr/bin/env python3
"""PyTorch's GEMMs and attention at the shapes of tessera-cuda-bench, and the comparison.

    torch_kernels_bench.py [--json FILE] [--reps N] [--compare TESSERA_JSON]

GEMMs: torch.matmul on the same (M, N, K, transposes) in fp32 (TF32 off) and bf16 (bf16 out).
Attention: F.scaled_dot_product_attention(is_causal=True) forward and backward in fp32 (and bf16
for reference; tessera's attention is fp32 only), on [B, H, T, D] tensors, excluding the
T x T "math" backend; grouped-query shapes use enable_gqa, or k/v expanded to Hq heads beforehand
(outside the timing) where this torch has no GQA kernel. FLOPs as in tessera-cuda-bench. Times
are medians over N repetitions after 3 warm-ups, with CUDA events.

With --compare, prints one line per case found in both files: tessera's and torch's times and
torch_ms / tessera_ms (> 1: tessera is faster).
"""
import argparse
import json
import statistics
import sys

MODELS = [
    dict(name="gpt2-small", tokens=8192,
         linears=[("qkv", 768, 2304), ("attn_out", 768, 768), ("mlp_up", 768, 3072),
                  ("mlp_down", 3072, 768), ("lm_head", 768, 50304)],
         B=8, T=1024, Hq=12, Hkv=12, D=64),
    dict(name="llama-1b", tokens=8192,
         linears=[("qkv", 2048, 3072), ("attn_out", 2048, 2048), ("gate_up", 2048, 16384),
                  ("down", 8192, 2048), ("lm_head", 2048, 128256)],
         B=4, T=2048, Hq=32, Hkv=8, D=64),
]


def passes(T, lin):
    name, fin, fout = lin
    return [("fwd", T, fout, fin, False, False),
            ("dgrad", T, fin, fout, False, True),
            ("wgrad", fin, fout, T, True, False)]


def time_ms(torch, fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def bench(torch, reps):
    import torch.nn.functional as F
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    records = []
    for m in MODELS:
        for dtype, dname in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            tot_flop = tot_ms = 0.0
            for lin in m["linears"]:
                for pname, M, N, K, ta, tb in passes(m["tokens"], lin):
                    A = torch.randn((K, M) if ta else (M, K), device=dev, dtype=dtype)
                    Bm = torch.randn((N, K) if tb else (K, N), device=dev, dtype=dtype)
                    opA = A.t() if ta else A
                    opB = Bm.t() if tb else Bm
                    ms = time_ms(torch, lambda: torch.matmul(opA, opB), reps)
                    flop = 2.0 * M * N * K
                    tot_flop += flop
                    tot_ms += ms
                    records.append(dict(model=m["name"], kind="gemm", name=f"{lin[0]}.{pname}",
                                        dtype=dname, M=M, N=N, K=K, ms=ms,
                                        tflops=flop / (ms * 1e-3) / 1e12))
                    print(f"  {m['name']:<10} {dname:<5} {lin[0] + '.' + pname:<16} "
                          f"{M:6d} x {N:6d} x {K:6d}  {ms:9.3f} ms  "
                          f"{records[-1]['tflops']:7.1f} TFLOP/s", flush=True)
                    del A, Bm, opA, opB
            records.append(dict(model=m["name"], kind="gemm", name="layer+head", dtype=dname,
                                M=0, N=0, K=0, ms=tot_ms, tflops=tot_flop / (tot_ms * 1e-3) / 1e12))
            torch.cuda.empty_cache()

        B, T, Hq, Hkv, D = m["B"], m["T"], m["Hq"], m["Hkv"], m["D"]
        fwd_flop = 4.0 * B * Hq * T * T * D / 2
        for dtype, dname in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            q = torch.randn(B, Hq, T, D, device=dev, dtype=dtype, requires_grad=True)
            k = torch.randn(B, Hkv, T, D, device=dev, dtype=dtype, requires_grad=True)
            v = torch.randn(B, Hkv, T, D, device=dev, dtype=dtype, requires_grad=True)
            dout = torch.randn(B, Hq, T, D, device=dev, dtype=dtype)
            how = run_attention(torch, F, q, k, v, dout, Hq, Hkv, reps, fwd_flop, m["name"],
                                dname, records)
            print(f"  {m['name']:<10} {dname:<5} attention ({how})", flush=True)
            del q, k, v, dout
            torch.cuda.empty_cache()
    return records


def run_attention(torch, F, q, k, v, dout, Hq, Hkv, reps, fwd_flop, model, dname, records):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                SDPBackend.CUDNN_ATTENTION]
    gqa = Hq != Hkv

    def attempt(kk, vv, enable_gqa):
        with sdpa_kernel(backends):
            def fwd():
                return F.scaled_dot_product_attention(q, kk, vv, is_causal=True,
                                                      enable_gqa=enable_gqa)
            out = fwd()
            with torch.no_grad():
                fwd_ms = time_ms(torch, fwd, reps)
            bwd_ms = time_ms(torch, lambda: torch.autograd.grad(out, (q, kk, vv), dout,
                                                                retain_graph=True), reps)
        return fwd_ms, bwd_ms

    try:
        fwd_ms, bwd_ms = attempt(k, v, gqa)
        how = "enable_gqa" if gqa else "MHA"
    except RuntimeError:
        if not gqa:
            raise
        rep = Hq // Hkv
        kk = k.detach().repeat_interleave(rep, dim=1).requires_grad_()
        vv = v.detach().repeat_interleave(rep, dim=1).requires_grad_()
        fwd_ms, bwd_ms = attempt(kk, vv, False)
        how = "k/v expanded to Hq heads"
    for name, ms, flop in (("fwd", fwd_ms, fwd_flop), ("bwd", bwd_ms, 2.5 * fwd_flop)):
        records.append(dict(model=model, kind="attention", name=name, dtype=dname, M=q.shape[2],
                            N=q.shape[1], K=q.shape[3], ms=ms, tflops=flop / (ms * 1e-3) / 1e12))
        print(f"  {model:<10} {dname:<5} attention.{name:<6} {ms:9.3f} ms  "
              f"{records[-1]['tflops']:7.1f} TFLOP/s", flush=True)
    return how


def compare(ours_path, theirs):
    with open(ours_path) as f:
        ours = json.load(f)
    peak = ours.get("peak_tflops", 989.0)
    index = {(r["model"], r["kind"], r["name"], r["dtype"]): r for r in theirs}
    print(f"\n{'case':<44} {'tessera ms':>11} {'torch ms':>10} {'torch/tessera':>14} "
          f"{'tessera TFLOP/s':>16} {'% peak':>7}")
    for r in ours["records"]:
        key = (r["model"], r["kind"], r["name"], r["dtype"])
        t = index.get(key)
        label = f"{r['model']} {r['dtype']} {r['kind']} {r['name']}"
        if t is None:
            print(f"{label:<44} {r['ms']:11.3f} {'-':>10}")
            continue
        print(f"{label:<44} {r['ms']:11.3f} {t['ms']:10.3f} {t['ms'] / r['ms']:14.2f} "
              f"{r['tflops']:16.1f} {100 * r['tflops'] / peak:6.1f}%")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--compare")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch is not installed: no PyTorch comparison")
        return 0
    if not torch.cuda.is_available():
        print("torch has no CUDA device: no PyTorch comparison")
        return 0
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    records = bench(torch, a.reps)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(impl="torch", version=torch.__version__,
                           device=torch.cuda.get_device_name(0), records=records), f, indent=1)
    if a.compare:
        compare(a.compare, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
