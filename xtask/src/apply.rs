//! `.candle/patched/<crate>` = the pinned crates.io source + `patches/<crate>.patch`.
//!
//! `.candle/stamp` records what the copy was made from (Candle version, patch files) and the
//! copy's own content fingerprint; `setup` is a no-op while both still match, and otherwise
//! makes the copy again (an edited copy is moved to `.candle/previous` first, not lost).

use crate::fetch;
use crate::fingerprint::Fingerprint;
use crate::PATCHED;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Names left out of fingerprints and diffs: build output, patch leftovers.
const SKIP: [&str; 3] = ["target", "Cargo.lock", ".git"];

struct Paths {
    work: PathBuf,
    patched: PathBuf,
    stamp: PathBuf,
    patches: PathBuf,
}

impl Paths {
    fn new(root: &Path) -> Self {
        let work = root.join(".candle");
        Paths {
            patched: work.join("patched"),
            stamp: work.join("stamp"),
            patches: root.join("patches"),
            work,
        }
    }

    fn patch_file(&self, krate: &str) -> PathBuf {
        self.patches.join(format!("{krate}.patch"))
    }
}

/// Makes `.candle/patched` unless it is up to date.
pub fn setup(root: &Path) -> Result<(), String> {
    let p = Paths::new(root);
    let version = fetch::candle_version(root)?;
    let inputs = inputs_fingerprint(&p, &version)?;
    let stamp = std::fs::read_to_string(&p.stamp).unwrap_or_default();
    let stamped_inputs = stamp_field(&stamp, "inputs");
    if stamped_inputs == Some(inputs.as_str()) && p.patched.is_dir() {
        if stamp_field(&stamp, "tree") == Some(tree_fingerprint(&p.patched)?.as_str()) {
            return Ok(());
        }
        eprintln!(
            "xtask: .candle/patched was edited since it was made: moving it to .candle/previous \
             and making it again (to keep edits, run `cargo xtask patch-diff` first)"
        );
        let previous = p.work.join("previous");
        let _ = std::fs::remove_dir_all(&previous);
        std::fs::rename(&p.patched, &previous).map_err(|e| format!("{}: {e}", p.patched.display()))?;
    } else if p.patched.exists() {
        eprintln!("xtask: .candle/patched is stale (Candle version or patches changed): making it again");
    }
    make(&p, &version, &inputs)
}

fn make(p: &Paths, version: &str, inputs: &str) -> Result<(), String> {
    eprintln!("xtask: making .candle/patched: Candle {version} + patches/*.patch");
    let _ = std::fs::remove_file(&p.stamp);
    let sources = fetch::pristine_sources(&p.work, &PATCHED, version)?;
    if p.patched.exists() {
        std::fs::remove_dir_all(&p.patched).map_err(|e| format!("{}: {e}", p.patched.display()))?;
    }
    for (krate, src) in PATCHED.iter().zip(&sources) {
        let dst = p.patched.join(krate);
        copy_tree(src, &dst)?;
        let patch = p.patch_file(krate);
        if !patch.exists() {
            continue;
        }
        let out = Command::new("patch")
            .args(["-p1", "--batch", "--forward", "--quiet", "-d"])
            .arg(&p.patched)
            .arg("-i")
            .arg(&patch)
            .output()
            .map_err(|e| format!("cannot run `patch` (GNU patch is needed): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{} does not apply to {krate} {version}:\n{}{}\
                 Fix the copy in {} by hand (see the .rej files), then run `cargo xtask patch-diff`.",
                patch.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                dst.display()
            ));
        }
    }
    write_stamp(p, inputs)
}

/// Writes `patches/<crate>.patch` = diff of pristine source and `.candle/patched/<crate>`.
pub fn patch_diff(root: &Path) -> Result<(), String> {
    let p = Paths::new(root);
    if !p.patched.is_dir() {
        return Err("no .candle/patched to diff: run `cargo xtask setup` first".into());
    }
    let version = fetch::candle_version(root)?;
    let sources = fetch::pristine_sources(&p.work, &PATCHED, &version)?;
    let diff_dir = p.work.join("diff");
    let _ = std::fs::remove_dir_all(&diff_dir);
    std::fs::create_dir_all(&p.patches).map_err(|e| format!("{}: {e}", p.patches.display()))?;
    for (krate, src) in PATCHED.iter().zip(&sources) {
        for (side, target) in [("a", src.clone()), ("b", p.patched.join(krate))] {
            let dir = diff_dir.join(side);
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            symlink_dir(&target, &dir.join(krate))?;
        }
        let mut cmd = Command::new("diff");
        cmd.arg("-ruN");
        for s in SKIP.iter().chain(&["*.orig", "*.rej"]) {
            cmd.args(["-x", s]);
        }
        let out = cmd
            .arg(format!("a/{krate}"))
            .arg(format!("b/{krate}"))
            .current_dir(&diff_dir)
            .output()
            .map_err(|e| format!("cannot run `diff`: {e}"))?;
        if out.status.code() == Some(2) || out.status.code().is_none() {
            return Err(format!("diff failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let text = strip_timestamps(&String::from_utf8_lossy(&out.stdout));
        let file = p.patch_file(krate);
        if text.is_empty() {
            let _ = std::fs::remove_file(&file);
            eprintln!("xtask: {krate}: no changes, {} removed", file.display());
        } else {
            std::fs::write(&file, &text).map_err(|e| format!("{}: {e}", file.display()))?;
            eprintln!("xtask: wrote {} ({} lines)", file.display(), text.lines().count());
        }
    }
    let _ = std::fs::remove_dir_all(&diff_dir);
    let inputs = inputs_fingerprint(&p, &version)?;
    write_stamp(&p, &inputs)
}

/// `--- a/x.rs<TAB>2024-...` -> `--- a/x.rs`: patch files without local timestamps.
fn strip_timestamps(diff: &str) -> String {
    let mut out = String::with_capacity(diff.len());
    for line in diff.lines() {
        if line.starts_with("--- ") || line.starts_with("+++ ") {
            out += line.split('\t').next().unwrap_or(line);
        } else {
            out += line;
        }
        out.push('\n');
    }
    out
}

fn inputs_fingerprint(p: &Paths, version: &str) -> Result<String, String> {
    let mut f = Fingerprint::new();
    f.add(version.as_bytes());
    for krate in PATCHED {
        f.add(krate.as_bytes());
        f.add(&std::fs::read(p.patch_file(krate)).unwrap_or_default());
    }
    Ok(f.hex())
}

fn tree_fingerprint(dir: &Path) -> Result<String, String> {
    let mut f = Fingerprint::new();
    f.add_tree(dir, &SKIP)?;
    Ok(f.hex())
}

fn write_stamp(p: &Paths, inputs: &str) -> Result<(), String> {
    let text = format!("inputs={inputs}\ntree={}\n", tree_fingerprint(&p.patched)?);
    std::fs::write(&p.stamp, text).map_err(|e| format!("{}: {e}", p.stamp.display()))
}

fn stamp_field<'a>(stamp: &'a str, key: &str) -> Option<&'a str> {
    stamp.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}

fn copy_tree(src: &Path, dst: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dst).map_err(|e| format!("{}: {e}", dst.display()))?;
    let entries = std::fs::read_dir(src).map_err(|e| format!("{}: {e}", src.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", src.display()))?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        if SKIP.contains(&entry.file_name().to_string_lossy().as_ref()) {
            continue;
        }
        if from.is_dir() {
            copy_tree(&from, &to)?;
        } else {
            std::fs::copy(&from, &to).map_err(|e| format!("{}: {e}", from.display()))?;
        }
    }
    Ok(())
}

#[cfg(unix)]
fn symlink_dir(target: &Path, link: &Path) -> Result<(), String> {
    std::os::unix::fs::symlink(target, link).map_err(|e| format!("{}: {e}", link.display()))
}

#[cfg(not(unix))]
fn symlink_dir(target: &Path, link: &Path) -> Result<(), String> {
    copy_tree(target, link)
}
