//! The one error type of model loading and running.
//!
//! Every variant names where the problem is — the file, and the tensor or config field — so a
//! user with a broken checkpoint folder can act on the one-line message. Nothing in this crate
//! panics on data read from disk; it returns one of these.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid JSON: {msg}")]
    Json { path: PathBuf, msg: String },
    #[error("{path}: field `{field}`: {msg}")]
    Config { path: PathBuf, field: String, msg: String },
    #[error("{path}: not a valid safetensors file: {msg}")]
    Safetensors { path: PathBuf, msg: String },
    #[error("{path}: tensor `{tensor}`: {msg}")]
    Tensor { path: PathBuf, tensor: String, msg: String },
    #[error("{path}: {msg}")]
    Tokenizer { path: PathBuf, msg: String },
    /// A request the loaded model cannot serve (for example a prompt longer than the context).
    #[error("{0}")]
    Request(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io { path: path.into(), source }
    }
    pub(crate) fn config(path: impl Into<PathBuf>, field: &str, msg: impl Into<String>) -> Error {
        Error::Config { path: path.into(), field: field.to_string(), msg: msg.into() }
    }
    pub(crate) fn tensor(path: impl Into<PathBuf>, tensor: &str, msg: impl Into<String>) -> Error {
        Error::Tensor { path: path.into(), tensor: tensor.to_string(), msg: msg.into() }
    }
}
