//! Where `--model` points: a local GGUF file, an MLC `q4f16_1` directory, or a file of a
//! Hugging Face repository (`OWNER/REPO/FILE.gguf`), read from the local Hugging Face cache
//! or downloaded. The Hub client honours `HF_HOME`, `HF_ENDPOINT`, `HF_TOKEN` and
//! `HF_HUB_OFFLINE` (no network at all; a file missing from the cache is an error).

use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::common::{file_sha256, hub_sha256};

/// The model `run` and `chat` use when no `--model` is given.
pub const DEFAULT_REPO: &str = "microsoft/bitnet-b1.58-2B-4T-gguf";
/// The file of [`DEFAULT_REPO`] that is downloaded.
pub const DEFAULT_FILE: &str = "ggml-model-i2_s.gguf";

/// A file of a Hugging Face model repository.
#[derive(Debug, PartialEq, Eq)]
pub struct HubFile {
    /// `OWNER/REPO`.
    pub repo: String,
    /// The file's path inside the repository.
    pub file: String,
}

impl HubFile {
    /// Reads `OWNER/REPO/FILE.gguf` (FILE may sit in folders of the repository); `None`
    /// for anything else (absolute paths, `.` or `..` parts, other extensions).
    pub fn parse(s: &str) -> Option<HubFile> {
        let path = Path::new(s);
        if !path.components().all(|c| matches!(c, Component::Normal(_))) {
            return None;
        }
        let parts: Vec<&str> = s.split('/').collect();
        if parts.len() < 3 || parts.iter().any(|p| p.is_empty()) || !s.ends_with(".gguf") {
            return None;
        }
        Some(HubFile {
            repo: format!("{}/{}", parts[0], parts[1]),
            file: parts[2..].join("/"),
        })
    }
}

/// Whether `HF_HUB_OFFLINE` asks for no network (the values `huggingface_hub` takes as
/// true: 1, true, yes, on).
fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// The token for the Hub: `HF_TOKEN`, else the one `huggingface-cli login` saved.
fn token(cache: &hf_hub::Cache) -> Option<String> {
    std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
        .or_else(|| cache.token())
}

/// The local path of the model `--model` names, checked before anything is loaded: a
/// missing path and a directory that is not an MLC model are errors naming the path; a
/// missing path of the form `OWNER/REPO/FILE.gguf` is looked up on the Hub.
pub fn resolve(path: &Path) -> Result<PathBuf> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            if ternion::mlc::is_mlc_dir(path) {
                Ok(path.to_owned())
            } else {
                bail!(
                    "{} is a directory, not a GGUF file (nor an MLC q4f16_1 directory: it has \
                     no mlc-chat-config.json)",
                    path.display()
                )
            }
        }
        Ok(_) => Ok(path.to_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match path.to_str().and_then(HubFile::parse) {
                Some(h) => fetch(&h),
                None => bail!(
                    "{}: not found (give a GGUF file, an MLC q4f16_1 directory, or a Hugging \
                     Face file as OWNER/REPO/FILE.gguf)",
                    path.display()
                ),
            }
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// The default model's path (see [`fetch`]).
pub fn default_model() -> Result<PathBuf> {
    fetch(&HubFile {
        repo: DEFAULT_REPO.into(),
        file: DEFAULT_FILE.into(),
    })
}

/// A file of the Hub: from the local cache, or (unless `HF_HUB_OFFLINE`) downloaded with
/// a progress bar and then checked against the SHA-256 the Hub reported (a file that
/// fails the check is deleted from the cache, so the next run downloads it again).
pub fn fetch(h: &HubFile) -> Result<PathBuf> {
    let cache = hf_hub::Cache::from_env();
    if let Some(p) = cache.model(h.repo.clone()).get(&h.file) {
        return Ok(p);
    }
    let (repo, file) = (&h.repo, &h.file);
    if offline() {
        bail!(
            "{repo}/{file} is not in the local Hugging Face cache ({}) and HF_HUB_OFFLINE is \
             set, so it is not downloaded",
            cache.path().display()
        );
    }
    eprintln!("Downloading {repo}/{file} (once) ...");
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_token(token(&cache))
        .with_progress(true)
        .build()
        .context("setting up the Hugging Face client")?;
    let path = api.model(repo.clone()).get(file).map_err(|e| {
        anyhow::anyhow!(
            "could not download {repo}/{file}: {e}\n\
             If this machine is offline, download the file elsewhere and pass it with \
             --model PATH, or make a test model with \
             `ternion synth --shape 2b-4t --type i2_s --out model.gguf`."
        )
    })?;
    match hub_sha256(&path) {
        Some(want) => {
            let got = file_sha256(&path)?;
            if got != want {
                let blob = std::fs::canonicalize(&path).ok();
                for p in [Some(path.clone()), blob].into_iter().flatten() {
                    // Best effort: the error below is what matters.
                    let _ = std::fs::remove_file(p);
                }
                bail!(
                    "the download of {repo}/{file} is corrupt: its SHA-256 is {got}, the Hub \
                     reported {want}; the file was deleted, run again to download it again"
                );
            }
            eprintln!("SHA-256 matches the Hub's ({want})");
        }
        None => eprintln!("the Hub reported no SHA-256 for {file}; pass --sha256 to check it"),
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_file_forms() {
        let h = HubFile::parse("owner/repo/dir/m.gguf").unwrap();
        assert_eq!(
            (h.repo.as_str(), h.file.as_str()),
            ("owner/repo", "dir/m.gguf")
        );
        for bad in [
            "owner/repo",
            "/abs/x/m.gguf",
            "./a/b/m.gguf",
            "a/../b/m.gguf",
            "a/b/c.bin",
        ] {
            assert_eq!(HubFile::parse(bad), None, "{bad}");
        }
    }
}
