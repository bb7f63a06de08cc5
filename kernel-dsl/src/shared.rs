//! Work-group shared memory (LDS on AMD GPUs).
//!
//! A kernel asks for shared memory through parameters: `tile: Shared<f32, 256>` (size fixed
//! at compile time) or `buf: SharedDyn<f32>` (length chosen per launch). These parameters
//! are not kernel arguments: `#[amdgpu_kernel]` lays them out in the work-group's
//! launch-sized shared memory and the launcher requests the bytes. Elements are accessed by
//! index with bounds checks (`tile[i] = x;`); a shared array is not a Rust reference, so
//! work-items writing different elements never alias `&mut` borrows.
use core::marker::PhantomData;
use core::ops::{Index, IndexMut};

pub use crate::arch::shared_base;

/// Shared memory of `N` elements of `T`, one array per work-group.
pub struct Shared<T, const N: usize> {
    ptr: *mut T,
    _t: PhantomData<T>,
}

/// Shared memory whose length is chosen at launch.
pub struct SharedDyn<T> {
    ptr: *mut T,
    len: usize,
}

impl<T: Copy, const N: usize> Shared<T, N> {
    /// Bytes this array takes.
    pub const BYTES: usize = core::mem::size_of::<[T; N]>();

    /// Wraps `ptr`. Generated code only.
    ///
    /// # Safety
    /// `ptr` must point at `N` elements of work-group shared memory, aligned for `T`.
    #[doc(hidden)]
    #[inline(always)]
    pub unsafe fn from_raw(ptr: *mut T) -> Self {
        Shared { ptr, _t: PhantomData }
    }
    /// Number of elements.
    #[inline(always)]
    pub const fn len(&self) -> usize { N }
    /// `true` when `N == 0`.
    #[inline(always)]
    pub const fn is_empty(&self) -> bool { N == 0 }
    /// Raw pointer to the first element.
    #[inline(always)]
    pub fn as_ptr(&self) -> *mut T { self.ptr }
}

impl<T: Copy> SharedDyn<T> {
    /// Wraps `ptr` and `len`. Generated code only.
    ///
    /// # Safety
    /// `ptr` must point at `len` elements of work-group shared memory, aligned for `T`.
    #[doc(hidden)]
    #[inline(always)]
    pub unsafe fn from_raw(ptr: *mut T, len: usize) -> Self {
        SharedDyn { ptr, len }
    }
    /// Number of elements (set at launch).
    #[inline(always)]
    pub fn len(&self) -> usize { self.len }
    /// `true` when empty.
    #[inline(always)]
    pub fn is_empty(&self) -> bool { self.len == 0 }
    /// Raw pointer to the first element.
    #[inline(always)]
    pub fn as_ptr(&self) -> *mut T { self.ptr }
}

#[cold]
#[inline(never)]
#[track_caller]
fn oob(index: usize, len: usize) -> ! {
    panic!("shared memory index out of bounds: the len is {len} but the index is {index}")
}

impl<T: Copy, const N: usize> Index<usize> for Shared<T, N> {
    type Output = T;
    #[inline(always)]
    #[track_caller]
    fn index(&self, i: usize) -> &T {
        if i >= N { oob(i, N) }
        // SAFETY: bounds-checked; shared memory lives for the whole launch.
        unsafe { &*self.ptr.add(i) }
    }
}
impl<T: Copy, const N: usize> IndexMut<usize> for Shared<T, N> {
    #[inline(always)]
    #[track_caller]
    fn index_mut(&mut self, i: usize) -> &mut T {
        if i >= N { oob(i, N) }
        // SAFETY: as above; the reference lives only for this element access.
        unsafe { &mut *self.ptr.add(i) }
    }
}
impl<T: Copy> Index<usize> for SharedDyn<T> {
    type Output = T;
    #[inline(always)]
    #[track_caller]
    fn index(&self, i: usize) -> &T {
        if i >= self.len { oob(i, self.len) }
        // SAFETY: bounds-checked.
        unsafe { &*self.ptr.add(i) }
    }
}
impl<T: Copy> IndexMut<usize> for SharedDyn<T> {
    #[inline(always)]
    #[track_caller]
    fn index_mut(&mut self, i: usize) -> &mut T {
        if i >= self.len { oob(i, self.len) }
        // SAFETY: bounds-checked.
        unsafe { &mut *self.ptr.add(i) }
    }
}
