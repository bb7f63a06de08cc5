//! Kernels the DSL cannot compile for a GPU are rejected at the user's span, with why.
#[test]
fn dsl_rejects_bad_kernels() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
