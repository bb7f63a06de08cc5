//! Per-lane layouts of the 16x16x16 fragments, one per lowering: which element of a tile
//! item `j` of lane `lane` holds. The same functions serve the device code (where the
//! lowering is a constant and they fold away) and the CPU executor's emulation.
use super::Lowering;

/// Items of an A or B fragment per lane.
#[inline(always)]
pub const fn ab_len(low: Lowering) -> usize {
    match low {
        Lowering::Mfma => 4,
        Lowering::Wmma => 16,
        Lowering::Wmma12 | Lowering::MmaSync | Lowering::Valu => 8,
    }
}

/// Items of an accumulator fragment per lane.
#[inline(always)]
pub const fn c_len(low: Lowering) -> usize {
    match low {
        Lowering::Mfma => 4,
        Lowering::Wmma | Lowering::Wmma12 | Lowering::MmaSync | Lowering::Valu => 8,
    }
}

/// `(row, k)` of A item `j` in `lane`; `i8` selects the 8-bit layout where it differs.
#[inline(always)]
pub const fn a_coord(low: Lowering, i8: bool, lane: usize, j: usize) -> (usize, usize) {
    let (g, t) = (lane / 4, lane % 4);
    match low {
        Lowering::Mfma => (lane % 16, 4 * (lane / 16) + j),
        Lowering::Wmma => (lane % 16, j),
        Lowering::Wmma12 => (lane % 16, wmma12_k(i8, lane, j)),
        Lowering::MmaSync | Lowering::Valu => {
            if i8 {
                (g + 8 * (j / 4), 4 * t + j % 4)
            } else {
                (g + 8 * ((j / 2) % 2), 2 * t + j % 2 + 8 * (j / 4))
            }
        }
    }
}

/// `(k, col)` of B item `j` in `lane`.
#[inline(always)]
pub const fn b_coord(low: Lowering, i8: bool, lane: usize, j: usize) -> (usize, usize) {
    let (g, t) = (lane / 4, lane % 4);
    match low {
        Lowering::Mfma => (4 * (lane / 16) + j, lane % 16),
        Lowering::Wmma => (j, lane % 16),
        Lowering::Wmma12 => (wmma12_k(i8, lane, j), lane % 16),
        Lowering::MmaSync | Lowering::Valu => {
            if i8 {
                (4 * t + j % 4, g + 8 * (j / 4))
            } else {
                (2 * t + j % 2 + 8 * ((j / 2) % 2), g + 8 * (j / 4))
            }
        }
    }
}

/// `(row, col)` of accumulator item `j` in `lane`.
#[inline(always)]
pub const fn c_coord(low: Lowering, lane: usize, j: usize) -> (usize, usize) {
    let (g, t) = (lane / 4, lane % 4);
    match low {
        Lowering::Mfma => (4 * (lane / 16) + j, lane % 16),
        Lowering::Wmma => (2 * j + lane / 16, lane % 16),
        Lowering::Wmma12 => (j + 8 * (lane / 16), lane % 16),
        Lowering::MmaSync | Lowering::Valu => (g + 8 * ((j / 2) % 2), 2 * t + j % 2 + 8 * (j / 4)),
    }
}

/// Lane and item of the accumulator holding `(row, col)` (the inverse of [`c_coord`]; for
/// each element the lowest such lane).
#[inline(always)]
pub const fn c_locate(low: Lowering, row: usize, col: usize) -> (usize, usize) {
    match low {
        Lowering::Mfma => (col + 16 * (row / 4), row % 4),
        Lowering::Wmma => (col + 16 * (row % 2), row / 2),
        Lowering::Wmma12 => (col + 16 * (row / 8), row % 8),
        Lowering::MmaSync | Lowering::Valu => {
            (4 * (row % 8) + (col % 8) / 2, col % 2 + 2 * (row / 8) + 4 * (col / 8))
        }
    }
}

/// XOR lane masks that connect the lanes holding one accumulator row.
#[inline(always)]
pub const fn row_lane_masks(low: Lowering) -> &'static [u32] {
    match low {
        Lowering::Mfma | Lowering::Wmma | Lowering::Wmma12 => &[1, 2, 4, 8],
        Lowering::MmaSync | Lowering::Valu => &[1, 2],
    }
}

/// k of A (or B) item `j` in `lane` on gfx12 WMMA: lanes 0-15 hold k 0-3 and 8-11 of their
/// row (column), lanes 16-31 k 4-7 and 12-15, two 16-bit items per register; 8-bit items
/// are k 0-7 (lanes 0-15) and 8-15 (lanes 16-31), four per register.
#[inline(always)]
pub const fn wmma12_k(i8: bool, lane: usize, j: usize) -> usize {
    let h = lane / 16;
    if i8 {
        j + 8 * h
    } else {
        j % 4 + 4 * h + 8 * (j / 4)
    }
}
