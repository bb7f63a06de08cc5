//! A content fingerprint of a folder tree (FNV-1a 64 over relative paths and bytes).

use std::path::Path;

pub struct Fingerprint(u64);

impl Fingerprint {
    pub fn new() -> Self {
        Fingerprint(0xcbf2_9ce4_8422_2325)
    }

    pub fn add(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // a separator, so ("ab", "c") and ("a", "bc") differ
        self.0 = self.0.rotate_left(5) ^ bytes.len() as u64;
    }

    /// Every file under `dir` (sorted, skipping names in `skip`), path and contents.
    pub fn add_tree(&mut self, dir: &Path, skip: &[&str]) -> Result<(), String> {
        let mut files = Vec::new();
        collect(dir, dir, skip, &mut files)?;
        files.sort();
        for rel in files {
            let bytes = std::fs::read(dir.join(&rel)).map_err(|e| format!("{rel}: {e}"))?;
            self.add(rel.as_bytes());
            self.add(&bytes);
        }
        Ok(())
    }

    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}

fn collect(root: &Path, dir: &Path, skip: &[&str], out: &mut Vec<String>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if skip.contains(&name.as_str()) {
            continue;
        }
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| format!("{}: {e}", path.display()))?;
        if kind.is_dir() {
            collect(root, &path, skip, out)?;
        } else {
            let rel = path.strip_prefix(root).map_err(|e| e.to_string())?;
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
    Ok(())
}
