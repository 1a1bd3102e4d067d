// The kernel API. Every compute kernel tessera runs is declared here once and takes Tensors;
// the call runs on the backend of the tensors' memory space: cpu/ (OpenMP loops + oneDNN GEMM)
// for Space::host, cuda/ (CUDA + cuBLAS) for Space::cuda.
//
// Sizes are passed explicitly, as scalars, and each tensor must hold at least the elements they
// imply; the call checks that, that every tensor argument is in one space, and that each has the
// dtype the kernel takes (f32 unless stated; token ids i32). A mismatch raises tessera::Error
// naming the kernel and the argument: nothing is converted silently. Tensors are dense and
// row-major. An output that a call does not use may be an empty Tensor{}.
//
// On Space::cuda kernels are queued on the calling thread's current cuda::Context
// (kernels/cuda/context.hpp) and return at once, except sum_squares, which returns a host value.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tensor/tensor.hpp"

namespace tessera {
class DevicePool;
}

namespace tessera::kernels {

// ---- backends ---------------------------------------------------------------------------
// Whether this build has the CUDA backend (configured with TESSERA_CUDA=ON), and the CUDA
// devices this process sees (0 without the backend, a driver or a device). Under emulation
// the backend counts as built and the count is the emulated one.
bool cuda_backend_built();
int cuda_device_count();
// Which physical GPU the visible device `index` is (its PCI bus id; "emulated N" under
// emulation): two ranks of a node that see different devices as index 0 are told apart.
std::string cuda_device_id(int index);
// Emulated CUDA devices (tests only, doc/testing.md): TESSERA_EMULATE_CUDA=N, N > 0, makes
// N devices visible whose memory is host memory and whose kernels are the host ones, so the
// GPU path's control flow (device allocation, every staging copy) runs without a GPU and
// gives the CPU run's results bit for bit. 0 when unset.
int cuda_emulated();

// The device a rank's tensors live on under hardware.device = cuda, for this object's
// lifetime: on a GPU a cuda::Context (stream, cuBLAS handle, memory pool) made current on the
// creating thread, which must be the thread that runs the kernels; under emulation a pool of
// host memory whose blocks say Space::cuda. tessera::Error when neither is available.
class Device {
 public:
  explicit Device(int index);  // the node's CUDA device `index`
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  DevicePool& pool();  // its blocks are Space::cuda (Allocator(pool, host))
  void synchronize();  // waits for the queued work; raises a kernel's fault
  // What collectives on its memory need (comm/'s DeviceLink): the kernels' stream and a
  // communication stream (cudaStream_t; null on an emulated device), and whether the device
  // is emulated (its memory is host memory, which MPI reads as it is).
  void* compute_stream();
  void* comm_stream();
  bool emulated() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Copies n elements from src to dst (the same dtype, any spaces): the staging copy between
// host and device memory. A copy into host memory has finished when the call returns; one
// into device memory is queued (the source may be reused at once).
void transfer(const Tensor& src, const Tensor& dst, int64_t n);
// Whether the cpu backend multiplies bf16 natively: oneDNN on a CPU with AVX512-BF16 or AMX, not
// capped below it by ONEDNN_MAX_CPU_ISA. Otherwise its bf16 GEMM is oneDNN's emulation
// (AVX-512) or, below AVX-512, sgemm on operands widened to fp32: slower than fp32.
bool cpu_native_bf16();
// Whether the cpu backend's bf16 GEMMs are oneDNN's matmul (AVX-512 and up), which
// matmul_packed_b can pack B for; below AVX-512 they are widened to fp32 and never packed.
bool cpu_bf16_matmul();
// Whether the cpu backend's 16-bit GEMMs run on a matrix engine (oneDNN with AMX, not capped
// below it by ONEDNN_MAX_CPU_ISA): 4-9x its fp32 GEMMs, so that the traffic around a GEMM, not
// its arithmetic, sets the time of the wide ones (the output head's vocabulary tiles,
// ModelConfig::head_vocab_tile).
bool cpu_matrix_engine();

// ---- GEMM ---------------------------------------------------------------------------
// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, row-major.
// trans_a: A is stored as [K,M]; trans_b: B is stored as [N,K].
// A and B f32 with C f32; or A and B both bf16 or both f16 (fp32 accumulation) with C f32 or of
// their dtype (the cpu backend: bf16 through oneDNN, f16 widened to f32, C f32 for f16).
void matmul(const Tensor& A, const Tensor& B, const Tensor& C, int64_t M, int64_t N, int64_t K,
            bool trans_a, bool trans_b, float alpha = 1.0f, float beta = 0.0f);
// C = op(A) op(B) as matmul, where the backend may first pack B into pack_space (memory of any
// dtype the caller does not need during the call) when it gains by it: the cpu backend with
// bf16 operands on oneDNN's matmul (cpu_bf16_matmul), A not transposed, at least 512 rows (1024
// with AMX), and room for the packed B (the output
// head's two GEMMs over the vocabulary; doc/performance.md, "Packing the weights"), the same
// bits as matmul; or, with AMX, a long reduction with B not transposed and C f32 (the head's
// input gradient) as its transpose C^T = B^T A^T into pack_space, then transposed into C (the
// same products in another summation order; doc/performance.md, "Measured on a CPU with AMX").
// Returns whether pack_space was used.
bool matmul_packed_b(const Tensor& A, const Tensor& B, const Tensor& C, int64_t M, int64_t N,
                     int64_t K, bool trans_a, bool trans_b, const Tensor& pack_space);

// FLOPs (2 M N K) of the GEMMs this process has run through matmul and matmul_packed_b, by
// operand dtype (f32, bf16, f16): what a run reports as the share computed in 16 bits
// (gemm.json; a 16-bit layout test fails on a run that silently multiplies in fp32).
double gemm_flops(DType operands);

// ---- elementwise / reductions ---------------------------------------------------------
void fill(const Tensor& x, float value, int64_t n);
void copy(const Tensor& x, const Tensor& y, int64_t n);         // y = x
void add_inplace(const Tensor& y, const Tensor& x, int64_t n);  // y += x
void scale_inplace(const Tensor& x, float alpha, int64_t n);    // x *= alpha
double sum_squares(const Tensor& x, int64_t n);                 // sum x^2 in fp64
// total[0] += sum x^2 in fp64; total is f64 in x's space, so a device sums many tensors
// without waiting and copies one number back at the end.
void sum_squares_accumulate(const Tensor& x, int64_t n, const Tensor& total);
// db[C] += sum over rows of dy[N,C] (bias gradient)
void bias_backward(const Tensor& dy, const Tensor& db, int64_t N, int64_t C);
// y[N,C] += b[C]
void bias_add(const Tensor& y, const Tensor& b, int64_t N, int64_t C);
// y[r, c] = x[r, c] for r < rows, c < cols, rows ldx apart in x and ldy apart in y (cols <=
// both): a block of a wider matrix in one call.
void copy_rows(const Tensor& x, int64_t ldx, const Tensor& y, int64_t ldy, int64_t rows,
               int64_t cols);

// ---- casts -----------------------------------------------------------------------------
// y = x converted to y's dtype: f32 -> bf16 / f16 with round to nearest even (NaN stays NaN,
// overflow becomes infinity), and bf16 / f16 -> f32 (exact). Same dtypes: a copy (f32 only).
void cast(const Tensor& x, const Tensor& y, int64_t n);

// ---- normalisation -------------------------------------------------------------------
// The forwards' y is f32, or bf16 / f16: the fp32 value rounded as kernels::cast rounds it (a
// 16-bit run keeps a norm's output only as its GEMMs' operand). Statistics are f32.
// y = x / rms(x) * w; rstd[N] saved for backward.
void rmsnorm_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd,
                     int64_t N, int64_t C, float eps);
// dx = (overwritten); dw += (accumulated).
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dw, int64_t N, int64_t C);
// y = (x - mean) * rstd * w + b; mean[N], rstd[N] saved for backward.
void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd, int64_t N, int64_t C, float eps);
// dx overwritten; dw, db accumulated.
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db,
                        int64_t N, int64_t C);

// ---- activations ---------------------------------------------------------------------
// out = silu(gate) * up
void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out, int64_t n);
// dgate, dup overwritten.
void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                     const Tensor& dup, int64_t n);
// GELU, tanh approximation (GPT-2).
void gelu_forward(const Tensor& x, const Tensor& y, int64_t n);
void gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx, int64_t n);  // dx =

// ---- fused MLP epilogues ----------------------------------------------------------------
// One pass over an MLP's hidden tensors [N, C] between its GEMMs, computing what bias_add, the
// activation above, cast and bias_backward compute, in the same order and with the same bits
// (doc/kokkos.md, "Fused epilogues"). Optional arguments may be empty Tensors; a 16-bit output
// is bf16 or f16, rounded as kernels::cast rounds the fp32 value.
// Forward: pre += bias (per column, when bias is given; pre keeps the result), act = gelu(pre)
// written to act (f32) and / or act16 (16 bits; at least one).
void gelu_bias_forward(const Tensor& pre, const Tensor& bias, const Tensor& act,
                       const Tensor& act16, int64_t N, int64_t C);
// gate += gate_bias, up += up_bias (both or neither), act = silu(gate) * up, act16 as above.
void swiglu_bias_forward(const Tensor& gate, const Tensor& up, const Tensor& gate_bias,
                         const Tensor& up_bias, const Tensor& act, const Tensor& act16, int64_t N,
                         int64_t C);
// Backward: dpre = gelu'(pre) * dact, written to dpre (f32) and / or dpre16 (at least one);
// dbias[C] += the column sums of dpre (optional), summed as bias_backward sums them.
void gelu_bias_backward(const Tensor& dact, const Tensor& pre, const Tensor& dpre,
                        const Tensor& dpre16, const Tensor& dbias, int64_t N, int64_t C);
// swiglu_backward's dgate, dup (f32 pair and / or 16-bit pair), and the column sums of each into
// dgate_bias, dup_bias (both or neither).
void swiglu_bias_backward(const Tensor& dact, const Tensor& gate, const Tensor& up,
                          const Tensor& dgate, const Tensor& dup, const Tensor& dgate16,
                          const Tensor& dup16, const Tensor& dgate_bias, const Tensor& dup_bias,
                          int64_t N, int64_t C);

// ---- rotary position embedding ------------------------------------------------------------
// x is [B,T,H,D] (D even), rotated in place; position of token t is pos0 + t.
// Pairs are (x[2i], x[2i+1]) with frequency theta^(-2i/D) (the Llama convention).
// inverse = true applies the transpose rotation (used by backward). With y (bf16, the size of
// x) the rotated x is written there, rounded to nearest even (as kernels::cast rounds it), and
// x is left unchanged: the rotation and the rounding in one pass.
void rope(const Tensor& x, int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos0, float theta,
          bool inverse, const Tensor& y = {});
// The same rotation of x[N,H,D] with token n at position pos[n] (i32): document masking's
// positions, which restart at each document (doc/data.md, "Document masks").
void rope_at(const Tensor& x, const Tensor& pos, int64_t N, int64_t H, int64_t D, float theta,
             bool inverse, const Tensor& y = {});

// ---- causal attention -----------------------------------------------------------------
// q[B,T,Hq,D], k,v[B,Tk,Hkv,D], out[B,T,Hq,D], lse[B,Hq,T] (log-sum-exp of the scaled
// scores of each query row, saved for backward). Hq % Hkv == 0: query head h reads
// key/value head h / (Hq/Hkv). Computed blockwise with an online softmax; no TxTk matrix.
// Positions: query row i is at q_pos0 + i, key row j at k_pos0 + j, and query i sees key j
// when k_pos0 + j <= q_pos0 + i (the causal mask in global positions). Tk = 0 means Tk = T.
// With the defaults (Tk = T, both offsets 0) this is plain causal self-attention; with other
// offsets it is one block of a longer sequence (context parallelism): a query row that sees
// no key of the block gets out = 0 and lse = -inf, and blocks combine with attention_merge.
// Document masking: with doc_start (i32 [B, T], the global position where query row i's
// document starts) query i also needs k_pos0 + j >= doc_start[b, i]: it sees the keys of
// [doc_start, q_pos0 + i] only. Keys need no metadata, so a block of a ring works unchanged;
// key tiles that no query row of a tile sees are skipped (the work falls with short
// documents). An empty doc_start is plain causal attention.
// The cuda backend takes D <= 128.
// Precision (compute): f32 multiplies in fp32, with f32 tensors; the scores are (scale q) k^T.
// bf16 multiplies bf16 operands with fp32 sums: q, k, v are bf16 tensors read as they are, or
// f32 tensors rounded to bf16 as the tiles are copied (the same bits as rounding them first
// with kernels::cast), and dout (f32) is rounded as it is copied; the scores are
// scale (q k^T), the scale applied to the fp32 products (as flash-attention does), and
// dk = scale (dS^T q). The probabilities are rounded to bf16 before P V and P^T dO, dS before
// dS K and dS^T Q (in the forward, P = exp(s - m) with m the running row maximum over the
// 64-key tiles seen so far, in key order from the block's first key, and the row sum l adds
// the rounded P; in the backward, P = exp(s - lse)); the scores, softmax statistics, lse,
// Dvec = rowsum(bf16(dout) * out) and all sums are fp32. With bf16 q, k, v the output may be
// bf16 (the fp32 result rounded once, as kernels::cast rounds it; the backward then reads it
// as stored) or f32 (context parallelism's partial outputs, merged in fp32).
struct AttnShape {
  int64_t B, T, Hq, Hkv, D;
  float scale;                     // usually 1/sqrt(D)
  int64_t Tk = 0;                  // key rows; 0: T
  int64_t q_pos0 = 0, k_pos0 = 0;  // global positions of the first query and key rows
  DType compute = DType::f32;      // f32 or bf16: the products' operands (above)
  int64_t keys() const { return Tk > 0 ? Tk : T; }
};
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                       const Tensor& lse, const AttnShape& s, const Tensor& doc_start = {});
// dq, dk, dv are overwritten. out and lse are those of the whole attention the block is part
// of (the merged result), so the backward of each block uses the final softmax
// normalisation; the blocks' dq (and, per key block, dk and dv) contributions add up.
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv, const AttnShape& s, const Tensor& doc_start = {});
// Online-softmax merge of one block's partial result into a running one, both over the
// same query rows: out[B,T,H,D], lse[B,H,T] become those of the union of the keys,
//   lse' = log(exp(lse) + exp(lse_part)),
//   out' = exp(lse - lse') out + exp(lse_part - lse') out_part.
// A -inf lse (no key seen yet) takes the other side as it is.
void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& out_part,
                     const Tensor& lse_part, int64_t B, int64_t T, int64_t H, int64_t D);

// ---- embedding -----------------------------------------------------------------------
// ids are i32. out[N,C] = table[ids[n], :]
void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, int64_t N,
                       int64_t C);
// dtable[ids[n], :] += dout[n, :]
void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable, int64_t N,
                        int64_t C);
// Vocabulary-parallel forms: the table holds rows [v0, v0 + rows) of the whole one. Forward
// writes table[ids[n] - v0] for ids inside the range and zeros elsewhere (the ranks' outputs
// sum to the whole lookup); backward adds only the rows inside the range.
void embedding_forward_range(const Tensor& ids, const Tensor& table, const Tensor& out, int64_t N,
                             int64_t C, int64_t v0, int64_t rows);
void embedding_backward_range(const Tensor& ids, const Tensor& dout, const Tensor& dtable,
                              int64_t N, int64_t C, int64_t v0, int64_t rows);

// ---- cross-entropy -------------------------------------------------------------------
// targets are i32. logits[N,V] (row stride V) are replaced by
// grad_scale * (softmax - onehot(target)). Columns >= V_valid are padding: they get
// probability 0 and gradient 0. losses[N] receives -log softmax[target] per row.
// With dlogits (bf16 or f16, N x V) the gradient goes there instead, rounded as kernels::cast
// would round it, and the logits are left as scratch: a 16-bit GEMM operand in one pass.
// A negative target is masked (PyTorch's ignore_index): its row's loss is 0 and its gradient
// row is 0 on every column; so in the vocabulary-parallel passes below.
void cross_entropy_fused(const Tensor& logits, const Tensor& targets, const Tensor& losses,
                         int64_t N, int64_t V, int64_t V_valid, float grad_scale,
                         const Tensor& dlogits = {});
// Vocabulary-parallel cross-entropy, in three passes with all-reduces over the vocabulary
// ranks between them; this rank holds columns [v0, v0 + V) of the logits, of which the first
// V_valid are real. (1) row_max[n] = max over the valid local columns (-inf if none).
void cross_entropy_local_max(const Tensor& logits, const Tensor& row_max, int64_t N, int64_t V,
                             int64_t V_valid);
// (2) with the global row_max: logits[n, v] = exp(logits[n, v] - row_max[n]) on valid columns,
// sum_exp[n] (f64) = their sum, target_logit[n] = logits[n, t] - row_max[n] when target t is
// local, else 0.
void cross_entropy_local_exp(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                             const Tensor& sum_exp, const Tensor& target_logit, int64_t N,
                             int64_t V, int64_t V_valid, int64_t v0);
// (3) with the global sums: losses[n] = log(sum_exp[n]) - target_logit[n]; logits become
// grad_scale * (softmax - onehot(target)) on this rank's columns (padding 0), or that goes to
// dlogits when given (as in cross_entropy_fused).
void cross_entropy_local_finish(const Tensor& logits, const Tensor& targets, const Tensor& sum_exp,
                                const Tensor& target_logit, const Tensor& losses, int64_t N,
                                int64_t V, int64_t V_valid, int64_t v0, float grad_scale,
                                const Tensor& dlogits = {});
// Over vocabulary tiles (the output head's tiles, model/output_head.cpp): the logits of N rows
// arrive a tile of T columns at a time, logits[N, T] (row stride T) holding columns
// [c0, c0 + T) of the vocabulary, all of them real (the caller leaves padding columns out);
// targets are vocabulary columns. (1) Per tile, the running statistics of each row: row_max[n]
// the maximum of the columns seen so far, sum_exp[n] (f64) the sum of exp(logit - row_max[n])
// over them (rescaled when the maximum grows), target_logit[n] the target's logit once its
// tile has passed (unchanged before). first: they start afresh with this tile (T = 0 leaves
// -inf, 0 and 0: a rank without real columns).
void cross_entropy_tile_stats(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                              const Tensor& sum_exp, const Tensor& target_logit, int64_t N,
                              int64_t T, int64_t c0, bool first);
// (2) Vocabulary-parallel: sum_exp[n] *= exp(local_max[n] - row_max[n]), the local sums moved to
// the all-reduced maximum row_max (before the sums are all-reduced; target logits are summed
// over the ranks as they are, 0 where the target is not local).
void cross_entropy_rescale(const Tensor& sum_exp, const Tensor& local_max, const Tensor& row_max,
                           int64_t N);
// (3) losses[n] = log(sum_exp[n]) + row_max[n] - target_logit[n] (0 for a masked target).
void cross_entropy_tile_loss(const Tensor& targets, const Tensor& row_max, const Tensor& sum_exp,
                             const Tensor& target_logit, const Tensor& losses, int64_t N);
// (4) A tile's gradient with the final statistics: grad_scale * (exp(logit - row_max) /
// sum_exp - onehot(target)), in place of the logits or into dlogits (16-bit, N x T) as
// cross_entropy_fused writes it; 0 on a masked row.
void cross_entropy_tile_grad(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                             const Tensor& sum_exp, int64_t N, int64_t T, int64_t c0,
                             float grad_scale, const Tensor& dlogits = {});

// ---- mixture-of-experts routing -------------------------------------------------------
// The per-token work of a MoE block's router (model/moe.cpp, doc/moe.md "Routing as kernels"):
// N = B T tokens of B sequences, E routed experts, K chosen per token. Integer outputs are exact;
// every floating-point sum runs in one fixed order (a token's, a sequence's or an expert's own
// loop), so the results depend neither on the thread count nor on the space. Expert indices and
// rows are i32; lse, norm, aux and stats f64.
//
// scores[N,E] = softmax(logits) (sums of exponentials in double), or sigmoid(logits) when
// sigmoid; lse[N] = logsumexp of each row of logits; norm[N] (optional) = the sum in double of
// each row of scores.
void moe_scores(const Tensor& logits, const Tensor& scores, const Tensor& lse, const Tensor& norm,
                int64_t N, int64_t E, bool sigmoid);
// choice[N,K] = the K experts of highest key scores[n,e] + bias[e], highest first, equal keys to
// the lower expert index (a NaN key counts as -inf). Node-limited routing when 0 < max_nodes <
// nodes: node g holds experts [g E/nodes, (g+1) E/nodes), its score is the sum in float of its
// q = min(ceil(K / max_nodes), E/nodes) highest keys, highest first; the max_nodes nodes of
// highest score are kept (equal scores to the lower node) and every other expert's key is -inf.
// weight[N,K] (optional) = the choices' scores, divided by their sum (in double) when normalise.
void moe_top_k(const Tensor& scores, const Tensor& bias, const Tensor& choice,
               const Tensor& weight, int64_t N, int64_t E, int64_t K, int64_t nodes,
               int64_t max_nodes, bool normalise);
// Capacity, sequence by sequence: expert e takes its first cap token-choices of the sequence
// (tokens in order, a token's choices in rank order). load[B,E] = token-choices of each
// sequence and expert (before capacity); kept[B,E] = those kept of the tokens [first, first +
// count); row[N,K] = for such a kept choice its place among its expert's kept choices in the
// sequence, for every other choice -1.
void moe_capacity(const Tensor& choice, const Tensor& load, const Tensor& kept, const Tensor& row,
                  int64_t B, int64_t T, int64_t K, int64_t E, int64_t cap, int64_t first,
                  int64_t count);
// The balancing loss's terms: f[B,E] = E / (K T) load; aux[B,E] (optional) = f P / T with P the
// sum over the sequence's tokens, in order, of scores[n,e] / norm[n] (norm optional: 1).
void moe_balance(const Tensor& scores, const Tensor& norm, const Tensor& load, const Tensor& f,
                 const Tensor& aux, int64_t B, int64_t T, int64_t K, int64_t E);
// The packed order, expert by expert, tokens in order within an expert (from moe_capacity's
// kept and row): offset[E+1] = each expert's first packed row (offset[E]: the rows in all);
// kept[B,E] becomes each sequence's first row within its expert's; row[N,K] each kept choice's
// packed row (-1 stays).
void moe_pack(const Tensor& choice, const Tensor& kept, const Tensor& offset, const Tensor& row,
              int64_t B, int64_t T, int64_t K, int64_t E);
// A micro-batch's routing statistics, stats[E+4]: [e] = load summed over the sequences; [E] =
// the choices beyond cap; [E+1] = z0 + lse[n]^2 added token by token; [E+2] = aux0 + each
// sequence's sum over experts of aux, sequence by sequence (aux optional: aux0); [E+3] = the
// choices of tokens [first, first + count) in outside[N,K] (optional: 0) not in experts [lo, hi).
void moe_route_stats(const Tensor& lse, const Tensor& load, const Tensor& aux,
                     const Tensor& outside, const Tensor& stats, int64_t B, int64_t T, int64_t K,
                     int64_t E, int64_t cap, double z0, double aux0, int64_t first, int64_t count,
                     int64_t lo, int64_t hi);
// The dispatch: packed[row[n,j], :] = x[n, :] for the tokens n in [first, first + count) and
// their choices with row >= 0; x[N,C], packed [rows, C].
void moe_gather(const Tensor& x, const Tensor& row, const Tensor& packed, int64_t first,
                int64_t count, int64_t K, int64_t C);
// The combine: y[n - y_first, :] += weight[n,j] packed[row[n,j], :] for n in [first, first +
// count), j in rank order, row >= 0 (weight optional: 1, the scatter of input gradients).
void moe_combine(const Tensor& packed, const Tensor& row, const Tensor& weight, const Tensor& y,
                 int64_t first, int64_t count, int64_t y_first, int64_t K, int64_t C);
// The combine's backward, for n in [first, first + count): d_packed[row[n,j], :] = weight[n,j]
// dy[n - dy_first, :] (kept choices), dweight[n,j] = dy[n - dy_first, :] . packed[row[n,j], :]
// summed in double in column order (0 for a dropped choice).
void moe_combine_backward(const Tensor& dy, const Tensor& packed, const Tensor& row,
                          const Tensor& weight, const Tensor& d_packed, const Tensor& dweight,
                          int64_t first, int64_t count, int64_t dy_first, int64_t K, int64_t C);
// d(objective)/d(logits) into dlogits[n - first, :] for n in [first, first + count): through the
// combine weights (dweight[N,K]; sigmoid: normalised weights), the balancing loss (coefficient
// aux, already times the loss scale; f[B,E] from moe_balance) and the z-loss (z = 2 x
// coefficient x loss scale). Sums in double, in expert order.
void moe_router_backward(const Tensor& logits, const Tensor& scores, const Tensor& choice,
                         const Tensor& weight, const Tensor& dweight, const Tensor& f,
                         const Tensor& dlogits, int64_t first, int64_t count, int64_t T, int64_t E,
                         int64_t K, bool sigmoid, double aux, double z);

// ---- optimizer -----------------------------------------------------------------------
// One AdamW step with decoupled weight decay on n elements (PyTorch's torch.optim.AdamW).
struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;             // 1-based, for bias correction
  float grad_scale = 1.0f;  // g is used as grad_scale * g (gradient clipping, fused)
};
// With compute (bf16 or f16, n elements) the updated p is also written there, rounded as
// kernels::cast rounds it: the 16-bit compute copy refreshed in the same pass.
void adamw(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, int64_t n,
           const AdamWArgs& a, const Tensor& compute = {});

}  // namespace tessera::kernels
