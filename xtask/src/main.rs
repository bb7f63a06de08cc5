//! Project tasks, run as `cargo xtask <command>` (alias in `.cargo/config.toml`).
//!
//! The root workspace uses Candle with our external-backend patch: `[patch.crates-io]` points
//! at `.candle/patched/<crate>`, which this tool makes from the pinned crates.io sources (fetched
//! by cargo itself) and `patches/<crate>.patch`. Cargo resolves those paths before any build
//! script runs, so the set-up has to happen here, before the first cargo call on the workspace.
//!
//! - `setup`: make `.candle/patched` (fast no-op when it is up to date; a stale or edited copy
//!   is made again).
//! - `demo [--full] [-n N] [cargo args]`: `setup`, then the demo (`candle-rocm/examples/demo.rs`:
//!   what was built, then a small LLM on the best device).
//! - `test [args]`: `setup`, then `cargo test --workspace [args]`.
//! - `patch-diff`: write `patches/<crate>.patch` from the edited copy (how the patch is changed,
//!   and how it is carried to a new Candle version: docs/candle.md, "Changing the patch").

mod apply;
mod fetch;
mod fingerprint;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The crates we patch; each has `patches/<name>.patch`.
pub const PATCHED: [&str; 3] = ["candle-core", "candle-nn", "candle-transformers"];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<ExitCode, String> {
    let root = repo_root()?;
    let (cmd, rest) = args.split_first().map(|(c, r)| (c.as_str(), r)).unwrap_or(("help", &[]));
    match cmd {
        "setup" => {
            apply::setup(&root)?;
            Ok(ExitCode::SUCCESS)
        }
        "demo" => {
            apply::setup(&root)?;
            cargo(&root, &demo_args(rest))
        }
        "test" => {
            apply::setup(&root)?;
            let mut a = vec!["test".to_string(), "--workspace".to_string()];
            a.extend(rest.iter().cloned());
            cargo(&root, &a)
        }
        "patch-diff" => {
            apply::patch_diff(&root)?;
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            eprintln!(
                "usage: cargo xtask <setup | demo | test [cargo test args] | patch-diff>\n\
                 setup       make .candle/patched (Candle {} + patches/*.patch)\n\
                 demo        setup, then cargo run --release -p candle-rocm --example demo\n\
                             (--full: every kernel's registers; -n N: tokens; other args go to cargo)\n\
                 test        setup, then cargo test --workspace\n\
                 patch-diff  write patches/*.patch from the edited .candle/patched copy",
                fetch::candle_version(&root).unwrap_or_else(|e| e)
            );
            Ok(if cmd == "help" { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
    }
}

/// `cargo run` of the demo: `--full` and `-n N` go to the demo, anything else (`--features
/// cuda`) to cargo.
fn demo_args(rest: &[String]) -> Vec<String> {
    let mut cargo_args: Vec<String> =
        ["run", "--release", "-p", "candle-rocm", "--example", "demo"].map(String::from).to_vec();
    let mut demo = Vec::new();
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--full" => demo.push(a.clone()),
            "-n" => {
                demo.push(a.clone());
                demo.extend(it.next().cloned());
            }
            _ => cargo_args.push(a.clone()),
        }
    }
    cargo_args.push("--".into());
    cargo_args.extend(demo);
    cargo_args
}

/// Runs the cargo that runs us, in the repository root; its exit status becomes ours.
fn cargo(root: &Path, args: &[String]) -> Result<ExitCode, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(root)
        .status()
        .map_err(|e| format!("cannot run {cargo}: {e}"))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(c.clamp(1, 255) as u8),
        None => ExitCode::FAILURE,
    })
}

/// The repository root: the parent of this crate's folder.
fn repo_root() -> Result<PathBuf, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    dir.parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| format!("{} has no parent", dir.display()))
}
