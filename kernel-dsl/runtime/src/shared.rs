//! Read-only device copies of small host arrays (layouts, geometry), shared by every
//! upload of the same contents: a framework launching the same strided views over and over
//! uploads each layout once instead of once per op.
use crate::DeviceVec;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Entries kept before the cache starts over (a few hundred KiB of device memory at most
/// for typical layouts of a few dimensions).
const CAPACITY: usize = 4096;

/// The per-device cache behind [`Device::upload_shared`](crate::Device::upload_shared).
#[derive(Default)]
pub(crate) struct SharedUploads {
    map: Mutex<HashMap<Vec<usize>, Arc<DeviceVec<usize>>>>,
    /// During a graph capture: the arrays handed out, which the graph keeps alive.
    captured: Mutex<Option<Vec<Arc<DeviceVec<usize>>>>>,
}

impl SharedUploads {
    pub(crate) fn get(&self, data: &[usize]) -> Option<Arc<DeviceVec<usize>>> {
        let v = self.map.lock().unwrap_or_else(PoisonError::into_inner).get(data).cloned()?;
        if let Some(kept) = self.captured.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            kept.push(v.clone());
        }
        Some(v)
    }

    /// Starts remembering the arrays handed out (a graph capture begins).
    pub(crate) fn begin_capture(&self) {
        *self.captured.lock().unwrap_or_else(PoisonError::into_inner) = Some(Vec::new());
    }

    /// The arrays handed out since [`SharedUploads::begin_capture`], for the graph to keep.
    pub(crate) fn end_capture(&self) -> Vec<Arc<DeviceVec<usize>>> {
        self.captured.lock().unwrap_or_else(PoisonError::into_inner).take().unwrap_or_default()
    }

    /// Keeps `v`, a copy of `data`. When full, the cache starts over: dropped entries go back
    /// to the caching allocator, which reuses them in stream order (kernels queued earlier
    /// that read them still see their contents).
    pub(crate) fn insert(&self, data: &[usize], v: Arc<DeviceVec<usize>>) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= CAPACITY {
            map.clear();
        }
        map.insert(data.to_vec(), v);
    }

    /// Drops every entry (their blocks go back to the caching allocator).
    pub(crate) fn clear(&self) {
        self.map.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}
