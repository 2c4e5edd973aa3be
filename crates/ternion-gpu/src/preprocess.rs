//! The WGSL preprocessor.
//!
//! Kernels are plain `.wgsl` files. Code that must not even appear when a feature is off
//! (`enable f16;`, subgroup builtins) sits between lines that are exactly
//! `#if NAME`, `#else` and `#endif` (leading spaces allowed, nesting allowed). The names
//! are `F16`, `SUBGROUPS` and `KV_F32` (the KV cache's element type, `kv_type.wgsl`),
//! defined from the [`Variant`](super::Variant), and `ROPE` / `TILED` for the kernel
//! sources that have those variants. Nothing else is rewritten;
//! numeric specialisations go through WGSL `override` constants.

use crate::{Error, Result};

/// Applies the `#if NAME` / `#else` / `#endif` preprocessor (see the module docs).
pub fn preprocess(file: &str, src: &str, defines: &[&str]) -> Result<String> {
    // Each entry: (this branch is active, some enclosing branch is inactive).
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let mut out = String::with_capacity(src.len());
    let active =
        |stack: &[(bool, bool)]| stack.last().is_none_or(|&(a, outer_off)| a && !outer_off);
    for (n, line) in src.lines().enumerate() {
        let t = line.trim();
        let err = |what: &str| Error::Shader {
            kernel: format!("{file}:{}", n + 1),
            message: format!("preprocessor: {what}"),
        };
        if let Some(name) = t.strip_prefix("#if ") {
            let outer_off = !active(&stack);
            stack.push((defines.contains(&name.trim()), outer_off));
            out.push('\n');
        } else if t == "#else" {
            let top = stack.last_mut().ok_or_else(|| err("#else without #if"))?;
            top.0 = !top.0;
            out.push('\n');
        } else if t == "#endif" {
            stack.pop().ok_or_else(|| err("#endif without #if"))?;
            out.push('\n');
        } else if t.starts_with('#') {
            return Err(err(&format!("unknown directive '{t}'")));
        } else {
            // Inactive lines become empty so that line numbers in errors stay right.
            if active(&stack) {
                out.push_str(line);
            }
            out.push('\n');
        }
    }
    if !stack.is_empty() {
        return Err(Error::Shader {
            kernel: file.into(),
            message: "preprocessor: unterminated #if".into(),
        });
    }
    Ok(out)
}

#[cfg(test)]
#[path = "preprocess_tests.rs"]
mod tests;
