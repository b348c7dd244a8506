//! The plugin's settings (`[models.settings]` of a `phi4mm` model in the host's TOML).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use frontend::audio::ResampleMode;
use frontend::limits::Limits;

/// The official ASR instruction (docs/phi4mm-model.md §10.3 and the test vector of §13).
pub const DEFAULT_TRANSCRIPTION_INSTRUCTION: &str = "Transcribe the audio exactly.";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The pure-Rust CPU backend.
    #[default]
    Host,
    /// IREE-compiled modules (needs a build with the `iree` feature and the IREE compiler).
    Iree,
    /// IREE when this build has it and the compiler loads, else the host backend.
    Auto,
}

/// Who computes the prompt's token embeddings and the image rows (the vision tower and its
/// projector). The audio encoder and the decoder always run on the backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProducerKind {
    /// The backend itself (the host model's table; the backend's vision tower).
    #[default]
    Host,
    /// MLX (needs a build with the `mlx` feature), qualified against the host model at start.
    Mlx,
}

/// `[models.settings.iree]`: how the IREE backend compiles, caches and runs its modules.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IreeSettings {
    /// HAL driver: `local-task` (the CPU, every core; the default), `local-sync` (the CPU, one
    /// thread: the calling one), or `cuda` (a build with the `cuda` feature, and an NVIDIA
    /// driver). The modules are compiled for the device's kind:
    /// the local CPU (`target_cpu`) or CUDA (`cuda_target`).
    #[serde(default = "default_device")]
    pub device: String,
    /// Artifact cache directory. Default: for a served model, the host's cache for the plugin
    /// (`<server.cache_dir>/plugins/phi4mm/iree`, set by `create_instance`); for the `phi4mm`
    /// CLI, `$XDG_CACHE_HOME/switchyard/iree` (else `~/.cache/switchyard/iree`).
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
    /// LLVM CPU the modules are compiled for; `host` is this machine's (part of the cache
    /// identity: a module built for `host` may not run on another CPU).
    #[serde(default = "default_target_cpu")]
    pub target_cpu: String,
    /// NVPTX architecture the modules are compiled for on `device = "cuda"`. The default,
    /// `sm_80`, runs on Ampere and every later GPU: IREE embeds PTX, which the driver compiles
    /// for the GPU it finds. (The pinned compiler knows targets up to `sm_89`; it refuses
    /// `sm_90`, so a Hopper GPU such as the H100 or H200 runs `sm_80` or `sm_89` modules.)
    #[serde(default = "default_cuda_target")]
    pub cuda_target: String,
    /// Longest row (prompt + generated tokens) the decoder is compiled for; default the
    /// checkpoint's `max_position_embeddings`. Rows only take the cache memory their length
    /// needs, so a smaller value only saves compile time (fewer cache sizes).
    #[serde(default)]
    pub context: Option<usize>,
    /// Prompt tokens per compiled prefill call.
    #[serde(default = "default_iree_prefill_chunk")]
    pub prefill_chunk: usize,
    /// The compiler library (`libIREECompiler.so`); default `$PHI4MM_IREE_COMPILER`, else the
    /// iree-base-compiler of the active Python.
    #[serde(default)]
    pub compiler: Option<PathBuf>,
    /// How long one module's compile may run before it is killed and the instance fails to start
    /// (a compile that keeps computing without end; a deadlocked one is caught sooner by the stall
    /// limit). Default [`DEFAULT_COMPILE_TIMEOUT_SECS`].
    #[serde(default = "default_compile_timeout_secs")]
    pub compile_timeout_secs: u64,
}

#[cfg(feature = "iree")]
impl IreeSettings {
    /// What the modules are compiled for on this device.
    pub fn compile_target(&self) -> crate::iree::compiler::CompileTarget {
        crate::iree::compiler::CompileTarget::for_device(
            &self.device,
            &self.target_cpu,
            &self.cuda_target,
        )
    }
}

impl Default for IreeSettings {
    fn default() -> Self {
        IreeSettings {
            device: default_device(),
            cache_dir: None,
            target_cpu: default_target_cpu(),
            cuda_target: default_cuda_target(),
            context: None,
            prefill_chunk: default_iree_prefill_chunk(),
            compiler: None,
            compile_timeout_secs: default_compile_timeout_secs(),
        }
    }
}

fn default_device() -> String {
    "local-task".into()
}
fn default_target_cpu() -> String {
    "host".into()
}
fn default_cuda_target() -> String {
    "sm_80".into()
}
fn default_iree_prefill_chunk() -> usize {
    64
}
/// The default of `iree.compile_timeout_secs`, the compiler's time limit
/// (`iree::compiler::TIME_LIMIT`).
pub const DEFAULT_COMPILE_TIMEOUT_SECS: u64 = 3600;
fn default_compile_timeout_secs() -> u64 {
    DEFAULT_COMPILE_TIMEOUT_SECS
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Phi4mmSettings {
    /// Checkpoint directory (either layout). Relative to the host's config file (see
    /// [`Phi4mmSettings::resolve_paths`]).
    pub checkpoint: PathBuf,
    #[serde(default)]
    pub backend: BackendKind,
    /// Who produces the token embeddings and image rows: `host` (the backend) or `mlx`.
    #[serde(default)]
    pub producer: ProducerKind,
    /// IREE backend options (used when `backend` is `iree` or `auto`).
    #[serde(default)]
    pub iree: IreeSettings,
    /// Rows decoded together.
    #[serde(default = "default_slots")]
    pub slots: usize,
    /// Decoder threads; default the host's `thread_budget`.
    #[serde(default)]
    pub threads: Option<usize>,
    /// Media pool threads (decoding, preprocessing, encoders); default a quarter of the decoder
    /// threads, at least one.
    #[serde(default)]
    pub media_threads: Option<usize>,
    /// Requests admitted beyond the free slots; more are refused (HTTP 429).
    #[serde(default = "default_max_queued")]
    pub max_queued: usize,
    /// Prompt tokens of all waiting requests together.
    #[serde(default = "default_max_queued_tokens")]
    pub max_queued_tokens: usize,
    /// Bytes of KV cache all admitted requests together may hold (the KV pool). Admission
    /// reserves the most a request's row can come to (prompt + `max_tokens` positions): a
    /// request that needs more than the whole pool is refused with HTTP 400, one that only has
    /// to wait for running rows to finish with HTTP 429. Default: one row of the checkpoint's
    /// `original_max_position_embeddings` (4096 for Phi-4-multimodal) per slot; raise it to
    /// serve longer prompts, up to `max_position_embeddings`.
    #[serde(default)]
    pub kv_cache_bytes: Option<u64>,
    /// Prompt tokens prefilled per decoder step (bounds the stall a long prompt causes).
    #[serde(default = "default_prefill_chunk")]
    pub prefill_chunk: usize,
    /// `max_tokens` when a request gives none.
    #[serde(default = "default_max_tokens")]
    pub default_max_tokens: usize,
    /// Media limits (counts, sizes, durations).
    #[serde(default)]
    pub limits: Limits,
    /// How clips that are not 16 kHz are brought to 16 kHz.
    #[serde(default)]
    pub resample: ResampleMode,
    /// The user turn of a transcription request, after the audio placeholder.
    #[serde(default = "default_instruction")]
    pub transcription_instruction: String,
}

fn default_slots() -> usize {
    4
}
fn default_max_queued() -> usize {
    16
}
fn default_max_queued_tokens() -> usize {
    65_536
}
fn default_prefill_chunk() -> usize {
    512
}
fn default_max_tokens() -> usize {
    256
}
fn default_instruction() -> String {
    DEFAULT_TRANSCRIPTION_INSTRUCTION.into()
}

impl Phi4mmSettings {
    /// Resolves the paths of the settings (`checkpoint`, `iree.cache_dir`, `iree.compiler`)
    /// with `resolve`; the plugin passes `HostServices::resolve_path`, so relative paths mean
    /// relative to the host's config file, as the host's own plugin paths do.
    pub fn resolve_paths(&mut self, resolve: impl Fn(&Path) -> PathBuf) {
        self.checkpoint = resolve(&self.checkpoint);
        for p in [&mut self.iree.cache_dir, &mut self.iree.compiler]
            .into_iter()
            .flatten()
        {
            *p = resolve(p);
        }
    }

    /// Refuses values the plugin cannot serve with.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if !(1..=MAX_SLOTS).contains(&self.slots) {
            return Err(SettingsError::Slots);
        }
        if self.kv_cache_bytes == Some(0) {
            return Err(SettingsError::NoKvPool);
        }
        let threads = 1..=MAX_THREADS;
        if [self.threads, self.media_threads]
            .iter()
            .flatten()
            .any(|n| !threads.contains(n))
        {
            return Err(SettingsError::Threads);
        }
        if self.prefill_chunk == 0 || self.default_max_tokens == 0 {
            return Err(SettingsError::NoChunkOrBudget);
        }
        if self.iree.prefill_chunk == 0 || self.iree.context == Some(0) {
            return Err(SettingsError::NoIreeShape);
        }
        if self.iree.compile_timeout_secs == 0 {
            return Err(SettingsError::NoCompileTime);
        }
        self.limits.validate()?;
        Ok(())
    }
}

/// The most `slots`: the scheduler steps every slot together and keeps a state per slot, so a
/// mistyped count (100,000,000 aborted a reload on its allocation) is refused instead.
pub const MAX_SLOTS: usize = 1024;
/// The most `threads` or `media_threads`: each is an OS thread of a pool made at creation.
pub const MAX_THREADS: usize = 1024;

/// Settings that parse but that the plugin cannot serve with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("slots must be in 1..={MAX_SLOTS}")]
    Slots,
    #[error("kv_cache_bytes must be at least 1 when set")]
    NoKvPool,
    #[error("threads and media_threads must be in 1..={MAX_THREADS} when set")]
    Threads,
    #[error("prefill_chunk and default_max_tokens must be at least 1")]
    NoChunkOrBudget,
    #[error("iree.context and iree.prefill_chunk must be at least 1")]
    NoIreeShape,
    #[error("iree.compile_timeout_secs must be at least 1")]
    NoCompileTime,
    #[error(transparent)]
    Limits(#[from] frontend::limits::InvalidLimits),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_unknown_fields() {
        let s: Phi4mmSettings = toml_like(r#"{"checkpoint": "m"}"#).unwrap();
        assert_eq!(s.slots, 4);
        assert_eq!(s.backend, BackendKind::Host);
        assert_eq!(s.producer, ProducerKind::Host);
        let s: Phi4mmSettings = toml_like(r#"{"checkpoint": "m", "producer": "mlx"}"#).unwrap();
        assert_eq!(s.producer, ProducerKind::Mlx);
        assert!(toml_like(r#"{"checkpoint": "m", "producer": "iree"}"#).is_err());
        assert_eq!(
            s.transcription_instruction,
            DEFAULT_TRANSCRIPTION_INSTRUCTION
        );
        assert!(toml_like(r#"{"checkpoint": "m", "slot": 2}"#).is_err());
        assert!(toml_like(r#"{"checkpoint": "m", "backend": "mlx"}"#).is_err());
        let s = toml_like(r#"{"checkpoint": "m", "backend": "iree", "iree": {"context": 8192}}"#)
            .unwrap();
        assert_eq!(s.backend, BackendKind::Iree);
        assert_eq!(
            (s.iree.context, s.iree.device.as_str()),
            (Some(8192), "local-task")
        );
        assert!(toml_like(r#"{"checkpoint": "m", "iree": {"contxt": 1}}"#).is_err());
        let s: Phi4mmSettings =
            toml_like(r#"{"checkpoint": "m", "slots": 0, "resample": "reference"}"#).unwrap();
        assert!(s.validate().is_err());
        let s = toml_like(r#"{"checkpoint": "m", "limits": {"max_audio_seconds": -1}}"#).unwrap();
        assert_eq!(
            s.validate(),
            Err(SettingsError::Limits(
                frontend::limits::InvalidLimits::AudioSeconds
            ))
        );
        let s = toml_like(r#"{"checkpoint": "m", "slots": 1025}"#).unwrap();
        assert_eq!(s.validate(), Err(SettingsError::Slots));
    }

    #[test]
    fn the_compile_time_limit_defaults_to_an_hour_and_is_at_least_a_second() {
        let s = toml_like(r#"{"checkpoint": "m"}"#).unwrap();
        assert_eq!(s.iree.compile_timeout_secs, 3600);
        assert_eq!(s.validate(), Ok(()));
        let s =
            toml_like(r#"{"checkpoint": "m", "iree": {"compile_timeout_secs": 7200}}"#).unwrap();
        assert_eq!(s.iree.compile_timeout_secs, 7200);
        let s = toml_like(r#"{"checkpoint": "m", "iree": {"compile_timeout_secs": 0}}"#).unwrap();
        let err = s.validate().unwrap_err();
        assert_eq!(err, SettingsError::NoCompileTime);
        assert!(
            err.to_string().contains("iree.compile_timeout_secs"),
            "{err}"
        );
        assert!(toml_like(r#"{"checkpoint": "m", "iree": {"compile_timeout_secs": -1}}"#).is_err());
    }

    #[test]
    fn relative_paths_resolve_against_the_given_base() {
        let mut s = toml_like(
            r#"{"checkpoint": "ckpt", "iree": {"cache_dir": "/abs/cache", "compiler": "lib/c.so"}}"#,
        )
        .unwrap();
        s.resolve_paths(|p| {
            if p.is_relative() {
                Path::new("/etc/sy").join(p)
            } else {
                p.to_path_buf()
            }
        });
        assert_eq!(s.checkpoint, Path::new("/etc/sy/ckpt"));
        assert_eq!(s.iree.cache_dir.as_deref(), Some(Path::new("/abs/cache")));
        assert_eq!(
            s.iree.compiler.as_deref(),
            Some(Path::new("/etc/sy/lib/c.so"))
        );
    }

    fn toml_like(json: &str) -> Result<Phi4mmSettings, serde_json::Error> {
        serde_json::from_str(json)
    }
}
