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

static const size_t FIBER_STACK = 32 * 1024;
struct Fiber {
    void* sp = nullptr;
    bool done = false;
};
static std::vector<Fiber> fibers;
static std::vector<char> stacks;
static void* scheduler_sp;
static unsigned current;
static const std::function<void()>* fiber_body;

static void yield_to_scheduler() { kiln_emu_swap(&fibers[current].sp, scheduler_sp); }

[[noreturn]] static void fiber_entry() {
    (*fiber_body)();
    fibers[current].done = true;
    yield_to_scheduler();
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

static float exchange[1024];

static inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
    unsigned t = threadIdx.x;
    exchange[t] = v;
    yield_to_scheduler();
    float r = exchange[(t & ~31u) | ((t & 31u) ^ (unsigned)lane_mask)];
    yield_to_scheduler();
    return r;
}

static inline float __shfl_up_sync(unsigned, float v, unsigned delta) {
    unsigned t = threadIdx.x;
    exchange[t] = v;
    yield_to_scheduler();
    unsigned lane = t & 31u;
    float r = lane >= delta ? exchange[t - delta] : v;
    yield_to_scheduler();
    return r;
}

static double exchange64[1024];

static inline double __shfl_xor_sync(unsigned, double v, int lane_mask) {
    unsigned t = threadIdx.x;
    exchange64[t] = v;
    yield_to_scheduler();
    double r = exchange64[(t & ~31u) | ((t & 31u) ^ (unsigned)lane_mask)];
    yield_to_scheduler();
    return r;
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
        for (unsigned t = 0; t < block; ++t)
            fibers[t] = Fiber{fiber_start(stacks.data() + (t + 1) * FIBER_STACK), false};
        unsigned live = block;
        while (live > 0) {
            for (unsigned t = 0; t < block; ++t) {
                if (fibers[t].done) continue;
                current = t;
                threadIdx = {t, 0, 0};
                kiln_emu_swap(&scheduler_sp, fibers[t].sp);
                if (fibers[t].done) --live;
            }
        }
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
