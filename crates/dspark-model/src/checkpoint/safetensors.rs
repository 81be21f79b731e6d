//! Safetensors checkpoints: one `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`, memory-mapped.
//!
//! The format is an 8-byte little-endian header length, a JSON header mapping each tensor
//! name to `{dtype, shape, data_offsets: [begin, end]}` (offsets relative to the data section
//! that follows the header), then the data. The header is parsed here rather than by the
//! `safetensors` crate so that every inconsistency — a truncated file, offsets that run past
//! the end, a byte count that disagrees with the shape — becomes an error naming the file and
//! the tensor. Files are mapped, not read: opening a 16 GB checkpoint touches only its headers,
//! and a tensor's pages are read when the model converts it. A checkpoint can also be bytes
//! compiled into the binary ([`Checkpoint::from_static`], the CLI's embedded demo), parsed by
//! the same code.

use crate::checkpoint::json::JsonObject;
use crate::error::{Error, Result};
use dspark_tensor::DType;
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Headers larger than this are refused: real ones are a few hundred KiB, and a corrupt length
/// must not make us parse gigabytes as JSON.
const MAX_HEADER_BYTES: u64 = 100 << 20;

/// Where one tensor lives.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// The dtype string as written in the header (kept raw so unsupported types can be reported).
    pub dtype_name: String,
    pub dtype: Option<DType>,
    pub shape: Vec<usize>,
    /// Index into [`Checkpoint::files`].
    pub file: usize,
    /// Absolute byte range within the file.
    pub start: usize,
    pub end: usize,
}

impl TensorInfo {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// One shard: its path (for messages; a virtual one for bytes in the binary) and its bytes.
pub struct ShardFile {
    pub path: PathBuf,
    map: ShardBytes,
}

/// A shard's bytes: a read-only map of a file, or bytes that live as long as the program.
enum ShardBytes {
    Mapped(Mmap),
    Static(&'static [u8]),
    Owned(Vec<u8>),
}

impl std::ops::Deref for ShardBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ShardBytes::Mapped(m) => m,
            ShardBytes::Static(b) => b,
            ShardBytes::Owned(b) => b,
        }
    }
}

/// All tensors of a checkpoint folder.
pub struct Checkpoint {
    pub files: Vec<ShardFile>,
    pub tensors: BTreeMap<String, TensorInfo>,
}

impl Checkpoint {
    /// Opens `<dir>/model.safetensors.index.json` if present, else `<dir>/model.safetensors`.
    pub fn open_dir(dir: &Path) -> Result<Checkpoint> {
        let index = dir.join("model.safetensors.index.json");
        if index.exists() {
            return Self::open_index(&index);
        }
        let single = dir.join("model.safetensors");
        if !single.exists() {
            return Err(Error::io(
                &single,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no model.safetensors or model.safetensors.index.json in this folder",
                ),
            ));
        }
        Self::open_files(&[single])
    }

    /// Opens the shards a `model.safetensors.index.json` names and checks that every tensor
    /// of its `weight_map` is in the shard it claims.
    pub fn open_index(index: &Path) -> Result<Checkpoint> {
        let j = JsonObject::read(index)?;
        let IndexEntries { files: names, claimed } = index_entries(&j)?;
        let dir = index.parent().unwrap_or(Path::new("."));
        let paths: Vec<PathBuf> = names.iter().map(|n| dir.join(n)).collect();
        let ck = Self::open_files(&paths)?;
        for (tensor, file) in claimed {
            let fi = names.iter().position(|n| *n == file).unwrap_or(0);
            match ck.tensors.get(&tensor) {
                Some(t) if t.file == fi => {}
                Some(t) => {
                    return Err(Error::tensor(
                        index,
                        &tensor,
                        format!("index says {file} but it is in {}", ck.files[t.file].path.display()),
                    ))
                }
                None => {
                    return Err(Error::tensor(index, &tensor, format!("listed in the index but missing from {file}")))
                }
            }
        }
        Ok(ck)
    }

    /// Maps and parses the given files as one checkpoint. A tensor name in two files is an error.
    pub fn open_files(paths: &[PathBuf]) -> Result<Checkpoint> {
        let mut files = Vec::new();
        let mut tensors = BTreeMap::new();
        for path in paths {
            let file = File::open(path).map_err(|e| Error::io(path, e))?;
            // SAFETY: the map is read-only and private to this process. Like every mmap-based
            // loader we assume the checkpoint is not truncated by another process while mapped.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
            add_shard(&mut files, &mut tensors, path.clone(), ShardBytes::Mapped(map))?;
        }
        Ok(Checkpoint { files, tensors })
    }

    /// A single-file checkpoint over bytes that live as long as the program (`include_bytes!`),
    /// checked exactly as a mapped `model.safetensors` is; `path` names it in messages.
    pub fn from_static(path: impl Into<PathBuf>, bytes: &'static [u8]) -> Result<Checkpoint> {
        let (mut files, mut tensors) = (Vec::new(), BTreeMap::new());
        add_shard(&mut files, &mut tensors, path.into(), ShardBytes::Static(bytes))?;
        Ok(Checkpoint { files, tensors })
    }

    /// [`Checkpoint::from_static`] over bytes it owns (the readers' fuzz target, tests).
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Checkpoint> {
        let (mut files, mut tensors) = (Vec::new(), BTreeMap::new());
        add_shard(&mut files, &mut tensors, path.into(), ShardBytes::Owned(bytes))?;
        Ok(Checkpoint { files, tensors })
    }

    /// The file a tensor lives in (the first file when the tensor is absent), for messages.
    pub fn path_of(&self, name: &str) -> &Path {
        let fi = self.tensors.get(name).map(|t| t.file).unwrap_or(0);
        &self.files[fi].path
    }

    /// Folder-level name for messages about missing tensors.
    pub fn describe(&self) -> PathBuf {
        match self.files.as_slice() {
            [one] => one.path.clone(),
            many => many[0].path.parent().unwrap_or(Path::new(".")).join("model.safetensors.index.json"),
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Checks that `name` exists with exactly `shape` and a supported dtype, without reading it.
    pub fn check(&self, name: &str, shape: &[usize]) -> Result<(&TensorInfo, DType)> {
        let t = self.tensors.get(name).ok_or_else(|| Error::tensor(self.describe(), name, "missing"))?;
        let path = &self.files[t.file].path;
        if t.shape != shape {
            return Err(Error::tensor(path, name, format!("shape {:?}, expected {:?}", t.shape, shape)));
        }
        let dtype = t.dtype.ok_or_else(|| {
            Error::tensor(path, name, format!("dtype {} is not supported (expected BF16, F16 or F32)", t.dtype_name))
        })?;
        Ok((t, dtype))
    }

    /// The raw little-endian bytes of `name` and their dtype, after [`Checkpoint::check`].
    pub fn raw(&self, name: &str, shape: &[usize]) -> Result<(DType, &[u8])> {
        let (t, dtype) = self.check(name, shape)?;
        Ok((dtype, &self.files[t.file].map[t.start..t.end]))
    }

    /// The bytes of a tensor of any dtype (the FP8 reader's, which checks it itself).
    pub fn bytes_of(&self, t: &TensorInfo) -> &[u8] {
        &self.files[t.file].map[t.start..t.end]
    }

    /// Loads `name` as f32 after the checks of [`Checkpoint::check`].
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (t, dtype) = self.check(name, shape)?;
        Ok(dtype.to_f32(&self.files[t.file].map[t.start..t.end]))
    }
}

/// An index's `weight_map`: the shard file names in first-seen order, and each tensor with the
/// file it claims.
pub struct IndexEntries {
    pub files: Vec<String>,
    pub claimed: Vec<(String, String)>,
}

/// Reads an index's `weight_map` ([`IndexEntries`]). Every entry must name a file in the
/// index's own folder.
pub fn index_entries(j: &JsonObject) -> Result<IndexEntries> {
    let map = j.opt_object("weight_map")?.ok_or_else(|| j.err("weight_map", "missing (required)"))?;
    let mut names: Vec<String> = Vec::new();
    let mut claimed: Vec<(String, String)> = Vec::new();
    for (tensor, file) in &map.map {
        let file = file.as_str().ok_or_else(|| j.err("weight_map", format!("entry `{tensor}` is not a file name")))?;
        if file.contains('/') || file.contains('\\') {
            return Err(j.err("weight_map", format!("entry `{tensor}` names a path outside the folder: {file}")));
        }
        if !names.iter().any(|n| n == file) {
            names.push(file.to_string());
        }
        claimed.push((tensor.clone(), file.to_string()));
    }
    if names.is_empty() {
        return Err(j.err("weight_map", "is empty"));
    }
    Ok(IndexEntries { files: names, claimed })
}

/// Parses shard number `files.len()` and adds it and its tensors. A tensor name already taken
/// by an earlier shard is an error.
fn add_shard(
    files: &mut Vec<ShardFile>,
    tensors: &mut BTreeMap<String, TensorInfo>,
    path: PathBuf,
    map: ShardBytes,
) -> Result<()> {
    for (name, info) in parse_header(&path, &map, files.len())? {
        if tensors.contains_key(&name) {
            return Err(Error::tensor(&path, &name, "appears in more than one shard"));
        }
        tensors.insert(name, info);
    }
    files.push(ShardFile { path, map });
    Ok(())
}

/// Parses and validates one file's header. Offsets are checked against the file's real size,
/// and each tensor's byte count against its shape and dtype.
fn parse_header(path: &Path, bytes: &[u8], file: usize) -> Result<Vec<(String, TensorInfo)>> {
    let bad = |msg: String| Error::Safetensors { path: path.to_path_buf(), msg };
    if bytes.len() < 8 {
        return Err(bad(format!("file is {} bytes, shorter than the 8-byte header length", bytes.len())));
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().map_err(|_| bad("unreadable header length".into()))?);
    if n > MAX_HEADER_BYTES {
        return Err(bad(format!("header length {n} is implausibly large (corrupt file?)")));
    }
    let data_start = 8 + n as usize;
    if data_start > bytes.len() {
        return Err(bad(format!("header length {n} runs past the end of the {}-byte file (truncated?)", bytes.len())));
    }
    let header = std::str::from_utf8(&bytes[8..data_start]).map_err(|_| bad("header is not UTF-8".into()))?;
    let header: serde_json::Value =
        serde_json::from_str(header.trim_end()).map_err(|e| bad(format!("header is not valid JSON: {e}")))?;
    let obj = header.as_object().ok_or_else(|| bad("header is not a JSON object".into()))?;
    let data_len = bytes.len() - data_start;
    let mut out = Vec::with_capacity(obj.len());
    for (name, entry) in obj {
        if name == "__metadata__" {
            continue;
        }
        let terr = |msg: String| Error::tensor(path, name, msg);
        let dtype_name = entry
            .get("dtype")
            .and_then(|v| v.as_str())
            .ok_or_else(|| terr("header entry has no dtype".into()))?
            .to_string();
        let shape = entry
            .get("shape")
            .and_then(|v| v.as_array())
            .ok_or_else(|| terr("header entry has no shape".into()))?
            .iter()
            .map(|d| d.as_u64().map(|d| d as usize))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| terr("shape holds something other than non-negative integers".into()))?;
        let offs = entry
            .get("data_offsets")
            .and_then(|v| v.as_array())
            .filter(|a| a.len() == 2)
            .and_then(|a| Some((a[0].as_u64()? as usize, a[1].as_u64()? as usize)))
            .ok_or_else(|| terr("header entry has no valid data_offsets [begin, end]".into()))?;
        let (begin, end) = offs;
        if begin > end || end > data_len {
            return Err(terr(format!(
                "data_offsets [{begin}, {end}] lie outside the {data_len}-byte data section (truncated or corrupt file)"
            )));
        }
        let dtype = DType::from_safetensors_name(&dtype_name);
        if let Some(dt) = dtype {
            let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            let want = numel.and_then(|n| n.checked_mul(dt.size()));
            if want != Some(end - begin) {
                return Err(terr(format!(
                    "data_offsets span {} bytes but shape {:?} of {} needs {}",
                    end - begin,
                    shape,
                    dtype_name,
                    want.map(|w| w.to_string()).unwrap_or_else(|| "more than fits in memory".into())
                )));
            }
        }
        out.push((
            name.clone(),
            TensorInfo { dtype_name, dtype, shape, file, start: data_start + begin, end: data_start + end },
        ));
    }
    Ok(out)
}

/// Serialises tensors into safetensors bytes. Tests and fixture tools use it to write small
/// (and deliberately broken) checkpoints; the engine itself only reads.
pub fn serialize(tensors: &[(&str, DType, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let named: Vec<(&str, &str, Vec<usize>, Vec<u8>)> =
        tensors.iter().map(|(n, d, s, b)| (*n, d.safetensors_name(), s.clone(), b.clone())).collect();
    serialize_named(&named)
}

/// [`serialize`] with the dtype given by its header name (also the ones the engine does not
/// load as plain tensors, such as `F8_E4M3`).
pub fn serialize_named(tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, dtype, shape, data) in tensors {
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + data.len()]}),
        );
        offset += data.len();
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Applies a same-length textual edit to the header of serialised safetensors bytes.
    fn edit_header(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
        assert_eq!(from.len(), to.len());
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
        assert!(header.contains(from), "{header}");
        let mut out = bytes[..8].to_vec();
        out.extend_from_slice(header.replace(from, to).as_bytes());
        out.extend_from_slice(&bytes[8 + n..]);
        out
    }

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn round_trip_and_shape_check() {
        let d = tempfile::tempdir().unwrap();
        let bytes = serialize(&[("a", DType::F32, vec![2, 2], f32_bytes(&[1.0, 2.0, 3.0, 4.0]))]);
        let p = write(d.path(), "model.safetensors", &bytes);
        let ck = Checkpoint::open_files(&[p]).unwrap();
        assert_eq!(ck.f32("a", &[2, 2]).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        let e = ck.f32("a", &[4]).unwrap_err().to_string();
        assert!(e.contains("`a`") && e.contains("shape [2, 2], expected [4]"), "{e}");
        let e = ck.f32("b", &[1]).unwrap_err().to_string();
        assert!(e.contains("`b`") && e.contains("missing"), "{e}");
    }

    #[test]
    fn static_bytes_read_like_a_file() {
        let bytes = serialize(&[("a", DType::F32, vec![2], f32_bytes(&[1.0, 2.0]))]);
        let bytes: &'static [u8] = Vec::leak(bytes);
        let ck = Checkpoint::from_static("<embedded>/model.safetensors", bytes).unwrap();
        assert_eq!(ck.f32("a", &[2]).unwrap(), vec![1.0, 2.0]);
        assert_eq!(ck.describe(), PathBuf::from("<embedded>/model.safetensors"));
        let e = Checkpoint::from_static("<embedded>/model.safetensors", &bytes[..bytes.len() - 4]).err().unwrap();
        let e = e.to_string();
        assert!(e.contains("<embedded>/model.safetensors") && e.contains("`a`") && e.contains("outside"), "{e}");
    }

    #[test]
    fn truncated_file_is_reported() {
        let d = tempfile::tempdir().unwrap();
        let bytes = serialize(&[("w", DType::F32, vec![8], f32_bytes(&[0.5; 8]))]);
        let p = write(d.path(), "model.safetensors", &bytes[..bytes.len() - 5]);
        let e = Checkpoint::open_files(&[p]).err().unwrap().to_string();
        assert!(e.contains("model.safetensors") && e.contains("`w`") && e.contains("outside"), "{e}");
        let p = write(d.path(), "tiny.safetensors", &bytes[..4]);
        let e = Checkpoint::open_files(&[p]).err().unwrap().to_string();
        assert!(e.contains("tiny.safetensors") && e.contains("shorter"), "{e}");
    }

    #[test]
    fn lying_offsets_are_reported() {
        let d = tempfile::tempdir().unwrap();
        let bytes = serialize(&[("w", DType::F32, vec![2], f32_bytes(&[1.0, 2.0]))]);
        // Rewrite the header so the offsets claim 4 bytes for a 2-element f32 tensor.
        let bytes = edit_header(&bytes, "[0,8]", "[0,4]");
        let p = write(d.path(), "model.safetensors", &bytes);
        let e = Checkpoint::open_files(&[p]).err().unwrap().to_string();
        assert!(e.contains("`w`") && e.contains("span 4 bytes"), "{e}");
    }

    #[test]
    fn unsupported_dtype_is_reported_on_use() {
        let d = tempfile::tempdir().unwrap();
        let bytes = serialize(&[("w", DType::F32, vec![2], f32_bytes(&[1.0, 2.0]))]);
        let bytes = edit_header(&bytes, "\"F32\"", "\"I32\"");
        let p = write(d.path(), "model.safetensors", &bytes);
        let ck = Checkpoint::open_files(&[p]).unwrap();
        let e = ck.f32("w", &[2]).unwrap_err().to_string();
        assert!(e.contains("`w`") && e.contains("I32"), "{e}");
    }
}
