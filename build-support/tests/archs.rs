//! The per-architecture cfgs that build-support passes to kernel-dsl: every default
//! architecture has an ISA generation, and the new ones map to the right generation and
//! dot-product instructions.
use build_support::compile::{amdgpu_dot, amdgpu_gen};
use build_support::{BuildError, DEFAULT_ARCHS};

#[test]
fn every_default_arch_has_a_generation() {
    for a in DEFAULT_ARCHS {
        assert!(amdgpu_gen(a).is_ok(), "{a}");
    }
}

#[test]
fn generations_and_dot_instructions() {
    let cases = [
        ("gfx90a", "gfx9", Some("sdot4")),
        ("gfx942", "gfx9", Some("sdot4")),
        ("gfx950", "gfx9", Some("sdot4")),
        ("gfx1030", "gfx10", Some("sdot4")),
        ("gfx1100", "gfx11", Some("sudot4")),
        ("gfx1101", "gfx11", Some("sudot4")),
        ("gfx1151", "gfx11", Some("sudot4")),
        ("gfx1200", "gfx12", Some("sudot4")),
        ("gfx1201", "gfx12", Some("sudot4")),
    ];
    for (arch, gen, dot) in cases {
        assert_eq!(amdgpu_gen(arch).unwrap(), gen, "{arch}");
        assert_eq!(amdgpu_dot(arch), dot, "{arch}");
    }
}

#[test]
fn unknown_generations_are_typed_errors() {
    for a in ["gfx1300", "gfx803", "sm_80", "gfx", "gfx12zz"] {
        assert!(matches!(amdgpu_gen(a), Err(BuildError::UnsupportedArch(ref s)) if s == a), "{a}");
    }
}
