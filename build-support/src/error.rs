//! Build errors: each names what is missing and how to fix it.
use std::path::PathBuf;

/// Why the kernel build failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// No rustc that can compile GPU code was found.
    #[error("no usable rustc for GPU kernels: {0}")]
    Toolchain(String),
    /// Neither rust-src nor rust-docs could provide `core` for a GPU target.
    #[error("cannot provide `core` for {target}: rust-src not found and rust-docs unusable ({detail}); run `rustup component add rust-src --toolchain nightly`")]
    CoreSource {
        /// GPU target.
        target: String,
        /// What was tried.
        detail: String,
    },
    /// A rustc invocation failed.
    #[error("compiling {what} failed:\n{stderr}")]
    Compile {
        /// What was being compiled.
        what: String,
        /// rustc's diagnostics.
        stderr: String,
    },
    /// A kernel source file could not be read or parsed.
    #[error("{path}: {message}")]
    Source {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The architecture cannot be targeted.
    #[error("unsupported AMD architecture `{0}`: supported are gfx9xx (CDNA/Vega), gfx10xx (RDNA1/2), gfx11xx (RDNA3/3.5) and gfx12xx (RDNA4)")]
    UnsupportedArch(String),
    /// The code object disagrees with the launcher.
    #[error("kernel ABI mismatch: {0}")]
    AbiMismatch(String),
    /// Reading a produced code object failed.
    #[error("reading {path}: {message}")]
    Metadata {
        /// The code object.
        path: PathBuf,
        /// Parser message.
        message: String,
    },
    /// Filesystem error.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Attaches a path to an I/O error.
pub(crate) trait IoContext<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T, BuildError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T, BuildError> {
        self.map_err(|source| BuildError::Io { path: path.into(), source })
    }
}
