//! Typed reads from a JSON config object, each failure naming the file and the field.
//!
//! HF configs are loose: fields are optional with model-specific defaults, numbers may be
//! written as `1000000` or `1e6`, and `eos_token_id` is either an integer or a list. These
//! helpers keep that looseness in one place so the config structs read like their spec.

use crate::error::{Error, Result};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// A parsed JSON object plus the file it came from, for error messages.
pub struct JsonObject {
    pub path: PathBuf,
    pub map: Map<String, Value>,
}

impl JsonObject {
    /// Reads and parses `path`, which must hold a JSON object.
    pub fn read(path: &Path) -> Result<JsonObject> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<JsonObject> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| Error::Json { path: path.to_path_buf(), msg: e.to_string() })?;
        match value {
            Value::Object(map) => Ok(JsonObject { path: path.to_path_buf(), map }),
            _ => Err(Error::Json { path: path.to_path_buf(), msg: "expected a JSON object".into() }),
        }
    }

    pub fn err(&self, field: &str, msg: impl Into<String>) -> Error {
        Error::config(&self.path, field, msg)
    }

    pub fn get(&self, field: &str) -> Option<&Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    /// A required non-negative integer.
    pub fn usize(&self, field: &str) -> Result<usize> {
        match self.get(field) {
            None => Err(self.err(field, "missing (required)")),
            Some(v) => self.as_usize(field, v),
        }
    }

    pub fn opt_usize(&self, field: &str) -> Result<Option<usize>> {
        self.get(field).map(|v| self.as_usize(field, v)).transpose()
    }

    /// A required positive integer.
    pub fn positive(&self, field: &str) -> Result<usize> {
        let v = self.usize(field)?;
        if v == 0 {
            return Err(self.err(field, "must be positive, got 0"));
        }
        Ok(v)
    }

    fn as_usize(&self, field: &str, v: &Value) -> Result<usize> {
        v.as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.err(field, format!("expected a non-negative integer, got {v}")))
    }

    pub fn opt_f64(&self, field: &str) -> Result<Option<f64>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.err(field, format!("expected a number, got {v}"))),
        }
    }

    pub fn opt_bool(&self, field: &str) -> Result<Option<bool>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.err(field, format!("expected true or false, got {v}"))),
        }
    }

    pub fn opt_str(&self, field: &str) -> Result<Option<&str>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.err(field, format!("expected a string, got {v}"))),
        }
    }

    /// An integer or a list of integers (`eos_token_id`'s two spellings); empty when absent.
    pub fn id_list(&self, field: &str) -> Result<Vec<u32>> {
        let one = |v: &Value| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| self.err(field, format!("expected a token id, got {v}")))
        };
        match self.get(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(one).collect(),
            Some(v) => Ok(vec![one(v)?]),
        }
    }

    /// A nested object, if present.
    pub fn opt_object(&self, field: &str) -> Result<Option<JsonObject>> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(JsonObject { path: self.path.clone(), map: m.clone() })),
            Some(v) => Err(self.err(field, format!("expected an object, got {v}"))),
        }
    }
}
