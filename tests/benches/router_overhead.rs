//! Router overhead, measured with a third-party load generator (`oha`): a non-streaming chat
//! request through a real release `switchyard serve` (the echo plugin, `token_delay_ms = 0`,
//! 256 slots) against `router-baseline` (`benches/router_baseline.rs`), a minimal axum server that
//! does the same work without the router. Both run side by side in one run, in interleaved
//! rounds (the order alternates each round), at concurrency 1, 8 and 64; each figure is the median
//! over the rounds, and each ratio or added latency the median of the per-round ones, so a
//! burst of load on this shared machine hits both sides alike. Also the bare ABI cost of
//! `submit` + its events through the real loader. Writes its section of `docs/benchmarks.md` and
//! prints one JSON line.
//!
//! Run: `scripts/bench-router.sh` (installs oha, builds the release binaries). Environment:
//! `OHA` (the oha binary, default `oha`), `ROUTER_BENCH_ROUNDS` (default 3),
//! `ROUTER_BENCH_PHASE_SECS` (default 3).

use serde_json::{json, Value};
use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};
use switchyard::config;
use switchyard_integration_tests::{
    free_port, machine_description, plugin_lib, target_profile_dir, user, write_benchmark_section,
    Server, TempDir,
};

const CONCURRENCY: [usize; 3] = [1, 8, 64];
const PROMPT: &str = "the quick brown fox jumps over the lazy dog";

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One oha run against one server.
#[derive(Clone, Copy, Debug)]
struct Sample {
    rps: f64,
    p50: f64,
    p99: f64,
}

fn oha() -> String {
    std::env::var("OHA").unwrap_or_else(|_| "oha".into())
}

fn oha_version() -> String {
    let out = Command::new(oha())
        .arg("--version")
        .output()
        .expect("run oha --version (scripts/bench-router.sh installs oha)");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `oha` for `secs` at `concurrency`; panics unless every request got a 200.
fn run_oha(url: &str, body: &str, concurrency: usize, secs: u64) -> Sample {
    let out = Command::new(oha())
        .args(["--no-tui", "--output-format", "json", "-z"])
        .arg(format!("{secs}s"))
        .args(["-c", &concurrency.to_string(), "-m", "POST"])
        .args(["-H", "content-type: application/json", "-d", body])
        // Requests still in flight at the deadline finish and count, rather than being cut.
        .arg("-w")
        .arg(url)
        .stderr(Stdio::inherit())
        .output()
        .expect("run oha");
    assert!(out.status.success(), "oha failed: {}", out.status);
    let report: Value = serde_json::from_slice(&out.stdout).expect("oha's JSON report");
    let codes = &report["statusCodeDistribution"];
    let ok = codes["200"].as_u64().unwrap_or(0);
    let all: u64 = codes
        .as_object()
        .map_or(0, |m| m.values().filter_map(Value::as_u64).sum());
    let errors = report["errorDistribution"]
        .as_object()
        .map_or(0, |m| m.len());
    assert!(
        ok > 0 && ok == all && errors == 0,
        "{url}: not every request answered 200: {codes} {}",
        report["errorDistribution"]
    );
    let number = |v: &Value| v.as_f64().expect("a number in oha's report");
    Sample {
        rps: number(&report["summary"]["requestsPerSec"]),
        p50: number(&report["latencyPercentiles"]["p50"]),
        p99: number(&report["latencyPercentiles"]["p99"]),
    }
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// The baseline server process, killed on drop.
struct Baseline {
    child: Child,
    url: String,
}

impl Baseline {
    /// `answer`: `json` (built as a `serde_json::Value`) or `typed` (serialised from structs).
    async fn start(answer: &str) -> Self {
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new(target_profile_dir().join("router-baseline"))
            .args([addr.as_str(), answer])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start router-baseline (scripts/bench-router.sh builds it)");
        let url = format!("http://{addr}/v1/chat/completions");
        let until = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(&addr).await.is_err() {
            assert!(Instant::now() < until, "router-baseline did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self { child, url }
    }
}

impl Drop for Baseline {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The answer without what differs per request (`id`, `created`), the id replaced by its
/// length (both servers write ids of the same form: a random prefix and a counter).
async fn answer_shape(url: &str, body: &Value) -> Value {
    let mut answer: Value = reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let fields = answer.as_object_mut().unwrap();
    let id = fields.remove("id").expect("an id");
    assert!(fields.remove("created").is_some());
    fields.insert("id_length".into(), id.as_str().map_or(0, str::len).into());
    answer
}

/// submit + events through the real loader, on the caller's thread.
fn abi_cost() -> (Duration, Duration) {
    let dir = TempDir::new("abi-bench");
    let text = format!(
        "[[plugins]]\nname = \"echo\"\npath = \"{}\"\n[[models]]\nname = \"bot\"\nplugin = \"echo\"\nkind = \"echo\"\nsettings = {{ inline = true }}\n",
        plugin_lib("echo").display()
    );
    let cfg = config::from_toml_str(&text, dir.path()).unwrap();
    let runtime = switchyard::runtime::Runtime::new(None, dir.path().join("cache")).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(runtime.apply(cfg)).unwrap();
    let generation = runtime.current();
    let instance = generation.table.instances()["bot"].clone();
    let request = switchyard_plugin_api::Request::new(
        1,
        switchyard_plugin_api::Endpoint::Chat,
        vec![switchyard_plugin_api::Message::text(
            switchyard_plugin_api::Role::User,
            "x",
        )],
    );
    let n = 200_000;
    let t = Instant::now();
    for _ in 0..n {
        let (mut admission, mut events) = instance
            .submit(request.clone().into())
            .map_err(|r| format!("{r:?}"))
            .unwrap();
        let mut count = 0;
        while let Some(event) = events.try_recv() {
            count += 1;
            if matches!(event, switchyard_plugin_api::Event::Finished { .. }) {
                admission.mark_finished();
            }
        }
        assert_eq!(count, 3); // Started, Token, Finished
    }
    let submit = t.elapsed() / n;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(instance.stats());
    }
    let stats = t.elapsed() / n;
    (submit, stats)
}

/// The figures of one concurrency over all rounds.
struct Row {
    concurrency: usize,
    /// The baseline building its answer as a `serde_json::Value`.
    baseline: Vec<Sample>,
    /// The baseline serialising its answer from typed structs, as switchyard does.
    typed: Vec<Sample>,
    routed: Vec<Sample>,
}

impl Row {
    fn median_of(samples: &[Sample], f: impl Fn(&Sample) -> f64) -> f64 {
        median(samples.iter().map(f).collect())
    }
    fn per_round(base: &[Sample], routed: &[Sample], f: impl Fn(&Sample, &Sample) -> f64) -> f64 {
        median(base.iter().zip(routed).map(|(b, r)| f(b, r)).collect())
    }
    fn ratio(&self, base: &[Sample]) -> f64 {
        Self::per_round(base, &self.routed, |b, r| r.rps / b.rps)
    }
    fn p50_added_us(&self) -> f64 {
        Self::per_round(&self.baseline, &self.routed, |b, r| (r.p50 - b.p50) * 1e6)
    }
    fn p99_added_us(&self) -> f64 {
        Self::per_round(&self.baseline, &self.routed, |b, r| (r.p99 - b.p99) * 1e6)
    }
}

fn main() {
    let rounds = env_or("ROUTER_BENCH_ROUNDS", 3) as usize;
    let secs = env_or("ROUTER_BENCH_PHASE_SECS", 3);
    let oha_version = oha_version();
    let (submit, stats) = abi_cost();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = format!(
        "[[plugins]]\nname = \"echo\"\npath = \"{}\"\n[[models]]\nname = \"bot\"\nplugin = \"echo\"\nkind = \"echo\"\nmax_in_flight = 1024\nsettings = {{ token_delay_ms = 0, slots = 256 }}\n",
        plugin_lib("echo").display()
    );
    let body = json!({"model": "bot", "messages": user(PROMPT)});
    let body_text = body.to_string();
    let (server, baseline, typed) = rt.block_on(async {
        let server = Server::start(&config).await;
        let baseline = Baseline::start("json").await;
        let typed = Baseline::start("typed").await;
        (server, baseline, typed)
    });
    let routed_url = format!("{}/v1/chat/completions", server.base);
    // The baseline must do the same work: the same answer, field for field.
    let (b, t, r) = rt.block_on(async {
        (
            answer_shape(&baseline.url, &body).await,
            answer_shape(&typed.url, &body).await,
            answer_shape(&routed_url, &body).await,
        )
    });
    assert_eq!(b, r, "the baseline's answer differs from switchyard's");
    assert_eq!(
        t, r,
        "the typed baseline's answer differs from switchyard's"
    );
    assert_eq!(r["choices"][0]["message"]["content"], PROMPT);

    // Warm both (connections, allocator, the echo plugin's workers).
    for url in [&baseline.url, &typed.url, &routed_url] {
        run_oha(url, &body_text, 64, 1);
    }
    let mut rows: Vec<Row> = CONCURRENCY
        .iter()
        .map(|&concurrency| Row {
            concurrency,
            baseline: Vec::new(),
            typed: Vec::new(),
            routed: Vec::new(),
        })
        .collect();
    let mut loads = vec![load_average()];
    let started = Instant::now();
    for round in 0..rounds {
        for row in &mut rows {
            let c = row.concurrency;
            // The order rotates every round, so no side always runs first or last.
            for side in (0..3).map(|i| (i + round) % 3) {
                match side {
                    0 => row
                        .baseline
                        .push(run_oha(&baseline.url, &body_text, c, secs)),
                    1 => row.typed.push(run_oha(&typed.url, &body_text, c, secs)),
                    _ => row.routed.push(run_oha(&routed_url, &body_text, c, secs)),
                }
            }
            loads.push(load_average());
            // Each round's figures, for the medians of the rates and of the per-round ratios
            // can differ far when the machine changes speed between rounds.
            let last = |v: &[Sample]| v.last().map_or(0.0, |s| s.rps);
            eprintln!(
                "round {round} concurrency {c}: baseline {:.0}, typed {:.0}, switchyard {:.0} \
                 requests/s (ratio {:.3})",
                last(&row.baseline),
                last(&row.typed),
                last(&row.routed),
                last(&row.routed) / last(&row.baseline)
            );
        }
    }
    let wall = started.elapsed();
    drop(server);
    drop(baseline);
    drop(typed);

    let (load_min, load_max) = loads
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &l| (lo.min(l), hi.max(l)));
    let mut table = String::from(
        "| concurrency | baseline req/s | switchyard req/s | throughput ratio | typed baseline req/s | ratio to it | baseline p50 / p99 ms | switchyard p50 / p99 ms | p50 added µs | p99 added µs |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let mut json_rows = serde_json::Map::new();
    for row in &rows {
        let med = |s: &[Sample], f: fn(&Sample) -> f64| Row::median_of(s, f);
        let (b_rps, r_rps) = (med(&row.baseline, |s| s.rps), med(&row.routed, |s| s.rps));
        let t_rps = med(&row.typed, |s| s.rps);
        let ms = |s: &[Sample], f: fn(&Sample) -> f64| med(s, f) * 1e3;
        table.push_str(&format!(
            "| {} | {b_rps:.0} | {r_rps:.0} | **{:.2}×** | {t_rps:.0} | {:.2}× | {:.3} / {:.3} | {:.3} / {:.3} | {:.0} | **{:.0}** |\n",
            row.concurrency,
            row.ratio(&row.baseline),
            row.ratio(&row.typed),
            ms(&row.baseline, |s| s.p50),
            ms(&row.baseline, |s| s.p99),
            ms(&row.routed, |s| s.p50),
            ms(&row.routed, |s| s.p99),
            row.p50_added_us(),
            row.p99_added_us(),
        ));
        json_rows.insert(
            format!("c{}", row.concurrency),
            json!({
                "baseline_rps": b_rps.round(), "switchyard_rps": r_rps.round(),
                "ratio": (row.ratio(&row.baseline) * 1000.0).round() / 1000.0,
                "typed_baseline_rps": t_rps.round(),
                "ratio_to_typed": (row.ratio(&row.typed) * 1000.0).round() / 1000.0,
                "p50_added_us": row.p50_added_us().round(),
                "p99_added_us": row.p99_added_us().round(),
            }),
        );
    }
    let report = format!(
        "## Router overhead (issue 17)\n\n\
Command: `scripts/bench-router.sh` (installs {oha_version} with `cargo install --locked`, builds\n\
release binaries, runs `cargo bench -p switchyard-integration-tests --bench router_overhead`).\n\
Machine: {machine}; load average (1 min) {load_min:.1}–{load_max:.1} during the run.\n\n\
The load generator is `oha` (a separate process, keep-alive connections, `-z {secs}s` per phase).\n\
Both servers get the same non-streaming chat request, `\"{PROMPT}\"` (9 tokens), and answer\n\
the same JSON (checked field for field before the run). *switchyard*: the release `switchyard\n\
serve`, echo plugin, `token_delay_ms = 0`, `slots = 256`. *baseline*: `router-baseline`\n\
(`tests/benches/router_baseline.rs`), a minimal axum server that parses the same request into\n\
typed structs and a plugin-API `Request`, streams the echoed words as tokens and builds the same\n\
answer as a `serde_json::Value` with `json!`. *typed baseline*: the same server serialising its\n\
answer from borrowed, typed structs, as switchyard now does (the fairer comparison of what the\n\
router adds). Added latencies are against the first baseline. {rounds} interleaved rounds (order\n\
rotating) of {secs} s per side\n\
and concurrency, {wall:.0} s in all; medians over the rounds, ratios and added latencies as the\n\
median of the per-round ones.\n\n\
{table}\n\
ABI cost through the real loader (echo plugin in `inline` mode, on the caller's thread, {n} calls):\n\
`submit` + 3 events (Started, Token, Finished) through the host's channel sink: **{submit_us:.2} µs**;\n\
`stats()` round trip: **{stats_us:.3} µs**.\n",
        machine = machine_description(),
        wall = wall.as_secs_f64(),
        n = 200_000,
        submit_us = submit.as_secs_f64() * 1e6,
        stats_us = stats.as_secs_f64() * 1e6,
    );
    print!("{report}");
    write_benchmark_section("router-overhead", &report).unwrap();
    let line = json!({
        "bench": "router-overhead", "load_generator": oha_version, "rounds": rounds,
        "phase_secs": secs, "load_avg_min": load_min, "load_avg_max": load_max,
        "abi_submit_us": (submit.as_secs_f64() * 1e8).round() / 100.0,
        "results": json_rows,
    });
    println!("{line}");
}
