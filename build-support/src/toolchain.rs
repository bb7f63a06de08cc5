//! Finding a rustc that can compile GPU code.
use crate::BuildError;
use std::path::PathBuf;
use std::process::Command;

/// A rustc able to build `no_std` code for the GPU targets.
#[derive(Clone, Debug)]
pub struct GpuRustc {
    /// The rustc binary.
    pub rustc: PathBuf,
    /// `rustc -vV` first line, e.g. `rustc 1.97.0-nightly (e50aa6fba 2026-05-19)`.
    pub version: String,
    /// Its sysroot (where rust-src / rust-docs live).
    pub sysroot: PathBuf,
    /// Whether `RUSTC_BOOTSTRAP=1` is needed to unlock features (non-nightly rustc).
    pub bootstrap: bool,
    /// How it was found, for messages.
    pub origin: String,
}

impl GpuRustc {
    /// A `Command` for this rustc with the environment it needs.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.rustc);
        // Unlocks the unstable features GPU code needs (`abi_gpu_kernel`, intrinsics).
        c.env("RUSTC_BOOTSTRAP", "1");
        // Cargo's variables for the host build must not leak into the GPU compiles.
        for v in ["RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "RUSTC_WRAPPER", "RUSTC_WORKSPACE_WRAPPER"] {
            c.env_remove(v);
        }
        c
    }

    /// A short hash of the version string, naming cache folders.
    pub fn version_key(&self) -> String {
        format!("{:016x}", fnv1a(self.version.as_bytes()))
    }
}

/// FNV-1a, for cache keys (stable across runs and platforms).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn probe(rustc: PathBuf, origin: &str) -> Result<GpuRustc, String> {
    let out = Command::new(&rustc)
        .args(["-vV"])
        .env("RUSTC_BOOTSTRAP", "1")
        .output()
        .map_err(|e| format!("{origin} ({}): cannot run: {e}", rustc.display()))?;
    if !out.status.success() {
        return Err(format!("{origin} ({}): `rustc -vV` failed", rustc.display()));
    }
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let version = text.lines().next().unwrap_or("").to_string();
    let targets = Command::new(&rustc)
        .args(["--print", "target-list"])
        .output()
        .map_err(|e| format!("{origin}: {e}"))?;
    let list = String::from_utf8_lossy(&targets.stdout);
    for t in ["amdgcn-amd-amdhsa", "nvptx64-nvidia-cuda"] {
        if !list.lines().any(|l| l.trim() == t) {
            return Err(format!("{origin} ({version}) does not know the target {t}"));
        }
    }
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("{origin}: {e}"))?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    Ok(GpuRustc { rustc, bootstrap: !version.contains("nightly"), version, sysroot, origin: origin.to_string() })
}

/// Finds the rustc for GPU builds, in this order: `$KERNEL_RUSTC`; rustup's `nightly`
/// toolchain; the rustc cargo is using (`$RUSTC`, with `RUSTC_BOOTSTRAP=1`).
pub fn find() -> Result<GpuRustc, BuildError> {
    let mut tried = Vec::new();
    if let Ok(p) = std::env::var("KERNEL_RUSTC") {
        return probe(PathBuf::from(p), "$KERNEL_RUSTC").map_err(BuildError::Toolchain);
    }
    if let Ok(out) = Command::new("rustup").args(["which", "rustc", "--toolchain", "nightly"]).output() {
        if out.status.success() {
            let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            match probe(p, "rustup nightly") {
                Ok(r) => return Ok(r),
                Err(e) => tried.push(e),
            }
        } else {
            tried.push("rustup has no nightly toolchain".to_string());
        }
    } else {
        tried.push("rustup not found".to_string());
    }
    let current = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    match probe(PathBuf::from(current), "current rustc with RUSTC_BOOTSTRAP=1") {
        Ok(r) => Ok(r),
        Err(e) => {
            tried.push(e);
            Err(BuildError::Toolchain(format!(
                "tried: {}. Install a nightly toolchain (`rustup toolchain install nightly`) or set KERNEL_RUSTC",
                tried.join("; ")
            )))
        }
    }
}
