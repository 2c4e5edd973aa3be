//! The official `openai` Python package for the server tests.

use std::process::Command;

/// Whether `python3` can import `openai`. Without it the test fails with how to install
/// it, unless `TERNION_SKIP_PYTHON=1` asks to skip (then false).
pub fn openai_available() -> bool {
    let importable = Command::new("python3")
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !importable {
        if std::env::var("TERNION_SKIP_PYTHON").as_deref() == Ok("1") {
            eprintln!("skipping: python3 cannot import openai (TERNION_SKIP_PYTHON=1)");
            return false;
        }
        panic!(
            "this test needs python3 with the `openai` package: run `pip install openai`, \
             or set TERNION_SKIP_PYTHON=1 to skip it"
        );
    }
    true
}
