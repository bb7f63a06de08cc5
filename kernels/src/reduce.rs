//! Work-group reductions shared by the row-wise families (softmax, norms): a butterfly
//! inside each wave, then one value per wave through shared memory.
use kernel_dsl::prelude::*;

/// Most waves a work-group can have (1024 work-items in waves of 32).
pub const MAX_WAVES: usize = 32;

/// Folds `v` over the whole work-group with `op` (associative, commutative), returning the
/// result in every work-item. All work-items must call it (uniform control flow) and the
/// work-group size must be a multiple of the wave size. `partials` is scratch shared memory
/// it reuses; it is free again when this returns.
#[device]
#[inline(always)]
pub fn block_reduce(v: f32, partials: &mut Shared<f32, MAX_WAVES>, op: impl Fn(f32, f32) -> f32 + Copy) -> f32 {
    let w = wave::reduce(v, op);
    if wave::lane_id() == 0 {
        partials[wave::wave_id() as usize] = w;
    }
    barrier();
    let waves = flat_block_dim() / wave::size();
    let mut r = partials[0];
    let mut k = 1;
    while k < waves as usize {
        r = op(r, partials[k]);
        k += 1;
    }
    // Everyone has read the partials before anyone writes the next reduction's.
    barrier();
    r
}
