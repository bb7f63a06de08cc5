//! NCCL and RCCL loaded at run time (`dlopen`), and the unique id that names a communicator.
//!
//! RCCL exports NCCL's API (same symbols, enums and 128-byte unique id), so one symbol table
//! serves both; which library a device needs follows from its backend ([`Backend`]).
use crate::CollectiveError;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

/// Which collectives library: NCCL for NVIDIA GPUs, RCCL for AMD GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// NVIDIA's NCCL (`libnccl.so.2`).
    Nccl,
    /// AMD's RCCL (`librccl.so`), NCCL's API on HIP.
    Rccl,
}

impl Backend {
    /// The environment variable naming the library file to load instead of the default names.
    pub fn env_var(self) -> &'static str {
        match self {
            Backend::Nccl => "NCCL_LIBRARY",
            Backend::Rccl => "RCCL_LIBRARY",
        }
    }

    /// The names tried, in order, when [`Backend::env_var`] is unset (the dynamic loader's
    /// search path: `LD_LIBRARY_PATH`, the ld cache, ...).
    pub fn default_names(self) -> &'static [&'static str] {
        match self {
            Backend::Nccl => &["libnccl.so.2", "libnccl.so"],
            Backend::Rccl => &["librccl.so.1", "librccl.so", "/opt/rocm/lib/librccl.so.1", "/opt/rocm/lib/librccl.so"],
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Nccl => "NCCL",
            Backend::Rccl => "RCCL",
        })
    }
}

/// Bytes of `ncclUniqueId` (`NCCL_UNIQUE_ID_BYTES`, the same in RCCL).
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RawUniqueId {
    pub(crate) internal: [c_char; UNIQUE_ID_BYTES],
}

/// The id every rank of one communicator initialises with ([`Library::unique_id`] on one
/// rank, then passed to the others as bytes or hex: an environment variable, a file, a
/// socket). For NCCL it holds the rendezvous address of rank 0's bootstrap listener.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub(crate) [u8; UNIQUE_ID_BYTES]);

impl UniqueId {
    /// The raw bytes.
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        self.0
    }

    /// An id from bytes another rank sent (exactly [`UNIQUE_ID_BYTES`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId, CollectiveError> {
        let arr: [u8; UNIQUE_ID_BYTES] = bytes
            .try_into()
            .map_err(|_| CollectiveError::InvalidArgument(format!("a unique id has {UNIQUE_ID_BYTES} bytes, got {}", bytes.len())))?;
        Ok(UniqueId(arr))
    }

    /// Lower-case hex of the bytes (256 characters), for environment variables and files.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The id in the environment variable `var` (hex, as [`UniqueId::to_hex`] writes it).
    pub fn from_env(var: &str) -> Result<UniqueId, CollectiveError> {
        let s = std::env::var(var).map_err(|e| CollectiveError::InvalidArgument(format!("environment variable {var}: {e}")))?;
        s.trim().parse()
    }

    pub(crate) fn raw(&self) -> RawUniqueId {
        RawUniqueId { internal: self.0.map(|b| b as c_char) }
    }
}

impl FromStr for UniqueId {
    type Err = CollectiveError;
    /// Parses [`UniqueId::to_hex`]'s output.
    fn from_str(s: &str) -> Result<UniqueId, CollectiveError> {
        let bad = |why: String| CollectiveError::InvalidArgument(format!("unique id hex: {why}"));
        if s.len() != 2 * UNIQUE_ID_BYTES {
            return Err(bad(format!("{} characters, expected {}", s.len(), 2 * UNIQUE_ID_BYTES)));
        }
        let mut out = [0u8; UNIQUE_ID_BYTES];
        for (i, o) in out.iter_mut().enumerate() {
            let pair = s.get(2 * i..2 * i + 2).ok_or_else(|| bad("not ASCII".into()))?;
            *o = u8::from_str_radix(pair, 16).map_err(|_| bad(format!("`{pair}` at {} is not a hex byte", 2 * i)))?;
        }
        Ok(UniqueId(out))
    }
}

impl fmt::Display for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId({})", self.to_hex())
    }
}

pub(crate) type Comm = *mut c_void;
pub(crate) type Stream = *mut c_void;
type Res = c_int;

/// `ncclSuccess`.
const SUCCESS: Res = 0;
/// `ncclInProgress`: a non-blocking call still running (only with non-blocking communicators,
/// which this crate does not create).
const IN_PROGRESS: Res = 7;

/// The entry points used here (NCCL 2.x / RCCL; `ncclGetLastError` is optional: NCCL >= 2.13).
#[allow(clippy::type_complexity)]
pub(crate) struct Fns {
    pub(crate) get_version: unsafe extern "C" fn(*mut c_int) -> Res,
    pub(crate) get_unique_id: unsafe extern "C" fn(*mut RawUniqueId) -> Res,
    pub(crate) comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, RawUniqueId, c_int) -> Res,
    pub(crate) comm_init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> Res,
    pub(crate) comm_destroy: unsafe extern "C" fn(Comm) -> Res,
    pub(crate) get_error_string: unsafe extern "C" fn(Res) -> *const c_char,
    pub(crate) get_last_error: Option<unsafe extern "C" fn(Comm) -> *const c_char>,
    pub(crate) all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Res,
    pub(crate) broadcast: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Res,
    pub(crate) all_gather: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> Res,
    pub(crate) reduce_scatter: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Res,
    pub(crate) group_start: unsafe extern "C" fn() -> Res,
    pub(crate) group_end: unsafe extern "C" fn() -> Res,
}

/// A loaded NCCL or RCCL.
pub struct Library {
    backend: Backend,
    path: String,
    version: i32,
    pub(crate) fns: Fns,
    // Keeps the code of `fns` mapped; dropped last.
    _lib: libloading::Library,
}

/// The library of each backend, loaded once per process by [`Library::load`].
static LOADED: Mutex<[Option<Arc<Library>>; 2]> = Mutex::new([None, None]);

impl Library {
    /// The process's NCCL or RCCL, loaded at first use: the file named by
    /// [`Backend::env_var`] (`NCCL_LIBRARY` / `RCCL_LIBRARY`) when set, else the first of
    /// [`Backend::default_names`] the dynamic loader finds. A failed load is retried at the
    /// next call; a successful one is kept.
    pub fn load(backend: Backend) -> Result<Arc<Library>, CollectiveError> {
        let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(lib) = &loaded[backend.index()] {
            return Ok(lib.clone());
        }
        let candidates: Vec<String> = match std::env::var(backend.env_var()) {
            Ok(path) if !path.is_empty() => vec![path],
            _ => backend.default_names().iter().map(|s| s.to_string()).collect(),
        };
        let mut reasons = Vec::new();
        for c in &candidates {
            match Library::open(backend, c) {
                Ok(lib) => {
                    let lib = Arc::new(lib);
                    loaded[backend.index()] = Some(lib.clone());
                    return Ok(lib);
                }
                // A file that loads but is not NCCL/RCCL: say so rather than try the next name.
                Err(e @ CollectiveError::MissingSymbol { .. }) => return Err(e),
                Err(e) => reasons.push(e.to_string()),
            }
        }
        Err(CollectiveError::LibraryNotFound { backend, tried: candidates, reason: reasons.join("; "), env_var: backend.env_var() })
    }

    /// The library already loaded for `backend`, if any (no attempt to load it).
    pub(crate) fn loaded(backend: Backend) -> Option<Arc<Library>> {
        LOADED.lock().unwrap_or_else(|e| e.into_inner())[backend.index()].clone()
    }

    /// Loads the file `path` (a path or a name for the dynamic loader) as `backend`'s
    /// library, without caching it. [`CollectiveError::LibraryNotFound`] when it does not
    /// load, [`CollectiveError::MissingSymbol`] when it lacks an entry point.
    pub fn open(backend: Backend, path: &str) -> Result<Library, CollectiveError> {
        let not_found = |reason: String| CollectiveError::LibraryNotFound { backend, tried: vec![path.to_string()], reason, env_var: backend.env_var() };
        // SAFETY: loading NCCL/RCCL runs their initialisers, which have no preconditions.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| not_found(e.to_string()))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol's C signature (nccl.h, identical in rccl.h) is the type
                // of the field it is stored in.
                *unsafe { lib.get($name) }.map_err(|e| CollectiveError::MissingSymbol { backend, path: path.to_string(), symbol: $name, reason: e.to_string() })?
            };
        }
        let fns = Fns {
            get_version: sym!("ncclGetVersion"),
            get_unique_id: sym!("ncclGetUniqueId"),
            comm_init_rank: sym!("ncclCommInitRank"),
            comm_init_all: sym!("ncclCommInitAll"),
            comm_destroy: sym!("ncclCommDestroy"),
            get_error_string: sym!("ncclGetErrorString"),
            // SAFETY: as above (`const char* ncclGetLastError(ncclComm_t)`).
            get_last_error: unsafe { lib.get("ncclGetLastError") }.ok().map(|s| *s),
            all_reduce: sym!("ncclAllReduce"),
            broadcast: sym!("ncclBroadcast"),
            all_gather: sym!("ncclAllGather"),
            reduce_scatter: sym!("ncclReduceScatter"),
            group_start: sym!("ncclGroupStart"),
            group_end: sym!("ncclGroupEnd"),
        };
        let mut version: c_int = 0;
        // SAFETY: a valid out-pointer.
        let r = unsafe { (fns.get_version)(&mut version) };
        let mut lib = Library { backend, path: path.to_string(), version: 0, fns, _lib: lib };
        lib.check("ncclGetVersion", r, None)?;
        lib.version = version;
        Ok(lib)
    }

    /// NCCL or RCCL.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The file it was loaded from (as given to the loader).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// `ncclGetVersion`: major * 10000 + minor * 100 + patch for NCCL >= 2.9.
    pub fn version(&self) -> i32 {
        self.version
    }

    /// A fresh unique id (`ncclGetUniqueId`): call on one rank and hand it to the others.
    /// With NCCL it opens rank 0's bootstrap listener on the address of `NCCL_SOCKET_IFNAME`
    /// (or the first usable interface), so call it in the process of rank 0.
    pub fn unique_id(&self) -> Result<UniqueId, CollectiveError> {
        let mut raw = RawUniqueId { internal: [0; UNIQUE_ID_BYTES] };
        // SAFETY: a valid out-pointer to a `ncclUniqueId`.
        let r = unsafe { (self.fns.get_unique_id)(&mut raw) };
        self.check("ncclGetUniqueId", r, None)?;
        Ok(UniqueId(raw.internal.map(|c| c as u8)))
    }

    /// `Ok` for `ncclSuccess`, else [`CollectiveError::Library`] with the library's error
    /// string and, when it has one, its last error message (`ncclGetLastError`).
    pub(crate) fn check(&self, call: &'static str, r: Res, comm: Option<Comm>) -> Result<(), CollectiveError> {
        if r == SUCCESS {
            return Ok(());
        }
        // SAFETY: `ncclGetErrorString` returns a static string for any code.
        let message = unsafe { cstr((self.fns.get_error_string)(r)) }.unwrap_or_else(|| "unknown error".into());
        let detail = self.fns.get_last_error.and_then(|f| {
            // SAFETY: `comm` is a live communicator or null (then the thread's last error).
            unsafe { cstr(f(comm.unwrap_or(std::ptr::null_mut()))) }.filter(|s| !s.is_empty())
        });
        let hint = if r == IN_PROGRESS { " (non-blocking operation still in progress)" } else { "" };
        Err(CollectiveError::Library { backend: self.backend, call, code: r, message: format!("{message}{hint}"), detail })
    }
}

impl fmt::Debug for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Library").field("backend", &self.backend).field("path", &self.path).field("version", &self.version).finish()
    }
}

/// The string at `p`, if not null.
///
/// # Safety
/// `p` is null or a NUL-terminated string that lives through the call.
unsafe fn cstr(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        // SAFETY: the caller's contract.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}
