// Measuring stick only (never built into Ternion): the fused RMSNorm + int8 quantization +
// I2_S matvec of crates/ternion-gpu/src/kernels/ternary_decode.wgsl written in CUDA with
// the same algorithm (prefetched weights, one-pass norm, 8 lanes a row summed by shuffles),
// to learn what the GPU does with it. Build and run on the device machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 scripts/sticks/fused_decode.cu -o /tmp/fused && /tmp/fused
// It prints µs a launch for 2B-4T's shapes, L2-resident weights (1 copy) and weights from
// DRAM (30 copies), on a stream and in a CUDA graph (BENCHMARKS.md, 2026-11-26).
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__device__ __forceinline__ int vec_dot(uint4 wv, int v, const uint4* act_sh) {
    int a = (v >> 1) * 8 + (v & 1);
    int d0 = 0, d1 = 0, d2 = 0, d3 = 0;
#pragma unroll
    for (int g = 0; g < 4; g++) {
        int sh = 6 - 2 * g;
        uint4 av = act_sh[a + 2 * g];
        d0 = __dp4a((int)((wv.x >> sh) & 0x03030303u), (int)av.x, d0);
        d1 = __dp4a((int)((wv.y >> sh) & 0x03030303u), (int)av.y, d1);
        d2 = __dp4a((int)((wv.z >> sh) & 0x03030303u), (int)av.z, d2);
        d3 = __dp4a((int)((wv.w >> sh) & 0x03030303u), (int)av.w, d3);
    }
    return (d0 + d1) + (d2 + d3);
}

// MODE 0: norm prologue + dots; 1: dots only (activations from a constant pattern);
// 2: nothing (empty kernel of the same grid).
template <int TPR, int MODE, bool GLU>
__global__ void __launch_bounds__(256) fused(const uint4* __restrict__ w, const uint4* __restrict__ w2,
                                             const float4* __restrict__ x, const float4* __restrict__ nw,
                                             float* __restrict__ out, int M, int K, float eps) {
    if (MODE == 2) return;
    __shared__ uint4 act_sh[512];
    __shared__ float2 red[8];
    __shared__ int redq[8];
    int li = threadIdx.x;
    int lane = li % TPR;
    int row = blockIdx.x * (256 / TPR) + li / TPR;
    int nv = K / 64;
    bool live = row < M;
    uint4 pre[8], pre2[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int v = lane + i * TPR;
        pre[i] = (live && v < nv) ? w[(size_t)row * nv + v] : make_uint4(0, 0, 0, 0);
        if (GLU) pre2[i] = (live && v < nv) ? w2[(size_t)row * nv + v] : make_uint4(0, 0, 0, 0);
    }
    int n4 = K / 4;
    float s = 1.0f;
    int qsum = 0;
    if (MODE == 0) {
        float ss = 0.f, mx = 0.f;
        for (int c = li; c < n4; c += 256) {
            float4 v = x[c], g = nw[c];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v.x * g.x), fabsf(v.y * g.y)), fmaxf(fabsf(v.z * g.z), fabsf(v.w * g.w))));
        }
        for (int o = 16; o > 0; o >>= 1) {
            ss += __shfl_xor_sync(~0u, ss, o);
            mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, o));
        }
        if ((li & 31) == 0) red[li >> 5] = make_float2(ss, mx);
        __syncthreads();
        float2 r = red[0];
        for (int i = 1; i < 8; i++) { r.x += red[i].x; r.y = fmaxf(r.y, red[i].y); }
        float inv = rsqrtf(r.x / K + eps);
        float amax = r.y * inv;
        s = amax > 1e-5f ? 127.f / amax : 1.27e7f;
        int qs = 0;
        for (int c = li; c < n4 / 4; c += 256) {
            uint32_t wd[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float4 v = x[4 * c + j], g = nw[4 * c + j];
                int q0 = max(-128, min(127, __float2int_rn(v.x * inv * g.x * s)));
                int q1 = max(-128, min(127, __float2int_rn(v.y * inv * g.y * s)));
                int q2 = max(-128, min(127, __float2int_rn(v.z * inv * g.z * s)));
                int q3 = max(-128, min(127, __float2int_rn(v.w * inv * g.w * s)));
                qs += q0 + q1 + q2 + q3;
                wd[j] = (q0 & 255) | ((q1 & 255) << 8) | ((q2 & 255) << 16) | ((uint32_t)(q3 & 255) << 24);
            }
            act_sh[c] = make_uint4(wd[0], wd[1], wd[2], wd[3]);
        }
        for (int o = 16; o > 0; o >>= 1) qs += __shfl_xor_sync(~0u, qs, o);
        if ((li & 31) == 0) redq[li >> 5] = qs;
    } else {
        for (int c = li; c < n4 / 4; c += 256) act_sh[c] = make_uint4(0x01020304u + c, 5, 6, 7);
    }
    __syncthreads();
    if (MODE == 0) for (int i = 0; i < 8; i++) qsum += redq[i];
    int acc = 0, acc2 = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        acc += vec_dot(pre[i], lane + i * TPR, act_sh);
        if (GLU) acc2 += vec_dot(pre2[i], lane + i * TPR, act_sh);
    }
    if (live) {
        for (int v = lane + 8 * TPR; v < nv; v += TPR) {
            acc += vec_dot(w[(size_t)row * nv + v], v, act_sh);
            if (GLU) acc2 += vec_dot(w2[(size_t)row * nv + v], v, act_sh);
        }
    }
    for (int o = TPR / 2; o > 0; o >>= 1) {
        acc += __shfl_xor_sync(~0u, acc, o);
        if (GLU) acc2 += __shfl_xor_sync(~0u, acc2, o);
    }
    if (lane == 0 && live) {
        float y = (float)(acc - qsum) / s;
        if (GLU) {
            float u = (float)(acc2 - qsum) / s;
            float r = fmaxf(y, 0.f);
            out[row] = r * r * u;
        } else {
            out[row] += y;
        }
    }
}

template <int TPR, int MODE, bool GLU>
float time_it(const char* label, int M, int K, int copies, uint4* w, uint4* w2, float4* x, float4* nw, float* out, bool graph) {
    int nv = K / 64;
    dim3 grid((M + 256 / TPR - 1) / (256 / TPR));
    size_t per = (size_t)M * nv;
    cudaStream_t st;
    cudaStreamCreate(&st);
    auto launch = [&](int i) {
        int c = i % copies;
        fused<TPR, MODE, GLU><<<grid, 256, 0, st>>>(w + c * per, w2 + c * per, x, nw, out, M, K, 1e-5f);
    };
    for (int i = 0; i < 2000; i++) launch(i);  // warm-up (clock)
    cudaStreamSynchronize(st);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    int reps = 600;
    float ms = 0;
    if (graph) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
        for (int i = 0; i < reps; i++) launch(i);
        cudaStreamEndCapture(st, &g);
        cudaGraphInstantiate(&ge, g, 0);
        cudaGraphLaunch(ge, st);
        cudaStreamSynchronize(st);
        cudaEventRecord(a, st);
        cudaGraphLaunch(ge, st);
        cudaEventRecord(b, st);
    } else {
        cudaEventRecord(a, st);
        for (int i = 0; i < reps; i++) launch(i);
        cudaEventRecord(b, st);
    }
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms, a, b);
    float us = ms * 1000.f / reps;
    printf("%-44s TPR %2d mode %d %s copies %2d: %6.2f us/launch\n", label, TPR, MODE, graph ? "graph " : "stream", copies, us);
    return us;
}

int main() {
    const int copies = 30;
    int K = 2560, KF = 6912;
    size_t maxw = (size_t)6912 * (6912 / 64) * copies + 16;
    uint4 *w, *w2;
    float4 *x, *nw;
    float* out;
    CK(cudaMalloc(&w, maxw * 16));
    CK(cudaMalloc(&w2, maxw * 16));
    CK(cudaMemset(w, 0x5a, maxw * 16));
    CK(cudaMemset(w2, 0xa5, maxw * 16));
    CK(cudaMalloc(&x, KF * 4));
    CK(cudaMalloc(&nw, KF * 4));
    std::vector<float> h(KF);
    for (int i = 0; i < KF; i++) h[i] = 0.001f * (i % 1000) - 0.5f;
    CK(cudaMemcpy(x, h.data(), KF * 4, cudaMemcpyHostToDevice));
    for (int i = 0; i < KF; i++) h[i] = 1.0f;
    CK(cudaMemcpy(nw, h.data(), KF * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&out, 16 * 6912 * 4));
    for (int cp : {1, copies}) {
        for (bool graph : {false, true}) {
            time_it<8, 0, false>("norm + o 2560x2560", 2560, K, cp, w, w2, x, nw, out, graph);
            time_it<8, 1, false>("o 2560x2560 (no prologue)", 2560, K, cp, w, w2, x, nw, out, graph);
            time_it<8, 2, false>("empty, o grid", 2560, K, cp, w, w2, x, nw, out, graph);
            time_it<4, 0, true>("norm + gate/up 2x6912x2560", 6912, K, cp, w, w2, x, nw, out, graph);
            time_it<4, 1, true>("gate/up (no prologue)", 6912, K, cp, w, w2, x, nw, out, graph);
            time_it<8, 0, false>("norm + down 2560x6912", 2560, KF, cp, w, w2, x, nw, out, graph);
            time_it<8, 0, false>("norm + q/k/v 3840x2560", 3840, K, cp, w, w2, x, nw, out, graph);
        }
    }
    return 0;
}
