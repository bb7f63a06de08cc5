//! Compiles this crate's kernel modules for every configured GPU target.
fn main() {
    build_support::KernelBuild::new()
        .module("flash")
        .module("flash_wgmma")
        .module("paged")
        .module("cache")
        .module("prefill")
        // Hopper's warpgroup matrix units (`wgmma`) exist only in `sm_90a` PTX.
        .ptx_variant("sm_90a", &["flash_fwd_wgmma"])
        .build();
}
