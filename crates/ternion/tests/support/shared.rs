//! The shared data folder beside the repository (`../shared`: golden data and test
//! vocabularies) for every test that needs it, native or integration (included with
//! `#[path]`). A missing file fails the test loudly, with this one message; no test skips.

use std::path::{Path, PathBuf};

/// `../shared/<rel>` beside the repository; panics with a clear message when it is
/// missing.
pub fn shared_path(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared")
        .join(rel);
    assert!(
        p.exists(),
        "the shared test data is missing: {} does not exist (the folder `shared` beside the \
         repository holds the golden data and test vocabularies; these tests need it)",
        p.display()
    );
    p
}
