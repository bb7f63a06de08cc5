//! `NCCL_LIBRARY` / `RCCL_LIBRARY` name the file `Library::load` opens, and only that file.
//! Its own test binary: it sets the variables, which no other test may see.
use kernel_collectives::{Backend, CollectiveError, Library};

#[test]
fn the_environment_variable_names_the_only_file_tried() {
    for (backend, var) in [(Backend::Nccl, "NCCL_LIBRARY"), (Backend::Rccl, "RCCL_LIBRARY")] {
        assert_eq!(backend.env_var(), var);
        std::env::set_var(var, "/nonexistent/dir/libcollectives-test.so");
        match Library::load(backend) {
            Err(CollectiveError::LibraryNotFound { tried, env_var, .. }) => {
                assert_eq!(tried, vec!["/nonexistent/dir/libcollectives-test.so".to_string()]);
                assert_eq!(env_var, var);
            }
            other => panic!("{backend}: {other:?}"),
        }
        // A library that loads but is not NCCL/RCCL: named as such, not skipped over.
        std::env::set_var(var, "libm.so.6");
        match Library::load(backend) {
            Err(CollectiveError::MissingSymbol { path, symbol: "ncclGetVersion", .. }) => assert_eq!(path, "libm.so.6"),
            other => panic!("{backend}: {other:?}"),
        }
        std::env::remove_var(var);
    }
}
