// The backend-neutral kernel API. Every compute kernel tessera runs is declared here;
// cpu/ holds the reference implementation (OpenMP loops + oneDNN GEMM), cuda/ the GPU one.
// All tensors are dense, row-major, fp32 unless stated; sizes are element counts.
#pragma once

#include <cstdint>

namespace tessera::kernels {

// ---- GEMM ---------------------------------------------------------------------------
// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, row-major.
// trans_a: A is stored as [K,M]; trans_b: B is stored as [N,K].
void matmul(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K,
            bool trans_a, bool trans_b, float alpha = 1.0f, float beta = 0.0f);

// ---- elementwise / reductions ---------------------------------------------------------
void fill(float* x, float value, int64_t n);
void copy(const float* x, float* y, int64_t n);
void add_inplace(float* y, const float* x, int64_t n);        // y += x
void scale_inplace(float* x, float alpha, int64_t n);         // x *= alpha
double sum_squares(const float* x, int64_t n);                 // sum x^2 in fp64
// db[C] += sum over rows of dy[N,C] (bias gradient)
void bias_backward(const float* dy, float* db, int64_t N, int64_t C);
// y[N,C] += b[C]
void bias_add(float* y, const float* b, int64_t N, int64_t C);

// ---- normalisation -------------------------------------------------------------------
// y = x / rms(x) * w; rstd[N] saved for backward.
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t N,
                     int64_t C, float eps);
// dx = (overwritten); dw += (accumulated).
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd,
                      float* dx, float* dw, int64_t N, int64_t C);
// y = (x - mean) * rstd * w + b; mean[N], rstd[N] saved for backward.
void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean,
                       float* rstd, int64_t N, int64_t C, float eps);
// dx overwritten; dw, db accumulated.
void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean,
                        const float* rstd, float* dx, float* dw, float* db, int64_t N,
                        int64_t C);

// ---- activations ---------------------------------------------------------------------
// out = silu(gate) * up
void swiglu_forward(const float* gate, const float* up, float* out, int64_t n);
// dgate, dup overwritten.
void swiglu_backward(const float* dout, const float* gate, const float* up, float* dgate,
                     float* dup, int64_t n);
// GELU, tanh approximation (GPT-2).
void gelu_forward(const float* x, float* y, int64_t n);
void gelu_backward(const float* dy, const float* x, float* dx, int64_t n);  // dx overwritten

// ---- rotary position embedding ------------------------------------------------------------
// x is [B,T,H,D] (D even), rotated in place; position of token t is pos0 + t.
// Pairs are (x[2i], x[2i+1]) with frequency theta^(-2i/D) (the Llama convention).
// inverse = true applies the transpose rotation (used by backward).
void rope(float* x, int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos0, float theta,
          bool inverse);

// ---- causal attention -----------------------------------------------------------------
// q[B,T,Hq,D], k,v[B,T,Hkv,D], out[B,T,Hq,D], lse[B,Hq,T] (log-sum-exp of the scaled
// scores of each query row, saved for backward). Hq % Hkv == 0: query head h reads
// key/value head h / (Hq/Hkv). Computed blockwise with an online softmax; no TxT matrix.
struct AttnShape {
  int64_t B, T, Hq, Hkv, D;
  float scale;  // usually 1/sqrt(D)
};
void attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                       const AttnShape& s);
// dq, dk, dv are overwritten.
void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                        const float* out, const float* lse, float* dq, float* dk, float* dv,
                        const AttnShape& s);

// ---- embedding -----------------------------------------------------------------------
// out[N,C] = table[ids[n], :]
void embedding_forward(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C);
// dtable[ids[n], :] += dout[n, :]
void embedding_backward(const int32_t* ids, const float* dout, float* dtable, int64_t N,
                        int64_t C);
// Vocabulary-parallel forms: the table holds rows [v0, v0 + rows) of the whole one. Forward
// writes table[ids[n] - v0] for ids inside the range and zeros elsewhere (the ranks' outputs
// sum to the whole lookup); backward adds only the rows inside the range.
void embedding_forward_range(const int32_t* ids, const float* table, float* out, int64_t N,
                             int64_t C, int64_t v0, int64_t rows);
void embedding_backward_range(const int32_t* ids, const float* dout, float* dtable, int64_t N,
                              int64_t C, int64_t v0, int64_t rows);

// ---- cross-entropy -------------------------------------------------------------------
// logits[N,V] (row stride V) are replaced by grad_scale * (softmax - onehot(target)).
// Columns >= V_valid are padding: they get probability 0 and gradient 0.
// losses[N] receives -log softmax[target] per row.
void cross_entropy_fused(float* logits, const int32_t* targets, float* losses, int64_t N,
                         int64_t V, int64_t V_valid, float grad_scale);
// Vocabulary-parallel cross-entropy, in three passes with all-reduces over the vocabulary
// ranks between them; this rank holds columns [v0, v0 + V) of the logits, of which the first
// V_valid are real. (1) row_max[n] = max over the valid local columns (-inf if none).
void cross_entropy_local_max(const float* logits, float* row_max, int64_t N, int64_t V,
                             int64_t V_valid);
// (2) with the global row_max: logits[n, v] = exp(logits[n, v] - row_max[n]) on valid columns,
// sum_exp[n] = their sum, target_logit[n] = logits[n, t] - row_max[n] when target t is local,
// else 0.
void cross_entropy_local_exp(float* logits, const int32_t* targets, const float* row_max,
                             double* sum_exp, float* target_logit, int64_t N, int64_t V,
                             int64_t V_valid, int64_t v0);
// (3) with the global sums: losses[n] = log(sum_exp[n]) - target_logit[n]; logits become
// grad_scale * (softmax - onehot(target)) on this rank's columns (padding 0).
void cross_entropy_local_finish(float* logits, const int32_t* targets, const double* sum_exp,
                                const float* target_logit, float* losses, int64_t N, int64_t V,
                                int64_t V_valid, int64_t v0, float grad_scale);

// ---- optimizer -----------------------------------------------------------------------
// One AdamW step with decoupled weight decay on n elements (PyTorch's torch.optim.AdamW).
struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;             // 1-based, for bias correction
  float grad_scale = 1.0f;  // g is used as grad_scale * g (gradient clipping, fused)
};
void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWArgs& a);

}  // namespace tessera::kernels
