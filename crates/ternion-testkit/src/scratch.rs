//! Scratch folders of a test process, `<temp>/<prefix>-<pid>`, removed with everything in
//! them when the process exits (the test harness's exit, passed or failed), so that test
//! runs leave nothing behind in the system's temporary folder.

use std::path::PathBuf;
use std::sync::Mutex;

/// The folders to remove at exit.
static FOLDERS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// `<temp>/<prefix>-<pid>`, created if missing, removed when this process exits. Tests
/// of one process share it (they run in parallel: give their files distinct names).
pub fn dir(prefix: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    std::fs::create_dir_all(&d)
        .unwrap_or_else(|e| panic!("creating the scratch folder {}: {e}", d.display()));
    let mut folders = FOLDERS.lock().unwrap_or_else(|e| e.into_inner());
    if !folders.contains(&d) {
        if folders.is_empty() {
            remove_at_exit();
        }
        folders.push(d.clone());
    }
    d
}

/// Registers [`remove_all`] to run when the process exits.
#[cfg(unix)]
fn remove_at_exit() {
    // SAFETY: `remove_all` is a plain `extern "C" fn()` that never unwinds.
    let registered = unsafe { libc::atexit(remove_all) } == 0;
    assert!(
        registered,
        "registering the scratch folders' removal at exit"
    );
}

/// Elsewhere the folders stay (the tests run on Linux).
#[cfg(not(unix))]
fn remove_at_exit() {}

/// Removes every registered folder (a folder already gone is fine).
#[cfg(unix)]
extern "C" fn remove_all() {
    let folders = FOLDERS.lock().unwrap_or_else(|e| e.into_inner());
    for d in folders.iter() {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The folder exists and is registered once.
    #[test]
    fn a_folder_is_created_and_registered_once() {
        let d = dir("ternion-scratch-test");
        assert!(d.is_dir());
        assert_eq!(dir("ternion-scratch-test"), d);
        let folders = FOLDERS.lock().unwrap();
        assert_eq!(folders.iter().filter(|f| **f == d).count(), 1);
    }

    /// A test process's folder, with a file in it, is gone once that process has exited:
    /// this test binary runs [`child_writes_a_file`] alone and reads the folder it made.
    #[test]
    #[cfg(unix)]
    fn the_folder_is_removed_when_the_process_exits() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "scratch::tests::child_writes_a_file",
            ])
            .args(["--nocapture", "--test-threads", "1"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8(out.stdout).unwrap();
        let line = stdout
            .lines()
            .find_map(|l| l.split("folder: ").nth(1))
            .unwrap();
        let d = PathBuf::from(line);
        assert!(d.starts_with(std::env::temp_dir()), "{}", d.display());
        assert!(!d.exists(), "{} is still there", d.display());
    }

    /// The child half of [`the_folder_is_removed_when_the_process_exits`].
    #[test]
    #[ignore = "run by the_folder_is_removed_when_the_process_exits in a process of its own"]
    fn child_writes_a_file() {
        let d = dir("ternion-scratch-child");
        std::fs::write(d.join("file"), b"x").unwrap();
        println!("folder: {}", d.display());
    }
}
