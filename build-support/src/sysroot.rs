//! `core` and `compiler_builtins` for the GPU targets, without `-Zbuild-std`.
//!
//! `core` comes from rust-src when the toolchain has it. Otherwise it is rebuilt from the
//! source pages rustdoc ships in rust-docs (`share/doc/rust/html/src/core/**.rs.html`): each
//! page names its original path (`library/core/src/...`) and holds the code as HTML, which
//! is turned back into the file. Files pulled in only for documentation (`include_str!` of
//! `.md`) are not shipped; empty stand-ins are enough. Results are cached per toolchain,
//! target and target CPU.
use crate::error::IoContext;
use crate::toolchain::GpuRustc;
use crate::BuildError;
use std::fs;
use std::path::{Path, PathBuf};

const MARKER: &str = ".complete";

/// Panic strategy of all GPU code: a panic (failed bounds check, division by zero) becomes
/// a trap at the call site. `core`'s panic entry points are then inlined instead of being
/// out-of-line functions, which NVPTX's LTO output would otherwise leave undefined.
pub const PANIC_STRATEGY: &str = "immediate-abort";

/// Flags for every GPU compile of a library crate (`core`, `kernel-dsl`): make all its
/// functions available for instantiation in the kernel crate. NVPTX output is produced
/// with `--emit=asm`, which does not link upstream bitcode, so a function that stayed in
/// an upstream crate would be an undefined `.extern .func` in the PTX.
pub const LIBRARY_FLAGS: &[&str] = &["-Zcross-crate-inline-threshold=always"];

/// Where `library/core/src/lib.rs` is, and which source it came from.
#[derive(Clone, Debug)]
pub struct CoreSource {
    /// `.../library/core/src/lib.rs`.
    pub lib_rs: PathBuf,
    /// `"rust-src"` or `"rust-docs"`.
    pub origin: &'static str,
}

/// Finds or reconstructs the source of `core` for `rustc`.
pub fn core_source(rustc: &GpuRustc, cache: &Path) -> Result<CoreSource, BuildError> {
    let src = rustc.sysroot.join("lib/rustlib/src/rust/library/core/src/lib.rs");
    if src.is_file() {
        return Ok(CoreSource { lib_rs: src, origin: "rust-src" });
    }
    let docs = rustc.sysroot.join("share/doc/rust/html/src/core");
    let out = cache.join(rustc.version_key()).join("core-src");
    let lib_rs = out.join("library/core/src/lib.rs");
    if out.join(MARKER).is_file() && lib_rs.is_file() {
        return Ok(CoreSource { lib_rs, origin: "rust-docs" });
    }
    if !docs.is_dir() {
        return Err(BuildError::CoreSource {
            target: "GPU targets".into(),
            detail: format!("neither {} nor {} exists", src.display(), docs.display()),
        });
    }
    let tmp = out.with_extension(format!("tmp-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    let n = extract_docs(&docs, &tmp)?;
    if !tmp.join("library/core/src/lib.rs").is_file() {
        return Err(BuildError::CoreSource {
            target: "GPU targets".into(),
            detail: format!("{n} source pages in {} but none is library/core/src/lib.rs", docs.display()),
        });
    }
    stub_included_docs(&tmp.join("library"))?;
    fs::write(tmp.join(MARKER), format!("{n} files from rust-docs\n")).at(&tmp)?;
    let _ = fs::remove_dir_all(&out);
    if fs::rename(&tmp, &out).is_err() {
        // Another build script won the race; use its copy.
        let _ = fs::remove_dir_all(&tmp);
    }
    Ok(CoreSource { lib_rs, origin: "rust-docs" })
}

/// Extracts every rustdoc source page below `dir` into `out`; returns the file count.
pub fn extract_docs(dir: &Path, out: &Path) -> Result<usize, BuildError> {
    let mut count = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).at(&d)? {
            let path = entry.at(&d)?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "html") {
                let html = fs::read_to_string(&path).at(&path)?;
                if let Some((rel, code)) = source_page(&html) {
                    let dest = out.join(rel);
                    fs::create_dir_all(dest.parent().unwrap()).at(&dest)?;
                    fs::write(&dest, code).at(&dest)?;
                    count += 1;
                }
            }
        }
    }
    Ok(count)
}

/// The original path and source text of one rustdoc source page.
pub fn source_page(html: &str) -> Option<(String, String)> {
    const META: &str = "content=\"Source of the Rust file `";
    let start = html.find(META)? + META.len();
    let raw = &html[start..start + html[start..].find('`')?];
    // Paths like `library/core/src/../../stdarch/...`: resolve `..` without leaving the root.
    let mut parts: Vec<&str> = Vec::new();
    for p in raw.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    let rel = parts.join("/");
    if rel.is_empty() || raw.starts_with('/') {
        return None;
    }
    const PRE: &str = "<pre class=\"rust\"><code>";
    let body_start = html.find(PRE)? + PRE.len();
    let body_end = body_start + html[body_start..].find("</code></pre>")?;
    Some((rel, html_to_text(&html[body_start..body_end])))
}

/// Removes tags (and the line-number anchors with their text) and decodes entities.
fn html_to_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(lt) = rest.find('<') {
        push_unescaped(&mut out, &rest[..lt]);
        let tag_end = match rest[lt..].find('>') {
            Some(e) => lt + e + 1,
            None => break,
        };
        let tag = &rest[lt..tag_end];
        rest = &rest[tag_end..];
        if tag.starts_with("<a ") && tag.contains("data-nosnippet") {
            // Line-number anchor: drop its text too.
            if let Some(close) = rest.find("</a>") {
                rest = &rest[close + 4..];
            }
        }
    }
    push_unescaped(&mut out, rest);
    out
}

fn push_unescaped(out: &mut String, text: &str) {
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let after = &rest[amp..];
        let Some(semi) = after.find(';').filter(|&i| i <= 10) else {
            out.push('&');
            rest = &after[1..];
            continue;
        };
        let entity = &after[1..semi];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            "nbsp" => Some('\u{a0}'),
            e if e.starts_with("#x") || e.starts_with("#X") => u32::from_str_radix(&e[2..], 16).ok().and_then(char::from_u32),
            e if e.starts_with('#') => e[1..].parse().ok().and_then(char::from_u32),
            _ => None,
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &after[semi + 1..];
            }
            None => {
                out.push('&');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
}

/// Creates empty stand-ins for files that sources `include_str!` (documentation only).
pub fn stub_included_docs(root: &Path) -> Result<usize, BuildError> {
    let mut made = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).at(&d)? {
            let path = entry.at(&d)?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = fs::read_to_string(&path).at(&path)?;
                // Every string literal naming a `.md` file: `include_str!("x.md")` and
                // macros that pass the name on (`type_alias! { "c_char.md", ... }`).
                let mut rest = text.as_str();
                while let Some(i) = rest.find(".md\"") {
                    let start = rest[..i].rfind('"').map_or(i, |q| q + 1);
                    let name = &rest[start..i + 3];
                    rest = &rest[i + 4..];
                    if name.contains(char::is_whitespace) || name.is_empty() {
                        continue;
                    }
                    let target = path.parent().unwrap().join(name);
                    if !target.exists() {
                        if let Some(p) = target.parent() {
                            fs::create_dir_all(p).at(p)?;
                        }
                        fs::write(&target, "").at(&target)?;
                        made += 1;
                    }
                }
            }
        }
    }
    Ok(made)
}

/// A sysroot folder holding `core` and `compiler_builtins` for `target`/`cpu`; built on
/// first use and cached.
pub fn ensure(rustc: &GpuRustc, core: &CoreSource, cache: &Path, target: &str, cpu: &str) -> Result<PathBuf, BuildError> {
    let root = cache.join(rustc.version_key()).join(format!("sysroot-{target}-{cpu}-{PANIC_STRATEGY}-xci"));
    let lib = root.join("lib/rustlib").join(target).join("lib");
    if root.join(MARKER).is_file() {
        return Ok(root);
    }
    // Several build scripts (crates, profiles) may need the same sysroot at once: one
    // builds it, the others wait for its marker.
    let lock = root.with_extension("lock");
    fs::create_dir_all(root.parent().unwrap()).at(&root)?;
    loop {
        if root.join(MARKER).is_file() {
            return Ok(root);
        }
        match fs::OpenOptions::new().write(true).create_new(true).open(&lock) {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let stale = fs::metadata(&lock)
                    .and_then(|m| m.modified())
                    .map(|t| t.elapsed().map(|d| d.as_secs() > 900).unwrap_or(false))
                    .unwrap_or(true);
                if stale {
                    let _ = fs::remove_file(&lock);
                }
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
            Err(e) => return Err(BuildError::Io { path: lock, source: e }),
        }
    }
    let result = build_sysroot(rustc, core, target, cpu, &root, &lib);
    let _ = fs::remove_file(&lock);
    result
}

fn build_sysroot(rustc: &GpuRustc, core: &CoreSource, target: &str, cpu: &str, root: &Path, lib: &Path) -> Result<PathBuf, BuildError> {
    let tmp = root.with_extension(format!("tmp-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    let tmp_lib = tmp.join("lib/rustlib").join(target).join("lib");
    fs::create_dir_all(&tmp_lib).at(&tmp_lib)?;
    let common = |c: &mut std::process::Command| {
        c.args(["--edition", "2024", "--target", target])
            .arg(format!("-Ctarget-cpu={cpu}"))
            .args(["-Copt-level=3", "-Zunstable-options"])
            .arg(format!("-Cpanic={PANIC_STRATEGY}"))
            .args(LIBRARY_FLAGS)
            .args(["-Cembed-bitcode=yes", "-Cdebuginfo=0", "--cap-lints", "allow"]);
    };
    // Documentation files still missing are reported by rustc as "couldn't read `path`":
    // give them empty stand-ins and try again (rust-docs sources only).
    let mut attempts = 0;
    loop {
        let mut c = rustc.command();
        c.args(["--crate-type", "lib", "--crate-name", "core"]);
        common(&mut c);
        c.arg(&core.lib_rs).arg("-o").arg(tmp_lib.join("libcore.rlib"));
        match run(c, &format!("core for {target} ({cpu}, from {})", core.origin)) {
            Ok(()) => break,
            Err(BuildError::Compile { what, stderr }) if core.origin == "rust-docs" && attempts < 5 => {
                let missing = missing_docs(&stderr);
                if missing.is_empty() {
                    return Err(BuildError::Compile { what, stderr });
                }
                for m in missing {
                    if let Some(p) = m.parent() {
                        fs::create_dir_all(p).at(p)?;
                    }
                    fs::write(&m, "").at(&m)?;
                }
                attempts += 1;
            }
            Err(e) => return Err(e),
        }
    }

    let cb = tmp.join("compiler_builtins.rs");
    fs::write(&cb, "#![no_std]\n#![feature(compiler_builtins)]\n#![compiler_builtins]\n#![allow(internal_features)]\n").at(&cb)?;
    let mut c = rustc.command();
    c.args(["--crate-type", "lib", "--crate-name", "compiler_builtins"]).arg("--sysroot").arg(&tmp);
    common(&mut c);
    c.arg(&cb).arg("-o").arg(tmp_lib.join("libcompiler_builtins.rlib"));
    run(c, &format!("compiler_builtins for {target}"))?;
    fs::write(tmp.join(MARKER), &rustc.version).at(&tmp)?;
    let _ = fs::remove_dir_all(root);
    if fs::rename(&tmp, root).is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    debug_assert!(lib.exists() || root.join(MARKER).exists());
    Ok(root.to_path_buf())
}

/// `.md` files rustc could not read, from its diagnostics.
fn missing_docs(stderr: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut rest = stderr;
    while let Some(i) = rest.find("couldn't read `") {
        rest = &rest[i + 15..];
        let Some(end) = rest.find('`') else { break };
        let p = PathBuf::from(&rest[..end]);
        if p.extension().is_some_and(|e| e == "md") && !out.contains(&p) {
            out.push(p);
        }
        rest = &rest[end..];
    }
    out
}

/// Runs a rustc command, turning failure into [`BuildError::Compile`].
pub(crate) fn run(mut c: std::process::Command, what: &str) -> Result<(), BuildError> {
    let out = c.output().map_err(|e| BuildError::Compile { what: what.to_string(), stderr: e.to_string() })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(BuildError::Compile { what: what.to_string(), stderr: String::from_utf8_lossy(&out.stderr).to_string() })
    }
}
