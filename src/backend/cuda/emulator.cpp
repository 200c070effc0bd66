// A software GPU for the tests: the kernels of kernels/*.cu compiled by the host's C++
// compiler (x86-64) and run one block at a time, each thread of the block a fiber (so
// __syncthreads and warp shuffles behave as on the device). nvrtc.rs's
// `emulator_source` appends the kernel files and a table of launchers to this text; the tests
// build it into a shared library that `Gpu::emulated` loads in place of a driver.
//
// It checks what a kernel computes and how it indexes, not its speed or its memory model:
// device memory is host memory, and a launch returns when every block has run.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#define KILN_EMULATED 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

using std::max;
using std::min;

struct Dim3 {
    unsigned x = 0, y = 0, z = 0;
};
static Dim3 threadIdx, blockIdx, blockDim, gridDim;

// ---- the threads of a block: fibers on one OS thread ----
// A fiber runs until it reaches a barrier (__syncthreads, or a warp shuffle's exchange) and
// gives control back; a round runs every live fiber to its next barrier, so all threads of
// the block pass each barrier together (kernels never place barriers under divergent
// branches, as CUDA requires). The switch saves and restores the callee-saved registers.
extern "C" void kiln_emu_swap(void** save_sp, void* load_sp);
asm(R"(
    .text
    .globl kiln_emu_swap
    .type kiln_emu_swap, @function
kiln_emu_swap:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size kiln_emu_swap, .-kiln_emu_swap
)");

// A fiber's stack; the stride between stacks is not a power of two, so that the tops of the
// stacks (where every switch saves and restores registers) spread over the cache's sets
// instead of contending for one (a 32 KiB stride put every fiber's top in the same set of
// L1 and L2, and the switches ran at the speed of L3).
static const size_t FIBER_STACK = 32 * 1024 + 5 * 64;
struct Fiber {
    void* sp = nullptr;
    bool done = false;
};
static std::vector<Fiber> fibers;
static std::vector<char> stacks;
static void* scheduler_sp;
static unsigned current;
static const std::function<void()>* fiber_body;

static unsigned live;       // fibers of the block not done
static void* dead_sp;       // where a finished fiber's registers go (never resumed)

// The next fiber after `t` that is not done, in thread order, wrapping around (a round ends at
// the wrap); `t` itself when it is the only one left.
static unsigned next_live(unsigned t) {
    unsigned n = t, count = blockDim.x;
    do n = n + 1 == count ? 0 : n + 1;
    while (fibers[n].done && n != t);
    return n;
}

// Switch from the current fiber (its registers saved at `*save`) straight to fiber `n`: a
// switch costs one swap of stacks, not two through a scheduler.
static void switch_to(void** save, unsigned n) {
    current = n;
    threadIdx = {n, 0, 0};
    kiln_emu_swap(save, fibers[n].sp);
}

// A barrier: the next live thread runs until its own barrier, and so on around the block.
static void yield_to_scheduler() {
    unsigned t = current, n = next_live(t);
    if (n != t) switch_to(&fibers[t].sp, n);
}

[[noreturn]] static void fiber_entry() {
    (*fiber_body)();
    unsigned t = current;
    fibers[t].done = true;
    if (--live == 0) kiln_emu_swap(&dead_sp, scheduler_sp);
    switch_to(&dead_sp, next_live(t));
    __builtin_unreachable();
}

// A fresh fiber whose first switch-in starts `fiber_entry` on its own stack.
static void* fiber_start(char* stack_top) {
    auto* sp = reinterpret_cast<uintptr_t*>(reinterpret_cast<uintptr_t>(stack_top) & ~uintptr_t(15));
    *--sp = 0;  // the entry's return address slot (it never returns): rsp ≡ 8 mod 16 on entry
    *--sp = reinterpret_cast<uintptr_t>(&fiber_entry);
    for (int i = 0; i < 6; ++i) *--sp = 0;  // rbp rbx r12 r13 r14 r15
    return sp;
}

static inline void __syncthreads() { yield_to_scheduler(); }
// Blocks run one after another, so an atomic is a plain update and fences have nothing to
// order.
static inline void __threadfence() {}
static inline int atomicAdd(int* p, int v) {
    int old = *p;
    *p += v;
    return old;
}
template <class T>
static inline T __ldcg(const T* p) { return *p; }
// Rounded one by one (this file is built without FMA instructions, so nothing is contracted).
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }

// A warp shuffle: each thread writes its value, yields once (a round of the scheduler runs
// every thread of the block to its next barrier, so all have written), then reads. The
// buffers alternate between consecutive shuffles: a thread reaches its next write to the same
// buffer two rounds later, after every thread has read it.
static float exchange[2][1024];
static double exchange64[2][1024];
static unsigned char shuffle_parity[1024];

template <typename T>
static inline T shuffle(T (&buf)[2][1024], T v, unsigned from) {
    unsigned t = threadIdx.x;
    unsigned p = shuffle_parity[t];
    shuffle_parity[t] = p ^ 1;
    buf[p][t] = v;
    yield_to_scheduler();
    return buf[p][from];
}

static inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
    unsigned t = threadIdx.x;
    return shuffle(exchange, v, (t & ~31u) | ((t & 31u) ^ (unsigned)lane_mask));
}

static inline float __shfl_up_sync(unsigned, float v, unsigned delta) {
    unsigned t = threadIdx.x;
    unsigned lane = t & 31u;
    float r = shuffle(exchange, v, lane >= delta ? t - delta : t);
    return lane >= delta ? r : v;
}

static inline double __shfl_xor_sync(unsigned, double v, int lane_mask) {
    unsigned t = threadIdx.x;
    return shuffle(exchange64, v, (t & ~31u) | ((t & 31u) ^ (unsigned)lane_mask));
}

static inline float __int_as_float(int v) {
    float f;
    std::memcpy(&f, &v, 4);
    return f;
}
static inline float __uint_as_float(unsigned v) {
    float f;
    std::memcpy(&f, &v, 4);
    return f;
}
static inline unsigned __float_as_uint(float f) {
    unsigned v;
    std::memcpy(&v, &f, 4);
    return v;
}
// Four signed bytes of a times those of b, plus c.
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 32; i += 8) c += (int)(signed char)(a >> i) * (int)(signed char)(b >> i);
    return c;
}

typedef unsigned short u16;
typedef unsigned int u32;
static inline float h2f(u16 h) {
    _Float16 f;
    std::memcpy(&f, &h, 2);
    return (float)f;
}
static inline u16 f2h(float v) {
    _Float16 f = (_Float16)v;  // round to nearest even, as cvt.rn.f16.f32
    u16 h;
    std::memcpy(&h, &f, 2);
    return h;
}
static inline float u2f(u32 v) { return __uint_as_float(v); }

// Run `body` as a grid of `grid` blocks of `block` threads (at most 1024).
static void emulate(unsigned grid, unsigned block, const std::function<void()>& body) {
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    fiber_body = &body;
    fibers.assign(block, Fiber{});
    if (stacks.size() < block * FIBER_STACK) stacks.resize(block * FIBER_STACK);
    for (unsigned b = 0; b < grid; ++b) {
        blockIdx = {b, 0, 0};
        for (unsigned t = 0; t < block; ++t) {
            fibers[t] = Fiber{fiber_start(stacks.data() + (t + 1) * FIBER_STACK), false};
            shuffle_parity[t] = 0;
        }
        live = block;
        current = 0;
        threadIdx = {0, 0, 0};
        // Back here when the block's last fiber finishes.
        kiln_emu_swap(&scheduler_sp, fibers[0].sp);
    }
}

// Call `f` with its parameters read from `params`, as cuLaunchKernel passes them.
template <typename... A, std::size_t... I>
static void call_with(void (*f)(A...), void** params, std::index_sequence<I...>) {
    f(*static_cast<std::remove_reference_t<A>*>(params[I])...);
}
template <typename... A>
static void call(void (*f)(A...), void** params) {
    call_with(f, params, std::index_sequence_for<A...>{});
}

struct Launcher {
    const char* name;
    void (*run)(void** params);
};
