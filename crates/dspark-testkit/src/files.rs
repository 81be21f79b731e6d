//! Checkpoint files broken on purpose: the loader tests copy a fixture folder and rewrite one
//! of its JSON files or a safetensors header, so each test can show that one wrong field,
//! dtype, shape or offset is refused by name. The helpers panic on a malformed input: they
//! only ever read the repository's own fixtures.

use serde_json::Value;
use std::path::Path;

/// Copies every file of the folder `src` into `dst` (fixture folders are flat).
pub fn copy_files(src: &Path, dst: &Path) {
    for entry in std::fs::read_dir(src).unwrap_or_else(|e| panic!("{}: {e}", src.display())) {
        let p = entry.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
        }
    }
}

/// Rewrites the JSON file at `path` (a `config.json`, say) through `edit`.
pub fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

/// Rewrites the safetensors file at `path` through `edit`, which gets its header (the JSON
/// object of tensor entries) and its data section. The header is written back padded with
/// spaces to a multiple of 8 bytes, as the format asks, and its length prefix updated; the
/// offsets in it are the caller's to keep true.
pub fn edit_safetensors(path: &Path, edit: impl FnOnce(&mut Value, &mut Vec<u8>)) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut data = bytes[8 + n..].to_vec();
    edit(&mut header, &mut data);
    let mut h = header.to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

/// [`edit_safetensors`] of the header alone: the data section stays byte for byte.
pub fn edit_safetensors_header(path: &Path, edit: impl FnOnce(&mut Value)) {
    edit_safetensors(path, |h, _| edit(h));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A one-tensor safetensors file: its header, padded, then 8 data bytes.
    fn tiny(path: &Path) {
        let h = json!({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).to_string();
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        std::fs::write(path, out).unwrap();
    }

    fn read(path: &Path) -> (Value, Vec<u8>, usize) {
        let b = std::fs::read(path).unwrap();
        let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        (serde_json::from_slice(&b[8..8 + n]).unwrap(), b[8 + n..].to_vec(), n)
    }

    #[test]
    fn header_edits_keep_the_data_and_pad_the_header() {
        let dir = std::env::temp_dir().join(format!("dspark-testkit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("model.safetensors");
        tiny(&p);
        edit_safetensors_header(&p, |h| h["t"]["dtype"] = json!("I32"));
        let (h, data, n) = read(&p);
        assert_eq!(h["t"]["dtype"], "I32");
        assert_eq!(h["t"]["shape"], json!([2]));
        assert_eq!(data, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(n % 8, 0, "header of {n} bytes");
        edit_safetensors(&p, |h, d| {
            h["t"]["data_offsets"] = json!([0, 4]);
            d.truncate(4);
        });
        let (h, data, _) = read(&p);
        assert_eq!((h["t"]["data_offsets"].clone(), data), (json!([0, 4]), vec![1, 2, 3, 4]));

        let copy = dir.join("copy");
        std::fs::create_dir_all(&copy).unwrap();
        std::fs::write(dir.join("config.json"), r#"{"a": 1}"#).unwrap();
        copy_files(&dir, &copy);
        edit_json(&copy.join("config.json"), |v| v["a"] = json!(2));
        assert_eq!(read(&copy.join("model.safetensors")).1, [1, 2, 3, 4]);
        assert_eq!(std::fs::read_to_string(copy.join("config.json")).unwrap(), r#"{"a":2}"#);
        assert_eq!(std::fs::read_to_string(dir.join("config.json")).unwrap(), r#"{"a": 1}"#);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
