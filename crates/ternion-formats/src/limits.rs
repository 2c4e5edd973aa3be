//! Limits derived from the machine: does a model (or a KV cache) fit the memory there is?
//!
//! The GGUF reader already bounds every count, array and string length by the bytes left
//! in the file, so nothing in a file can make it allocate more than a small multiple of the
//! file's size. What a file *can* still do is describe a model larger than the machine: its
//! tensor data is mapped, not read, so without a check the failure comes much later, as an
//! OOM kill in the middle of a forward pass. [`check_model_fits`] turns that into an error
//! before anything is paged in.
//!
//! Available memory is Linux's `MemAvailable` (from `/proc/meminfo`): free memory plus what
//! the kernel can reclaim (page cache included) without swapping. On other systems, or when
//! the value cannot be read, it is unknown and the checks pass (they cannot judge). Setting
//! `TERNION_NO_MEMORY_CHECK=1` also skips them (for machines with large swap, or files on
//! a fast disk that are deliberately larger than RAM).

use std::fmt;
use std::path::PathBuf;

use crate::gguf::GgufFile;
use crate::{Error, Result};

/// Environment variable that disables the memory checks when set to `1`.
pub const SKIP_ENV: &str = "TERNION_NO_MEMORY_CHECK";

/// Bytes of memory available to this process now, or `None` when unknown (not Linux, no
/// `/proc/meminfo`, or no parsable `MemAvailable` line).
pub fn available_memory() -> Option<u64> {
    if cfg!(target_os = "linux") {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        parse_meminfo(&text)
    } else {
        None
    }
}

/// `MemAvailable` in bytes from the text of `/proc/meminfo` (`MemAvailable:  123 kB`).
pub fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut parts = line["MemAvailable:".len()..].split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    let scale = match parts.next() {
        None => 1,
        Some(u) if u.eq_ignore_ascii_case("kB") => 1024,
        Some(u) if u.eq_ignore_ascii_case("MB") => 1024 * 1024,
        Some(u) if u.eq_ignore_ascii_case("GB") => 1024 * 1024 * 1024,
        Some(_) => return None,
    };
    value.checked_mul(scale)
}

/// Total bytes of tensor data in a file (the sum of every tensor's true size).
pub fn tensor_data_bytes(file: &GgufFile) -> u64 {
    // Each size is bounded by the file length and tensors do not overlap, so the sum fits.
    file.tensors
        .iter()
        .fold(0u64, |acc, t| acc.saturating_add(t.size))
}

/// Bytes of a KV cache of `n_layer` layers, `kv_dim` values per position and `n_ctx`
/// positions (keys and values, F16), or `None` if that overflows u64.
pub fn kv_cache_bytes(n_layer: usize, kv_dim: usize, n_ctx: usize) -> Option<u64> {
    [n_layer, kv_dim, n_ctx]
        .iter()
        .try_fold(2u64 * 2, |acc, &x| acc.checked_mul(x as u64))
}

fn skipped() -> bool {
    std::env::var(SKIP_ENV).is_ok_and(|v| v == "1")
}

/// What a memory check is about: the subject of [`Error::InsufficientMemory`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemoryUse {
    /// The tensor data of a model file.
    ModelData {
        /// The file.
        file: PathBuf,
    },
    /// A KV cache, on top of the weights the caller also holds.
    KvCache {
        /// Positions.
        n_ctx: usize,
        /// Layers.
        n_layer: usize,
        /// Values per position and layer.
        kv_dim: usize,
        /// Bytes of weights counted with it.
        weights: u64,
    },
}

impl fmt::Display for MemoryUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryUse::ModelData { file } => write!(f, "{}: tensor data", file.display()),
            MemoryUse::KvCache {
                n_ctx,
                n_layer,
                kv_dim,
                weights,
            } => write!(
                f,
                "a KV cache of {n_ctx} positions × {n_layer} layers × {kv_dim} values (plus {} \
                 of weights)",
                human(*weights)
            ),
        }
    }
}

/// Checks that `need` bytes (for `what`) fit in `available` bytes; `None` for `available`
/// means unknown, which passes. The pure core of the checks below.
pub fn check_fits(what: MemoryUse, need: u64, available: Option<u64>) -> Result<()> {
    match available {
        Some(available) if need > available => Err(Error::InsufficientMemory {
            what,
            need,
            available,
        }),
        _ => Ok(()),
    }
}

/// Checks, before a model is bound, that its tensor data fits the memory available now.
/// Call it right after the file is opened (`model::load`), before `BitNet::load`.
/// Returns [`Error::InsufficientMemory`] naming the file and both sizes when it does not
/// fit; passes
/// when available memory is unknown or the check is disabled with `TERNION_NO_MEMORY_CHECK=1`.
pub fn check_model_fits(file: &GgufFile) -> Result<()> {
    if skipped() {
        return Ok(());
    }
    check_fits(
        MemoryUse::ModelData {
            file: file.path().to_path_buf(),
        },
        tensor_data_bytes(file),
        available_memory(),
    )
}

/// Checks that a KV cache of the given size can be allocated (its size does not overflow
/// and fits the memory available now, on top of `already` bytes the caller will also use,
/// typically [`tensor_data_bytes`]). Call it before `Model::kv_pool` / `Session::new`.
pub fn check_kv_cache_fits(
    n_layer: usize,
    kv_dim: usize,
    n_ctx: usize,
    already: u64,
) -> Result<()> {
    let need = kv_cache_bytes(n_layer, kv_dim, n_ctx).ok_or(Error::KvCacheOverflow {
        n_ctx,
        n_layer,
        kv_dim,
    })?;
    if skipped() {
        return Ok(());
    }
    let what = MemoryUse::KvCache {
        n_ctx,
        n_layer,
        kv_dim,
        weights: already,
    };
    check_fits(what, need.saturating_add(already), available_memory())
}

/// A byte count for messages: "1.5 GiB", "512 B".
pub(crate) fn human(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo() {
        let text = "MemTotal:       16314504 kB\nMemFree:          508036 kB\n\
                    MemAvailable:    9812344 kB\nBuffers:          112236 kB\n";
        assert_eq!(parse_meminfo(text), Some(9_812_344 * 1024));
        assert_eq!(parse_meminfo("MemFree: 1 kB\n"), None);
        assert_eq!(parse_meminfo("MemAvailable: lots kB\n"), None);
        assert_eq!(parse_meminfo("MemAvailable: 7\n"), Some(7));
        assert_eq!(
            parse_meminfo("MemAvailable: 18446744073709551615 kB\n"),
            None
        );
    }

    #[test]
    fn machine_value_is_plausible() {
        if let Some(b) = available_memory() {
            assert!(b > 1 << 20, "MemAvailable of {b} bytes");
        }
    }

    #[test]
    fn fits_or_not() {
        let model = || MemoryUse::ModelData {
            file: "model.gguf".into(),
        };
        assert!(check_fits(model(), 10, Some(10)).is_ok());
        assert!(
            check_fits(model(), 10, None).is_ok(),
            "unknown memory passes"
        );
        let e = check_fits(model(), 3 << 30, Some(1 << 30)).unwrap_err();
        assert_eq!(e.kind(), "InsufficientMemory");
        let m = e.to_string();
        assert!(m.contains("3.0 GiB") && m.contains("1.0 GiB"), "{m}");
        assert!(m.contains("model.gguf") && m.contains(SKIP_ENV), "{m}");
    }

    #[test]
    fn kv_cache_sizes() {
        assert_eq!(kv_cache_bytes(30, 640, 4096), Some(4 * 30 * 640 * 4096));
        assert_eq!(kv_cache_bytes(1 << 20, 1 << 20, usize::MAX), None);
        assert!(check_kv_cache_fits(1 << 20, 1 << 20, usize::MAX, 0).is_err());
        assert!(check_kv_cache_fits(1, 8, 8, 0).is_ok());
        if available_memory().is_some() && !skipped() {
            // 2^60 bytes fits no machine.
            assert!(check_kv_cache_fits(1 << 10, 1 << 20, 1 << 28, 0).is_err());
        }
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(5 << 30), "5.0 GiB");
    }
}
