//! The configuration file: one TOML file, read with the `config` crate, with environment
//! overrides (`SWITCHYARD__SERVER__LISTEN=...`), validated as a whole. Every error names the key.
//! The reference is `docs/configuration.md`.

use serde::Deserialize;
use std::{
    collections::HashSet,
    net::SocketAddr,
    path::{Path, PathBuf},
};
use switchyard_plugin_api::Modality;

/// The most seconds any duration key takes: "now" plus it must stay a valid instant.
const MAX_SECS: f64 = 1e7;
/// The most `threads` a model may be given.
pub const MAX_MODEL_THREADS: u32 = 1024;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub plugins: Vec<PluginConfig>,
    #[serde(default)]
    pub models: Vec<ModelConfig>,
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    #[serde(default = "default_listen")]
    pub listen: String,
    /// A second listener for `/admin/*`; must be a loopback address.
    #[serde(default)]
    pub admin_listen: Option<String>,
    /// When set, `/admin/*` is also served on the main listener behind `Authorization: Bearer`.
    #[serde(default)]
    pub admin_token: Option<String>,
    /// A file holding the admin token (a mounted Secret), read at start instead of
    /// `admin_token`, which then holds its contents: a secret in a file stays out of the
    /// process's environment, which `/proc/<pid>/environ` and crash reports show.
    #[serde(default)]
    pub admin_token_file: Option<PathBuf>,
    /// Largest accepted request body, in bytes (HTTP 413 above).
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// Most bytes of request bodies (those over 4 KiB) held at once, from their first byte
    /// read to the end of their parse, over both listeners (HTTP 503 beyond).
    /// Unset: 1 GiB, or `max_body_bytes` where that is larger (a config written before this
    /// key stays valid). See [`ServerConfig::buffered_body_budget`].
    #[serde(default)]
    pub max_buffered_body_bytes: Option<usize>,
    /// How long a retired instance may take to finish its in-flight requests.
    #[serde(default = "default_drain")]
    pub drain_timeout_secs: f64,
    /// Most retired plugin libraries kept mapped (libraries are never unloaded).
    #[serde(default = "default_retired_cap")]
    pub retired_library_cap: usize,
    /// Reload when the config file changes.
    #[serde(default)]
    pub watch_config: bool,
    /// `Retry-After` seconds on HTTP 429.
    #[serde(default = "default_retry_after")]
    pub retry_after_secs: u32,
    /// Root for plugin caches and shadow copies (default `$XDG_CACHE_HOME/switchyard`).
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
    /// A connection must send a request's whole head within this time from when it starts
    /// waiting for it (a new connection, or a kept-alive one after its last response), else it
    /// is closed. This also bounds how long an idle kept-alive connection is kept.
    #[serde(default = "default_header_read_timeout")]
    pub header_read_timeout_secs: f64,
    /// A request's whole body must arrive within this time after its head (HTTP 408 after).
    #[serde(default = "default_body_read_timeout")]
    pub body_read_timeout_secs: f64,
    /// A connection whose response makes no progress for this long (its client reads nothing
    /// while a write waits) is closed, and the request it carried ends.
    #[serde(default = "default_write_timeout")]
    pub write_timeout_secs: f64,
    /// Connections served at once, per listener; more wait in the kernel's accept queue.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Wall-clock limit of one request from its arrival to its last byte; plugins get it as
    /// the request's deadline, and the host ends the request with HTTP 504 (or an SSE error).
    #[serde(default = "default_request_timeout")]
    pub request_timeout_secs: f64,
    /// Events per request that may wait unread before the request counts as stalled while its
    /// client reads nothing (see `crate::sink`).
    #[serde(default = "default_event_buffer")]
    pub event_buffer: usize,
    /// Longest a request may stay stalled, its client reading nothing; then it is cancelled.
    /// A plugin's `send` never blocks.
    #[serde(default = "default_event_send_timeout")]
    pub event_send_timeout_secs: f64,
    /// Longest the creation plus warm-up of one instance may take in a reload.
    #[serde(default = "default_reload_timeout")]
    pub reload_timeout_secs: f64,
    /// The operator caps of every model instance that does not set its own (`[server.limits]`).
    #[serde(default)]
    pub limits: LimitsConfig,
}

/// Operator caps on what one request may ask of a model instance: in `[server.limits]` for
/// every instance, in a `[[models]]` entry's `limits` for that one. Unset keys fall back to
/// the server's, then to [`RequestLimits::default`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    pub max_tokens_limit: Option<u32>,
    pub default_max_tokens: Option<u32>,
    pub max_prompt_bytes: Option<usize>,
    pub max_stop_sequences: Option<usize>,
    pub max_stop_bytes: Option<usize>,
    pub max_content_parts: Option<usize>,
}

/// The caps in force for one instance. Each refusal is HTTP 400 and names its key.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestLimits {
    /// Most tokens a request may ask for (`max_tokens` / `max_completion_tokens`).
    pub max_tokens_limit: u32,
    /// The `max_tokens` of a request that sets none; unset, the plugin's own default applies
    /// (Phi4MM's `default_max_tokens` setting, for one).
    pub default_max_tokens: Option<u32>,
    /// Most bytes of text over all the messages' text parts.
    pub max_prompt_bytes: usize,
    /// Most stop strings (OpenAI allows 4).
    pub max_stop_sequences: usize,
    /// Longest stop string, in bytes.
    pub max_stop_bytes: usize,
    /// Most content parts over all messages (a plain string content is one part).
    pub max_content_parts: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_tokens_limit: 4096,
            default_max_tokens: None,
            max_prompt_bytes: 1 << 20,
            max_stop_sequences: 4,
            max_stop_bytes: 256,
            max_content_parts: 128,
        }
    }
}

impl RequestLimits {
    /// `model`'s caps over `server`'s over the defaults.
    pub fn resolve(model: &LimitsConfig, server: &LimitsConfig) -> Self {
        let d = Self::default();
        let max_tokens_limit = model
            .max_tokens_limit
            .or(server.max_tokens_limit)
            .unwrap_or(d.max_tokens_limit);
        Self {
            max_tokens_limit,
            default_max_tokens: model
                .default_max_tokens
                .or(server.default_max_tokens)
                .or(d.default_max_tokens),
            max_prompt_bytes: model
                .max_prompt_bytes
                .or(server.max_prompt_bytes)
                .unwrap_or(d.max_prompt_bytes),
            max_stop_sequences: model
                .max_stop_sequences
                .or(server.max_stop_sequences)
                .unwrap_or(d.max_stop_sequences),
            max_stop_bytes: model
                .max_stop_bytes
                .or(server.max_stop_bytes)
                .unwrap_or(d.max_stop_bytes),
            max_content_parts: model
                .max_content_parts
                .or(server.max_content_parts)
                .unwrap_or(d.max_content_parts),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            admin_listen: None,
            admin_token: None,
            admin_token_file: None,
            max_body_bytes: default_max_body(),
            max_buffered_body_bytes: None,
            drain_timeout_secs: default_drain(),
            retired_library_cap: default_retired_cap(),
            watch_config: false,
            retry_after_secs: default_retry_after(),
            cache_dir: None,
            header_read_timeout_secs: default_header_read_timeout(),
            body_read_timeout_secs: default_body_read_timeout(),
            write_timeout_secs: default_write_timeout(),
            max_connections: default_max_connections(),
            request_timeout_secs: default_request_timeout(),
            event_buffer: default_event_buffer(),
            event_send_timeout_secs: default_event_send_timeout(),
            reload_timeout_secs: default_reload_timeout(),
            limits: LimitsConfig::default(),
        }
    }
}

fn default_header_read_timeout() -> f64 {
    10.0
}
fn default_body_read_timeout() -> f64 {
    60.0
}
fn default_write_timeout() -> f64 {
    30.0
}
fn default_max_connections() -> usize {
    1024
}
fn default_request_timeout() -> f64 {
    600.0
}
fn default_event_buffer() -> usize {
    256
}
fn default_event_send_timeout() -> f64 {
    30.0
}
fn default_reload_timeout() -> f64 {
    600.0
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
fn default_max_body() -> usize {
    64 << 20
}
/// `max_buffered_body_bytes` when it is not set, unless `max_body_bytes` is larger.
const DEFAULT_MAX_BUFFERED_BODY: usize = 1 << 30;

impl ServerConfig {
    /// The keys read only at start (`docs/configuration.md`) whose values `new` changes: a
    /// reload applies everything else and logs these as waiting for a restart.
    pub fn start_only_changes(&self, new: &ServerConfig) -> Vec<&'static str> {
        let keys = [
            ("listen", self.listen == new.listen),
            ("admin_listen", self.admin_listen == new.admin_listen),
            ("admin_token", self.admin_token == new.admin_token),
            (
                "admin_token_file",
                self.admin_token_file == new.admin_token_file,
            ),
            ("max_body_bytes", self.max_body_bytes == new.max_body_bytes),
            (
                "max_buffered_body_bytes",
                self.max_buffered_body_bytes == new.max_buffered_body_bytes,
            ),
            (
                "header_read_timeout_secs",
                self.header_read_timeout_secs == new.header_read_timeout_secs,
            ),
            (
                "body_read_timeout_secs",
                self.body_read_timeout_secs == new.body_read_timeout_secs,
            ),
            (
                "write_timeout_secs",
                self.write_timeout_secs == new.write_timeout_secs,
            ),
            (
                "max_connections",
                self.max_connections == new.max_connections,
            ),
            ("watch_config", self.watch_config == new.watch_config),
            ("cache_dir", self.cache_dir == new.cache_dir),
        ];
        keys.into_iter()
            .filter_map(|(key, same)| (!same).then_some(key))
            .collect()
    }

    /// The bytes of request bodies that may be held at once (`max_buffered_body_bytes`).
    pub fn buffered_body_budget(&self) -> usize {
        self.max_buffered_body_bytes
            .unwrap_or(DEFAULT_MAX_BUFFERED_BODY.max(self.max_body_bytes))
    }
}
fn default_drain() -> f64 {
    30.0
}
fn default_retired_cap() -> usize {
    16
}
fn default_retry_after() -> u32 {
    1
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    pub name: String,
    /// Path of the shared library; relative paths are relative to the config file.
    pub path: PathBuf,
    /// Optional pin: the library is refused unless its sha256 (hex) matches.
    #[serde(default)]
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub name: String,
    pub plugin: String,
    pub kind: String,
    /// Plugin-specific settings, handed to the plugin as JSON.
    #[serde(default = "empty_table")]
    pub settings: serde_json::Value,
    /// Compute threads for this instance (default: all cores).
    #[serde(default)]
    pub threads: Option<u32>,
    /// Admission limit: requests in flight at once; more get HTTP 429 (or a fallback).
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: u32,
    /// This instance's operator caps, over `[server.limits]`.
    #[serde(default)]
    pub limits: LimitsConfig,
}

fn empty_table() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}
fn default_max_in_flight() -> u32 {
    64
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Requested model names (the request's `model` field) this route answers.
    pub models: Vec<String>,
    /// Modalities this route takes (`text`, `image`, `audio`, `image+audio`); empty: any.
    #[serde(default)]
    pub modalities: Vec<String>,
    /// Only requests carrying this header value take this route.
    #[serde(default)]
    pub header: Option<HeaderMatch>,
    /// Weighted backends (model instance names), split deterministically by weight.
    pub backends: Vec<Backend>,
    /// Tried in order when the chosen backend is unavailable or full.
    #[serde(default)]
    pub fallbacks: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderMatch {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    pub model: String,
    #[serde(default = "default_weight")]
    pub weight: u32,
}

fn default_weight() -> u32 {
    1
}

/// All the problems found in a config, each naming its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {}", .0.join("; "))]
pub struct ConfigErrors(pub Vec<String>);

/// A config that passed validation, with plugin paths made absolute. It can only be read: a
/// changed config has to pass [`validate`] again (or come from a method here that keeps it valid).
#[derive(Debug, Clone)]
pub struct ValidConfig {
    config: Config,
    source: Option<PathBuf>,
    base_dir: PathBuf,
}

impl ValidConfig {
    /// No plugins, models or routes; the server defaults.
    pub fn empty() -> Self {
        let config: Config = serde_json::from_str("{}").expect("every key has a default");
        validate(config, Path::new("."), None).expect("the empty config is valid")
    }

    pub fn server(&self) -> &ServerConfig {
        &self.config.server
    }

    pub fn plugins(&self) -> &[PluginConfig] {
        &self.config.plugins
    }

    pub fn models(&self) -> &[ModelConfig] {
        &self.config.models
    }

    pub fn routes(&self) -> &[RouteConfig] {
        &self.config.routes
    }

    /// The file it was read from, if any.
    pub fn source(&self) -> Option<&Path> {
        self.source.as_deref()
    }

    /// The directory relative paths are resolved against (the config file's), made absolute.
    /// Plugins get it too, for the paths in their settings.
    pub fn base_dir(&self) -> &Path {
        &self.base_dir
    }

    /// Requested model names clients may use: route names and instance names.
    pub fn public_model_names(&self) -> Vec<String> {
        let mut seen = HashSet::new();
        let mut names = Vec::new();
        let from_routes = self.routes().iter().flat_map(|r| r.models.iter());
        for name in from_routes.chain(self.models().iter().map(|m| &m.name)) {
            if seen.insert(name.clone()) {
                names.push(name.clone());
            }
        }
        names
    }

    /// The names `instance` is served under, comma-joined: the requested names of every route
    /// whose backends or fallbacks name it, in config order, or the instance's own name when no
    /// route does. The `model_name` label of its `vllm:*` metrics.
    pub fn served_names(&self, instance: &str) -> String {
        let mut names: Vec<&str> = Vec::new();
        for route in self.routes() {
            let backends = route.backends.iter().map(|b| b.model.as_str());
            if backends
                .chain(route.fallbacks.iter().map(String::as_str))
                .any(|m| m == instance)
            {
                for name in &route.models {
                    if !names.contains(&name.as_str()) {
                        names.push(name);
                    }
                }
            }
        }
        if names.is_empty() {
            return instance.to_string();
        }
        names.join(",")
    }

    /// Only what a request for `model` can reach: the routes that answer it, and the models they
    /// and `model` itself name. Still valid, since every name a kept route uses is kept.
    pub fn reachable_from(&self, model: &str) -> Self {
        let routes: Vec<RouteConfig> = self
            .routes()
            .iter()
            .filter(|r| r.models.iter().any(|m| m == model))
            .cloned()
            .collect();
        let wanted: HashSet<&str> = routes
            .iter()
            .flat_map(|r| {
                let backends = r.backends.iter().map(|b| b.model.as_str());
                backends.chain(r.fallbacks.iter().map(String::as_str))
            })
            .chain([model])
            .collect();
        let models = self
            .models()
            .iter()
            .filter(|m| wanted.contains(m.name.as_str()))
            .cloned()
            .collect();
        let config = Config {
            models,
            routes,
            ..self.config.clone()
        };
        Self {
            config,
            ..self.clone()
        }
    }
}

/// Reads `path` and applies `SWITCHYARD__...` environment overrides, then validates.
pub fn load(path: &Path) -> Result<ValidConfig, ConfigErrors> {
    let built = config::Config::builder()
        .add_source(
            config::File::from(path)
                .format(config::FileFormat::Toml)
                .required(true),
        )
        .add_source(
            config::Environment::with_prefix("SWITCHYARD")
                .prefix_separator("__")
                .separator("__")
                // Values stay text and take the type of the key they set: parsed up front, an
                // all-digit admin token became a number and lost its leading zeros.
                .try_parsing(false),
        )
        .build()
        .map_err(|e| ConfigErrors(vec![format!("{}: {e}", path.display())]))?;
    refuse_non_finite(&built)?;
    let config: Config = built
        .try_deserialize()
        .map_err(|e| ConfigErrors(vec![format!("{}: {e}", path.display())]))?;
    let base = path.parent().unwrap_or(Path::new("."));
    validate(config, base, Some(path.to_path_buf()))
}

/// Parses TOML text (no environment overrides); relative plugin paths resolve against `base`.
pub fn from_toml_str(text: &str, base: &Path) -> Result<ValidConfig, ConfigErrors> {
    let built = config::Config::builder()
        .add_source(config::File::from_str(text, config::FileFormat::Toml))
        .build()
        .map_err(|e| ConfigErrors(vec![e.to_string()]))?;
    refuse_non_finite(&built)?;
    let config: Config = built
        .try_deserialize()
        .map_err(|e| ConfigErrors(vec![e.to_string()]))?;
    validate(config, base, None)
}

/// Refuses an `inf` or a `nan` anywhere in the file, by its key. TOML has them, and they reached
/// the typed keys as whatever the conversion made of them (`retry_after_secs = nan` was 0, a
/// `max_tokens_limit = inf` the largest integer) and the plugins' settings as JSON's null.
fn refuse_non_finite(built: &config::Config) -> Result<(), ConfigErrors> {
    // TOML has no null: read as JSON, a null is where a non-finite number was.
    let tree: serde_json::Value = built
        .clone()
        .try_deserialize()
        .map_err(|e| ConfigErrors(vec![e.to_string()]))?;
    match first_null(&tree) {
        None => Ok(()),
        Some(path) => Err(ConfigErrors(vec![format!(
            "{}: inf and nan are not values here (a number must be finite; a plugin gets its \
             settings as JSON, which has no such numbers)",
            path.trim_start_matches('.')
        )])),
    }
}

/// The path (`.a.b[2]`) of the first null in `value`, if any.
fn first_null(value: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    match value {
        Value::Null => Some(String::new()),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| first_null(item).map(|rest| format!("[{i}]{rest}"))),
        Value::Object(fields) => fields
            .iter()
            .find_map(|(name, field)| first_null(field).map(|rest| format!(".{name}{rest}"))),
        Value::Bool(_) | Value::Number(_) | Value::String(_) => None,
    }
}

/// The most bytes an admin token file may hold: a token is tens of characters.
const MAX_TOKEN_FILE_BYTES: u64 = 4096;

/// An admin token file's contents: a regular file (a FIFO or a device such as `/dev/zero`
/// would hang or exhaust the start) of at most 4 KiB.
fn read_token_file(path: &Path) -> Result<String, String> {
    use std::io::Read;
    // Checked before the open, which would block on a FIFO until a writer came.
    if !std::fs::metadata(path)
        .map_err(|e| e.to_string())?
        .is_file()
    {
        return Err("not a regular file".into());
    }
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut token = String::new();
    file.take(MAX_TOKEN_FILE_BYTES + 1)
        .read_to_string(&mut token)
        .map_err(|e| e.to_string())?;
    if token.len() as u64 > MAX_TOKEN_FILE_BYTES {
        return Err(format!("longer than {MAX_TOKEN_FILE_BYTES} bytes"));
    }
    Ok(token)
}

/// Checks the config as a whole: every reference resolves, names are unique, values are sane.
/// Plugin files are only checked for existence here; the registry checks their contents.
pub fn validate(
    mut config: Config,
    base: &Path,
    source: Option<PathBuf>,
) -> Result<ValidConfig, ConfigErrors> {
    // Relative paths start from the config file's directory, made absolute: a bare file name
    // (`echo.so`, from `config check serve.toml` run in its directory) would otherwise reach
    // `dlopen` without a slash, which searches the library path instead of that directory.
    let base = &std::path::absolute(if base.as_os_str().is_empty() {
        Path::new(".")
    } else {
        base
    })
    .unwrap_or_else(|_| base.to_path_buf());
    let mut errors = Vec::new();
    let mut token_key = "server.admin_token";
    if let Some(file) = &config.server.admin_token_file {
        if config.server.admin_token.is_some() {
            errors.push(
                "server.admin_token_file: set either admin_token or admin_token_file, not both"
                    .into(),
            );
        } else {
            let path = base.join(file);
            match read_token_file(&path) {
                Ok(token) => {
                    config.server.admin_token = Some(token);
                    token_key = "server.admin_token_file";
                }
                Err(why) => errors.push(format!(
                    "server.admin_token_file: cannot read {}: {why}",
                    path.display()
                )),
            }
        }
    }
    if let Some(token) = &mut config.server.admin_token {
        // A token read from a file (a Kubernetes Secret made with `--from-file`, `$(cat …)`)
        // ends with a newline no client sends: kept, it would refuse every request.
        if token.trim() != token {
            *token = token.trim().to_string();
        }
    }
    let server = &config.server;
    if server.listen.parse::<SocketAddr>().is_err() {
        errors.push(format!(
            "server.listen: {:?} is not an address like 127.0.0.1:8080",
            server.listen
        ));
    }
    if let Some(admin) = &server.admin_listen {
        match admin.parse::<SocketAddr>() {
            Ok(addr) if addr.ip().is_loopback() => {}
            Ok(_) => errors.push(format!(
                "server.admin_listen: {admin} is not a loopback address"
            )),
            Err(_) => errors.push(format!("server.admin_listen: {admin:?} is not an address")),
        }
    }
    if matches!(&server.admin_token, Some(t) if t.len() < 16) {
        errors.push(format!(
            "{token_key}: the token must be at least 16 characters (leading and trailing \
             whitespace is not counted)"
        ));
    }
    if server.max_body_bytes < 1024 {
        errors.push("server.max_body_bytes: must be at least 1024".into());
    }
    // A permit per byte: tokio's semaphore holds at most usize::MAX >> 3.
    let budget = server.buffered_body_budget();
    if budget < server.max_body_bytes || budget > 1 << 50 {
        errors.push(
            "server.max_buffered_body_bytes: must be at least max_body_bytes (one whole body) \
             and at most 2^50"
                .into(),
        );
    }
    // Bounded above like the timeouts below: a drain deadline is "now" plus this.
    if !(server.drain_timeout_secs.is_finite()
        && server.drain_timeout_secs >= 0.0
        && server.drain_timeout_secs <= MAX_SECS)
    {
        errors.push("server.drain_timeout_secs: must be a number of seconds in [0, 1e7]".into());
    }
    for (key, secs) in [
        ("header_read_timeout_secs", server.header_read_timeout_secs),
        ("body_read_timeout_secs", server.body_read_timeout_secs),
        ("write_timeout_secs", server.write_timeout_secs),
        ("request_timeout_secs", server.request_timeout_secs),
        ("event_send_timeout_secs", server.event_send_timeout_secs),
        ("reload_timeout_secs", server.reload_timeout_secs),
    ] {
        // Bounded above too, so that adding it to "now" cannot overflow.
        if !(secs.is_finite() && secs > 0.0 && secs <= MAX_SECS) {
            errors.push(format!(
                "server.{key}: must be a number of seconds in (0, 1e7]"
            ));
        }
    }
    if server.max_connections == 0 {
        errors.push("server.max_connections: must be at least 1".into());
    }
    if server.event_buffer == 0 {
        errors.push("server.event_buffer: must be at least 1".into());
    }
    check_limits("server.limits", &server.limits, &server.limits, &mut errors);

    let mut plugin_names = HashSet::new();
    for (i, plugin) in config.plugins.iter_mut().enumerate() {
        let key = format!("plugins[{i}]");
        if plugin.name.is_empty() {
            errors.push(format!("{key}.name: must not be empty"));
        }
        if !plugin_names.insert(plugin.name.clone()) {
            errors.push(format!(
                "{key}.name: duplicate plugin name {:?}",
                plugin.name
            ));
        }
        if plugin.path.is_relative() {
            plugin.path = base.join(&plugin.path);
        }
        if !plugin.path.is_file() {
            errors.push(format!(
                "{key}.path: no such file {}",
                plugin.path.display()
            ));
        }
        if let Some(pin) = &plugin.sha256 {
            if pin.len() != 64 || !pin.chars().all(|c| c.is_ascii_hexdigit()) {
                errors.push(format!("{key}.sha256: expected 64 hex digits, got {pin:?}"));
            }
        }
    }

    let mut model_names = HashSet::new();
    for (i, model) in config.models.iter().enumerate() {
        let key = format!("models[{i}]");
        if model.name.is_empty() {
            errors.push(format!("{key}.name: must not be empty"));
        }
        if !model_names.insert(model.name.clone()) {
            errors.push(format!("{key}.name: duplicate model name {:?}", model.name));
        }
        if !plugin_names.contains(&model.plugin) {
            errors.push(format!("{key}.plugin: unknown plugin {:?}", model.plugin));
        }
        if !model.settings.is_object() {
            errors.push(format!("{key}.settings: must be a table"));
        }
        if model.max_in_flight == 0 {
            errors.push(format!("{key}.max_in_flight: must be at least 1"));
        }
        if model
            .threads
            .is_some_and(|t| !(1..=MAX_MODEL_THREADS).contains(&t))
        {
            errors.push(format!(
                "{key}.threads: must be in 1..={MAX_MODEL_THREADS} (a thread pool of that many is made per instance)"
            ));
        }
        let server_limits = &config.server.limits;
        check_limits(
            &format!("{key}.limits"),
            &model.limits,
            server_limits,
            &mut errors,
        );
    }

    for (i, route) in config.routes.iter().enumerate() {
        let key = format!("routes[{i}]");
        if route.models.is_empty() || route.models.iter().any(String::is_empty) {
            errors.push(format!(
                "{key}.models: list at least one non-empty requested model name"
            ));
        }
        for (j, m) in route.modalities.iter().enumerate() {
            if Modality::parse(m).is_none() {
                errors.push(format!("{key}.modalities[{j}]: unknown modality {m:?} (text, image, audio, image+audio)"));
            }
        }
        if let Some(h) = &route.header {
            if axum::http::HeaderName::try_from(h.name.as_str()).is_err() {
                errors.push(format!(
                    "{key}.header.name: {:?} is not a header name",
                    h.name
                ));
            }
        }
        if route.backends.is_empty() {
            errors.push(format!("{key}.backends: list at least one backend"));
        }
        if route.backends.iter().all(|b| b.weight == 0) && !route.backends.is_empty() {
            errors.push(format!("{key}.backends: at least one weight must be > 0"));
        }
        for (j, b) in route.backends.iter().enumerate() {
            if !model_names.contains(&b.model) {
                errors.push(format!(
                    "{key}.backends[{j}].model: unknown model {:?}",
                    b.model
                ));
            }
        }
        for (j, f) in route.fallbacks.iter().enumerate() {
            if !model_names.contains(f) {
                errors.push(format!("{key}.fallbacks[{j}]: unknown model {f:?}"));
            }
        }
    }

    if errors.is_empty() {
        Ok(ValidConfig {
            config,
            source,
            base_dir: base.clone(),
        })
    } else {
        Err(ConfigErrors(errors))
    }
}

/// The caps that `limits` (over `server`) puts in force must be usable: no zero ceiling, and a
/// default within the ceiling.
fn check_limits(key: &str, limits: &LimitsConfig, server: &LimitsConfig, errors: &mut Vec<String>) {
    let resolved = RequestLimits::resolve(limits, server);
    for (name, value) in [
        ("max_tokens_limit", resolved.max_tokens_limit as usize),
        (
            "default_max_tokens",
            resolved.default_max_tokens.map_or(1, |n| n as usize),
        ),
        ("max_prompt_bytes", resolved.max_prompt_bytes),
        ("max_stop_bytes", resolved.max_stop_bytes),
        ("max_content_parts", resolved.max_content_parts),
    ] {
        if value == 0 {
            errors.push(format!("{key}.{name}: must be at least 1"));
        }
    }
    if let Some(default) = resolved
        .default_max_tokens
        .filter(|d| *d > resolved.max_tokens_limit)
    {
        errors.push(format!(
            "{key}.default_max_tokens: {default} exceeds max_tokens_limit = {}",
            resolved.max_tokens_limit
        ));
    }
}

/// `$XDG_CACHE_HOME/switchyard`, else `~/.cache/switchyard`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("switchyard");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("switchyard")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<ValidConfig, ConfigErrors> {
        from_toml_str(text, Path::new("/nonexistent"))
    }

    #[test]
    fn errors_name_their_keys_and_are_all_reported() {
        let err = check(
            r#"
            [server]
            listen = "nope"
            [[plugins]]
            name = "p"
            path = "missing.so"
            sha256 = "abc"
            [[models]]
            name = "m"
            plugin = "q"
            kind = "k"
            [[routes]]
            models = ["x"]
            modalities = ["video"]
            backends = [{ model = "n" }]
            fallbacks = ["o"]
            "#,
        )
        .unwrap_err();
        let all = err.0.join("\n");
        for key in [
            "server.listen",
            "plugins[0].path",
            "plugins[0].sha256",
            "models[0].plugin",
            "routes[0].modalities[0]",
            "routes[0].backends[0].model",
            "routes[0].fallbacks[0]",
        ] {
            assert!(all.contains(key), "{key} missing from:\n{all}");
        }
    }

    #[test]
    fn an_admin_token_read_from_a_file_loses_its_newline_and_blank_is_refused() {
        let token = |value: &str| {
            check(&format!("[server]\nadmin_token = {value:?}\n"))
                .map(|c| c.server().admin_token.clone().unwrap())
        };
        assert_eq!(
            token("abcdefghijklmnopqrstuvwx\n").unwrap(),
            "abcdefghijklmnopqrstuvwx"
        );
        assert_eq!(token(" abcdefghijklmnop\r\n").unwrap(), "abcdefghijklmnop");
        for short in ["                ", "abcdefghijklmno\n\n"] {
            let err = token(short).unwrap_err();
            assert!(err.to_string().contains("server.admin_token"), "{err}");
        }
    }

    #[test]
    fn an_admin_token_file_is_read_trimmed_and_every_misuse_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "abcdefghijklmnopqrstuvwx\n").unwrap();
        std::fs::write(dir.path().join("short"), "abc\n").unwrap();
        std::fs::write(dir.path().join("long"), "a".repeat(5000)).unwrap();
        let check_in = |server: &str| {
            from_toml_str(&format!("[server]\n{server}\n"), dir.path())
                .map(|c| c.server().admin_token.clone())
                .map_err(|e| e.to_string())
        };
        // Relative to the config's directory, like every other path.
        assert_eq!(
            check_in("admin_token_file = \"token\"").unwrap().as_deref(),
            Some("abcdefghijklmnopqrstuvwx")
        );
        let both = check_in("admin_token_file = \"token\"\nadmin_token = \"abcdefghijklmnopq\"");
        assert!(both.unwrap_err().contains("not both"));
        let missing = check_in("admin_token_file = \"absent\"").unwrap_err();
        assert!(
            missing.contains("server.admin_token_file: cannot read") && missing.contains("absent"),
            "{missing}"
        );
        for (device, why) in [
            ("/dev/zero", "not a regular file"),
            ("long", "longer than 4096"),
        ] {
            let err = check_in(&format!("admin_token_file = {device:?}")).unwrap_err();
            assert!(
                err.contains("server.admin_token_file") && err.contains(why),
                "{err}"
            );
        }
        let short = check_in("admin_token_file = \"short\"").unwrap_err();
        assert!(
            short.contains("server.admin_token_file: the token must be at least 16"),
            "{short}"
        );
    }

    #[test]
    fn the_body_budget_defaults_to_a_gibibyte_or_the_largest_body() {
        let server = |text: &str| check(text).unwrap().server().buffered_body_budget();
        assert_eq!(server("[server]\n"), 1 << 30);
        // A config written before the key, with bodies larger than the default: still valid.
        assert_eq!(server("[server]\nmax_body_bytes = 2147483648\n"), 2 << 30);
        assert_eq!(
            server("[server]\nmax_body_bytes = 1048576\nmax_buffered_body_bytes = 1048576\n"),
            1 << 20
        );
        let err =
            check("[server]\nmax_body_bytes = 4096\nmax_buffered_body_bytes = 2048\n").unwrap_err();
        assert!(
            err.to_string().contains("server.max_buffered_body_bytes"),
            "{err}"
        );
    }

    #[test]
    fn non_finite_numbers_are_refused_by_their_path() {
        let model = |settings: &str, extra: &str| {
            format!(
                "{extra}[[plugins]]\nname = \"p\"\npath = \"/bin/sh\"\n[[models]]\nname = \"m\"\n\
                 plugin = \"p\"\nkind = \"k\"\nsettings = {settings}\n"
            )
        };
        for (text, path) in [
            (
                model("{ temperature = inf }", ""),
                "models[0].settings.temperature:",
            ),
            (
                model("{ a = 1, scales = [1.0, nan] }", ""),
                "models[0].settings.scales[1]:",
            ),
            (
                model("{ limits = { seconds = -inf } }", ""),
                "models[0].settings.limits.seconds:",
            ),
            // The host's own keys, which the conversion turned into 0 or the largest integer.
            (
                model("{}", "[server]\nretry_after_secs = nan\n"),
                "server.retry_after_secs:",
            ),
            (
                model("{}", "[server.limits]\nmax_tokens_limit = inf\n"),
                "server.limits.max_tokens_limit:",
            ),
        ] {
            let err = check(&text).unwrap_err().to_string();
            assert!(err.contains(path), "{text}: {err}");
            assert!(err.contains("inf and nan are not values here"), "{err}");
        }
        let ok = from_toml_str(&model("{ a = 1.5, b = [], c = {} }", ""), Path::new("/"));
        assert!(ok.is_ok(), "{:?}", ok.err());
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = check("[server]\nlisten = \"127.0.0.1:1\"\nlisen = 3\n").unwrap_err();
        assert!(err.to_string().contains("lisen"), "{err}");
    }

    #[test]
    fn admin_listener_must_be_loopback() {
        let err = check("[server]\nadmin_listen = \"0.0.0.0:9\"\n").unwrap_err();
        assert!(err.to_string().contains("server.admin_listen"), "{err}");
        assert!(check("[server]\nadmin_listen = \"127.0.0.1:9\"\n").is_ok());
    }

    #[test]
    fn reachable_from_keeps_a_models_routes_and_their_backends_only() {
        let dir = std::env::temp_dir().join(format!("switchyard-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("p.so"), b"").unwrap();
        let config = from_toml_str(
            r#"
            [[plugins]]
            name = "p"
            path = "p.so"
            [[models]]
            name = "a"
            plugin = "p"
            kind = "k"
            [[models]]
            name = "b"
            plugin = "p"
            kind = "k"
            [[models]]
            name = "c"
            plugin = "p"
            kind = "k"
            [[models]]
            name = "d"
            plugin = "p"
            kind = "k"
            [[routes]]
            models = ["chat"]
            backends = [{ model = "a" }]
            fallbacks = ["b"]
            [[routes]]
            models = ["other"]
            backends = [{ model = "c" }]
            "#,
            &dir,
        )
        .unwrap();
        let names = |c: &ValidConfig| {
            c.models()
                .iter()
                .map(|m| m.name.clone())
                .collect::<Vec<_>>()
        };
        let chat = config.reachable_from("chat");
        assert_eq!(names(&chat), ["a", "b"]);
        assert_eq!(chat.routes().len(), 1);
        assert_eq!(chat.public_model_names(), ["chat", "a", "b"]);
        let direct = config.reachable_from("d");
        assert_eq!(names(&direct), ["d"]);
        assert!(direct.routes().is_empty());
        assert_eq!(
            names(&config),
            ["a", "b", "c", "d"],
            "the original is unchanged"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
