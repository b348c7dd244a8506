//! Shared support for the integration tests: locate the built binary and plugin libraries, start
//! a real `switchyard serve` process on loopback ports, and talk to it over HTTP.
//!
//! The binary and the plugins are built by `cargo build --workspace` (the README's test command
//! runs it before `cargo test`).

use std::{
    io::Read,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `target/<profile>` of this build (the test executable lives in `target/<profile>/deps`).
pub fn target_profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// `path`, after checking that it exists and is newer than every source it is built from
/// (`Cargo.toml` and `src/` of each crate in `crates`, relative to the workspace root): a test
/// must never pass or fail on a binary built from other code than the tree it checks.
fn built(path: PathBuf, crates: &[&str]) -> PathBuf {
    let built_at = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing: run `cargo build --workspace` before the tests (see README)",
                path.display()
            )
        });
    let root = workspace_root();
    for krate in crates {
        let dir = root.join(krate);
        let mut stack = vec![dir.join("Cargo.toml"), dir.join("src")];
        while let Some(p) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&p) else {
                continue;
            };
            if meta.is_dir() {
                stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            } else if meta.modified().unwrap() > built_at {
                panic!(
                    "{} is older than {}: run `cargo build --workspace` before the tests \
                     (see README)",
                    path.display(),
                    p.display()
                );
            }
        }
    }
    path
}

pub fn switchyard_bin() -> PathBuf {
    built(
        target_profile_dir().join("switchyard"),
        &["crates/host", "crates/plugin-api"],
    )
}

/// A fixture plugin library: `echo`, `echo_v2`, `mirror`, `incompatible`.
pub fn plugin_lib(name: &str) -> PathBuf {
    let dir = format!("tests/plugins/{}", name.replace('_', "-"));
    // `incompatible` copies a changed ABI and depends on neither echo-core nor plugin-api.
    let sources: &[&str] = if name == "incompatible" {
        &[&dir]
    } else {
        &[&dir, "tests/plugins/echo-core", "crates/plugin-api"]
    };
    built(
        target_profile_dir().join(format!("libswitchyard_plugin_{name}.so")),
        sources,
    )
}

/// The Phi4MM plugin library.
pub fn phi4mm_lib() -> PathBuf {
    built(
        target_profile_dir().join("libswitchyard_phi4mm.so"),
        &[
            "crates/phi4mm",
            "crates/phi4mm-frontend",
            "crates/artifact-cache",
            "crates/plugin-api",
        ],
    )
}

/// A field of `/proc/<pid>/status` in kB (`VmRSS:`, `VmHWM:`, …).
pub fn proc_status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Resets a process's peak resident memory (`VmHWM`) to its current resident memory, so the
/// next peak is the peak of what follows (Linux's `clear_refs` value 5).
pub fn reset_peak_rss(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .unwrap_or_else(|e| panic!("resetting the peak RSS of {pid}: {e}"));
}

/// A fresh private directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "switchyard-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// How long [`Server::start`] waits for `/ready` (see `Server::wait_ready`).
const START_TIMEOUT: Duration = Duration::from_secs(600);

/// How waiting for a starting server ended.
enum Ready {
    Yes,
    Exited,
    TimedOut,
}

/// A running `switchyard serve` process.
pub struct Server {
    child: Option<Child>,
    pub base: String,
    pub admin: String,
    pub dir: TempDir,
    pub config_path: PathBuf,
    pub http: reqwest::Client,
}

impl Server {
    /// Writes `config` (TOML; `{dir}` is replaced by the temp dir) and starts the server.
    /// Waits until `/ready` answers 200, or panics with the server's stderr.
    pub async fn start(config: &str) -> Self {
        Self::start_in(TempDir::new("server"), config).await
    }

    pub async fn start_in(dir: TempDir, config: &str) -> Self {
        let config_path = dir.path().join("switchyard.toml");
        std::fs::write(
            &config_path,
            config.replace("{dir}", &dir.path().display().to_string()),
        )
        .unwrap();
        let mut server = Self {
            child: None,
            base: String::new(),
            admin: String::new(),
            dir,
            config_path,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap(),
        };
        // `free_port` hands out a port that is free now, and another test process may take it
        // before this server binds it: then the server exits at once, and it starts again on
        // other ports.
        let mut why = String::new();
        for _ in 0..5 {
            server.spawn();
            why = match server.wait_ready().await {
                Ready::Yes => return server,
                Ready::Exited if server.log().contains("Address already in use") => continue,
                Ready::Exited => "it exited".into(),
                Ready::TimedOut => format!("no 200 from /ready in {START_TIMEOUT:?}"),
            };
            break;
        }
        panic!(
            "server did not become ready ({why}); log:\n{}",
            server.log()
        );
    }

    /// Starts the process on two fresh ports.
    fn spawn(&mut self) {
        let (port, admin_port) = (free_port(), free_port());
        let log = std::fs::File::create(self.dir.path().join("server.log")).unwrap();
        let child = Command::new(switchyard_bin())
            .args(["serve", "--config"])
            .arg(&self.config_path)
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--admin-listen",
                &format!("127.0.0.1:{admin_port}"),
            ])
            .env("XDG_CACHE_HOME", self.dir.path().join("cache"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn switchyard");
        self.child = Some(child);
        self.base = format!("http://127.0.0.1:{port}");
        self.admin = format!("http://127.0.0.1:{admin_port}");
    }

    async fn wait_ready(&mut self) -> Ready {
        // Generous: a Phi4MM instance on the IREE backend compiles its modules on a cold cache
        // before the server reports ready. The decoder at the fixture's whole context takes
        // about two minutes alone on 2 cores; beside another test's compile, on a slower CI
        // machine, a start once ran past 300 s.
        let until = Instant::now() + START_TIMEOUT;
        while Instant::now() < until {
            if let Ok(r) = self.http.get(format!("{}/ready", self.base)).send().await {
                if r.status() == 200 {
                    return Ready::Yes;
                }
            }
            let child = self.child.as_mut().expect("spawned");
            if child.try_wait().expect("the server's status").is_some() {
                return Ready::Exited;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ready::TimedOut
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Sends SIGTERM (what Kubernetes sends a pod it stops).
    pub fn terminate(&self) {
        self.signal("-TERM");
    }

    /// Sends SIGINT (Ctrl-C at a terminal).
    pub fn interrupt(&self) {
        self.signal("-INT");
    }

    /// Sends SIGHUP (reload the config).
    pub fn hang_up(&self) {
        self.signal("-HUP");
    }

    fn signal(&self, flag: &str) {
        let status = Command::new("kill")
            .arg(flag)
            .arg(self.pid().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits up to `within` for the process to exit; its status, or `None` if still running.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if let Some(status) = self.child.as_mut().expect("running").try_wait().unwrap() {
                self.child = None;
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// `POST {base}{path}` with a JSON body: (status, body as JSON, or `Null`).
    pub async fn post_json(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> (u16, serde_json::Value) {
        let sent = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await;
        let r = self.answered(sent);
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// The response to a request sent to this server; a request that got none fails the test
    /// with why, whether the server still runs, and the end of its log (a transport error
    /// alone does not say whether the server crashed or closed the connection).
    pub fn answered(&self, sent: reqwest::Result<reqwest::Response>) -> reqwest::Response {
        sent.unwrap_or_else(|e| {
            let pid = self.child.as_ref().map(|c| c.id());
            let state = pid
                .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
                .and_then(|stat| Some(stat.rsplit_once(')')?.1.split_whitespace().next()?.to_owned()))
                .unwrap_or_else(|| "gone".into());
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "no response: {e:?}\nserver pid {pid:?}, process state {state}; the end of its log:\n{}",
                tail.join("\n")
            )
        })
    }

    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.dir.path().join("server.log")) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    pub fn rewrite_config(&self, config: &str) {
        let tmp = self.config_path.with_extension("tmp");
        std::fs::write(
            &tmp,
            config.replace("{dir}", &self.dir.path().display().to_string()),
        )
        .unwrap();
        std::fs::rename(tmp, &self.config_path).unwrap();
    }

    pub async fn reload(&self) -> (u16, serde_json::Value) {
        let sent = self
            .http
            .post(format!("{}/admin/reload", self.admin))
            .header("content-type", "application/json")
            .send()
            .await;
        let r = self.answered(sent);
        let status = r.status().as_u16();
        (status, r.json().await.unwrap())
    }

    pub async fn status(&self) -> serde_json::Value {
        let sent = self
            .http
            .get(format!("{}/admin/status", self.admin))
            .send()
            .await;
        self.answered(sent).json().await.unwrap()
    }

    /// Polls `/admin/status` until `ready` holds for it, and returns that status; fails the test
    /// with `what` and the last status after 60 s.
    pub async fn status_until(
        &self,
        what: &str,
        ready: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let status = self.status().await;
            if ready(&status) {
                return status;
            }
            assert!(Instant::now() < until, "never saw {what}: {status}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub async fn metrics(&self) -> String {
        let sent = self.http.get(format!("{}/metrics", self.base)).send().await;
        self.answered(sent).text().await.unwrap()
    }

    /// Non-streaming chat: (status, served-by plugin header, body).
    pub async fn chat(&self, body: serde_json::Value) -> ChatReply {
        self.chat_with(body, &[]).await
    }

    /// A `POST /v1/chat/completions` with `body`, ready to send.
    fn chat_request(&self, body: &serde_json::Value) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}/v1/chat/completions", self.base))
            .json(body)
    }

    pub async fn chat_with(&self, body: serde_json::Value, headers: &[(&str, &str)]) -> ChatReply {
        let mut req = self.chat_request(&body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let r = self.answered(req.send().await);
        let status = r.status().as_u16();
        let header = |name: &str| {
            r.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let (instance, plugin, retry_after) = (
            header("x-switchyard-instance"),
            header("x-switchyard-plugin"),
            header("retry-after"),
        );
        let body = r.json().await.unwrap_or(serde_json::Value::Null);
        ChatReply {
            status,
            instance,
            plugin,
            retry_after,
            body,
        }
    }

    /// Starts a chat request on its own task and reads its whole body there (a client holding a
    /// slot while the test goes on).
    pub fn chat_in_background(&self, body: serde_json::Value) -> tokio::task::JoinHandle<String> {
        let request = self.chat_request(&body);
        tokio::spawn(async move { request.send().await.unwrap().text().await.unwrap() })
    }

    /// Opens a streamed chat and reads its first chunk; dropping the stream disconnects.
    pub async fn open_stream(
        &self,
        body: serde_json::Value,
    ) -> impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> {
        use futures_util::StreamExt;
        let response = self.answered(self.chat_request(&body).send().await);
        let mut stream = response.bytes_stream();
        let _first = stream.next().await.unwrap().unwrap();
        stream
    }

    /// `POST /v1/audio/transcriptions` with one file (`model` and `fields` as text parts):
    /// (status, body text).
    pub async fn transcribe(
        &self,
        model: &str,
        file_name: &str,
        file: Vec<u8>,
        fields: &[(&str, &str)],
    ) -> (u16, String) {
        let mut form = reqwest::multipart::Form::new().text("model", model.to_string());
        for (name, value) in fields {
            form = form.text(name.to_string(), value.to_string());
        }
        let form = form.part(
            "file",
            reqwest::multipart::Part::bytes(file).file_name(file_name.to_string()),
        );
        let r = self
            .http
            .post(format!("{}/v1/audio/transcriptions", self.base))
            .multipart(form)
            .send()
            .await;
        let r = self.answered(r);
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// Streaming chat, read to the end.
    pub async fn chat_stream(&self, body: serde_json::Value) -> StreamReply {
        use futures_util::StreamExt;
        let r = self.answered(self.chat_request(&body).send().await);
        let status = r.status().as_u16();
        let plugin = r
            .headers()
            .get("x-switchyard-plugin")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let mut raw = String::new();
        let mut stream = r.bytes_stream();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => raw.push_str(&String::from_utf8_lossy(&bytes)),
                Err(e) => {
                    raw.push_str(&format!("\n<transport error: {e}>"));
                    break;
                }
            }
        }
        StreamReply::parse(status, plugin, raw)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGTERM first so the server drains and removes its shadow directory.
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            let until = Instant::now() + Duration::from_secs(10);
            while Instant::now() < until {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[derive(Debug)]
pub struct ChatReply {
    pub status: u16,
    pub instance: String,
    pub plugin: String,
    pub retry_after: String,
    pub body: serde_json::Value,
}

impl ChatReply {
    pub fn content(&self) -> &str {
        self.body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
    }
}

#[derive(Debug)]
pub struct StreamReply {
    pub status: u16,
    pub plugin: String,
    pub chunks: Vec<serde_json::Value>,
    pub done: bool,
    pub raw: String,
}

impl StreamReply {
    fn parse(status: u16, plugin: String, raw: String) -> Self {
        let mut chunks = Vec::new();
        let mut done = false;
        for line in raw.lines() {
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                done = true;
            } else if let Ok(v) = serde_json::from_str(data) {
                chunks.push(v);
            }
        }
        Self {
            status,
            plugin,
            chunks,
            done,
            raw,
        }
    }

    /// The concatenated content deltas.
    pub fn text(&self) -> String {
        self.chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect()
    }

    pub fn finish_reason(&self) -> Option<String> {
        self.chunks.iter().find_map(|c| {
            c["choices"][0]["finish_reason"]
                .as_str()
                .map(str::to_string)
        })
    }
}

/// The JSON of every `data:` line of a server-sent-events body but `[DONE]`; a data line that is
/// no JSON fails the test.
pub fn sse_data(raw: &str) -> Vec<serde_json::Value> {
    raw.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

pub fn user(text: &str) -> serde_json::Value {
    serde_json::json!([{"role": "user", "content": text}])
}

/// Replaces the section between `<!-- {name}:start -->` and `<!-- {name}:end -->` in
/// `docs/benchmarks.md` (appending it when absent), so each benchmark owns its own section.
pub fn write_benchmark_section(name: &str, body: &str) -> std::io::Result<()> {
    let path = workspace_root().join("docs/benchmarks.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n".into());
    let (start, end) = (
        format!("<!-- {name}:start -->"),
        format!("<!-- {name}:end -->"),
    );
    let section = format!("{start}\n{}\n{end}", body.trim_end());
    let updated = match (text.find(&start), text.find(&end)) {
        (Some(a), Some(b)) if b > a => format!("{}{section}{}", &text[..a], &text[b + end.len()..]),
        _ => format!("{}\n{section}\n", text.trim_end()),
    };
    std::fs::write(path, updated)
}

/// One line naming this machine: CPU model, cores, memory.
pub fn machine_description() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    format!("{model}, {cores} cores, {mem_gib:.0} GiB")
}

/// The Python of a virtual environment with `requirement` (pip's form, pinned) installed,
/// created under the target directory on first use and reused after (`pip` is idempotent).
/// Tests that need a real third-party client (a reference parser) run it through this, so they
/// need nothing installed by hand but `python3` with `venv`.
pub fn python_with(requirement: &str) -> PathBuf {
    static MADE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    let tag: String = requirement
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let venv = target_profile_dir()
        .parent()
        .expect("target/<profile>")
        .join(format!("test-venv-{tag}"));
    let python = venv.join("bin/python");
    if made.iter().any(|r| r == requirement) {
        return python;
    }
    let run = |cmd: &mut Command| {
        let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        assert!(
            out.status.success(),
            "{cmd:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
    }
    run(Command::new(&python).args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        requirement,
    ]));
    made.push(requirement.to_string());
    python
}
