//! `deploy/kubernetes/`: every manifest parsed with a real YAML parser, and checked against what
//! the server really serves. The ConfigMap's TOML goes through the host's own config loader,
//! and then a real `switchyard serve` runs on it (its container paths swapped for the built
//! plugin and the fixture checkpoint), answering each probe path the Deployment names. A
//! ConfigMap update as the kubelet publishes it (a `..data` link swap) reloads a watching
//! server.

use serde_json::{json, Map, Value};
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};
use switchyard::config;
use switchyard_fixtures::fixture;
use switchyard_integration_tests::{phi4mm_lib, plugin_lib, user, workspace_root, Server, TempDir};
use yaml_rust2::{Yaml, YamlLoader};

fn to_json(yaml: &Yaml) -> Value {
    match yaml {
        Yaml::Real(_) => json!(yaml.as_f64().expect("a real")),
        Yaml::Integer(i) => json!(i),
        Yaml::String(s) => json!(s),
        Yaml::Boolean(b) => json!(b),
        Yaml::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        Yaml::Hash(hash) => Value::Object(
            hash.iter()
                .map(|(k, v)| {
                    let key = k.as_str().expect("string keys in a manifest").to_string();
                    (key, to_json(v))
                })
                .collect(),
        ),
        Yaml::Null => Value::Null,
        other => panic!("unexpected YAML node {other:?}"),
    }
}

/// Every document of every `deploy/kubernetes/*.yaml`, by kind.
fn manifests() -> Map<String, Value> {
    let dir = workspace_root().join("deploy/kubernetes");
    let mut by_kind = Map::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir.display());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let docs =
            YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for doc in docs {
            let doc = to_json(&doc);
            let kind = doc["kind"].as_str().expect("every manifest has a kind");
            assert!(
                by_kind.insert(kind.to_string(), doc.clone()).is_none(),
                "two {kind}s"
            );
        }
    }
    by_kind
}

/// A Kubernetes quantity in bytes, for the binary and decimal suffixes a volume size uses
/// (`512Mi`, `1G`, `1048576`).
fn quantity_bytes(quantity: &str) -> u64 {
    const SUFFIXES: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    let (digits, unit) = SUFFIXES
        .iter()
        .find_map(|&(suffix, unit)| Some((quantity.strip_suffix(suffix)?, unit)))
        .unwrap_or((quantity, 1));
    let n: u64 = digits
        .parse()
        .unwrap_or_else(|e| panic!("quantity {quantity:?}: {e}"));
    n * unit
}

#[test]
fn kubernetes_quantities_read_as_bytes() {
    assert_eq!(quantity_bytes("512Mi"), 512 << 20);
    assert_eq!(quantity_bytes("2Gi"), 2 << 30);
    assert_eq!(quantity_bytes("1G"), 1_000_000_000);
    assert_eq!(quantity_bytes("1048576"), 1 << 20);
}

/// `labels` ⊆ `of`.
fn selects(labels: &Value, of: &Value) -> bool {
    labels
        .as_object()
        .unwrap()
        .iter()
        .all(|(k, v)| of.get(k) == Some(v))
}

/// The ConfigMap's config file: its name and its TOML.
fn configmap_config(manifests: &Map<String, Value>) -> (String, String) {
    let data = manifests["ConfigMap"]["data"].as_object().unwrap();
    assert_eq!(data.len(), 1, "one config file");
    let (name, text) = data.iter().next().unwrap();
    (name.clone(), text.as_str().unwrap().to_string())
}

#[test]
fn manifests_agree_with_the_server_config_and_each_other() {
    let m = manifests();
    for kind in [
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "InferencePool",
        "InferenceObjective",
    ] {
        assert!(m.contains_key(kind), "no {kind} in deploy/kubernetes");
    }
    // The config, through the host's own loader (it validates the whole file; the plugin paths
    // of the container image are the one thing this machine lacks).
    let (file_name, text) = configmap_config(&m);
    let dir = TempDir::new("manifests");
    let path = dir.path().join(&file_name);
    std::fs::write(
        &path,
        toml::to_string(&with_built_plugins(&text, dir.path())).unwrap(),
    )
    .unwrap();
    let loaded = config::load(&path).unwrap_or_else(|e| panic!("the ConfigMap's config: {e}"));
    let server = loaded.server();
    let port = server.listen.parse::<SocketAddr>().unwrap().port() as i64;
    assert!(
        server.watch_config,
        "ConfigMap updates reload only with watch_config"
    );

    let deployment = &m["Deployment"];
    let pod = &deployment["spec"]["template"];
    let labels = &pod["metadata"]["labels"];
    assert_eq!(labels["llm-d.ai/engine-type"], "vllm");
    assert!(selects(
        &deployment["spec"]["selector"]["matchLabels"],
        labels
    ));
    let spec = &pod["spec"];
    let grace = spec["terminationGracePeriodSeconds"].as_f64().unwrap();
    assert!(
        grace > server.drain_timeout_secs,
        "terminationGracePeriodSeconds {grace} must exceed drain_timeout_secs {}",
        server.drain_timeout_secs
    );
    let containers = spec["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let container = &containers[0];
    // The public listener's process: the image's unprivileged user, no capabilities, a
    // read-only root, and a writable /tmp for the compiles' temporary directories.
    let pod_security = &spec["securityContext"];
    assert_eq!(pod_security["runAsNonRoot"], true, "{pod_security}");
    let containerfile = std::fs::read_to_string(workspace_root().join("deploy/Containerfile"))
        .expect("deploy/Containerfile");
    let (image_user, image_group) = containerfile
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("the Containerfile sets USER")
        .trim()
        .split_once(':')
        .expect("the Containerfile's USER names the user and its group (uid:gid)");
    assert_eq!(
        pod_security["runAsUser"].to_string(),
        image_user,
        "runAsUser is the image's USER"
    );
    assert_eq!(
        pod_security["runAsGroup"].to_string(),
        image_group,
        "runAsGroup is the image's group"
    );
    assert!(
        containerfile.contains(&format!("groupadd --system --gid {image_group} ")),
        "the image makes its user's group with the gid USER names"
    );
    assert_eq!(pod_security["seccompProfile"]["type"], "RuntimeDefault");
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true, "{security}");
    assert_eq!(security["allowPrivilegeEscalation"], false, "{security}");
    assert_eq!(
        security["capabilities"]["drop"],
        json!(["ALL"]),
        "{security}"
    );
    let volume_at = |mount_path: &str| -> Value {
        let mount = container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == mount_path)
            .unwrap_or_else(|| panic!("nothing mounted at {mount_path}"));
        spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap_or_else(|| panic!("no volume {}", mount["name"]))
            .clone()
    };
    let tmp = volume_at("/tmp");
    assert!(tmp.get("emptyDir").is_some(), "/tmp is a writable emptyDir");
    // Bounded, so a runaway compile evicts its pod rather than filling the node's disk; with
    // room for several compiles of the released model at once (about 20 MB each).
    let limit = tmp["emptyDir"]["sizeLimit"]
        .as_str()
        .map(quantity_bytes)
        .expect("the /tmp emptyDir has a sizeLimit");
    assert!(
        (128 << 20..=4 << 30).contains(&limit),
        "/tmp's sizeLimit of {limit} bytes is outside 128 MiB to 4 GiB"
    );
    // The container port is the config's listen port, and the probes name it.
    let ports = container["ports"].as_array().unwrap();
    let http = ports
        .iter()
        .find(|p| p["containerPort"] == port)
        .unwrap_or_else(|| panic!("no container port {port} (server.listen) in {ports:?}"));
    let port_name = http["name"].as_str().unwrap();
    let probe_port = |probe: &Value| -> i64 {
        match &probe["httpGet"]["port"] {
            Value::String(name) => {
                assert_eq!(name, port_name, "{probe}");
                port
            }
            number => number.as_i64().unwrap(),
        }
    };
    for (probe, path) in [
        ("readinessProbe", "/ready"),
        ("livenessProbe", "/health"),
        ("startupProbe", "/ready"),
    ] {
        let p = &container[probe];
        assert_eq!(probe_port(p), port, "{probe}");
        assert_eq!(p["httpGet"]["path"], path, "{probe}");
    }
    // The startup window covers what the start may take: the settings check, then the creation
    // and warm-up of each model's instance, one after another (its loading and compiles), each
    // bounded by reload_timeout_secs.
    let startup = &container["startupProbe"];
    let window =
        startup["periodSeconds"].as_f64().unwrap() * startup["failureThreshold"].as_f64().unwrap();
    let bound = (1 + loaded.models().len()) as f64 * server.reload_timeout_secs;
    assert!(
        window > bound,
        "startupProbe allows {window} s, the start may take (1 + models) × reload_timeout_secs = {bound} s"
    );
    // `serve --config <mount>/<file>`, the ConfigMap mounted as a directory (a subPath mount
    // is never updated, and watch_config would never fire).
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "serve");
    let config_arg = Path::new(args[args.iter().position(|a| *a == "--config").unwrap() + 1]);
    assert_eq!(config_arg.file_name().unwrap().to_str().unwrap(), file_name);
    let volumes = spec["volumes"].as_array().unwrap();
    let mounts = container["volumeMounts"].as_array().unwrap();
    let mount_of = |volume: &dyn Fn(&Value) -> bool| {
        let v = volumes.iter().find(|v| volume(v)).expect("volume");
        mounts
            .iter()
            .find(|m| m["name"] == v["name"])
            .expect("mounted")
            .clone()
    };
    let config_mount = mount_of(&|v| v["configMap"]["name"] == m["ConfigMap"]["metadata"]["name"]);
    assert_eq!(
        Path::new(config_mount["mountPath"].as_str().unwrap()),
        config_arg.parent().unwrap()
    );
    assert!(config_mount.get("subPath").is_none());
    // The checkpoint and the cache live on the volumes the config names.
    let checkpoint_mount = mount_of(&|v| v.get("persistentVolumeClaim").is_some());
    for model in loaded.models() {
        let checkpoint = model.settings["checkpoint"].as_str().unwrap();
        assert!(
            checkpoint.starts_with(checkpoint_mount["mountPath"].as_str().unwrap()),
            "{checkpoint}"
        );
    }
    let cache_dir = server.cache_dir.as_ref().expect("server.cache_dir");
    assert!(mounts
        .iter()
        .any(|m| Path::new(m["mountPath"].as_str().unwrap()) == cache_dir));
    // The plugins are where the Containerfile puts them.
    let containerfile = std::fs::read_to_string(workspace_root().join("deploy/Containerfile"))
        .expect("deploy/Containerfile");
    let as_written: toml::Table = toml::from_str(&text).unwrap();
    for plugin in as_written["plugins"].as_array().unwrap() {
        let path = Path::new(plugin["path"].as_str().unwrap());
        let dir = path.parent().unwrap().display().to_string();
        assert!(containerfile.contains(&format!("{dir}/")), "{dir}");
    }
    // Beside the compiler library, the image holds the two tools the plugin runs (and refuses
    // an installation without): the driver, and the linker every CPU module needs.
    for tool in ["iree-compile", "iree-lld"] {
        assert!(
            containerfile.contains(&format!("$PHI4MM_IREE_COMPILER\")/{tool}\"")),
            "deploy/Containerfile does not copy {tool} beside the compiler library"
        );
    }
    // The admin token is read from the Secret's file (server.admin_token_file), not passed in
    // the environment, where /proc/<pid>/environ would show it.
    let token_file = Path::new(
        as_written["server"]["admin_token_file"]
            .as_str()
            .expect("server.admin_token_file"),
    );
    let secret = volume_at(token_file.parent().unwrap().to_str().unwrap());
    assert_eq!(
        secret["secret"]["secretName"], m["Secret"]["metadata"]["name"],
        "{token_file:?} is not in the Secret's mount"
    );
    let key = token_file.file_name().unwrap().to_str().unwrap();
    assert!(
        m["Secret"]["stringData"].get(key).is_some(),
        "the Secret has no key {key}"
    );
    // Readable by the pod's group only (fsGroup), not by every user of the node's image.
    assert_eq!(secret["secret"]["defaultMode"], 0o440, "{secret}");
    assert_eq!(spec["securityContext"]["fsGroup"].to_string(), image_group);
    assert!(
        container
            .get("env")
            .into_iter()
            .flat_map(|e| e.as_array())
            .flatten()
            .all(|e| { !e["name"].as_str().unwrap().contains("ADMIN_TOKEN") }),
        "the admin token is in the environment"
    );

    // The Service, the budget and the pool select these pods; the pool's port is the server's.
    let service = &m["Service"]["spec"];
    assert!(selects(&service["selector"], labels));
    assert_eq!(service["ports"][0]["targetPort"], port_name);
    assert!(selects(
        &m["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
        labels
    ));
    let pool = &m["InferencePool"];
    assert_eq!(pool["apiVersion"], "inference.networking.k8s.io/v1");
    assert!(selects(&pool["spec"]["selector"]["matchLabels"], labels));
    assert_eq!(pool["spec"]["targetPorts"], json!([{"number": port}]));
    assert!(pool["spec"]["endpointPickerRef"]["name"].is_string());
    let objective = &m["InferenceObjective"];
    assert_eq!(
        objective["apiVersion"],
        "inference.networking.x-k8s.io/v1alpha2"
    );
    assert_eq!(
        objective["spec"]["poolRef"]["name"],
        pool["metadata"]["name"]
    );
}

/// The ConfigMap's TOML with the paths this machine lacks replaced, so that the host's loader
/// can check the rest as written: each plugin's by the built library of the same file name, and
/// the admin token's file (the Secret's mount) by one written into `dir`.
fn with_built_plugins(text: &str, dir: &Path) -> toml::Table {
    let mut config: toml::Table = toml::from_str(text).unwrap();
    let server = config.get_mut("server").unwrap().as_table_mut().unwrap();
    if server.contains_key("admin_token_file") {
        let token = dir.join("admin-token");
        std::fs::write(&token, "a-token-as-long-as-the-secrets\n").unwrap();
        server.insert(
            "admin_token_file".into(),
            token.display().to_string().into(),
        );
    }
    for plugin in config.get_mut("plugins").unwrap().as_array_mut().unwrap() {
        let path = plugin["path"].as_str().unwrap().to_string();
        let built = phi4mm_lib();
        assert_eq!(
            Path::new(&path).file_name(),
            built.file_name(),
            "a plugin this test has no build of"
        );
        plugin["path"] = built.display().to_string().into();
    }
    config
}

/// Points the server's IREE artifact cache (`$XDG_CACHE_HOME/switchyard/iree`, the test server's
/// `XDG_CACHE_HOME` being `<dir>/cache`) at the one the plugin's IREE tests fill, as pods share a
/// persistent cache claim: the ConfigMap's decoder shape (the checkpoint's whole context) is
/// theirs, so a test run compiles it once. Compiling it privately, on a cold cache, took this
/// test past the server's start timeout on a loaded 2-core CI machine.
fn share_the_iree_cache(dir: &Path) {
    let shared = crate::shared_iree_cache();
    std::fs::create_dir_all(&shared).unwrap();
    let link = dir.join("cache/switchyard/iree");
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&shared, &link).unwrap();
}

/// The ConfigMap's TOML with all its container paths replaced: the built plugins, the fixture
/// checkpoint, and a private cache.
fn config_for_this_machine(text: &str, cache: &Path) -> String {
    let mut config = with_built_plugins(text, cache.parent().unwrap());
    let server = config.get_mut("server").unwrap().as_table_mut().unwrap();
    server.insert("cache_dir".into(), cache.display().to_string().into());
    for model in config.get_mut("models").unwrap().as_array_mut().unwrap() {
        let settings = model["settings"].as_table_mut().unwrap();
        let checkpoint = fixture().join("model").display().to_string();
        settings.insert("checkpoint".into(), checkpoint.into());
    }
    toml::to_string(&config).unwrap()
}

#[tokio::test]
async fn the_probes_the_deployment_names_answer_on_the_configmaps_server() {
    let m = manifests();
    let (_, text) = configmap_config(&m);
    let dir = TempDir::new("manifest-server");
    let config = config_for_this_machine(&text, &dir.path().join("cache"));
    share_the_iree_cache(dir.path());
    // The test picks free loopback ports (`--listen`): the manifest's own port may be taken on
    // a shared machine; that it equals the container port is checked above.
    let server = Server::start_in(dir, &config).await;
    // What an operator watching the pod start reads: the instance being created, each module
    // the IREE backend compiles (when the cache lacks it) and how long it took, then ready.
    let log = server.log();
    for line in ["creating instance", "instance ready"] {
        assert!(log.contains(line), "{line:?} missing from the log:\n{log}");
    }
    #[cfg(feature = "iree")]
    assert!(log.contains("on the iree backend"), "{log}");
    for compiling in log.split('\n').filter_map(|l| l.split("compiling ").nth(1)) {
        if let Some((entry, _)) = compiling.split_once(": not in the artifact cache") {
            let done = format!("compiled {entry} in ");
            assert!(log.contains(&done), "no {done:?} in the log:\n{log}");
        }
    }
    let container = &m["Deployment"]["spec"]["template"]["spec"]["containers"][0];
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        let path = container[probe]["httpGet"]["path"].as_str().unwrap();
        let r = server
            .http
            .get(format!("{}{path}", server.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{probe} {path}");
    }
    // Each route's model names answer, on both generation endpoints.
    let (_, toml_text) = configmap_config(&m);
    let table: toml::Table = toml::from_str(&toml_text).unwrap();
    for route in table["routes"].as_array().unwrap() {
        for name in route["models"].as_array().unwrap() {
            let name = name.as_str().unwrap();
            let body = json!({"model": name, "prompt": "Hi", "max_tokens": 2});
            let (status, reply) = server.post_json("/v1/completions", &body).await;
            assert_eq!(status, 200, "{name}: {reply}");
            let body = json!({"model": name, "messages": user("Hi"), "max_tokens": 2});
            let (status, reply) = server.post_json("/v1/chat/completions", &body).await;
            assert_eq!(status, 200, "{name}: {reply}");
        }
    }
}

fn echo_config(label: &str) -> String {
    format!(
        "[server]\nwatch_config = true\n[[plugins]]\nname = \"echo\"\npath = \"{}\"\n\
         [[models]]\nname = \"bot\"\nplugin = \"echo\"\nkind = \"echo\"\n\
         settings = {{ label = \"{label}\", tag_tokens = true }}\n",
        plugin_lib("echo").display()
    )
}

/// A ConfigMap volume as the kubelet lays it out: `<file> -> ..data/<file>`,
/// `..data -> ..<timestamp>/`; an update writes a new timestamped directory and renames a new
/// `..data` link over the old one.
#[tokio::test]
async fn a_configmap_update_published_by_link_swap_reloads_a_watching_server() {
    use std::os::unix::fs::symlink;
    let dir = TempDir::new("configmap");
    let root = dir.path().to_path_buf();
    std::fs::create_dir(root.join("..2026_01_01_00_00_00.1")).unwrap();
    symlink("..2026_01_01_00_00_00.1", root.join("..data")).unwrap();
    symlink("..data/switchyard.toml", root.join("switchyard.toml")).unwrap();
    // `start_in` writes the config through the links, into the first timestamped directory.
    let server = Server::start_in(dir, &echo_config("first")).await;
    let label = || async {
        let reply = server
            .chat(json!({"model": "bot", "messages": user("x")}))
            .await;
        reply.content().to_string()
    };
    assert!(label().await.contains("/first]"));

    let next = root.join("..2026_01_01_00_01_00.2");
    std::fs::create_dir(&next).unwrap();
    let text = echo_config("updated").replace("{dir}", &root.display().to_string());
    std::fs::write(next.join("switchyard.toml"), text).unwrap();
    symlink("..2026_01_01_00_01_00.2", root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    std::fs::remove_dir_all(root.join("..2026_01_01_00_00_00.1")).unwrap();
    for _ in 0..200 {
        if label().await.contains("/updated]") {
            assert!(server.log().contains("config file changed: reloading"));
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the ConfigMap update was not reloaded; log:\n{}",
        server.log()
    );
}

/// `1.91` or `1.91.0` as a comparable triple.
fn rust_version(text: &str) -> (u32, u32, u32) {
    let mut parts = text.trim().split('.').map(|p| {
        p.parse::<u32>()
            .unwrap_or_else(|_| panic!("not a Rust version: {text:?}"))
    });
    let major = parts.next().unwrap();
    (major, parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// The image builds with the toolchain it names: its `rust:X.Y` image is at least the workspace's
/// rust-version, and every dependency locked for Linux builds with that rust-version (cargo
/// refuses a package whose rust-version is above the compiler's, and `--locked` forbids picking
/// another). notify-types 2.3.0, which needs Rust 1.91, once made the image's
/// `cargo build --locked` on Rust 1.89 fail, while every test here, on a newer Rust, passed.
#[test]
fn the_images_rust_builds_every_locked_dependency() {
    let root = workspace_root();
    let manifest: toml::Table =
        toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()).unwrap();
    let declared = manifest["workspace"]["package"]["rust-version"]
        .as_str()
        .expect("workspace.package.rust-version");
    let msrv = rust_version(declared);

    let containerfile = std::fs::read_to_string(root.join("deploy/Containerfile")).unwrap();
    let image = containerfile
        .lines()
        .find_map(|l| l.strip_prefix("FROM docker.io/library/rust:"))
        .expect("deploy/Containerfile builds FROM docker.io/library/rust:<version>-…");
    let image_rust = rust_version(image.split(['-', ' ']).next().unwrap());
    assert!(
        image_rust >= msrv,
        "deploy/Containerfile builds with Rust {image_rust:?}, below the workspace's rust-version {declared}"
    );

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--all-features",
        ])
        .args(["--filter-platform", "x86_64-unknown-linux-gnu"])
        .current_dir(&root)
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata --locked: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = metadata["packages"].as_array().unwrap();
    assert!(packages.len() > 100, "{} packages", packages.len());
    let too_new: Vec<String> = packages
        .iter()
        .filter_map(|p| {
            let needs = p["rust_version"].as_str()?;
            (rust_version(needs) > msrv).then(|| {
                let field = |k: &str| p[k].as_str().unwrap_or("?").to_owned();
                format!("{} {} needs Rust {needs}", field("name"), field("version"))
            })
        })
        .collect();
    assert!(
        too_new.is_empty(),
        "locked dependencies need a newer Rust than the workspace's rust-version {declared} \
         (and the image's): {too_new:?}; `cargo update -p <name>` picks a version that fits \
         (resolver 3)"
    );
}

/// The image's build context leaves out what git ignores: build outputs and local toolchains
/// (here gigabytes of `target/` and a venv whose scripts name this machine's paths, which the
/// build stage's `scripts/iree-env.sh` would take for its own).
#[test]
fn the_images_build_context_leaves_out_what_git_ignores() {
    let root = workspace_root();
    let patterns = |name: &str| -> Vec<String> {
        std::fs::read_to_string(root.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| l.trim_start_matches('/').to_owned())
            .collect()
    };
    let ignored_by_image = patterns(".dockerignore");
    assert!(
        ignored_by_image.iter().any(|p| p == ".git"),
        "{ignored_by_image:?}"
    );
    for pattern in patterns(".gitignore") {
        // git matches a pattern without a slash at any depth; docker only where it is written.
        let as_docker = if pattern.contains('/') {
            pattern.clone()
        } else if pattern.starts_with('*') {
            format!("**/{pattern}")
        } else {
            pattern.clone()
        };
        assert!(
            ignored_by_image.contains(&as_docker),
            ".dockerignore lacks `{as_docker}` (from .gitignore's `{pattern}`)"
        );
    }
}
