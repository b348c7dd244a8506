//! The cost of a `/metrics` scrape with 10 instances (issue 17: endpoint pickers scrape every
//! 50 ms and treat metrics older than 200 ms as saturated; the target is ≤ 1 ms per scrape).
//! A real `switchyard serve` with 10 echo instances, every series populated by real requests,
//! one keep-alive client over loopback. Each round times `GET /metrics` and, as the same-run
//! baseline, `GET /health` (the same HTTP path with no work), alternating, since these machines
//! are noisy. Prints one JSON line and writes its section of `docs/benchmarks.md`.
//!
//! Run: `scripts/bench-metrics.sh` (builds release binaries first).

use serde_json::json;
use std::time::{Duration, Instant};
use switchyard_integration_tests::{
    machine_description, plugin_lib, user, write_benchmark_section, Server,
};

const INSTANCES: usize = 10;
const ROUNDS: usize = 5;
const PER_ROUND: usize = 400;

fn config() -> String {
    let mut config = format!(
        "[[plugins]]\nname = \"echo\"\npath = \"{}\"\n",
        plugin_lib("echo").display()
    );
    for i in 0..INSTANCES {
        config.push_str(&format!(
            "[[models]]\nname = \"echo-{i}\"\nplugin = \"echo\"\nkind = \"echo\"\n\
             settings = {{ slots = 4, adapters = [\"a{i}\", \"b{i}\"] }}\n\
             [[routes]]\nmodels = [\"model-{i}\", \"alias-{i}\"]\nbackends = [{{ model = \"echo-{i}\" }}]\n"
        ));
    }
    config
}

/// The 1-, 5- and 15-minute load averages, as numbers (the shape of `phi4mm bench`'s JSON).
fn load_average() -> Vec<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .filter_map(|v| v.parse().ok())
        .collect()
}

async fn time_get(client: &reqwest::Client, url: &str, into: &mut Vec<Duration>) -> usize {
    let t = Instant::now();
    let r = client.get(url).send().await.unwrap();
    assert!(r.status().is_success(), "{url}: {}", r.status());
    let bytes = r.bytes().await.unwrap().len();
    into.push(t.elapsed());
    bytes
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let load_before = load_average();
    let (mut scrape, mut health, bytes) = rt.block_on(async {
        let server = Server::start(&config()).await;
        // Populate every series: a few requests per instance.
        for i in 0..INSTANCES {
            for _ in 0..5 {
                let body = json!({"model": format!("model-{i}"), "messages": user("a b c d")});
                assert_eq!(server.chat(body).await.status, 200);
            }
        }
        let client = reqwest::Client::new();
        let (metrics_url, health_url) = (
            format!("{}/metrics", server.base),
            format!("{}/health", server.base),
        );
        let (mut scrape, mut health) = (Vec::new(), Vec::new());
        let mut bytes = 0;
        for _ in 0..50 {
            time_get(&client, &metrics_url, &mut Vec::new()).await;
            time_get(&client, &health_url, &mut Vec::new()).await;
        }
        for _ in 0..ROUNDS {
            for _ in 0..PER_ROUND {
                bytes = time_get(&client, &metrics_url, &mut scrape).await;
            }
            for _ in 0..PER_ROUND {
                time_get(&client, &health_url, &mut health).await;
            }
        }
        (scrape, health, bytes)
    });
    let load_after = load_average();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (s50, s99) = (percentile(&mut scrape, 0.5), percentile(&mut scrape, 0.99));
    let (h50, h99) = (percentile(&mut health, 0.5), percentile(&mut health, 0.99));
    // `scripts/bench-metrics.sh` runs release; a dev-profile run (`--profile dev`) says so.
    let profile = if cfg!(debug_assertions) {
        "dev"
    } else {
        "release"
    };
    let line = json!({
        "bench": "metrics-scrape",
        "profile": profile,
        "instances": INSTANCES,
        "scrapes": scrape.len(),
        "bytes": bytes,
        "scrape_p50_us": us(s50).round(),
        "scrape_p99_us": us(s99).round(),
        "health_p50_us": us(h50).round(),
        "health_p99_us": us(h99).round(),
        "ratio_p50": (s50.as_secs_f64() / h50.as_secs_f64() * 100.0).round() / 100.0,
        "added_p50_us": (us(s50) - us(h50)).round(),
        "load_average": &load_before,
        "load_average_after": &load_after,
    });
    println!("{line}");
    let shown = |load: &[f64]| {
        load.iter()
            .map(|v| format!("{v:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (load_before, load_after) = (shown(&load_before), shown(&load_after));
    let report = format!(
        "## `/metrics` scrape cost (issue 17)\n\n\
Command: `scripts/bench-metrics.sh` (release build; `cargo bench -p switchyard-integration-tests --bench metrics_scrape`).\n\
This run: the **{profile}** profile. Machine: {machine}. Load average (1, 5, 15 min) {load_before} before, {load_after} after.\n\
A real `switchyard serve` with {INSTANCES} echo instances (two adapters and two served names each,\n\
every `vllm:*` and `switchyard_*` series populated by real requests), one keep-alive client over\n\
loopback, {ROUNDS} alternating rounds of {PER_ROUND} `GET /metrics` and {PER_ROUND} `GET /health` (the same\n\
HTTP path doing nothing: the same-run baseline). The exposition is {bytes} bytes.\n\n\
| request | p50 µs | p99 µs |\n| --- | ---: | ---: |\n\
| `GET /health` (baseline) | {h50:.0} | {h99:.0} |\n\
| `GET /metrics`, {INSTANCES} instances | {s50:.0} | {s99:.0} |\n\
| added by the scrape (p50) | {added:.0} | |\n\n\
Target: ≤ 1 ms per scrape (pickers scrape every 50 ms). The JSON line the run printed:\n\n```\n{line}\n```\n",
        machine = machine_description(),
        h50 = us(h50),
        h99 = us(h99),
        s50 = us(s50),
        s99 = us(s99),
        added = us(s50) - us(h50),
    );
    write_benchmark_section("metrics-scrape", &report).unwrap();
}
