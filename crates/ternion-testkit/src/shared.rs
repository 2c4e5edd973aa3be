//! The shared data folder beside the repository (`../shared`: golden data and test
//! vocabularies) for every test that needs it, native or integration (included with
//! `#[path]`). A missing file fails the test loudly, with this one message; no test skips.

use std::path::{Path, PathBuf};

/// `../shared/<rel>` beside the repository; panics with a clear message when it is
/// missing.
pub fn shared_path(rel: &str) -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let beside = crate_dir.join("../../..");
    let p = beside
        .canonicalize()
        .unwrap_or(beside)
        .join("shared")
        .join(rel);
    assert!(
        p.exists(),
        "../shared (golden data) is missing beside the repository: {}",
        p.display()
    );
    p
}
