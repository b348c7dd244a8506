//! Memory-mapped safetensors files. Tensors stay in their on-disk precision; a [`TensorView`] is a
//! typed window onto the mapping that kernels widen to f32 as they read it.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use serde::Deserialize;

use super::error::{CheckpointError, Result};

/// Element type of a stored tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    BF16,
    F16,
    F32,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 => 4,
        }
    }
}

/// The bytes a view points into: normally the file mapping; an owned, 4-byte aligned copy only
/// when a tensor in the file is not aligned to its element size (never for files written by the
/// `safetensors` libraries, which pad the header to 8 bytes).
enum Backing {
    Mapped(Mmap),
    Owned(Vec<u32>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) => m,
            Backing::Owned(v) => {
                // SAFETY: u32 storage reinterpreted as bytes; length in bytes is 4 * len.
                unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len() * 4) }
            }
        }
    }
}

/// Borrowed, typed tensor data.
#[derive(Clone, Copy)]
pub enum WeightData<'a> {
    Bf16(&'a [u16]),
    F16(&'a [u16]),
    F32(&'a [f32]),
}

impl WeightData<'_> {
    pub fn len(&self) -> usize {
        match self {
            WeightData::Bf16(s) | WeightData::F16(s) => s.len(),
            WeightData::F32(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` widened to f32.
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            WeightData::Bf16(s) => bf16_to_f32(s[i]),
            WeightData::F16(s) => f16_to_f32(s[i]),
            WeightData::F32(s) => s[i],
        }
    }

    /// Widens `range` into `out` (same length).
    pub fn widen_into(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match self {
            WeightData::Bf16(s) => {
                for (o, &b) in out.iter_mut().zip(&s[start..end]) {
                    *o = bf16_to_f32(b);
                }
            }
            WeightData::F16(s) => {
                for (o, &b) in out.iter_mut().zip(&s[start..end]) {
                    *o = f16_to_f32(b);
                }
            }
            WeightData::F32(s) => out.copy_from_slice(&s[start..end]),
        }
    }
}

#[inline]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// IEEE half → f32, exact (f16 values are all representable in f32).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: value = m * 2^-24.
            let v = m as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, m) => sign | 0x7fc0_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// A typed window onto one tensor of a mapped safetensors file.
#[derive(Clone)]
pub struct TensorView {
    backing: Arc<Backing>,
    offset: usize,
    numel: usize,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// File the tensor came from (for error messages).
    pub source: Arc<PathBuf>,
}

impl std::fmt::Debug for TensorView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorView")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("source", &self.source)
            .finish()
    }
}

impl TensorView {
    pub fn numel(&self) -> usize {
        self.numel
    }

    pub fn size_bytes(&self) -> usize {
        self.numel * self.dtype.size()
    }

    pub fn data(&self) -> WeightData<'_> {
        let bytes = &self.backing.bytes()[self.offset..self.offset + self.size_bytes()];
        // SAFETY: alignment was checked (or the tensor copied to aligned storage) when the view was
        // made, the length is a whole number of elements, and every bit pattern is a valid u16/f32.
        unsafe {
            match self.dtype {
                DType::BF16 => WeightData::Bf16(std::slice::from_raw_parts(
                    bytes.as_ptr().cast(),
                    self.numel,
                )),
                DType::F16 => WeightData::F16(std::slice::from_raw_parts(
                    bytes.as_ptr().cast(),
                    self.numel,
                )),
                DType::F32 => WeightData::F32(std::slice::from_raw_parts(
                    bytes.as_ptr().cast(),
                    self.numel,
                )),
            }
        }
    }

    /// The whole tensor widened to f32 (for small tensors: norms, biases, separators).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.numel];
        self.data().widen_into(0, &mut out);
        out
    }

    /// First non-finite element, if any.
    pub fn first_non_finite(&self) -> Option<(usize, f32)> {
        match self.data() {
            // bf16 / f16: exponent all ones means Inf or NaN.
            WeightData::Bf16(s) => s
                .iter()
                .position(|&b| b & 0x7f80 == 0x7f80)
                .map(|i| (i, bf16_to_f32(s[i]))),
            WeightData::F16(s) => s
                .iter()
                .position(|&b| b & 0x7c00 == 0x7c00)
                .map(|i| (i, f16_to_f32(s[i]))),
            WeightData::F32(s) => s.iter().position(|v| !v.is_finite()).map(|i| (i, s[i])),
        }
    }
}

/// A safetensors header's entries in the order written, repeated keys kept (a map would keep
/// only the last of them).
struct HeaderEntries(Vec<(String, serde_json::Value)>);

impl<'de> Deserialize<'de> for HeaderEntries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = HeaderEntries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object of tensors")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<HeaderEntries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(HeaderEntries(entries))
            }
        }
        d.deserialize_map(Entries)
    }
}

#[derive(Deserialize)]
struct HeaderEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [usize; 2],
}

fn bad_header(path: &Path, reason: impl Into<String>) -> CheckpointError {
    CheckpointError::BadHeader {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Maps one safetensors file and returns its tensors by stored name (sorted). Checks the header
/// against the file size so that a truncated shard is reported with the first tensor it cuts.
pub fn open_safetensors(path: &Path) -> Result<BTreeMap<String, TensorView>> {
    let io = |cause| CheckpointError::Io {
        path: path.to_path_buf(),
        cause,
    };
    let file = File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len() as usize;
    if file_len < 8 {
        return Err(CheckpointError::TruncatedShard {
            path: path.to_path_buf(),
            tensor: "(header length)".into(),
            needed: 8,
            available: file_len,
        });
    }
    // SAFETY: the mapping is read-only; the checkpoint files are not expected to change while the
    // model is loaded (the same assumption every mmap-based weight loader makes).
    let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
    let header_len = u64::from_le_bytes(mmap[..8].try_into().expect("8 bytes")) as usize;
    if header_len > file_len - 8 {
        return Err(CheckpointError::TruncatedShard {
            path: path.to_path_buf(),
            tensor: "(header)".into(),
            needed: header_len + 8,
            available: file_len,
        });
    }
    let HeaderEntries(listed) = serde_json::from_slice(&mmap[8..8 + header_len])
        .map_err(|e| bad_header(path, e.to_string()))?;
    let mut header = BTreeMap::new();
    for (name, value) in listed {
        // JSON lets a key repeat and a map keeps the last: which tensor is meant is unclear.
        if header.insert(name.clone(), value).is_some() {
            return Err(bad_header(path, format!("tensor `{name}` is listed twice")));
        }
    }
    let data_start = 8 + header_len;
    let available = file_len - data_start;
    let source = Arc::new(path.to_path_buf());

    let mut entries = Vec::new();
    // (start, name, end) of every tensor whose bytes run past the end of the file.
    let mut cut: Option<(usize, String, usize)> = None;
    for (name, value) in header {
        if name == "__metadata__" {
            continue;
        }
        let entry: HeaderEntry = serde_json::from_value(value)
            .map_err(|e| bad_header(path, format!("tensor `{name}`: {e}")))?;
        let dtype = match entry.dtype.as_str() {
            "BF16" => DType::BF16,
            "F16" => DType::F16,
            "F32" => DType::F32,
            other => {
                return Err(CheckpointError::UnsupportedDtype {
                    path: path.to_path_buf(),
                    tensor: name,
                    dtype: other.to_string(),
                })
            }
        };
        let numel: usize = entry.shape.iter().product();
        let [begin, end] = entry.data_offsets;
        if end < begin || end - begin != numel * dtype.size() {
            return Err(bad_header(
                path,
                format!("tensor `{name}`: data_offsets {begin}..{end} do not hold {numel} {dtype:?} elements"),
            ));
        }
        if end > available {
            // Report the first damaged tensor in file order.
            if cut.as_ref().is_none_or(|(b, _, _)| begin < *b) {
                cut = Some((begin, name, end));
            }
            continue;
        }
        entries.push((name, dtype, entry.shape, data_start + begin, numel));
    }
    if let Some((_, tensor, needed)) = cut {
        return Err(CheckpointError::TruncatedShard {
            path: path.to_path_buf(),
            tensor,
            needed,
            available,
        });
    }

    // The format's rule: the tensors' bytes tile the data section, with no overlap and no hole.
    // A tensor pointing into another's bytes would compute with them silently.
    let mut spans: Vec<(usize, usize, &str)> = entries
        .iter()
        .map(|(name, dtype, _, offset, numel)| {
            let begin = offset - data_start;
            (begin, begin + numel * dtype.size(), name.as_str())
        })
        .collect();
    spans.sort_unstable();
    let mut covered = 0;
    for &(begin, end, name) in &spans {
        if begin != covered {
            let what = if begin < covered {
                "overlaps the tensor before it"
            } else {
                "leaves bytes no tensor covers before it"
            };
            return Err(bad_header(
                path,
                format!("tensor `{name}` (data_offsets {begin}..{end}) {what}, at byte {covered}"),
            ));
        }
        covered = end;
    }
    if covered != available {
        return Err(bad_header(
            path,
            format!(
                "the data section holds {available} bytes, but its tensors cover {covered}: \
                 the rest belongs to no tensor"
            ),
        ));
    }

    let aligned = entries.iter().all(|(_, dtype, _, offset, _)| {
        (mmap.as_ptr() as usize + offset).is_multiple_of(dtype.size())
    });
    let backing = if aligned {
        Arc::new(Backing::Mapped(mmap))
    } else {
        // Rare: copy every tensor into 4-byte aligned storage, each starting on a word boundary.
        let mut owned = Vec::new();
        let mut moved = Vec::new();
        for (name, dtype, shape, offset, numel) in entries {
            let bytes = &mmap[offset..offset + numel * dtype.size()];
            let start_word = owned.len();
            owned.resize(start_word + bytes.len().div_ceil(4), 0u32);
            // SAFETY: writing bytes into the freshly sized u32 buffer.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(
                    owned.as_mut_ptr().cast::<u8>().add(start_word * 4),
                    bytes.len(),
                )
            };
            dst.copy_from_slice(bytes);
            moved.push((name, dtype, shape, start_word * 4, numel));
        }
        entries = moved;
        Arc::new(Backing::Owned(owned))
    };

    Ok(entries
        .into_iter()
        .map(|(name, dtype, shape, offset, numel)| {
            let view = TensorView {
                backing: backing.clone(),
                offset,
                numel,
                dtype,
                shape,
                source: source.clone(),
            };
            (name, view)
        })
        .collect())
}
