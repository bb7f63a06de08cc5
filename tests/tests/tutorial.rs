//! The tutorial of `docs/adding-a-kernel.md`, run: its kernel (`workspace_tests::tutorial`)
//! on the CPU executor with waves of 32 and 64, and a check that the book's code blocks are
//! still this code.
use half::bf16;
use kernel_dsl::host::{CpuExecutor, LaunchConfig, WaveSize};
use workspace_tests::tutorial;

// ANCHOR: test
#[test]
fn axpy_matches_the_host_formula() {
    let n = 1000;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let y: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
    for wave in [WaveSize::W32, WaveSize::W64] {
        let exec = CpuExecutor::new(wave);
        let mut out = vec![0.0f32; n];
        // 256 work-items per work-group, as many work-groups as `n` needs.
        tutorial::axpy::launch::<f32>(&exec, LaunchConfig::for_elements(n, 256), 2.0, &x, &y, &mut out).unwrap();
        for i in 0..n {
            assert_eq!(out[i], 2.0 * x[i] + y[i], "element {i}, {wave:?}");
        }
    }
}
// ANCHOR_END: test

#[test]
fn axpy_in_bf16_rounds_once() {
    let n = 300;
    let x: Vec<bf16> = (0..n).map(|i| bf16::from_f32(i as f32 / 7.0)).collect();
    let y: Vec<bf16> = (0..n).map(|i| bf16::from_f32(3.0 - i as f32 / 3.0)).collect();
    let exec = CpuExecutor::new(WaveSize::W64);
    let mut out = vec![bf16::ZERO; n];
    tutorial::axpy::launch::<bf16>(&exec, LaunchConfig::for_elements(n, 128), -1.5, &x, &y, &mut out).unwrap();
    for i in 0..n {
        let want = bf16::from_f32(-1.5 * x[i].to_f32() + y[i].to_f32());
        assert_eq!(out[i], want, "element {i}");
    }
}

/// Every ```rust block of the tutorial between `<!-- from: FILE ANCHOR -->` and the next
/// block must be the lines of FILE between `// ANCHOR: name` and `// ANCHOR_END: name`.
#[test]
fn the_book_shows_this_code() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let book = std::fs::read_to_string(format!("{root}/docs/adding-a-kernel.md")).unwrap();
    let mut checked = 0;
    let mut rest = book.as_str();
    while let Some(at) = rest.find("<!-- from: ") {
        rest = &rest[at + "<!-- from: ".len()..];
        let end = rest.find(" -->").expect("unterminated marker");
        let (file, anchor) = rest[..end].split_once(' ').expect("marker: FILE ANCHOR");
        let block = &rest[rest.find("```rust\n").expect("no rust block after the marker") + 8..];
        let block = &block[..block.find("```").expect("unterminated block")];
        let source = std::fs::read_to_string(format!("{root}/{file}")).unwrap();
        let start = source.find(&format!("// ANCHOR: {anchor}\n")).unwrap_or_else(|| panic!("{file}: no anchor {anchor}"));
        let body = &source[start + format!("// ANCHOR: {anchor}\n").len()..];
        let body = &body[..body.find(&format!("// ANCHOR_END: {anchor}")).unwrap()];
        assert_eq!(block, body, "docs/adding-a-kernel.md: the block from {file} ({anchor}) differs from the source");
        checked += 1;
    }
    assert!(checked >= 2, "the tutorial should show the kernel and its test ({checked} blocks checked)");
}
