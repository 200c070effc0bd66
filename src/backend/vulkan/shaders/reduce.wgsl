// Workgroup reductions, for the kernels that declare `var<workgroup> part: array<sum_t, N>` (N a
// power of two, the workgroup's size; `sum_t` f32, or f64 where the device has it) and have each
// thread write its partial value there.

// The sum of `part[0..n]` (every thread of the workgroup calls it, after writing its `part`),
// added in a tree: `part[i] += part[i + s]` for s = n/2, n/4, ..., 1.
fn part_sum(li: u32, n: u32) -> sum_t {
    workgroupBarrier();
    for (var s = n / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            part[li] += part[li + s];
        }
        workgroupBarrier();
    }
    return part[0];
}
