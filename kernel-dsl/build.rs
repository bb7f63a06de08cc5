//! Publishes this crate's source path to dependents' build scripts (`DEP_KERNEL_DSL_SRC`)
//! and declares the `amdgpu_gen` and `amdgpu_dot` cfgs that the device build sets.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:src={dir}/src/lib.rs");
    println!("cargo:rustc-check-cfg=cfg(amdgpu_gen, values(\"gfx9\", \"gfx10\", \"gfx11\", \"gfx12\"))");
    println!("cargo:rustc-check-cfg=cfg(amdgpu_arch, values(any()))");
    println!("cargo:rustc-check-cfg=cfg(amdgpu_dot, values(\"sdot4\", \"sudot4\"))");
    println!("cargo:rerun-if-changed=build.rs");
}
