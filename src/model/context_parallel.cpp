#include "model/context_parallel.hpp"

#include <chrono>
#include <cmath>
#include <utility>
#include <vector>

#include "kernels/kernels.hpp"
#include "model/transfers.hpp"

namespace tessera::cp {
namespace {

constexpr int kTagKv = 1701, kTagDkv = 1702;

kernels::AttnShape block_shape(const ModelConfig& cfg, int64_t B, int64_t Tq, int64_t Tk,
                               int64_t q_pos0, int64_t k_pos0, int64_t Hq, int64_t Hkv,
                               DType compute) {
  const int64_t D = cfg.head_dim;
  // A bf16 core's q comes with the softmax scale folded in (Attention::kernel_scale).
  const float scale = compute == DType::bf16 ? 1.0f : 1.0f / std::sqrt(float(D));
  return {B, Tq, Hq, Hkv, D, scale, Tk, q_pos0, k_pos0, compute};
}

// ---- ring ---------------------------------------------------------------------------------

// The sizes of one rank's tokens: 2 chunks of c tokens of each of B sequences.
struct Ring {
  int P, r, next, prev;
  int64_t B, c, Hq, Hkv, D;
  int64_t nq, nkv, nlse;  // floats of one chunk of q (and out), of k (or v), of lse
  Ring(const StepContext& ctx, const ModelConfig& cfg, int64_t rows)
      : P(ctx.par.cp->size()),
        r(ctx.par.cp->rank()),
        next((r + 1) % P),
        prev((r + P - 1) % P),
        B(rows / cfg.seq_local()),
        c(cfg.seq_local() / 2),
        Hq(cfg.heads_local()),
        Hkv(cfg.kv_heads_local()),
        D(cfg.head_dim),
        nq(B * c * Hq * D),
        nkv(B * c * Hkv * D),
        nlse(B * Hq * c) {}
  // Global chunk index of local chunk j of rank src.
  int64_t chunk(int src, int j) const { return j == 0 ? src : 2 * P - 1 - src; }
  // The block of [k chunk 0, k chunk 1, v chunk 0, v chunk 1] that travels.
  int64_t block() const { return 4 * nkv; }
  int64_t k_at(int j) const { return j * nkv; }
  int64_t v_at(int j) const { return (2 + j) * nkv; }
  // Document starts of local chunk j's query rows, [B, c] (empty without document masking):
  // keys need none, so the blocks that travel carry nothing more.
  Tensor docs(const StepContext& ctx, int j) const {
    return ctx.docs.on() ? ctx.docs.start.slice(j * B * c, B * c) : Tensor{};
  }
};

Tensor flat(const Tensor& t, int64_t begin, int64_t n) {
  return t.slice(begin, n);
}

void ring_forward(StepContext& ctx, const ModelConfig& cfg, const Tensor& q, const Tensor& k,
                  const Tensor& v, const Tensor& att, const Tensor& lse, DType compute) {
  Communicator& comm = *ctx.par.cp;
  const Ring R(ctx, cfg, q.shape[0]);
  Tensor cur = ctx.scratch.get(ScratchId::cp_kv_a, {R.block()});
  Tensor nxt = ctx.scratch.get(ScratchId::cp_kv_b, {R.block()});
  const Tensor part = ctx.scratch.get(ScratchId::cp_part, {R.nq});
  const Tensor part_lse = ctx.scratch.get(ScratchId::cp_part_lse, {R.nlse});
  kernels::copy(k, flat(cur, 0, 2 * R.nkv), 2 * R.nkv);
  kernels::copy(v, flat(cur, 2 * R.nkv, 2 * R.nkv), 2 * R.nkv);
  bool started[2] = {false, false};
  for (int i = 0; i < R.P; ++i) {
    const int src = (R.r - i + R.P) % R.P;
    StepTransfers kv(ctx.par.cp_timing);
    if (i < R.P - 1) {  // the next block travels while this one is attended to
      kv.add(comm.irecv(nxt.slice(0, R.block()), R.prev, kTagKv));
      kv.add(comm.isend(cur.slice(0, R.block()), R.next, kTagKv));
    }
    for (int qj = 0; qj < 2; ++qj)
      for (int kj = 0; kj < 2; ++kj) {
        const int64_t gq = R.chunk(R.r, qj), gk = R.chunk(src, kj);
        if (gk > gq) continue;  // wholly in the queries' future
        const auto s = block_shape(cfg, R.B, R.c, R.c, gq * R.c, gk * R.c, R.Hq, R.Hkv, compute);
        const Tensor qc = flat(q, qj * R.nq, R.nq), oc = flat(att, qj * R.nq, R.nq);
        const Tensor lc = flat(lse, qj * R.nlse, R.nlse);
        const Tensor kc = flat(cur, R.k_at(kj), R.nkv), vc = flat(cur, R.v_at(kj), R.nkv);
        const Tensor dc = R.docs(ctx, qj);
        if (!started[qj]) {
          kernels::attention_forward(qc, kc, vc, oc, lc, s, dc);
          started[qj] = true;
        } else {
          kernels::attention_forward(qc, kc, vc, part, part_lse, s, dc);
          kernels::attention_merge(oc, lc, part, part_lse, R.B, R.c, R.Hq, R.D);
        }
        kv.poll();  // let MPI progress the transfer
      }
    kv.finish();
    std::swap(cur, nxt);
  }
}

void ring_backward(StepContext& ctx, const ModelConfig& cfg, const Tensor& d_att, const Tensor& q,
                   const Tensor& k, const Tensor& v, const Tensor& att, const Tensor& lse,
                   const Tensor& dq, const Tensor& dk, const Tensor& dv, DType compute) {
  Communicator& comm = *ctx.par.cp;
  const Ring R(ctx, cfg, q.shape[0]);
  Tensor cur = ctx.scratch.get(ScratchId::cp_kv_a, {R.block()});
  Tensor nxt = ctx.scratch.get(ScratchId::cp_kv_b, {R.block()});
  const Tensor dkv[2] = {ctx.scratch.get(ScratchId::cp_dkv_a, {R.block()}),
                         ctx.scratch.get(ScratchId::cp_dkv_b, {R.block()})};
  const Tensor local = ctx.scratch.get(ScratchId::cp_dkv_local, {R.block()});
  const Tensor dq_part = ctx.scratch.get(ScratchId::cp_part, {R.nq});
  const Tensor dk_part = ctx.scratch.get(ScratchId::cp_part_dk, {R.nkv});
  const Tensor dv_part = ctx.scratch.get(ScratchId::cp_part_dv, {R.nkv});
  kernels::copy(k, flat(cur, 0, 2 * R.nkv), 2 * R.nkv);
  kernels::copy(v, flat(cur, 2 * R.nkv, 2 * R.nkv), 2 * R.nkv);
  kernels::fill(dq, 0.0f, 2 * R.nq);
  // Step i holds the K/V block of rank src = r - i and, from step 1 on, receives the dK/dV
  // that ranks src .. r - 1 accumulated for it; it adds its own and sends the sum on. After
  // the last step every block's dK/dV has visited every rank and reaches its owner.
  Request dkv_send;
  for (int i = 0; i < R.P; ++i) {
    const int src = (R.r - i + R.P) % R.P;
    const Tensor& acc = dkv[i % 2];
    StepTransfers xfer(ctx.par.cp_timing);
    if (i < R.P - 1) {
      xfer.add(comm.irecv(nxt.slice(0, R.block()), R.prev, kTagKv));
      xfer.add(comm.isend(cur.slice(0, R.block()), R.next, kTagKv));
    }
    if (i > 0) xfer.add(comm.irecv(acc.slice(0, R.block()), R.prev, kTagDkv));
    kernels::fill(local, 0.0f, R.block());
    for (int qj = 0; qj < 2; ++qj)
      for (int kj = 0; kj < 2; ++kj) {
        const int64_t gq = R.chunk(R.r, qj), gk = R.chunk(src, kj);
        if (gk > gq) continue;
        const auto s = block_shape(cfg, R.B, R.c, R.c, gq * R.c, gk * R.c, R.Hq, R.Hkv, compute);
        kernels::attention_backward(flat(d_att, qj * R.nq, R.nq), flat(q, qj * R.nq, R.nq),
                                    flat(cur, R.k_at(kj), R.nkv), flat(cur, R.v_at(kj), R.nkv),
                                    flat(att, qj * R.nq, R.nq), flat(lse, qj * R.nlse, R.nlse),
                                    dq_part, dk_part, dv_part, s, R.docs(ctx, qj));
        kernels::add_inplace(flat(dq, qj * R.nq, R.nq), dq_part, R.nq);
        kernels::add_inplace(flat(local, R.k_at(kj), R.nkv), dk_part, R.nkv);
        kernels::add_inplace(flat(local, R.v_at(kj), R.nkv), dv_part, R.nkv);
        xfer.poll();
      }
    xfer.finish();
    if (i > 0)
      kernels::add_inplace(acc, local, R.block());
    else
      kernels::copy(local, acc, R.block());
    dkv_send.wait();  // the previous step's, from the other buffer
    dkv_send = comm.isend(acc.slice(0, R.block()), R.next, kTagDkv);
    std::swap(cur, nxt);
  }
  // This rank's own block comes home from the previous rank with every contribution.
  const Tensor& home = dkv[R.P % 2];
  comm.irecv(home.slice(0, R.block()), R.prev, kTagDkv).wait();
  dkv_send.wait();
  kernels::copy(flat(home, 0, 2 * R.nkv), dk, 2 * R.nkv);
  kernels::copy(flat(home, 2 * R.nkv, 2 * R.nkv), dv, 2 * R.nkv);
}

// ---- ulysses ------------------------------------------------------------------------------

// rows x cols elements from x (from element x0, rows ldx apart) to y (from y0, ldy apart), in
// the tensors' space.
void copy_block(const Tensor& x, int64_t x0, int64_t ldx, const Tensor& y, int64_t y0, int64_t ldy,
                int64_t rows, int64_t cols) {
  kernels::copy_rows(x.slice(x0, x.numel() - x0), ldx, y.slice(y0, y.numel() - y0), ldy, rows,
                     cols);
}

// x[B, Tl, H, D] (this rank's tokens, every head) -> y[B, T, H/P, D] (every token, this rank's
// heads), T = P x Tl.
void to_heads(StepContext& ctx, const Tensor& x, const Tensor& y, int64_t B, int64_t Tl, int64_t H,
              int64_t D) {
  Communicator& comm = *ctx.par.cp;
  const int64_t P = comm.size(), Hl = H / P, n = B * Tl * Hl * D;
  const Tensor send = ctx.scratch.get(ScratchId::cp_a2a_send, {n * P});
  const Tensor recv = ctx.scratch.get(ScratchId::cp_a2a_recv, {n * P});
  for (int64_t j = 0; j < P; ++j)  // [bt][H] -> [j][bt][Hl]
    copy_block(x, j * Hl * D, H * D, send, j * n, Hl * D, B * Tl, Hl * D);
  comm.all_to_all(send.slice(0, n * P), recv.slice(0, n * P));
  for (int64_t j = 0; j < P; ++j)  // [j][b][Tl] -> [b][j Tl]
    copy_block(recv, j * n, Tl * Hl * D, y, j * Tl * Hl * D, P * Tl * Hl * D, B, Tl * Hl * D);
}

// The inverse: y[B, T, H/P, D] -> x[B, Tl, H, D].
void to_sequence(StepContext& ctx, const Tensor& y, const Tensor& x, int64_t B, int64_t Tl,
                 int64_t H, int64_t D) {
  Communicator& comm = *ctx.par.cp;
  const int64_t P = comm.size(), Hl = H / P, n = B * Tl * Hl * D;
  const Tensor send = ctx.scratch.get(ScratchId::cp_a2a_send, {n * P});
  const Tensor recv = ctx.scratch.get(ScratchId::cp_a2a_recv, {n * P});
  for (int64_t j = 0; j < P; ++j)  // [b][j Tl] -> [j][b][Tl]
    copy_block(y, j * Tl * Hl * D, P * Tl * Hl * D, send, j * n, Tl * Hl * D, B, Tl * Hl * D);
  comm.all_to_all(send.slice(0, n * P), recv.slice(0, n * P));
  for (int64_t j = 0; j < P; ++j)  // [j][bt][Hl] -> [bt][H]
    copy_block(recv, j * n, Hl * D, x, j * Hl * D, H * D, B * Tl, Hl * D);
}

struct Ulysses {
  int64_t B, Tl, T, Hq, Hkv, D, P;
  Ulysses(const StepContext& ctx, const ModelConfig& cfg, int64_t rows)
      : B(rows / cfg.seq_local()),
        Tl(cfg.seq_local()),
        T(cfg.seq_len),
        Hq(cfg.heads_local()),
        Hkv(cfg.kv_heads_local()),
        D(cfg.head_dim),
        P(ctx.par.cp->size()) {}
  int64_t nq() const { return B * Tl * Hq * D; }
  int64_t nkv() const { return B * Tl * Hkv * D; }
  kernels::AttnShape shape(const ModelConfig& cfg, DType compute) const {
    return block_shape(cfg, B, T, T, 0, 0, Hq / P, Hkv / P, compute);
  }
};

void ulysses_forward(StepContext& ctx, const ModelConfig& cfg, const Tensor& q, const Tensor& k,
                     const Tensor& v, const Tensor& att, const Tensor& lse, DType compute) {
  const Ulysses U(ctx, cfg, q.shape[0]);
  const Tensor qh = ctx.scratch.get(ScratchId::cp_heads_q, {U.nq()});
  const Tensor kh = ctx.scratch.get(ScratchId::cp_heads_k, {U.nkv()});
  const Tensor vh = ctx.scratch.get(ScratchId::cp_heads_v, {U.nkv()});
  const Tensor oh = ctx.scratch.get(ScratchId::cp_heads_out, {U.nq()});
  to_heads(ctx, q, qh, U.B, U.Tl, U.Hq, U.D);
  to_heads(ctx, k, kh, U.B, U.Tl, U.Hkv, U.D);
  to_heads(ctx, v, vh, U.B, U.Tl, U.Hkv, U.D);
  kernels::attention_forward(qh, kh, vh, oh, lse, U.shape(cfg, compute), ctx.docs.start_seq);
  to_sequence(ctx, oh, att, U.B, U.Tl, U.Hq, U.D);
}

void ulysses_backward(StepContext& ctx, const ModelConfig& cfg, const Tensor& d_att,
                      const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& att,
                      const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                      DType compute) {
  const Ulysses U(ctx, cfg, q.shape[0]);
  const Tensor qh = ctx.scratch.get(ScratchId::cp_heads_q, {U.nq()});
  const Tensor kh = ctx.scratch.get(ScratchId::cp_heads_k, {U.nkv()});
  const Tensor vh = ctx.scratch.get(ScratchId::cp_heads_v, {U.nkv()});
  const Tensor oh = ctx.scratch.get(ScratchId::cp_heads_out, {U.nq()});
  const Tensor doh = ctx.scratch.get(ScratchId::cp_heads_dout, {U.nq()});
  const Tensor dqh = ctx.scratch.get(ScratchId::cp_heads_dq, {U.nq()});
  const Tensor dkh = ctx.scratch.get(ScratchId::cp_heads_dk, {U.nkv()});
  const Tensor dvh = ctx.scratch.get(ScratchId::cp_heads_dv, {U.nkv()});
  to_heads(ctx, q, qh, U.B, U.Tl, U.Hq, U.D);
  to_heads(ctx, k, kh, U.B, U.Tl, U.Hkv, U.D);
  to_heads(ctx, v, vh, U.B, U.Tl, U.Hkv, U.D);
  to_heads(ctx, att, oh, U.B, U.Tl, U.Hq, U.D);
  to_heads(ctx, d_att, doh, U.B, U.Tl, U.Hq, U.D);
  kernels::attention_backward(doh, qh, kh, vh, oh, lse, dqh, dkh, dvh, U.shape(cfg, compute),
                              ctx.docs.start_seq);
  to_sequence(ctx, dqh, dq, U.B, U.Tl, U.Hq, U.D);
  to_sequence(ctx, dkh, dk, U.B, U.Tl, U.Hkv, U.D);
  to_sequence(ctx, dvh, dv, U.B, U.Tl, U.Hkv, U.D);
}

}  // namespace

void attention_forward(StepContext& ctx, const ModelConfig& cfg, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& att, const Tensor& lse, DType compute) {
  if (cfg.cp.kind == CpKind::ulysses) return ulysses_forward(ctx, cfg, q, k, v, att, lse, compute);
  ring_forward(ctx, cfg, q, k, v, att, lse, compute);
}

void attention_backward(StepContext& ctx, const ModelConfig& cfg, const Tensor& d_att,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& att,
                        const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                        DType compute) {
  if (cfg.cp.kind == CpKind::ulysses)
    return ulysses_backward(ctx, cfg, d_att, q, k, v, att, lse, dq, dk, dv, compute);
  ring_backward(ctx, cfg, d_att, q, k, v, att, lse, dq, dk, dv, compute);
}

}  // namespace tessera::cp
