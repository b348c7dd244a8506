//! Checkpoint loading: both layouts of Phi-4-multimodal (original remote-code, sharded, inline
//! LoRA; transformers-native with PEFT adapter folders), memory-mapped, validated as a whole before
//! any compute.

pub mod config;
pub mod error;
pub mod layout;
mod progress;
pub mod schema;
pub mod store;
mod validate;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use config::{AudioConfig, Layout, LoraConfig, ModelConfig, TextConfig, VisionConfig};
pub use error::{CheckpointError, Result};
pub use layout::LoraAdapter;
pub use progress::Progress;
pub use store::{DType, TensorView, WeightData};

/// A validated checkpoint: its config and every tensor under its canonical name.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub layout: Layout,
    pub config: ModelConfig,
    tensors: BTreeMap<String, TensorView>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("layout", &self.layout)
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl Checkpoint {
    /// Opens and validates `dir` (see [`Checkpoint::open_with_progress`]).
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_with_progress(dir, &|_, _| {})
    }

    /// Maps every weight file, parses the config of whichever layout `dir` holds, and validates the
    /// tensor set against it (names, shapes, LoRA pairs and ranks, finiteness). Nothing is
    /// computed with a checkpoint that fails here.
    pub fn open_with_progress(dir: &Path, progress: Progress) -> Result<Self> {
        Self::open_checking(dir, Some(progress))
    }

    /// [`Checkpoint::open`] without the values' check: the config, the tensors' names and
    /// shapes and the LoRA pairs and ranks, from the weight files' headers alone. The settings
    /// check (`switchyard config check`) uses it: the values' pass reads every byte, minutes
    /// for the released checkpoint on a cold page cache.
    pub fn open_structure(dir: &Path) -> Result<Self> {
        Self::open_checking(dir, None)
    }

    /// Opens `dir`; `values` is `Some` (with its progress) when every value is checked too.
    fn open_checking(dir: &Path, values: Option<Progress>) -> Result<Self> {
        let config_path = dir.join("config.json");
        let root = config::read_json(&config_path)?;
        let raw = load_main_tensors(dir)?;
        let is_original = root.get("model_type").and_then(|v| v.as_str()) == Some("phi4mm")
            || raw.keys().any(|k| k.contains(".base_layer.weight"));
        let layout = if is_original {
            Layout::Original
        } else {
            Layout::Transformers
        };
        let config = config::parse_config(dir, &root, layout)?;

        let mut tensors: BTreeMap<String, TensorView> = BTreeMap::new();
        let mut origin: BTreeMap<String, String> = BTreeMap::new();
        let mut insert = |canonical: String, view: TensorView, from: String| -> Result<()> {
            if let Some(first) = origin.get(&canonical) {
                return Err(CheckpointError::DuplicateTensor {
                    tensor: canonical,
                    first: first.clone(),
                    second: from,
                });
            }
            origin.insert(canonical.clone(), from);
            tensors.insert(canonical, view);
            Ok(())
        };
        for (name, view) in raw {
            let canonical = match layout {
                Layout::Original => layout::canonical_from_original(&name),
                Layout::Transformers => name.clone(),
            };
            insert(canonical, view, name)?;
        }
        for adapter in LoraAdapter::ALL {
            let path = dir.join(adapter.folder()).join("adapter_model.safetensors");
            if !present(&path)? {
                continue;
            }
            for (key, view) in store::open_safetensors(&path)? {
                let from = format!("{}:{key}", path.display());
                match layout::canonical_from_adapter_file(&key, adapter) {
                    Some(canonical) => insert(canonical, view, from)?,
                    None => {
                        return Err(CheckpointError::UnexpectedTensor {
                            tensor: key,
                            source_file: path.display().to_string(),
                        })
                    }
                }
            }
        }

        validate::validate(&config, &tensors, values)?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            layout,
            config,
            tensors,
        })
    }

    /// A tensor by canonical name. Validation guarantees every required tensor exists, so a miss
    /// here is a programming error.
    pub fn tensor(&self, name: &str) -> &TensorView {
        self.tensors
            .get(name)
            .unwrap_or_else(|| panic!("tensor `{name}` missing after validation"))
    }

    pub fn get(&self, name: &str) -> Option<&TensorView> {
        self.tensors.get(name)
    }

    /// LoRA (A, B) of one adapter for `model.layers.{layer}.{module}`, if that adapter is present.
    pub fn lora(
        &self,
        layer: usize,
        module: &str,
        adapter: LoraAdapter,
    ) -> Option<(&TensorView, &TensorView)> {
        let a = self
            .tensors
            .get(&layout::lora_name(layer, module, 'A', adapter))?;
        let b = self
            .tensors
            .get(&layout::lora_name(layer, module, 'B', adapter))?;
        Some((a, b))
    }

    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn total_bytes(&self) -> usize {
        self.tensors.values().map(TensorView::size_bytes).sum()
    }
}

/// Whether an optional file is there. A file that cannot be looked at (an unreadable folder) is
/// an error, not an absence: taken for absent, a LoRA folder the process may not read left the
/// model without its adapter and no word of why.
pub(crate) fn present(path: &Path) -> Result<bool> {
    path.try_exists().map_err(|cause| CheckpointError::Io {
        path: path.to_path_buf(),
        cause,
    })
}

/// The base weight files: the shards named by `model.safetensors.index.json`, else
/// `model.safetensors`.
fn load_main_tensors(dir: &Path) -> Result<BTreeMap<String, TensorView>> {
    let index_path = dir.join("model.safetensors.index.json");
    if !present(&index_path)? {
        return store::open_safetensors(&dir.join("model.safetensors"));
    }
    let index = config::read_json(&index_path)?;
    let map = index
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| CheckpointError::InvalidConfig {
            key: format!("{}: weight_map", index_path.display()),
            reason: "missing or not an object".into(),
        })?;
    let mut shards: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| CheckpointError::InvalidConfig {
                key: format!("{}: weight_map.{tensor}", index_path.display()),
                reason: "shard name is not a string".into(),
            })?;
        shards
            .entry(file.to_string())
            .or_default()
            .push(tensor.clone());
    }
    let mut all = BTreeMap::new();
    for (file, listed) in shards {
        let path = dir.join(&file);
        let mut tensors = store::open_safetensors(&path)?;
        for t in &listed {
            if !tensors.contains_key(t) {
                return Err(CheckpointError::MissingFromShard {
                    path: path.clone(),
                    tensor: t.clone(),
                });
            }
        }
        // Tensors a shard holds but the index does not list are still loaded (and then judged by
        // validation like any other), so nothing in the files is silently ignored.
        for (name, view) in std::mem::take(&mut tensors) {
            if let Some(prev) = all.insert(name.clone(), view) {
                return Err(CheckpointError::DuplicateTensor {
                    tensor: name,
                    first: prev.source.display().to_string(),
                    second: path.display().to_string(),
                });
            }
        }
    }
    Ok(all)
}
